/* The kernel table: one typed entry per kernel the ops need (internal).
 *
 * Every kernel takes one pointer to its argument struct and returns an
 * accel_status. Every argument struct starts with the tensors the kernel
 * reads or writes, as a union of an array `t[]` and named members:
 *
 *     typedef struct accel_k_fill {
 *         ACCEL_KERNEL_TENSORS(1, *out);
 *         double value;
 *     } accel_k_fill;
 *
 * The tensors are host headers (dtype, shape, strides in elements) whose
 * `data` is a device pointer of the device the kernel runs on. Because the
 * tensors always come first in one array, a backend can rewrite every
 * tensor of any kernel with one mechanism (the hostless test backend
 * translates its pointers this way and then calls the CPU kernels); the
 * kernel list below (ACCEL_KERNELS) generates the table and such wrappers.
 * Entries of t[] may be NULL where a kernel documents an optional tensor.
 *
 * Conventions: outputs come first; an output is written whole (its old
 * contents are ignored) unless the kernel says it accumulates; inputs are
 * not written. Unless a kernel says otherwise, any dtype and any strides are
 * accepted; a kernel that needs contiguous or f32 operands says so, and the
 * op prepares them. A kernel never allocates tensors; scratch memory is its
 * backend's business.
 */
#ifndef ACCEL_BACKENDS_KERNELS_H
#define ACCEL_BACKENDS_KERNELS_H

#include "accel/core.h"

/* The leading tensors of an argument struct: ACCEL_KERNEL_TENSORS(2, *out, *in)
 * declares `accel_tensor *t[2]` overlaid with `accel_tensor *out, *in`. */
#define ACCEL_KERNEL_TENSORS(n, ...) \
    union { accel_tensor *t[n]; struct { accel_tensor __VA_ARGS__; }; }
/* The number of tensors of kernel args struct T (its t[] array). */
#define ACCEL_KERNEL_NTENSORS(T) ((int)(sizeof(((T *)0)->t) / sizeof(accel_tensor *)))
/* The most tensors any kernel takes. */
#define ACCEL_KERNEL_MAX_TENSORS 9

/* ---------------------------------------------------------------- memory-like */

/* out = in, same shape; any dtypes (converted, round-to-nearest-even) and strides. */
typedef struct accel_k_copy {
    ACCEL_KERNEL_TENSORS(2, *out, *in);
} accel_k_copy;

/* out[...] = value (converted to out's dtype), any strides. */
typedef struct accel_k_fill {
    ACCEL_KERNEL_TENSORS(1, *out);
    double value;
} accel_k_fill;

/* out += in (same shape; any float dtypes; in any strides; out contiguous, or
 * on the CPU at any strides: a gradient made in its tensor's layout, the
 * place of a slice in its input's gradient). */
typedef struct accel_k_accumulate {
    ACCEL_KERNEL_TENSORS(2, *out, *in);
} accel_k_accumulate;

/* ---------------------------------------------------------------- random */

typedef enum accel_k_rng_kind { ACCEL_K_RNG_NORMAL, ACCEL_K_RNG_UNIFORM, ACCEL_K_RNG_BERNOULLI } accel_k_rng_kind;

/* Philox-4x32-10 draws: element i (row-major) comes from counter offset + i
 * under key seed, so every device gives the same numbers.
 *   NORMAL:    out (float, contiguous) = a + b * z (Box-Muller)
 *   UNIFORM:   out (float, contiguous) = a + (b - a) * u, u in [0, 1)
 *   BERNOULLI: out (u8/bool, contiguous) = u < a */
typedef struct accel_k_rng {
    ACCEL_KERNEL_TENSORS(1, *out);
    accel_k_rng_kind kind;
    uint64_t seed, offset;
    double a, b;
} accel_k_rng;

/* ---------------------------------------------------------------- pointwise */

typedef enum accel__binop { ACCEL_B_ADD, ACCEL_B_SUB, ACCEL_B_MUL, ACCEL_B_DIV } accel__binop;

typedef enum accel__unop {
    ACCEL_U_ADD_SCALAR, ACCEL_U_MUL_SCALAR, ACCEL_U_POW, ACCEL_U_NEG, ACCEL_U_EXP, ACCEL_U_LOG,
    ACCEL_U_SQRT, ACCEL_U_RSQRT, ACCEL_U_TANH, ACCEL_U_SIGMOID, ACCEL_U_RELU, ACCEL_U_SILU,
    ACCEL_U_GELU, ACCEL_U_GELU_TANH,
} accel__unop;

