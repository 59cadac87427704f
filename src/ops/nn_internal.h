/* Helpers shared by the linear-algebra, nn and loss ops (not public API).
 * Implemented in nn_common.c. */
#ifndef ACCEL_OPS_NN_INTERNAL_H
#define ACCEL_OPS_NN_INTERNAL_H

#include "core/backend.h"
#include "op_internal.h"

/* Where a backward's kernel writes the f32 gradient of an input t (a
 * contiguous f32 tensor of t's shape on t's device):
 *   - dst == NULL: t does not need a gradient (skip the work);
 *   - beta == 1: dst is t->grad itself: the kernel adds into it (never a
 *     gradient two tensors hold, accel__grad_share: that one is staged);
 *   - beta == 0: dst is fresh memory to overwrite (t->grad of a non-leaf that
 *     had none yet, or a scratch tensor that accel__gbuf_end accumulates).
 * accel__gbuf_end reports the kernel's write into t->grad (core/prepared.h). */
typedef struct accel__gbuf {
    accel_tensor *t;
    accel_tensor *tmp; /* scratch to accumulate at the end, or NULL */
    accel_tensor *dst;
    float beta;
} accel__gbuf;

/* Returns false (error set) on OOM. */
bool accel__gbuf_begin(accel__gbuf *g, accel_tensor *t);
/* Same, but always gives zero-filled memory with beta = 1 semantics (for
 * scatter-adds and loops that accumulate). */
bool accel__gbuf_begin_zeroed(accel__gbuf *g, accel_tensor *t);
accel_status accel__gbuf_end(accel__gbuf *g);
/* As accel__gbuf_begin, for kernels that also write bf16/f16 gradients: a
 * bf16 or f16 t gets dst in its own dtype (its gradient's dtype) when that
 * can be written directly, so no f32 buffer and conversion pass. */
bool accel__gbuf_begin_native(accel__gbuf *g, accel_tensor *t);
/* accel__gbuf_begin_native with accel__gbuf_begin_zeroed's zero-filled dst. */
bool accel__gbuf_begin_native_zeroed(accel__gbuf *g, accel_tensor *t);
/* accel__gbuf_begin_native for a kernel that writes dst at any strides: a
 * step tensor's first gradient (beta 0) is made in t's own layout where t
 * is dense (a transposed view's gradient is then the transpose of a
 * contiguous block, which the view's backward passes on without a copy). A
 * gradient at t's strides is one only a CPU kernel may be given (CUDA's
 * write contiguous outputs); the accumulate kernel adds into it. */
bool accel__gbuf_begin_native_layout(accel__gbuf *g, accel_tensor *t);

/* Whether dev's gemm kernel writes a C of dtype c from A and B of dtypes a
 * and b itself (an f32 C always; a bf16/f16 C per the backend's gemm_c16,
 * backend.h); false: the op gives it an f32 C and converts that. */
bool accel__gemm_writes_c(accel_device dev, accel_dtype c, accel_dtype a, accel_dtype b);

/* The dtype matmul/linear/sdpa compute in: the autocast dtype when autocast is
 * on, else the promotion of the inputs. Errors (naming op) on non-float or
 * float64 inputs; returns -1 then. */
int accel__mm_dtype(const char *op, int n, accel_tensor *const *in);
/* A contiguous version of t in dtype dt for a GEMM to read (t itself when it
 * already is). Under autocast this is the rounding of the input. */
accel_tensor *accel__mm_operand(accel_tensor *t, accel_dtype dt);
/* The output gradient of a GEMM op, for its backward GEMMs against the
 * saved operands a and b: in their dtype when both are the same
 * low-precision dtype that the CPU GEMM provider multiplies itself
 * (accel__gemm_native; torch.autocast's backward GEMMs run in bf16 too),
 * f32 otherwise (exact for the widened operands). Step arena. */
accel_tensor *accel__mm_grad(accel_tensor *grad_out, const accel_tensor *a, const accel_tensor *b);

/* accel_rope_freqs over x [B, H, T, D] whose T rows are n equal runs, run i
 * at positions pos0[i].. (context parallelism's two chunks: one op, one
 * output and one gradient, where a rope per run would need slices and a
 * concat). */
accel_tensor *accel__rope_runs(accel_tensor *x, int n, const int64_t *pos0, const float *inv_freq,
                               double attention_scaling);

/* C[c_off..] = alpha op(A[a_off..]) op(B[b_off..]) + beta C on the device's
 * gemm kernel (accel_k_gemm: row-major, offsets and leading dims in
 * elements). */
accel_status accel__gemm_at(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, accel_tensor *a,
                            int64_t a_off, int64_t lda, accel_tensor *b, int64_t b_off, int64_t ldb, float beta,
                            accel_tensor *c, int64_t c_off, int64_t ldc);

/* The window of a conv or pool over planes [H, W] (conv.c): kernel k,
 * stride s, padding p, dilation d ({H, W} each) checked (k, s, d >= 1,
 * p >= 0, the dilated kernel no longer than the padded input, under
 * ceil_mode longer by less than the stride: errors name op and the
 * argument; arithmetic past int64 refused) and written to *win with the
 * output size (H + 2 p - d (k - 1) - 1) / s + 1, rounded down, or up under
 * ceil_mode (a last window that would start in the right padding dropped,
 * as torch's pooling). s, p, d NULL: 1, 0, 1; k NULL is
 * refused. */
bool accel__window_check(const char *op, int64_t H, int64_t W, const int64_t k[2], const int64_t s[2],
                         const int64_t p[2], const int64_t d[2], bool ceil_mode, accel_k_window2d *win);

/* torch's checks of padding="same" (ACCEL_PADDING_SAME, ops.h) on a
 * window's {H, W} padding and stride (NULL: 0, 1): true where neither dim
 * is "same", or both are with stride 1; else false with an error naming op
 * (the stride's, or the dim that is not "same"). */
bool accel__same_padding_ok(const char *op, const int64_t padding[2], const int64_t stride[2]);

/* Product of shape[from..to). */
int64_t accel__prod(const int64_t *shape, int from, int to);

#endif
