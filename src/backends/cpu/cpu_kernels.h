/* CPU kernels of the pointwise, reduction and copy ops (not public API).
 *
 * Every kernel writes a contiguous output. The fast paths work on f32 with
 * per-row loops (the op is chosen by a switch once per row, never per
 * element); the reference paths (accel_reference_kernels()) walk elements one
 * by one through generic strided loads, in any dtype, so tests can compare.
 */
#ifndef ACCEL_CPU_KERNELS_H
#define ACCEL_CPU_KERNELS_H

#include <math.h>

#include "core/kernels.h"
#include "core/core_internal.h"
#include "core/dtype_elem.h"

/* The CPU kernels of the table (core/kernels.h), one per entry:
 * accel_status accel__cpuk_<name>(accel_k_<...> *args). Each one's plain
 * reference version sits beside its fast one in the same file, selected by
 * accel_reference_kernels(). */
#define ACCEL__CPU_KERNEL_DECL(name, T) accel_status accel__cpuk_##name(T *args);
ACCEL_KERNELS(ACCEL__CPU_KERNEL_DECL)
#undef ACCEL__CPU_KERNEL_DECL

/* The machine's RAM (the CPU backend's mem_info). */
accel_status accel__cpu_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Whether the reference kernels are selected on this thread: accel_reference_kernels() of core.h. */

/* Sizes above which a kernel uses OpenMP threads. */
#define ACCEL_CPU_PAR_THRESHOLD 32768

/* ---- strided layouts */

/* A tensor's layout seen through an output shape: broadcast dims have stride 0,
 * adjacent dims that are contiguous with each other in every operand merged. */
typedef struct accel__layout {
    int ndim;                         /* >= 1 */
    int64_t shape[ACCEL_MAX_DIMS];
    int64_t stride[3][ACCEL_MAX_DIMS]; /* per operand, in elements */
} accel__layout;

/* Builds the layout of n_ops operands (strides in `strides[k]`, already aligned
 * to the output's ndim/shape, 0 on broadcast dims) and merges dims. */
void accel__layout_init(accel__layout *l, int ndim, const int64_t *shape, int n_ops,
                        const int64_t *const *strides);
/* Strides of t aligned to an output of ndim dims and shape (0 where t is
 * broadcast or missing). */
void accel__broadcast_strides(const accel_tensor *t, int ndim, const int64_t *shape,
                              int64_t *stride);
/* Offsets (elements) of operand k at the start of row r (rows = all dims but the last). */
int64_t accel__layout_row_offset(const accel__layout *l, int k, int64_t r);
int64_t accel__layout_rows(const accel__layout *l);

/* Element access of the reference loops: core/dtype_elem.h (accel__load_i64
 * and accel__store_i64 keep integers exact). */
/* Row-major element i of an output of shape (ndim, shape) -> offset in an
 * operand with broadcast strides. */
static inline int64_t accel__bcast_offset(int ndim, const int64_t *shape, const int64_t *stride, int64_t i) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    return off;
}

/* dst = src: same dtype and shape, any strides on both sides. */
void accel__cpu_copy(accel_tensor *dst, const accel_tensor *src);
/* n bytes at p set to zero with stores that bypass the caches (stream_zero.c). */
void accel__cpu_zero_streamed(void *p, size_t n);
/* Copies src (any strides, any dtype) into the contiguous buffer dst of the
 * same dtype. */
void accel__cpu_copy_strided(void *dst, const accel_tensor *src);

/* ---- pointwise */

/* out (contiguous f32, shape of the layout) = a op b, with a and b f32 at the
 * layout's strides (operands 0 and 1). */
void accel__cpu_binary_f32(accel__binop op, const accel__layout *l, const float *a, const float *b,
                           float *out);
/* out[0..n) = a op b on dense operands of n elements, one f32 (f) and one
 * bf16/f16 (lo, dtype lo_dt; the first operand when lo_first): lo widened a
 * block at a time on the stack instead of into an f32 copy of it (the
 * residual adds of an autocast step: the f32 stream plus a bf16 branch). The
 * values of accel__cpu_binary_f32 on the widened operand, bit for bit. */
void accel__cpu_binary_f32_lowp(accel__binop op, const float *f, const void *lo, accel_dtype lo_dt, bool lo_first,
                                float *out, int64_t n);