/* out (contiguous) = a op b, a and b broadcast to out's shape (any strides).
 * Fast path: all f32, and on the CPU also f32 with one bf16/f16 operand
 * (accel__binary_lowp_operand). Other dtypes: float outputs computed in f32,
 * integer outputs in int64. */
typedef struct accel_k_binary {
    ACCEL_KERNEL_TENSORS(3, *out, *a, *b);
    accel__binop op;
} accel_k_binary;

/* Which operand of an f32 binary op the CPU's fast path reads as bf16/f16
 * itself (0: a, 1: b), widening it a block at a time instead of the op
 * making an f32 copy of it first: out f32, that operand bf16 or f16 and the
 * other f32, all three contiguous and of out's shape (no broadcast); -1 when
 * the op must hand the kernel f32 operands. */
static inline int accel__binary_lowp_operand(const accel_tensor *out, const accel_tensor *a, const accel_tensor *b) {
    if (out->dtype != ACCEL_F32 || !accel_same_shape(out, a) || !accel_same_shape(out, b) ||
        !accel_is_contiguous(out) || !accel_is_contiguous(a) || !accel_is_contiguous(b))
        return -1;
    bool a_lo = a->dtype == ACCEL_BF16 || a->dtype == ACCEL_F16, b_lo = b->dtype == ACCEL_BF16 || b->dtype == ACCEL_F16;
    return a_lo && b->dtype == ACCEL_F32 ? 0 : b_lo && a->dtype == ACCEL_F32 ? 1 : -1;
}

/* out (contiguous) = f(x) elementwise, p the scalar of *_SCALAR / POW. Fast
 * path: x contiguous f32 and out f32; otherwise any float dtypes/strides.
 * out may be x (in place). */
typedef struct accel_k_unary {
    ACCEL_KERNEL_TENSORS(2, *out, *x);
    accel__unop op;
    double p;
} accel_k_unary;

/* dx (contiguous f32) = g * f'(x), y = f(x) given too. Fast path: g, x, y
 * contiguous f32; otherwise any float dtypes/strides. */
typedef struct accel_k_unary_grad {
    ACCEL_KERNEL_TENSORS(4, *dx, *g, *x, *y);
    accel__unop op;
    double p;
} accel_k_unary_grad;

/* SwiGLU, the Llama MLP's activation in one pass: out = silu(gate) * up
 * (same shapes, all contiguous; each f32, bf16 or f16, read and written in
 * its own dtype: the fast path converts bf16 in registers and computes in
 * f32). silu(gate) is rounded to gate's dtype before the product, as the
 * unfused silu then mul round it. */
typedef struct accel_k_swiglu {
    ACCEL_KERNEL_TENSORS(3, *out, *gate, *up);
} accel_k_swiglu;

/* The SwiGLU backward from g = d out: dgate (+)= g * up * silu'(gate) and
 * dup (+)= g * silu(gate) (each optional; beta 0 overwrites, 1 adds), all
 * contiguous, dtypes as the forward. g * up and silu(gate) are rounded to
 * gate's dtype first, as the unfused backwards of mul and silu round them. */
typedef struct accel_k_swiglu_backward {
    ACCEL_KERNEL_TENSORS(5, *dgate, *dup, *g, *gate, *up);
    float dgate_beta, dup_beta;
} accel_k_swiglu_backward;

/* out = x * mask * scale (mask u8, all contiguous; x and out f32): dropout
 * forward and backward. */
typedef struct accel_k_mask_scale {
    ACCEL_KERNEL_TENSORS(3, *out, *x, *mask);
    float scale;
} accel_k_mask_scale;

/* ---------------------------------------------------------------- metrics */

typedef enum accel__cmpop { ACCEL_C_EQ, ACCEL_C_NE, ACCEL_C_LT, ACCEL_C_LE, ACCEL_C_GT, ACCEL_C_GE } accel__cmpop;

/* out (bool, contiguous) = a op b with a and b broadcast to out's shape (any
 * dtypes and strides). b NULL compares with `scalar` instead. Both sides are
 * first rounded to `dt` (the promoted dtype, as PyTorch compares): integer
 * dt compares as int64, float dt as doubles (NaN: only NE is true). */
typedef struct accel_k_compare {
    ACCEL_KERNEL_TENSORS(3, *out, *a, *b);
    accel__cmpop op;
    accel_dtype dt;
    double scalar;
} accel_k_compare;

/* out (contiguous) = cond ? a : b elementwise, cond (bool/u8, nonzero is
 * true), a and b broadcast to out's shape (any dtypes and strides; values
 * converted to out's dtype). */
