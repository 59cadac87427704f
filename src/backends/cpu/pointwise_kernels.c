/* Pointwise kernels: binary ops with broadcasting, unary ops and their
 * derivatives (fast f32 paths and element-by-element references). */
#include "cpu_kernels.h"
#include "vec_math.h"

/* Inner loop of a binary op over one row, specialised on the common stride
 * patterns so the compiler vectorises them. */
#define BIN_ROW(EXPR)                                                                  \
    do {                                                                               \
        if (ia == 1 && ib == 1) {                                                      \
            for (int64_t j = 0; j < n; j++) { float x = pa[j], y = pb[j]; po[j] = EXPR; } \
        } else if (ia == 1 && ib == 0) {                                               \
            float y = pb[0];                                                           \
            for (int64_t j = 0; j < n; j++) { float x = pa[j]; po[j] = EXPR; }         \
        } else if (ia == 0 && ib == 1) {                                               \
            float x = pa[0];                                                           \
            for (int64_t j = 0; j < n; j++) { float y = pb[j]; po[j] = EXPR; }         \
        } else {                                                                       \
            for (int64_t j = 0; j < n; j++) {                                          \
                float x = pa[j * ia], y = pb[j * ib];                                  \
                po[j] = EXPR;                                                          \
            }                                                                          \
        }                                                                              \
    } while (0)

static void binary_row(accel__binop op, const float *pa, int64_t ia, const float *pb, int64_t ib,
                       float *po, int64_t n) {
    switch (op) {
    case ACCEL_B_ADD: BIN_ROW(x + y); break;
    case ACCEL_B_SUB: BIN_ROW(x - y); break;
    case ACCEL_B_MUL: BIN_ROW(x * y); break;
    case ACCEL_B_DIV: BIN_ROW(x / y); break;
    }
}

void accel__cpu_binary_f32(accel__binop op, const accel__layout *l, const float *a, const float *b,
                           float *out) {
    int nd = l->ndim;
    int64_t n = l->shape[nd - 1], rows = accel__layout_rows(l);
    int64_t ia = l->stride[0][nd - 1], ib = l->stride[1][nd - 1];
    if (rows == 1) {
        /* One long row: split it between threads. */
        int64_t chunk = 8192, nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t s = c * chunk, e = s + chunk < n ? s + chunk : n;
            binary_row(op, a + s * ia, ia, b + s * ib, ib, out + s, e - s);
        }
        return;
    }
#pragma omp parallel for if (rows * n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        binary_row(op, a + accel__layout_row_offset(l, 0, r), ia, b + accel__layout_row_offset(l, 1, r),
                   ib, out + r * n, n);
}

/* Elements a block widens at a time (on the stack, in L1). */
enum { LOWP_BLOCK = 1024 };

void accel__cpu_binary_f32_lowp(accel__binop op, const float *f, const void *lo, accel_dtype lo_dt, bool lo_first,
                                float *out, int64_t n) {
    int64_t nb = (n + LOWP_BLOCK - 1) / LOWP_BLOCK;
    size_t es = accel_dtype_size(lo_dt);
#pragma omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * LOWP_BLOCK, m = s + LOWP_BLOCK < n ? LOWP_BLOCK : n - s;
        float w[LOWP_BLOCK];
        accel__cpu_to_f32(w, (const char *)lo + (size_t)s * es, lo_dt, m);
        if (lo_first) binary_row(op, w, 1, f + s, 1, out + s, m);
        else binary_row(op, f + s, 1, w, 1, out + s, m);
    }
}

/* Integer arithmetic wraps as in PyTorch (two's complement), without signed-overflow UB. */
static int64_t int_op(accel__binop op, int64_t x, int64_t y) {
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case ACCEL_B_ADD: return (int64_t)(ux + uy);
    case ACCEL_B_SUB: return (int64_t)(ux - uy);
    case ACCEL_B_MUL: return (int64_t)(ux * uy);
    case ACCEL_B_DIV: return y ? x / y : 0; /* not reached: integer div returns float */
    }
    return 0;
}

static float float_op(accel__binop op, float x, float y) {
    switch (op) {
    case ACCEL_B_ADD: return x + y;
    case ACCEL_B_SUB: return x - y;
    case ACCEL_B_MUL: return x * y;
    case ACCEL_B_DIV: return x / y;
    }
    return 0.0f;
}

void accel__cpu_binary_ref(accel__binop op, accel_tensor *out, const accel_tensor *a,
                           const accel_tensor *b) {
    int nd = out->ndim;
    int64_t sa[ACCEL_MAX_DIMS], sb[ACCEL_MAX_DIMS], n = accel_numel(out);
    accel__broadcast_strides(a, nd, out->shape, sa);
    accel__broadcast_strides(b, nd, out->shape, sb);
    bool is_float = accel_dtype_is_float(out->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t oa = accel__bcast_offset(nd, out->shape, sa, i), ob = accel__bcast_offset(nd, out->shape, sb, i);
        if (is_float) {
            float x = (float)accel__load_elem(a->data, a->dtype, (size_t)oa);
            float y = (float)accel__load_elem(b->data, b->dtype, (size_t)ob);
            accel__store_elem(out->data, out->dtype, (size_t)i, float_op(op, x, y));
        } else {
            accel__store_i64(out->data, out->dtype, i,
                      int_op(op, accel__load_i64(a->data, a->dtype, oa), accel__load_i64(b->data, b->dtype, ob)));
        }
    }
}

/* ---- unary */

/* SiLU (the Llama MLP's activation) with the vectorised exp: libm's scalar
 * expf made it ~5% of a training step. Same formulas as accel__unary_f/_df. */