/* Reference: element by element; out of any dtype, a/b any dtype and strides
 * (broadcast). Float outputs are computed in f32, integer outputs in int64. */
void accel__cpu_binary_ref(accel__binop op, accel_tensor *out, const accel_tensor *a,
                           const accel_tensor *b);

/* y[i] = f(x[i]) on contiguous f32 (p: the scalar of *_scalar / pow). */
void accel__cpu_unary_f32(accel__unop op, double p, const float *x, float *y, int64_t n);
/* dx[i] = g[i] * f'(x[i]) (y = f(x) given too), contiguous f32. */
void accel__cpu_unary_grad_f32(accel__unop op, double p, const float *g, const float *x,
                               const float *y, float *dx, int64_t n);
/* Reference versions: any strides and float dtypes; outputs contiguous. */
void accel__cpu_unary_ref(accel__unop op, double p, accel_tensor *y, const accel_tensor *x);
void accel__cpu_unary_grad_ref(accel__unop op, double p, accel_tensor *dx, const accel_tensor *g,
                               const accel_tensor *x, const accel_tensor *y);

/* ---- bf16 directly (fused_kernels.c) */

/* dst (f32) = the n values of src (dtype dt), contiguous, one thread. */
void accel__cpu_to_f32(float *dst, const void *src, accel_dtype dt, int64_t n);
/* dst (dtype dt) = src (f32) rounded to nearest even, contiguous, one thread. */
void accel__cpu_from_f32(void *dst, accel_dtype dt, const float *src, int64_t n);
/* dst (dtype dt) = s src (f32 products) rounded to nearest even: the bits
 * of the products stored as f32 and then given to accel__cpu_from_f32. */
void accel__cpu_from_f32_scaled(void *dst, accel_dtype dt, const float *src, float s, int64_t n);
/* accel__cpu_to_f32 of `rows` rows of n elements, `stride` elements apart
 * in src, into dense f32 rows of n at dst (one run where stride is n); the
 * rows read ahead (prefetched) where they are apart. One thread. */
void accel__cpu_to_f32_rows(float *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride);
/* The same rows copied as they are (dt's elements) into dense rows of n. */
void accel__cpu_copy_rows(void *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride);
/* accel__cpu_from_f32 of dense f32 rows of n at src into `rows` rows of dt,
 * `stride` elements apart, at dst. One thread. */
void accel__cpu_from_f32_rows(void *dst, accel_dtype dt, const float *src, int64_t rows, int64_t n, int64_t stride);
/* ---- which convolution runs (conv_kernels.c; docs/cpu.md "Convolutions") */

/* ACCEL_CONV's values: auto | im2col | dnnl. */
typedef enum accel__conv_mode { ACCEL__CONV_AUTO, ACCEL__CONV_IM2COL, ACCEL__CONV_DNNL } accel__conv_mode;
/* Sets the mode for the process (overriding ACCEL_CONV; tests run both
 * paths in one process with it). */
accel_status accel__cpu_conv_set_mode(accel__conv_mode mode);
/* How many convolution forwards and backwards (the latter one call for dX
 * and dW) oneDNN has run in this process, and how many it declined (it has
 * only its reference loop for them: im2col ran instead). Tests tell from
 * them which path ran. */
int64_t accel__cpu_conv_direct_calls(void);
int64_t accel__cpu_conv_direct_declined(void);
/* "Conv: <what accel_conv2d runs>\n" (ACCEL_CONV, the oneDNN plug-in) into
 * buf (truncated to size); returns buf. */
const char *accel__cpu_conv_describe(char *buf, size_t size);

/* accel_convert with vectorised bf16 <-> f32 (OpenMP threads when large). */
void accel__cpu_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, int64_t n);
/* C[M, n] = alpha A[M, K] W[n, K]^T + beta C for a few rows M (decode): A
 * f32 rows of lda, W bf16 rows of ldw read as stored (never an f32 copy),
 * f32 accumulation; beta 0 ignores what C holds. One thread. */