typedef struct accel_k_where {
    ACCEL_KERNEL_TENSORS(4, *out, *cond, *a, *b);
} accel_k_where;

/* ---------------------------------------------------------------- reductions */

/* out (contiguous, kept dims in order) = scale * sum of x over the dims whose
 * bit is set in mask. Fast path: x f32 (any strides), out f32. */
typedef struct accel_k_sum {
    ACCEL_KERNEL_TENSORS(2, *out, *x);
    unsigned mask;
    double scale;
} accel_k_sum;

/* values (x's dtype) and indices (i64) of the max over dim of x (first index
 * of the max; NaN wins). Outputs contiguous, x any strides. */
typedef struct accel_k_max {
    ACCEL_KERNEL_TENSORS(3, *values, *indices, *x);
    int dim;
} accel_k_max;

/* gx (contiguous f32, x's shape) = 0 except g at the argmax of each row of dim. */
typedef struct accel_k_max_backward {
    ACCEL_KERNEL_TENSORS(3, *gx, *g, *indices);
    int dim;
} accel_k_max_backward;

/* ---------------------------------------------------------------- matrices */

/* C = alpha op(A) op(B) + beta C (+ bias) on row-major matrices starting at
 * element offsets a_off, b_off, c_off of the tensors' data: op(A) [M, K] (A
 * stored [K, M] when trans_a), op(B) [K, N], C [M, N] with leading dims lda,
 * ldb, ldc. A and B f32/bf16/f16, C f32, or bf16/f16 where the backend's
 * gemm_c16 says (backend.h; the CPU's from any operands, CUDA's from A and B
 * of C's dtype): the f32 result rounded once into it, as converting an f32 C
 * would (the CPU providers' order of roundings is in docs/cpu.md; CUDA's
 * bias in docs/cuda.md); beta 0 overwrites C (NaNs ignored).
 * bias (optional, NULL for none): f32 contiguous [N], added to every row of
 * C, the GEMM's epilogue (a linear's y = x W^T + b in one kernel; each
 * backend's order of the roundings is in its docs page).
 * b_weight: b is a layer's weight (or its autocast copy), read whole by
 * later calls until its storage is written, so the backend may keep it in a
 * layout of its own between calls (the CPU's: oneDNN's, a prepared form of
 * b; backends/cpu/gemm.h). */
typedef struct accel_k_gemm {
    ACCEL_KERNEL_TENSORS(4, *c, *a, *b, *bias);
    bool trans_a, trans_b;
    int64_t M, N, K, lda, ldb, ldc;
    int64_t a_off, b_off, c_off;
    float alpha, beta;
    bool b_weight;
} accel_k_gemm;

/* out [R, O] (f32 contiguous) = bias [O] (f32) in every row. */
typedef struct accel_k_bias_rows {
    ACCEL_KERNEL_TENSORS(2, *out, *bias);
    int64_t R, O;
} accel_k_bias_rows;

/* out [O] = beta * out + column sums of g [R, O] (f32 contiguous). */
typedef struct accel_k_col_sum {
    ACCEL_KERNEL_TENSORS(2, *out, *g);
    int64_t R, O;
    float beta;
} accel_k_col_sum;

/* ---------------------------------------------------------------- nn */

/* y = softmax (or log_softmax) of x over the middle dim of [outer, D, inner]
 * (f32 contiguous). */
typedef struct accel_k_softmax {
    ACCEL_KERNEL_TENSORS(2, *y, *x);
    int64_t outer, D, inner;
    bool log;
} accel_k_softmax;

/* dx (+)= the gradient through softmax given its output y and the gradient g
 * (f32 contiguous [outer, D, inner]); beta 0 overwrites, 1 adds. */
typedef struct accel_k_softmax_backward {
    ACCEL_KERNEL_TENSORS(3, *dx, *g, *y);
    int64_t outer, D, inner;
    bool log;
    float beta;
} accel_k_softmax_backward;

/* cos/sin [T, half] (f32) = scale * cos/sin of angle f32(pos0 + t) * inv_freq[i]
 * (inv_freq [half] f32 contiguous), in f32 as transformers. */
typedef struct accel_k_rope_tables {
    ACCEL_KERNEL_TENSORS(3, *cos, *sin, *inv_freq);
    int64_t T, half, pos0;
    float scale;
} accel_k_rope_tables;

