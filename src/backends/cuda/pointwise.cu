/* Copy, fill, accumulate, the pointwise kernels (binary with broadcasting,
 * unary and its gradient, dropout's mask-scale), the metrics kernels
 * (compare, where) and the bias kernels.
 * Grid-stride loops over the output in row-major order; strided and
 * broadcast operands are indexed through their views. f32 math as the CPU
 * kernels (the scalar functions of cpu_kernels.h are shared). */
#include "backends/cpu/cpu_kernels.h"
#include "cuda_common.cuh"

static bool is_contig(const accel_tensor *t) { return accel_is_contiguous(t); }

/* ---- copy / fill / accumulate */

__global__ void copy_same_k(char *dst, kview dv, const char *src, kview sv, int64_t n, int es) {
    GRID_STRIDE(i, n) {
        const char *s = src + offset_of(sv, i) * es;
        char *d = dst + offset_of(dv, i) * es;
        for (int b = 0; b < es; b++) d[b] = s[b];
    }
}

__global__ void convert_k(void *dst, accel_dtype ddt, kview dv, const void *src, accel_dtype sdt, kview sv,
                          int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(dst, ddt, offset_of(dv, i), accel__elem_get(src, sdt, offset_of(sv, i)));
}

extern "C" accel_status accel__cudak_copy(accel_k_copy *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t es = accel_dtype_size(a->out->dtype);
    if (a->out->dtype == a->in->dtype && is_contig(a->out) && is_contig(a->in))
        return accel__cuda_check(cudaMemcpyAsync(a->out->data, a->in->data, (size_t)n * es, cudaMemcpyDeviceToDevice, s),
                                 index, "copy");
    if (a->out->dtype == a->in->dtype)
        copy_same_k<<<blocks_for(n), KTHREADS, 0, s>>>((char *)a->out->data, view_of(a->out), (const char *)a->in->data,
                                                       view_of(a->in), n, (int)es);
    else
        convert_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, view_of(a->out), a->in->data,
                                                     a->in->dtype, view_of(a->in), n);
    return launched(index, "copy");
}

__global__ void fill_k(void *dst, accel_dtype dt, kview v, int64_t n, double value) {
    GRID_STRIDE(i, n) accel__elem_set(dst, dt, offset_of(v, i), value);
}

extern "C" accel_status accel__cudak_fill(accel_k_fill *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    if (a->value == 0.0 && is_contig(a->out))
        return accel__cuda_check(cudaMemsetAsync(a->out->data, 0, (size_t)n * accel_dtype_size(a->out->dtype), s), index,
                                 "fill");
    fill_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, view_of(a->out), n, a->value);
    return launched(index, "fill");
}

__global__ void accumulate_k(void *dst, accel_dtype ddt, const void *src, accel_dtype sdt, kview sv, int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(dst, ddt, i, accel__elem_get(dst, ddt, i) + accel__elem_get(src, sdt, offset_of(sv, i)));
}

extern "C" accel_status accel__cudak_accumulate(accel_k_accumulate *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    accumulate_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, a->in->data, a->in->dtype,
                                                    view_of(a->in), n);
    return launched(index, "accumulate");
}

/* ---- binary */

__device__ inline float float_op(accel__binop op, float x, float y) {
    switch (op) {
    case ACCEL_B_ADD: return x + y;
    case ACCEL_B_SUB: return x - y;
    case ACCEL_B_MUL: return x * y;
    case ACCEL_B_DIV: return x / y;
    }
    return 0.0f;
}

/* Integer arithmetic wraps (two's complement), as the CPU's. */
__device__ inline int64_t int_op(accel__binop op, int64_t x, int64_t y) {
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case ACCEL_B_ADD: return (int64_t)(ux + uy);
    case ACCEL_B_SUB: return (int64_t)(ux - uy);
    case ACCEL_B_MUL: return (int64_t)(ux * uy);
    case ACCEL_B_DIV: return y ? x / y : 0;
    }
    return 0;
}

__global__ void binary_k(accel__binop op, void *out, accel_dtype odt, const void *a, accel_dtype adt, kview av,
                         const void *b, accel_dtype bdt, kview bv, int64_t n, bool is_float) {
    GRID_STRIDE(i, n) {
        int64_t oa = offset_of(av, i), ob = offset_of(bv, i);
        if (is_float) accel__elem_set(out, odt, i, float_op(op, load_f(a, adt, oa), load_f(b, bdt, ob)));
        else accel__store_i64(out, odt, i, int_op(op, accel__load_i64(a, adt, oa), accel__load_i64(b, bdt, ob)));
    }
}

extern "C" accel_status accel__cudak_binary(accel_k_binary *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    binary_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, o->data, o->dtype, k->a->data, k->a->dtype,
                                                broadcast_view(k->a, o->ndim, o->shape), k->b->data, k->b->dtype,
                                                broadcast_view(k->b, o->ndim, o->shape), n,
                                                accel_dtype_is_float(o->dtype));
    return launched(index, "binary");
}