void accel__cpu_gemm_bf16w_nt(int64_t M, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                              const uint16_t *W, int64_t ldw, float beta, float *C, int64_t ldc);
/* The coefficients of one Adam / AdamW step (optim_kernels.c computes them
 * from accel_k_adam as PyTorch does): p = p * decay - step_size * m /
 * (sqrt(v) / bc2_sqrt + eps) after m += w1 (g' - m), v = v b2 + w2 g'^2,
 * g' = g + l2 p. decay is 1 - lr wd for AdamW (l2 0), l2 is wd for Adam
 * (decay 1). */
typedef struct accel__adam_coef {
    float step_size, bc2_sqrt, w1, b2, w2, eps, decay, l2;
} accel__adam_coef;
/* The update of n contiguous parameters and their moments (optim_update.c,
 * per ISA variant; OpenMP threads when large); cast (NULL: none) receives the
 * new p rounded to cast_dt, stored as cast_store (cast_dt, or f32 widened
 * back): kernels.h's accel_k_adam. */
void accel__cpu_adam_update(const accel__adam_coef *c, float *p, float *m, float *v, const float *g, int64_t n,
                            void *cast, accel_dtype cast_store, accel_dtype cast_dt);
/* RMSNorm's row loops (norm_rows.c, per ISA variant, the same bits on
 * every one), one thread each. A row x [D] (f32; xdt the dtype the input
 * had, whose rounding of x * rstd is kept): y = w * round(x * rstd) (w NULL:
 * no weight) with *rstd = 1 / sqrt(mean(x^2) + eps); dx (+)= s (g w - x s
 * mean(g w x s)) (beta 0: =, else +=; w NULL: g alone); dw[0, n) += g *
 * round(x * s) over n columns of one row. */
void accel__cpu_rms_norm_row(const float *x, const float *w, float *y, float *rstd, int64_t D, float eps,
                             accel_dtype xdt);
void accel__cpu_rms_norm_dx_row(const float *x, const float *g, const float *w, float s, float *dx, float beta,
                                int64_t D);
void accel__cpu_rms_norm_dw_row(const float *x, const float *g, float s, float *dw, int64_t n, accel_dtype xdt);
/* The fast paths of the swiglu kernels (core/kernels.h): contiguous
 * operands of f32, bf16 or f16 each. */
void accel__cpu_swiglu(const accel_k_swiglu *k);
void accel__cpu_swiglu_backward(const accel_k_swiglu_backward *k);
/* The fast path of the rope kernel: x and y f32, bf16 or f16, the last dim
 * of x contiguous (core/kernels.h). */
void accel__cpu_rope(const accel_k_rope *k);
/* The rows of cross_entropy_fused given the count of counted targets (all
 * targets already checked), on nt threads with C floats of scratch each;
 * *total = the sum of the counted rows' losses. */
void accel__cpu_cross_entropy_fused(const accel_k_cross_entropy_fused *k, int64_t count, int nt, float *scratch,
                                    double *total);

/* ---- reductions */

/* out[o] = scale * sum of x over the reduced dims (mask bit d set = dim d
 * reduced); out is contiguous f32 with the kept dims in order. x f32 any strides. */
void accel__cpu_sum_f32(const accel_tensor *x, unsigned mask, double scale, float *out);
/* Reference: any float dtype in and out. */
void accel__cpu_sum_ref(const accel_tensor *x, unsigned mask, double scale, accel_tensor *out);
/* Max over dim d: values (dtype of out) and first index of the max (NaN wins). */
void accel__cpu_max(const accel_tensor *x, int d, accel_tensor *values, int64_t *indices);

/* ---- vectorised row math (cross-entropy) */

/* max of x[0..n) (-inf when n == 0; NaNs are not propagated). */
float accel__row_max(const float *x, int64_t n);
/* sum of exp(x[j] - m), j < n. */
float accel__row_sum_exp(const float *x, int64_t n, float m);

/* ---- attention (attention_kernels.c) */

/* The provider attention's six tile GEMMs run on for these dims when q, k,
 * v (and dO) are all of dt (accel__gemm_tiles_provider, gemm.h: openblas,
 * dnnl or dnnl_f32; the class measured at its first use), openblas for
 * ragged blocks (Tq or Tk no multiple of 64); -1 with the error set (a bad
 * ACCEL_GEMM). Outside parallel regions. Tests derive from it which path
 * ran and which bounds hold. */