/* y [B, H, T, 2 half] (+)= x [B, H, T, 2 half] rotated by sign * angle
 * (rotate_half layout), computed in f32 from cos/sin [T, half] (f32
 * contiguous); BH = B * H. x and y of any float dtype each (read and written
 * in it, y rounded once); x at any strides (a [B, T, H, D] projection output
 * seen as [B, H, T, D] is read in place: the rotation and the head transpose
 * in one pass), y contiguous, or on the CPU at any strides with its last dim
 * contiguous (the backward writes a transposed view's gradient in the view's
 * own layout: the head transpose undone in the same pass). beta 0
 * overwrites, 1 adds. */
typedef struct accel_k_rope {
    ACCEL_KERNEL_TENSORS(4, *y, *x, *cos, *sin);
    int64_t BH, T, half;
    float sign, beta;
} accel_k_rope;

/* out [n, D] = rows of w [V, D] (contiguous, any dtype) picked by ids (i64
 * contiguous); an id outside [0, V) is an error naming it. */
typedef struct accel_k_embedding {
    ACCEL_KERNEL_TENSORS(3, *out, *w, *ids);
    int64_t n, D, V;
} accel_k_embedding;

/* gw [V, D] += scatter of g [n, D] rows to ids (f32 contiguous; ids repeat),
 * but for the rows of ids equal to pad (nn.Embedding's padding_idx: that row
 * gets no gradient; -1: none). */
typedef struct accel_k_embedding_backward {
    ACCEL_KERNEL_TENSORS(3, *gw, *g, *ids);
    int64_t n, D, pad;
} accel_k_embedding_backward;

/* RMSNorm over rows [R, D] (f32 contiguous; w optional [D]):
 * y = w * round(x * rstd), rstd[r] = 1/sqrt(mean(x^2) + eps), the rounding
 * to x_dt as transformers' LlamaRMSNorm does. y16 (optional, contiguous,
 * bf16 or f16): y rounded to its dtype as a copy rounds, in the same pass
 * (the CPU's kernel; the op asks no other backend for it). */
typedef struct accel_k_rms_norm {
    ACCEL_KERNEL_TENSORS(5, *y, *rstd, *x, *w, *y16);
    int64_t R, D;
    float eps;
    accel_dtype x_dt;
} accel_k_rms_norm;

/* dx (optional; dx_beta 0 overwrites, 1 adds) and dw (optional; accumulated)
 * of RMSNorm. dx16 (optional, with dx; contiguous, bf16 or f16): dx's new
 * values rounded to its dtype as a copy rounds, in the same pass (the CPU's
 * kernel; the op asks no other backend for it). */
typedef struct accel_k_rms_norm_backward {
    ACCEL_KERNEL_TENSORS(7, *dx, *dw, *g, *x, *w, *rstd, *dx16);
    int64_t R, D;
    accel_dtype x_dt;
    float dx_beta;
} accel_k_rms_norm_backward;

/* LayerNorm over rows [R, D] (f32 contiguous; w, b optional [D]). */
typedef struct accel_k_layer_norm {
    ACCEL_KERNEL_TENSORS(6, *y, *mean, *rstd, *x, *w, *b);
    int64_t R, D;
    float eps;
} accel_k_layer_norm;

/* dx (optional, dx_beta), dw and db (optional; accumulated) of LayerNorm. */
typedef struct accel_k_layer_norm_backward {
    ACCEL_KERNEL_TENSORS(8, *dx, *dw, *db, *g, *x, *w, *mean, *rstd);
    int64_t R, D;
    float dx_beta;
} accel_k_layer_norm_backward;

/* BatchNorm over x [N, C, S] (f32 contiguous), per channel c over its N * S
 * values: training: mean[c] and invstd[c] = 1/sqrt(var + eps) of the batch
 * (var biased); running_mean and running_var (optional, f32 contiguous [C])
 * become (1 - momentum) r + momentum * the batch's mean and unbiased var
 * (var * NS / (NS - 1), NS = N * S > 1). Eval: mean = running_mean and
 * invstd = 1/sqrt(running_var + eps) (both required then). Both: y [N, C, S]
 * (f32 contiguous) = (x - mean) invstd w + b (w, b optional f32 [C]). */
/* SyncBatchNorm's local pass: training with y NULL writes mean[c] and m2[c]
 * (f64 [C]: the sum of (x - mean)^2 over the channel) and nothing else; the
 * group's statistics are combined from every rank's, then applied in eval
 * form (running_mean, running_var: the group's mean and biased var). */
typedef struct accel_k_batch_norm {
    ACCEL_KERNEL_TENSORS(9, *y, *mean, *invstd, *x, *w, *b, *running_mean, *running_var, *m2);
    int64_t N, C, S;
    float eps, momentum;
    bool training;
} accel_k_batch_norm;