ACCEL__VEC_MATH static void silu_f32(const float *x, float *y, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * (1.0f / (1.0f + accel__expf(-x[i])));
}

ACCEL__VEC_MATH static void silu_grad_f32(const float *g, const float *x, float *dx, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + accel__expf(-x[i]));
        dx[i] = g[i] * (s * (1.0f + x[i] * (1.0f - s)));
    }
}

/* tanh (Gemma2's soft-capping) and GELU-tanh (Gemma's and GPT-2's MLPs)
 * with the vectorised tanh (vec_math.h): libm's scalar tanhf made Gemma2
 * cost ~1.15x Gemma per decoded token. */
ACCEL__VEC_MATH static void tanh_f32(const float *x, float *y, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = accel__tanhf(x[i]);
}

ACCEL__VEC_MATH static void gelu_tanh_f32(const float *x, float *y, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = ACCEL__GELU_TANH_OF(x[i], accel__tanhf(ACCEL__GELU_TANH_ARG(x[i])));
}

ACCEL__VEC_MATH static void gelu_tanh_grad_f32(const float *g, const float *x, float *dx, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++)
        dx[i] = g[i] * ACCEL__GELU_TANH_GRAD_OF(x[i], accel__tanhf(ACCEL__GELU_TANH_ARG(x[i])));
}

/* ReLU and its gradient, the expressions of accel__unary_f / _df (the same
 * bits) as selects the compiler vectorises: in the generic loops below
 * they were scalar compares and a branch per element, mispredicted on
 * activations of either sign (the gradient alone was 23% of the small
 * ResNet step's samples, bench/bench_conv.c). */
static void relu_f32(const float *x, float *y, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = !(x[i] <= 0.0f) ? x[i] : 0.0f;
}

static void relu_grad_f32(const float *g, const float *x, float *dx, int64_t n) {
#pragma omp parallel for simd if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] = g[i] * (!(x[i] <= 0.0f) ? 1.0f : 0.0f);
}

#define UN_CASE(OP)                                                   \
    case OP:                                                          \
        _Pragma("omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)") \
        for (int64_t i = 0; i < n; i++) y[i] = accel__unary_f(OP, x[i], pf); \
        break

void accel__cpu_unary_f32(accel__unop op, double p, const float *x, float *y, int64_t n) {
    float pf = (float)p;
    switch (op) {
        UN_CASE(ACCEL_U_ADD_SCALAR); UN_CASE(ACCEL_U_MUL_SCALAR); UN_CASE(ACCEL_U_POW);
        UN_CASE(ACCEL_U_NEG); UN_CASE(ACCEL_U_EXP); UN_CASE(ACCEL_U_LOG); UN_CASE(ACCEL_U_SQRT);
        UN_CASE(ACCEL_U_RSQRT); UN_CASE(ACCEL_U_SIGMOID); UN_CASE(ACCEL_U_GELU);
    case ACCEL_U_RELU: relu_f32(x, y, n); break;
    case ACCEL_U_TANH: tanh_f32(x, y, n); break;
    case ACCEL_U_SILU: silu_f32(x, y, n); break;
    case ACCEL_U_GELU_TANH: gelu_tanh_f32(x, y, n); break;
    }
}

#define UNG_CASE(OP)                                                  \
    case OP:                                                          \
        _Pragma("omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)") \
        for (int64_t i = 0; i < n; i++) dx[i] = g[i] * accel__unary_df(OP, x[i], y[i], pf); \
        break

void accel__cpu_unary_grad_f32(accel__unop op, double p, const float *g, const float *x,
                               const float *y, float *dx, int64_t n) {
    float pf = (float)p;
    switch (op) {
        UNG_CASE(ACCEL_U_ADD_SCALAR); UNG_CASE(ACCEL_U_MUL_SCALAR); UNG_CASE(ACCEL_U_POW);
        UNG_CASE(ACCEL_U_NEG); UNG_CASE(ACCEL_U_EXP); UNG_CASE(ACCEL_U_LOG); UNG_CASE(ACCEL_U_SQRT);
        UNG_CASE(ACCEL_U_RSQRT); UNG_CASE(ACCEL_U_TANH); UNG_CASE(ACCEL_U_SIGMOID);
        UNG_CASE(ACCEL_U_GELU);
    case ACCEL_U_RELU: relu_grad_f32(g, x, dx, n); break;
    case ACCEL_U_SILU: silu_grad_f32(g, x, dx, n); break;
    case ACCEL_U_GELU_TANH: gelu_tanh_grad_f32(g, x, dx, n); break;
    }
}

static float load_f(const accel_tensor *t, int64_t i) {
    return (float)accel__load_elem(accel__elem_ptr(t, i), t->dtype, 0);
}

void accel__cpu_unary_ref(accel__unop op, double p, accel_tensor *y, const accel_tensor *x) {
    int64_t n = accel_numel(x);
    for (int64_t i = 0; i < n; i++)
        accel__store_elem(y->data, y->dtype, (size_t)i, accel__unary_f(op, load_f(x, i), (float)p));
}

void accel__cpu_unary_grad_ref(accel__unop op, double p, accel_tensor *dx, const accel_tensor *g,
                               const accel_tensor *x, const accel_tensor *y) {
    int64_t n = accel_numel(x);
    for (int64_t i = 0; i < n; i++) {
        float d = accel__unary_df(op, load_f(x, i), load_f(y, i), (float)p);
        accel__store_elem(dx->data, dx->dtype, (size_t)i, load_f(g, i) * d);
    }
}