int accel__cpu_sdpa_provider(accel_dtype dt, const accel_k_sdpa_dims *d);
/* Whether that is the native path: dt bf16/f16 on oneDNN in dt, the GEMMs
 * reading q, k, v and dO as stored and taking P and dS rounded to dt. */
bool accel__cpu_sdpa_native(accel_dtype dt, const accel_k_sdpa_dims *d);
/* The class of a Tk x D attention of dt timed again (`accel env
 * --measure-gemm`); returns the provider kept, or -1. */
int accel__cpu_sdpa_measure(accel_dtype dt, int64_t Tk, int64_t D);
/* A block of attention's score rows (one query block's), for the row
 * kernels below, compiled per ISA variant (attention_rows.c): `rows` rows
 * of kend columns; row r sees its first min(kend, max(0, n0 + r)) keys
 * under the causal mask (`causal`), all kend otherwise (n0 unused), less
 * its first k0 (a padded row's masked keys) and, with starts (rows of
 * them; NULL: none), its first starts[r] (the keys before a packed
 * sequence's first token): a row whose keys all lie below those sees none;
 * the scores are multiplied by scale > 0. Each row is computed over its keys
 * rounded up to 16 (the masked scores among them set to -inf in the score
 * rows), and its columns past those are zeros. With lp each finished row is
 * also rounded to dt (bf16 or f16) into lp, chunk-major: chunk j holds keys
 * [j, j + c), c = min(chunk, kend - j), as a dense [rows, c] matrix at
 * element rows j (the layout the tile GEMMs read). */
typedef struct accel__score_block {
    int64_t rows, kend, n0, k0;
    const int32_t *starts;
    bool causal;
    float scale;
    void *lp;
    accel_dtype dt;
    int64_t chunk;
} accel__score_block;
/* p (rows ldp apart) = softmax(scale s) over each row's keys (s: rows lds
 * apart; p may be s), lse[r] the row's log-sum-exp (-inf and a row of zeros
 * for a row that sees no key). With b->lp, p keeps the exponentials and lp
 * gets them normalised as they are rounded (the bits of rounding the
 * normalised row). */
void accel__cpu_softmax_rows(const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds, float *lse);
/* p = exp(scale s - lse[r]): the same probabilities again from the rows'
 * log-sum-exp. */
void accel__cpu_probs_rows(const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds,
                           const float *lse);
/* g = scale p (g - delta[r]) in place (rows ldg apart), delta the row's
 * sum(g p) (attention's: dO . O). */
void accel__cpu_softmax_grad_rows(const accel__score_block *b, const float *p, int64_t ldp, float *g, int64_t ldg,
                                  const float *delta);
/* out[r] = the dot product of row r of a (dtype adt, rows lda apart) and
 * row r of b (bdt, ldb), n elements, for `rows` rows: f32 products in a
 * fixed order of additions, the same bits in every variant (attention's
 * row deltas, dO . O). */
void accel__cpu_dot_rows(float *out, const void *a, accel_dtype adt, int64_t lda, const void *b, accel_dtype bdt,
                         int64_t ldb, int64_t rows, int64_t n);

/* ---- the scalar functions, shared by the fast and reference paths (and the
 * CUDA kernels, which include this header: ACCEL__HD, from core/dtype_elem.h,
 * makes them device functions too) */

#define ACCEL__SQRT1_2 0.70710678118654752440f
#define ACCEL__SQRT_2_PI 0.79788456080286535588f  /* sqrt(2/pi) */
#define ACCEL__INV_SQRT_2PI 0.39894228040143267794f /* 1/sqrt(2*pi) */

ACCEL__HD static inline float accel__sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
ACCEL__HD static inline float accel__geluf(float x) { return 0.5f * x * (1.0f + erff(x * ACCEL__SQRT1_2)); }
ACCEL__HD static inline float accel__gelu_gradf(float x) {
    return 0.5f * (1.0f + erff(x * ACCEL__SQRT1_2)) + x * ACCEL__INV_SQRT_2PI * expf(-0.5f * x * x);
}
/* GELU-tanh around t = tanh(ACCEL__GELU_TANH_ARG(x)): its value and its
 * derivative. Macros, not functions, so that the CPU's vectorised loops
 * (pointwise_kernels.c, with vec_math.h's accel__tanhf) share the formulas:
 * GCC does not inline these functions into loops compiled with
 * ACCEL__VEC_MATH's different options. */