/* dx (optional; dx_beta 0 overwrites, 1 adds), dw and db (optional;
 * accumulated) of batch_norm given g [N, C, S] and the forward's mean and
 * invstd: through the batch statistics when training, else through the
 * affine map of the running ones alone. */
/* sums (optional, SyncBatchNorm: f32 [2, C]): the group's sums of g and of
 * g * xhat over its count values per channel, used (training) in place of
 * this batch's for dx. */
typedef struct accel_k_batch_norm_backward {
    ACCEL_KERNEL_TENSORS(9, *dx, *dw, *db, *g, *x, *w, *mean, *invstd, *sums);
    int64_t N, C, S, count;
    float dx_beta;
    bool training;
} accel_k_batch_norm_backward;

/* out (f32, 0-dim) = mean over rows whose target != ignore of
 * logsumexp(x[i]) - x[i, t[i]]; lse [N] written for the backward, count
 * (i64, 0-dim) the rows counted. x [N, C] f32, targets [N] i64, contiguous.
 * A target outside [0, C) (and not ignore) is an error naming it. */
typedef struct accel_k_cross_entropy {
    ACCEL_KERNEL_TENSORS(5, *out, *lse, *count, *x, *targets);
    int64_t N, C, ignore;
} accel_k_cross_entropy;

/* dx (+)= (exp(x - lse) - onehot(t)) * g / count on counted rows (0
 * elsewhere): softmax(x) - onehot(t) with cross_entropy's lse. A target
 * outside [0, C) (not ignore) adds no one-hot: the vocabulary-parallel
 * cross-entropy passes the logsumexp over every rank's columns and, for a
 * row whose target another rank holds, a target off this rank's columns. */
typedef struct accel_k_cross_entropy_backward {
    ACCEL_KERNEL_TENSORS(6, *dx, *g, *x, *lse, *targets, *count);
    int64_t N, C, ignore;
    float beta;
} accel_k_cross_entropy_backward;

/* Cross-entropy and its gradient in one pass over the logits: out and count
 * as cross_entropy, and dx [N, C] = (softmax(x) - onehot(t)) / count on
 * counted rows, 0 on ignored ones (the backward only scales it by the
 * incoming gradient, so no second pass of exponentials). x and dx
 * contiguous, f32, bf16 or f16 each (computed in f32, dx rounded once);
 * targets [N] i64 contiguous. g (optional, 0-dim f32): dx is that f32
 * gradient times g, multiplied in f32 before dx's rounding, as an f32
 * gradient scaled and then rounded to 16 bits (the backward of a 16-bit dx
 * for g != 1, which scaled after its rounding would be rounded twice). */
typedef struct accel_k_cross_entropy_fused {
    ACCEL_KERNEL_TENSORS(6, *out, *count, *dx, *x, *targets, *g);
    int64_t N, C, ignore;
} accel_k_cross_entropy_fused;

/* out (f32, 0-dim) = mean (pred - target)^2, both f32 contiguous. */
typedef struct accel_k_mse {
    ACCEL_KERNEL_TENSORS(3, *out, *pred, *target);
} accel_k_mse;

/* d (+)= sign * 2 g (pred - target) / numel (g 0-dim f32). */
typedef struct accel_k_mse_backward {
    ACCEL_KERNEL_TENSORS(4, *d, *g, *pred, *target);
    float sign, beta;
} accel_k_mse_backward;

/* ---------------------------------------------------------------- attention */

/* Scaled dot-product attention dims: q [B, H, Tq, D], k [B, Hkv, Tk, D],
 * v [B, Hkv, Tk, Dv], o [B, H, Tq, Dv]; bottom-right aligned causal mask.
 * key_range [B, 2] (host memory; NULL: none): batch row b sees keys
 * [lo, hi) = [key_range[2 b], key_range[2 b + 1]) only, beside the causal
 * mask (a padded batch's valid keys); only a backend with sdpa_key_range
 * (backend.h) reads it. key_start [B, Tq] (host memory; NULL: none): query
 * i of batch row b sees no key before key_start[b Tq + i] either (0 <= it
 * <= Tk; packed sequences: the first token of the query's), as the causal
 * mask hides those after it; only a backend with sdpa_key_start reads it.
 * qs, ks, vs, os: element strides of q, k, v and o over batch, head and row
 * (each row's D or Dv elements contiguous, rows at least a row apart), so
 * the kernels read q, k, v as the projections left them ([B, T, H, D] seen
 * as [B, H, T, D]) and write o in that layout. accel_k_sdpa_dense fills
 * the strides of dense tensors. */