/* ---- unary */

__global__ void unary_k(accel__unop op, float p, void *y, accel_dtype ydt, const void *x, accel_dtype xdt, kview xv,
                        int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(y, ydt, i, accel__unary_f(op, load_f(x, xdt, offset_of(xv, i)), p));
}

extern "C" accel_status accel__cudak_unary(accel_k_unary *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    unary_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (float)k->p, k->out->data, k->out->dtype, k->x->data,
                                               k->x->dtype, view_of(k->x), n);
    return launched(index, "unary");
}

__global__ void unary_grad_k(accel__unop op, float p, void *dx, accel_dtype dxdt, const void *g, accel_dtype gdt,
                             kview gv, const void *x, accel_dtype xdt, kview xv, const void *y, accel_dtype ydt,
                             kview yv, int64_t n) {
    GRID_STRIDE(i, n) {
        float d = accel__unary_df(op, load_f(x, xdt, offset_of(xv, i)), load_f(y, ydt, offset_of(yv, i)), p);
        accel__elem_set(dx, dxdt, i, load_f(g, gdt, offset_of(gv, i)) * d);
    }
}

extern "C" accel_status accel__cudak_unary_grad(accel_k_unary_grad *k) {
    int index = k->dx->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    unary_grad_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (float)k->p, k->dx->data, k->dx->dtype, k->g->data,
                                                    k->g->dtype, view_of(k->g), k->x->data, k->x->dtype,
                                                    view_of(k->x), k->y->data, k->y->dtype, view_of(k->y), n);
    return launched(index, "unary_grad");
}

__global__ void mask_scale_k(float *out, const float *x, const uint8_t *m, float scale, int64_t n) {
    GRID_STRIDE(i, n) out[i] = m[i] ? x[i] * scale : 0.0f;
}

extern "C" accel_status accel__cudak_mask_scale(accel_k_mask_scale *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    mask_scale_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->x->data,
                                                    (const uint8_t *)k->mask->data, k->scale, n);
    return launched(index, "mask_scale");
}

/* ---- SwiGLU (kernels.h's rules: silu(gate) and g * up rounded to gate's
 * dtype, as the unfused ops round them; each tensor in its own dtype) */

__device__ inline float rounded_to(float v, accel_dtype dt) { return (float)accel__round_to(v, dt); }

/* d[i] (+)= v in d's dtype (beta 0 overwrites, 1 adds). */
__device__ inline void store_beta(void *d, accel_dtype dt, int64_t i, float v, float beta) {
    accel__elem_set(d, dt, i, beta != 0.0f ? load_f(d, dt, i) + v : v);
}

__global__ void swiglu_k(void *out, accel_dtype odt, const void *gate, accel_dtype gdt, const void *up,
                         accel_dtype udt, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = load_f(gate, gdt, i);
        accel__elem_set(out, odt, i, rounded_to(x * accel__sigmoidf(x), gdt) * load_f(up, udt, i));
    }
}

extern "C" accel_status accel__cudak_swiglu(accel_k_swiglu *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    swiglu_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->out->data, k->out->dtype, k->gate->data, k->gate->dtype,
                                                k->up->data, k->up->dtype, n);
    return launched(index, "swiglu");
}

/* dgate, dup optional (NULL: not computed); their dtypes are read only when present. */
__global__ void swiglu_backward_k(void *dgate, accel_dtype dgdt, float dgate_beta, void *dup, accel_dtype dudt,
                                  float dup_beta, const void *g, accel_dtype gdt, const void *gate,
                                  accel_dtype xdt, const void *up, accel_dtype udt, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = load_f(gate, xdt, i), gi = load_f(g, gdt, i), s = accel__sigmoidf(x);
        if (dgate)
            store_beta(dgate, dgdt, i, rounded_to(gi * load_f(up, udt, i), xdt) * (s * (1.0f + x * (1.0f - s))),
                       dgate_beta);
        if (dup) store_beta(dup, dudt, i, gi * rounded_to(x * s, xdt), dup_beta);
    }
}

extern "C" accel_status accel__cudak_swiglu_backward(accel_k_swiglu_backward *k) {
    int index = k->gate->device.index;
    int64_t n = accel_numel(k->gate);
    if (!n || (!k->dgate && !k->dup)) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *dg = k->dgate, *du = k->dup;
    swiglu_backward_k<<<blocks_for(n), KTHREADS, 0, s>>>(
        dg ? dg->data : NULL, dg ? dg->dtype : ACCEL_F32, k->dgate_beta, du ? du->data : NULL,
        du ? du->dtype : ACCEL_F32, k->dup_beta, k->g->data, k->g->dtype, k->gate->data, k->gate->dtype,
        k->up->data, k->up->dtype, n);
    return launched(index, "swiglu_backward");
}

/* ---- metrics: compare and where (the CPU's rules: core/dtype_elem.h's
 * accel__round_to and cpu_kernels.h's accel__cmp_f/i) */