#define ACCEL__GELU_TANH_ARG(x) (ACCEL__SQRT_2_PI * ((x) + 0.044715f * (x) * (x) * (x)))
#define ACCEL__GELU_TANH_OF(x, t) (0.5f * (x) * (1.0f + (t)))
#define ACCEL__GELU_TANH_GRAD_OF(x, t) \
    (0.5f * (1.0f + (t)) + 0.5f * (x) * (1.0f - (t) * (t)) * ACCEL__SQRT_2_PI * (1.0f + 3.0f * 0.044715f * (x) * (x)))

ACCEL__HD static inline float accel__gelu_tanhf(float x) { return ACCEL__GELU_TANH_OF(x, tanhf(ACCEL__GELU_TANH_ARG(x))); }
ACCEL__HD static inline float accel__gelu_tanh_gradf(float x) {
    return ACCEL__GELU_TANH_GRAD_OF(x, tanhf(ACCEL__GELU_TANH_ARG(x)));
}

ACCEL__HD static inline float accel__unary_f(accel__unop op, float x, float p) {
    switch (op) {
    case ACCEL_U_ADD_SCALAR: return x + p;
    case ACCEL_U_MUL_SCALAR: return x * p;
    case ACCEL_U_POW: return powf(x, p);
    case ACCEL_U_NEG: return -x;
    case ACCEL_U_EXP: return expf(x);
    case ACCEL_U_LOG: return logf(x);
    case ACCEL_U_SQRT: return sqrtf(x);
    case ACCEL_U_RSQRT: return 1.0f / sqrtf(x);
    case ACCEL_U_TANH: return tanhf(x);
    case ACCEL_U_SIGMOID: return accel__sigmoidf(x);
    case ACCEL_U_RELU: return !(x <= 0.0f) ? x : 0.0f; /* NaN stays NaN, as torch */
    case ACCEL_U_SILU: return x * accel__sigmoidf(x);
    case ACCEL_U_GELU: return accel__geluf(x);
    case ACCEL_U_GELU_TANH: return accel__gelu_tanhf(x);
    }
    return 0.0f;
}

/* f'(x), given y = f(x). */
ACCEL__HD static inline float accel__unary_df(accel__unop op, float x, float y, float p) {
    switch (op) {
    case ACCEL_U_ADD_SCALAR: return 1.0f;
    case ACCEL_U_MUL_SCALAR: return p;
    case ACCEL_U_POW: return p == 0.0f ? 0.0f : p * powf(x, p - 1.0f);
    case ACCEL_U_NEG: return -1.0f;
    case ACCEL_U_EXP: return y;
    case ACCEL_U_LOG: return 1.0f / x;
    case ACCEL_U_SQRT: return 0.5f / y;
    case ACCEL_U_RSQRT: return -0.5f * y * y * y;
    case ACCEL_U_TANH: return 1.0f - y * y;
    case ACCEL_U_SIGMOID: return y * (1.0f - y);
    case ACCEL_U_RELU: return !(x <= 0.0f) ? 1.0f : 0.0f; /* NaN passes the gradient, as torch */
    case ACCEL_U_SILU: {
        float s = accel__sigmoidf(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case ACCEL_U_GELU: return accel__gelu_gradf(x);
    case ACCEL_U_GELU_TANH: return accel__gelu_tanh_gradf(x);
    }
    return 0.0f;
}

/* x op y of the metrics comparisons (compare). */
#define ACCEL__CMP_CASES(op, x, y)         \
    switch (op) {                          \
    case ACCEL_C_EQ: return (x) == (y);    \
    case ACCEL_C_NE: return (x) != (y);    \
    case ACCEL_C_LT: return (x) < (y);     \
    case ACCEL_C_LE: return (x) <= (y);    \
    case ACCEL_C_GT: return (x) > (y);     \
    case ACCEL_C_GE: return (x) >= (y);    \
    }                                      \
    return false

ACCEL__HD static inline bool accel__cmp_f(accel__cmpop op, double x, double y) { ACCEL__CMP_CASES(op, x, y); }
ACCEL__HD static inline bool accel__cmp_i(accel__cmpop op, int64_t x, int64_t y) { ACCEL__CMP_CASES(op, x, y); }

#endif