typedef struct accel_k_sdpa_dims {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    float scale;
    bool causal;
    const int64_t *key_range;
    const int32_t *key_start;
    int64_t qs[3], ks[3], vs[3], os[3];
} accel_k_sdpa_dims;

/* The strides s[3] of a dense [B, heads, T, n] tensor. */
static inline void accel_k_sdpa_dense_rows(int64_t s[3], int64_t heads, int64_t T, int64_t n) {
    s[0] = heads * T * n, s[1] = T * n, s[2] = n;
}

/* d's qs, ks, vs, os: dense q, k, v and o. */
static inline void accel_k_sdpa_dense(accel_k_sdpa_dims *d) {
    accel_k_sdpa_dense_rows(d->qs, d->H, d->Tq, d->D);
    accel_k_sdpa_dense_rows(d->ks, d->Hkv, d->Tk, d->D);
    accel_k_sdpa_dense_rows(d->vs, d->Hkv, d->Tk, d->Dv);
    accel_k_sdpa_dense_rows(d->os, d->H, d->Tq, d->Dv);
}

/* o and the log-sum-exp lse [B, H, Tq] (f32, contiguous) of each query
 * row's scaled scores over the keys it sees, lse_i = log sum_j exp(scale
 * q_i . k_j) (-inf for a row that sees no key; its o row is 0), from q, k
 * and v (all four at the strides in dims). The probabilities are never
 * stored: the backward recomputes P_ij = exp(scale q_i . k_j - lse_i). q,
 * k, v and o are each f32, bf16 or f16 (read and written in their dtype;
 * f32 scores, softmax and accumulation). */
typedef struct accel_k_sdpa {
    ACCEL_KERNEL_TENSORS(5, *o, *lse, *q, *k, *v);
    accel_k_sdpa_dims dims;
} accel_k_sdpa;

/* dq (optional, dq_beta 0 overwrites, 1 adds), dk and dv (optional; added
 * into, or with dkv_overwrite written without their old values being read;
 * set only where B, H and Tq are positive, so a kernel that returns early
 * when no query exists need not write them) from g = dO and the forward's q, k, v,
 * o (at dims' qs, ks, vs, os) and lse (f32 [B, H, Tq]): P recomputed from q,
 * k and lse, the softmax gradient's row term delta_i = sum_e g_ie o_ie (o as
 * stored, f32 sums). gs, dqs, dks, dvs: the strides of g (o's shape), dq
 * (q's), dk (k's) and dv (v's), as in dims (dense:
 * accel_k_sdpa_backward_dense). dq, dk, dv, g, q, k, v, o are each f32, bf16
 * or f16; f32 accumulation. */
typedef struct accel_k_sdpa_backward {
    ACCEL_KERNEL_TENSORS(9, *dq, *dk, *dv, *g, *q, *k, *v, *o, *lse);
    accel_k_sdpa_dims dims;
    float dq_beta;
    bool dkv_overwrite;
    int64_t gs[3], dqs[3], dks[3], dvs[3];
} accel_k_sdpa_backward;

/* b's gs, dqs, dks, dvs: dense g, dq, dk and dv (b->dims set). */
static inline void accel_k_sdpa_backward_dense(accel_k_sdpa_backward *b) {
    const accel_k_sdpa_dims *d = &b->dims;
    accel_k_sdpa_dense_rows(b->gs, d->H, d->Tq, d->Dv);
    accel_k_sdpa_dense_rows(b->dqs, d->H, d->Tq, d->D);
    accel_k_sdpa_dense_rows(b->dks, d->Hkv, d->Tk, d->D);
    accel_k_sdpa_dense_rows(b->dvs, d->Hkv, d->Tk, d->Dv);
}

/* ---------------------------------------------------------------- optimizers */

/* One SGD step on f32 contiguous p from g (PyTorch's rule): d = g + wd p;
 * with momentum (buf non-NULL) buf = first ? d : mom buf + undamped d
 * and d = nesterov ? d + mom buf : buf; then p -= lr d. undamped is
 * 1 - dampening computed in double and rounded, as torch rounds its alpha
 * (1.0f - a rounded dampening was off by up to 1e-5 relative for a
 * dampening near 1). */
typedef struct accel_k_sgd {
    ACCEL_KERNEL_TENSORS(3, *p, *g, *buf);
    float lr, weight_decay, momentum, undamped;
    bool first, nesterov;
} accel_k_sgd;