__global__ void compare_k(accel__cmpop op, uint8_t *out, const void *a, accel_dtype adt, kview av, const void *b,
                          accel_dtype bdt, kview bv, int64_t n, bool is_float, accel_dtype dt, double sf, int64_t si) {
    GRID_STRIDE(i, n) {
        int64_t oa = offset_of(av, i), ob = b ? offset_of(bv, i) : 0;
        bool r;
        if (is_float) {
            double x = accel__round_to(accel__elem_get(a, adt, oa), dt);
            r = accel__cmp_f(op, x, b ? accel__round_to(accel__elem_get(b, bdt, ob), dt) : sf);
        } else {
            r = accel__cmp_i(op, accel__load_i64(a, adt, oa), b ? accel__load_i64(b, bdt, ob) : si);
        }
        out[i] = r;
    }
}

extern "C" accel_status accel__cudak_compare(accel_k_compare *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    bool is_float = accel_dtype_is_float(k->dt);
    kview bv = k->b ? broadcast_view(k->b, o->ndim, o->shape) : kview{};
    compare_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (uint8_t *)o->data, k->a->data, k->a->dtype,
                                                 broadcast_view(k->a, o->ndim, o->shape), k->b ? k->b->data : NULL,
                                                 k->b ? k->b->dtype : ACCEL_F32, bv, n, is_float, k->dt,
                                                 accel__round_to(k->scalar, k->dt),
                                                 is_float ? 0 : (int64_t)k->scalar);
    return launched(index, "compare");
}

__global__ void where_k(void *out, accel_dtype odt, const void *c, accel_dtype cdt, kview cv, const void *a,
                        accel_dtype adt, kview av, const void *b, accel_dtype bdt, kview bv, int64_t n, bool is_float) {
    GRID_STRIDE(i, n) {
        bool pick_a = accel__load_i64(c, cdt, offset_of(cv, i)) != 0;
        const void *src = pick_a ? a : b;
        accel_dtype sdt = pick_a ? adt : bdt;
        int64_t off = offset_of(pick_a ? av : bv, i);
        if (is_float) accel__elem_set(out, odt, i, accel__elem_get(src, sdt, off));
        else accel__store_i64(out, odt, i, accel__load_i64(src, sdt, off));
    }
}

extern "C" accel_status accel__cudak_where(accel_k_where *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    where_k<<<blocks_for(n), KTHREADS, 0, s>>>(o->data, o->dtype, k->cond->data, k->cond->dtype,
                                               broadcast_view(k->cond, o->ndim, o->shape), k->a->data, k->a->dtype,
                                               broadcast_view(k->a, o->ndim, o->shape), k->b->data, k->b->dtype,
                                               broadcast_view(k->b, o->ndim, o->shape), n,
                                               accel_dtype_is_float(o->dtype));
    return launched(index, "where");
}

/* ---- bias */

__global__ void bias_rows_k(float *out, const float *bias, int64_t R, int64_t O) {
    GRID_STRIDE(i, R * O) out[i] = bias[i % O];
}

extern "C" accel_status accel__cudak_bias_rows(accel_k_bias_rows *k) {
    int index = k->out->device.index;
    if (!k->R || !k->O) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    bias_rows_k<<<blocks_for(k->R * k->O), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->bias->data,
                                                             k->R, k->O);
    return launched(index, "bias_rows");
}

/* One thread per column, walking the rows: coalesced across the warp. */
__global__ void col_sum_k(float *out, const float *g, int64_t R, int64_t O, float beta) {
    GRID_STRIDE(j, O) {
        float acc = 0.0f;
        for (int64_t r = 0; r < R; r++) acc += g[r * O + j];
        out[j] = (beta == 0.0f ? 0.0f : beta * out[j]) + acc;
    }
}

extern "C" accel_status accel__cudak_col_sum(accel_k_col_sum *k) {
    int index = k->out->device.index;
    if (!k->O) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    col_sum_k<<<blocks_for(k->O), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->g->data, k->R, k->O,
                                                    k->beta);
    return launched(index, "col_sum");
}

/* C[M, N] (leading dim ldc) = beta C (+ bias[N] in every row): a GEMM with K = 0. */
__global__ void scale_rows_k(float *c, int64_t M, int64_t N, int64_t ldc, float beta, const float *bias) {
    GRID_STRIDE(i, M * N) {
        float *p = c + (i / N) * ldc + i % N;
        float v = beta == 0.0f ? 0.0f : beta * *p;
        *p = bias ? v + bias[i % N] : v;
    }
}

extern "C" accel_status accel__cuda_scale_rows(int index, float *c, int64_t M, int64_t N, int64_t ldc, float beta,
                                               const float *bias) {
    cudaStream_t s = accel__cuda_enter(index);
    scale_rows_k<<<blocks_for(M * N), KTHREADS, 0, s>>>(c, M, N, ldc, beta, bias);
    return launched(index, "gemm");
}