/* One Adam/AdamW step on f32 contiguous p from g with moments m and v
 * (PyTorch's rule); step is the step number after this one (>= 1), decoupled
 * selects AdamW's weight decay. cast (optional; contiguous, p's numel)
 * receives the updated p rounded to cast_dt (bf16 or f16), stored as cast_dt
 * or, for an f32 cast, widened back to f32: the weight's autocast copy
 * (core/prepared.h's CAST and ROUNDED_F32 forms) refreshed in the pass that
 * updates the weight, with the bits a conversion of the new p would give. */
typedef struct accel_k_adam {
    ACCEL_KERNEL_TENSORS(5, *p, *g, *m, *v, *cast);
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
    bool decoupled;
    accel_dtype cast_dt;
} accel_k_adam;

/* out (f64, 0-dim) = sum |g|^norm_type over g (f32 contiguous), or max |g|
 * when norm_type is infinite: one rank's or one tensor's part of a grad norm.
 * Each term |g|^p is rounded to f32 before it is summed (in f64), as torch's
 * f32 vector_norm computes it: a term beyond FLT_MAX is inf, one below the
 * smallest subnormal 0 (for p = 1000 every |g| < 0.9), where an f64 term
 * gave a finite total torch's clip_grad_norm_ does not. */
typedef struct accel_k_norm_partial {
    ACCEL_KERNEL_TENSORS(2, *out, *g);
    double norm_type;
} accel_k_norm_partial;

/* GradScaler's unscale_: g (f32 contiguous) *= inv in place; found (f32,
 * 0-dim) = 1 when an element of the result is inf or nan, else 0. */
typedef struct accel_k_unscale {
    ACCEL_KERNEL_TENSORS(2, *g, *found);
    float inv;
} accel_k_unscale;

/* ---------------------------------------------------------------- windows (conv, pooling) */

/* A 2-D window over planes [H, W] giving [Ho, Wo]: kh x kw taps, dilated by
 * (dh, dw), at stride (sh, sw) over the input padded by (ph, pw). */
typedef struct accel_k_window2d {
    int64_t H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
} accel_k_window2d;

/* col [C * kh * kw, Ho * Wo] (contiguous, x's dtype) = the taps of the
 * image [C, H, W] at element x_off of x (contiguous): row (c, i, j), column
 * (oh, ow) holds x[c, oh sh - ph + i dh, ow sw - pw + j dw], 0 in padding. */
typedef struct accel_k_im2col {
    ACCEL_KERNEL_TENSORS(2, *col, *x);
    int64_t C, x_off;
    accel_k_window2d win;
} accel_k_im2col;

/* The adjoint of im2col: the image [C, H, W] at element x_off of dx (f32
 * contiguous) += each entry of col [C * kh * kw, Ho * Wo] (f32) at the place
 * im2col read it from (padding's entries dropped). */
typedef struct accel_k_col2im {
    ACCEL_KERNEL_TENSORS(2, *dx, *col);
    int64_t C, x_off;
    accel_k_window2d win;
} accel_k_col2im;

/* A convolution's forward or backward over the whole batch on a library's
 * direct convolution where the device has one (the CPU: oneDNN's,
 * backends/cpu/gemm.h accel__dnnl_conv, which says the dtypes), of x
 * [N, C, H, W] by w [O, C / G, kh, kw] (both given in either pass), all
 * tensors contiguous:
 *   FORWARD   y [N, O, Ho, Wo] from x, w, b (or NULL)
 *   BACKWARD  from dy [N, O, Ho, Wo]: dx (f32), and dw (f32) with db (f32,
 *             or NULL), each where not NULL (dx or dw given; db with dw
 *             only), overwritten for its beta 0, added to for 1
 * ran: set false (nothing written) where the device has none for the
 * case, or ACCEL_CONV=im2col: the op then runs im2col and its GEMMs. */
typedef enum accel_k_conv_pass {
    ACCEL_K_CONV_FORWARD,
    ACCEL_K_CONV_BACKWARD,
} accel_k_conv_pass;

typedef struct accel_k_conv2d {
    ACCEL_KERNEL_TENSORS(8, *y, *dx, *dw, *db, *x, *w, *b, *dy);
    accel_k_conv_pass pass;
    int64_t G;
    accel_k_window2d win;
    float dx_beta, dw_beta, db_beta;
    bool ran;
} accel_k_conv2d;

typedef enum accel_k_pool_kind { ACCEL_K_POOL_MAX, ACCEL_K_POOL_AVG, ACCEL_K_POOL_ADAPTIVE_AVG } accel_k_pool_kind;

/* y [P, Ho, Wo] (f32 contiguous) pooled from planes x [P, H, W] (f32
 * contiguous):
 *   MAX: the max over the window's taps inside the input (a NaN wins);
 *        idx (i64 [P, Ho, Wo]) its h * W + w (the first on ties);
 *   AVG: the mean over rows oh sh - ph .. + kh (cut at H + ph; likewise
 *        columns) divided by that window's size when count_include_pad,
 *        else by the count of its taps inside the input (taps outside
 *        add 0); idx unused (NULL);
 *   ADAPTIVE_AVG: the mean over rows floor(oh H / Ho) .. ceil((oh + 1) H / Ho)
 *        and likewise columns (win's taps, stride, padding unused). */
typedef struct accel_k_pool2d {
    ACCEL_KERNEL_TENSORS(3, *y, *idx, *x);
    int64_t P;
    accel_k_window2d win;
    accel_k_pool_kind kind;
    bool count_include_pad;
} accel_k_pool2d;

/* dx [P, H, W] (f32 contiguous) += the gradient of pool2d (same fields) for
 * g [P, Ho, Wo] (f32 contiguous): MAX adds g at idx, the averages spread it
 * over their windows divided as the forward divided. */
typedef struct accel_k_pool2d_backward {
    ACCEL_KERNEL_TENSORS(3, *dx, *g, *idx);
    int64_t P;
    accel_k_window2d win;
    accel_k_pool_kind kind;
    bool count_include_pad;
} accel_k_pool2d_backward;

/* ---------------------------------------------------------------- the table */

/* X(name, args type) for every kernel. */
#define ACCEL_KERNELS(X)                                  \
    X(copy, accel_k_copy)                                 \
    X(fill, accel_k_fill)                                 \
    X(accumulate, accel_k_accumulate)                     \
    X(rng, accel_k_rng)                                   \
    X(binary, accel_k_binary)                             \
    X(unary, accel_k_unary)                               \
    X(unary_grad, accel_k_unary_grad)                     \
    X(mask_scale, accel_k_mask_scale)                     \
    X(swiglu, accel_k_swiglu)                             \
    X(swiglu_backward, accel_k_swiglu_backward)           \
    X(compare, accel_k_compare)                           \
    X(where, accel_k_where)                               \
    X(sum, accel_k_sum)                                   \
    X(max, accel_k_max)                                   \
    X(max_backward, accel_k_max_backward)                 \
    X(gemm, accel_k_gemm)                                 \
    X(bias_rows, accel_k_bias_rows)                       \
    X(col_sum, accel_k_col_sum)                           \
    X(softmax, accel_k_softmax)                           \
    X(softmax_backward, accel_k_softmax_backward)         \
    X(rope_tables, accel_k_rope_tables)                   \
    X(rope, accel_k_rope)                                 \
    X(embedding, accel_k_embedding)                       \
    X(embedding_backward, accel_k_embedding_backward)     \
    X(rms_norm, accel_k_rms_norm)                         \
    X(rms_norm_backward, accel_k_rms_norm_backward)       \
    X(layer_norm, accel_k_layer_norm)                     \
    X(layer_norm_backward, accel_k_layer_norm_backward)   \
    X(batch_norm, accel_k_batch_norm)                     \
    X(batch_norm_backward, accel_k_batch_norm_backward)   \
    X(im2col, accel_k_im2col)                             \
    X(col2im, accel_k_col2im)                             \
    X(conv2d, accel_k_conv2d)                             \
    X(pool2d, accel_k_pool2d)                             \
    X(pool2d_backward, accel_k_pool2d_backward)           \
    X(cross_entropy, accel_k_cross_entropy)               \
    X(cross_entropy_backward, accel_k_cross_entropy_backward) \
    X(cross_entropy_fused, accel_k_cross_entropy_fused)   \
    X(mse, accel_k_mse)                                   \
    X(mse_backward, accel_k_mse_backward)                 \
    X(sdpa, accel_k_sdpa)                                 \
    X(sdpa_backward, accel_k_sdpa_backward)               \
    X(sgd, accel_k_sgd)                                   \
    X(adam, accel_k_adam)                                 \
    X(norm_partial, accel_k_norm_partial)                 \
    X(unscale, accel_k_unscale)

typedef struct accel_kernel_table {
#define ACCEL__KERNEL_SLOT(name, T) accel_status (*name)(T *args);
    ACCEL_KERNELS(ACCEL__KERNEL_SLOT)
#undef ACCEL__KERNEL_SLOT
} accel_kernel_table;

#endif
