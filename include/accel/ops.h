/*
 * accel/ops.h — differentiable tensor operations.
 *
 * Every op:
 *   - returns a new step tensor (or a view, where stated) or NULL on error;
 *   - given a NULL input returns NULL and keeps the pending error (so a step
 *     can be checked once at its end);
 *   - on a shape, dtype or device mismatch sets an error naming the op and
 *     both shapes, e.g. "accel_matmul: shapes [2, 3] and [4, 5] cannot be
 *     multiplied (3 != 4)";
 *   - on meta tensors computes the output shape and allocates nothing;
 *   - records itself on the tape when grad mode is on and an input requires
 *     grad (see autograd.h).
 *
 * Dtypes: float ops accept f32, bf16 and f16. Mixed inputs promote as PyTorch
 * does (bf16 + f32 -> f32). Low-precision inputs are computed in f32 and the
 * result rounded to the output dtype. Under autocast (accel_autocast_begin,
 * autograd.h) matmul/linear/attention cast their float inputs to the
 * autocast dtype (output in that dtype, f32 accumulation), while norms,
 * softmax and losses compute and return f32.
 */
#ifndef ACCEL_OPS_H
#define ACCEL_OPS_H

#include "autograd.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- pointwise */

/* Binary ops broadcast as NumPy/PyTorch. */
accel_tensor *accel_add(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_sub(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_mul(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_div(accel_tensor *a, accel_tensor *b);

accel_tensor *accel_add_scalar(accel_tensor *a, double s);
accel_tensor *accel_mul_scalar(accel_tensor *a, double s);
accel_tensor *accel_pow_scalar(accel_tensor *a, double p);   /* a ** p */
accel_tensor *accel_neg(accel_tensor *a);

accel_tensor *accel_exp(accel_tensor *a);
accel_tensor *accel_log(accel_tensor *a);
accel_tensor *accel_sqrt(accel_tensor *a);
accel_tensor *accel_rsqrt(accel_tensor *a);
accel_tensor *accel_tanh(accel_tensor *a);
accel_tensor *accel_sigmoid(accel_tensor *a);
accel_tensor *accel_relu(accel_tensor *a);
accel_tensor *accel_silu(accel_tensor *a);
/* GELU: exact (erf) when tanh_approx is false, else PyTorch's approximate='tanh'. */
accel_tensor *accel_gelu(accel_tensor *a, bool tanh_approx);
/* SwiGLU, silu(gate) * up, in one pass forward and one backward (the Llama
 * MLP's activation; what accel_mul(accel_silu(gate), up) gives, rounded the
 * same way, without the intermediates). gate and up of one shape, float
 * dtypes; the result has their promoted dtype. bf16 operands are read and
 * written in place (computed in f32). */
accel_tensor *accel_swiglu(accel_tensor *gate, accel_tensor *up);

/* Converts dtype (differentiable: the gradient is converted back). Returns
 * an alias when the dtype is already dt. */
accel_tensor *accel_to_dtype(accel_tensor *a, accel_dtype dt);

/* ---------------------------------------------------------------- reductions */

/* Sums over the listed dims (negative dims count from the end). n_dims == 0
 * means all dims. keepdim as in PyTorch. */
accel_tensor *accel_sum(accel_tensor *a, int n_dims, const int *dims, bool keepdim);
accel_tensor *accel_mean(accel_tensor *a, int n_dims, const int *dims, bool keepdim);
accel_tensor *accel_sum_all(accel_tensor *a);   /* 0-dim result */
accel_tensor *accel_mean_all(accel_tensor *a);  /* 0-dim result */
/* Sums of integer or bool tensors are i64 (a bool sum counts the trues, as
 * torch's `(pred == labels).sum()`); mean needs a float input. */
/* Max over one dim; indices (i64, no grad) written to *indices when non-NULL. */
accel_tensor *accel_max(accel_tensor *a, int dim, bool keepdim, accel_tensor **indices);
/* torch.argmax(a, dim, keepdim): i64 indices of the max over dim, the first
 * one on ties, a NaN counting as the max. Not differentiable. */
accel_tensor *accel_argmax(accel_tensor *a, int dim, bool keepdim);

/* ---------------------------------------------------------------- comparisons
 * Bool results, not differentiable. The tensor forms broadcast and compare
 * in the promoted dtype as PyTorch (an i64 and an f32 compare as f32s). The
 * _scalar forms compare with s as torch does with a Python number: a float
 * tensor compares in its own dtype (bf16 == 0.1 rounds 0.1 to bf16 first);
 * an integer or bool tensor compares exactly with an integral s, else in
 * f32. NaN compares unequal to everything (only ne is true). */
accel_tensor *accel_eq(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_ne(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_lt(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_le(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_gt(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_ge(accel_tensor *a, accel_tensor *b);
accel_tensor *accel_eq_scalar(accel_tensor *a, double s);
accel_tensor *accel_ne_scalar(accel_tensor *a, double s);
accel_tensor *accel_lt_scalar(accel_tensor *a, double s);
accel_tensor *accel_le_scalar(accel_tensor *a, double s);
accel_tensor *accel_gt_scalar(accel_tensor *a, double s);
accel_tensor *accel_ge_scalar(accel_tensor *a, double s);
/* torch.where(cond, a, b): cond bool; cond, a and b broadcast together; the
 * dtype is a's and b's promoted one. Differentiable in a and b (each gets
 * the gradient where it was picked, 0 elsewhere). */
accel_tensor *accel_where(accel_tensor *cond, accel_tensor *a, accel_tensor *b);

/* ---------------------------------------------------------------- shapes */

/* View when `a` is contiguous, else a copy. One entry of shape may be -1. */
accel_tensor *accel_reshape(accel_tensor *a, int ndim, const int64_t *shape);
accel_tensor *accel_permute(accel_tensor *a, const int *perm);      /* view */
accel_tensor *accel_transpose(accel_tensor *a, int d0, int d1);    /* view */
/* Elements start, start+step, ... < end of dim (negative indices allowed). View. */
accel_tensor *accel_slice(accel_tensor *a, int dim, int64_t start, int64_t end, int64_t step);
/* Broadcast to shape (size-1 dims and new leading dims). View (stride 0). */
accel_tensor *accel_expand(accel_tensor *a, int ndim, const int64_t *shape);
accel_tensor *accel_contiguous(accel_tensor *a);                   /* alias if contiguous */
accel_tensor *accel_unsqueeze(accel_tensor *a, int dim);           /* view */
accel_tensor *accel_squeeze(accel_tensor *a, int dim);             /* view */
accel_tensor *accel_concat(int n, accel_tensor *const *ts, int dim);
/* Splits dim into n parts of sizes[i] (sum == size of dim); views into outs[]. */
accel_status accel_split(accel_tensor *a, int dim, int n, const int64_t *sizes, accel_tensor **outs);
/* torch.nn.functional.pad's modes. */
typedef enum accel_pad_mode {
    ACCEL_PAD_CONSTANT,  /* the border holds value */
    ACCEL_PAD_REFLECT,   /* x mirrored at its edges, the edge not repeated */
    ACCEL_PAD_REPLICATE, /* the edge element repeated */
    ACCEL_PAD_CIRCULAR,  /* x wrapped around */
} accel_pad_mode;

/* torch.nn.functional.pad(x, pad, mode, value): pad[0], pad[1] are the
 * elements added before and after the last dim, pad[2], pad[3] the dim
 * before it, and so on for npad / 2 dims (npad even, at most 2 ndim). A new
 * tensor (also for npad 0), differentiable (the elements a border repeats
 * add their gradients up). Constant mode: any dtype, the border holds value
 * (cast to x's dtype, as torch casts it), a negative amount crops (a dim may
 * end at 0, not below; x's gradient is 0 where it was cropped). The other
 * modes, as torch: float dtypes, 2 pads of a 2-D or 3-D x, 4 of a 3-D or
 * 4-D, 6 of a 4-D or 5-D; reflect's below the dim's size, circular's at
 * most it; value unused; no negative pad (crop in constant mode first:
 * torch's own results for them follow no one rule). Errors name the
 * argument. */
accel_tensor *accel_pad(accel_tensor *x, int npad, const int64_t *pad, accel_pad_mode mode, double value);

/* ---------------------------------------------------------------- linear algebra */

/* Batched matmul with broadcasting of leading dims ([..., M, K] x [..., K, N]).
 * 1-D operands follow torch.matmul. f32 goes through OpenBLAS sgemm;
 * bf16/f16 inputs are multiplied with f32 accumulation. */
accel_tensor *accel_matmul(accel_tensor *a, accel_tensor *b);
/* y = x W^T + b with W [out, in] (PyTorch layout), x [..., in]; b may be NULL. */
accel_tensor *accel_linear(accel_tensor *x, accel_tensor *w, accel_tensor *b);

/* ---------------------------------------------------------------- nn */

/* ids: i64/i32 of any shape; weight [V, D] -> [..., D]. Out-of-range id is an error. */
accel_tensor *accel_embedding(accel_tensor *ids, accel_tensor *weight);
/* y = x / sqrt(mean(x^2, -1) + eps) * w  (computed in f32; output dtype of w as in
 * transformers' LlamaRMSNorm: x is cast to f32, then back to the input dtype before * w). */
accel_tensor *accel_rms_norm(accel_tensor *x, accel_tensor *w, double eps);
/* LayerNorm over the last dim; w and b may be NULL. */
accel_tensor *accel_layer_norm(accel_tensor *x, accel_tensor *w, accel_tensor *b, double eps);
accel_tensor *accel_softmax(accel_tensor *x, int dim);
accel_tensor *accel_log_softmax(accel_tensor *x, int dim);

/* Rotary position embedding as in transformers' Llama (rotate_half layout):
 * x [B, H, T, D] (D even), position of row t is pos_offset + t
 * (pos_offset >= 0, pos_offset + T < 2^63), inv_freq[i] = theta^(-2i/D). */
accel_tensor *accel_rope(accel_tensor *x, int64_t pos_offset, double theta);
/* The same rotation with the frequencies given: inv_freq [D/2] (host
 * memory, read during the call), and cos/sin multiplied by attention_scaling
 * (> 0; 1 for plain RoPE): the scaled RoPE variants of transformers
 * (accel_llama computes inv_freq from its config's rope_scaling). */
accel_tensor *accel_rope_freqs(accel_tensor *x, int64_t pos_offset, const float *inv_freq,
                               double attention_scaling);

/* Scaled dot-product attention. q [B, H, Tq, D], k and v [B, Hkv, Tk, D] with
 * H % Hkv == 0 (grouped-query: query head h uses kv head h / (H/Hkv)).
 * causal: query i (of Tq) sees keys j <= i + (Tk - Tq) (bottom-right aligned,
 * which is what a KV cache needs). scale <= 0 means 1/sqrt(D). Output [B, H, Tq, D].
 * Kept for the backward: each query row's log-sum-exp (f32 [B, H, Tq]), from
 * which it recomputes the probabilities, never a [Tq, Tk] matrix. */
accel_tensor *accel_sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal,
                         double scale);

/* ---------------------------------------------------------------- convolution, batch norm, pooling
 * As torch.nn.functional defines them, NCHW. Per-dim arguments are int64_t[2]
 * ({H, W}); NULL is torch's default (stride 1, a pool's its kernel; padding
 * 0; dilation 1; a NULL kernel or output size is refused); a bad one (stride
 * or dilation < 1, padding < 0, groups not dividing the channels, a kernel
 * larger than the padded input: a pool's under ceil_mode by the stride or
 * more, as torch) is an error naming it. Implemented on the CPU (and the
 * hostless test devices); on another device they fail with "kernel <name>
 * is not implemented on <device>", except a 1x1, stride-1, unpadded
 * convolution, which needs no im2col: its GEMMs run on any device with them
 * (not run on a GPU yet). */

/* padding="same" of torch's convolutions, as a padding value: every dim
 * padded by dilation (k - 1) in all, half of it (rounded down) before and
 * the rest after, so that the output has the input's size; stride 1 only.
 * An odd total pads x by accel_pad first, as torch does. (padding="valid"
 * is padding 0.) */
#define ACCEL_PADDING_SAME INT64_MIN

/* torch.nn.functional.conv2d: x [N, C, H, W] (or unbatched [C, H, W]),
 * w [O, C / groups, kh, kw], b [O] or NULL -> [N, O, Ho, Wo] with
 * Ho = (H + 2 padding - dilation (kh - 1) - 1) / stride + 1; padding
 * {ACCEL_PADDING_SAME, ACCEL_PADDING_SAME} is torch's "same" (both dims, or
 * neither: an error naming it). Under autocast
 * the operands are rounded to the autocast dtype and the result is in it
 * (f32 accumulation), as matmul. Computed as im2col + the device's GEMM per
 * image and group (a 1x1 stride-1 unpadded convolution reads x as it is). */
accel_tensor *accel_conv2d(accel_tensor *x, accel_tensor *w, accel_tensor *b, const int64_t stride[2],
                           const int64_t padding[2], const int64_t dilation[2], int64_t groups);
/* torch.nn.functional.conv1d: x [N, C, L] (or [C, L]), w [O, C / groups, k]
 * -> [N, O, Lo]: conv2d over [N, C, 1, L]; padding ACCEL_PADDING_SAME is
 * torch's "same". */
accel_tensor *accel_conv1d(accel_tensor *x, accel_tensor *w, accel_tensor *b, int64_t stride, int64_t padding,
                           int64_t dilation, int64_t groups);
/* torch.nn.functional.batch_norm: x [N, C], [N, C, L] or [N, C, H, W];
 * running_mean / running_var f32 [C] (NULL both: batch statistics always,
 * track_running_stats=False); weight, bias [C] or NULL. training: normalises
 * with the batch's mean and biased variance and, when the running stats are
 * given, updates them in place: r = (1 - momentum) r + momentum * stat, the
 * variance unbiased (exactly one value per channel refused, as torch; an
 * empty batch gives an empty result, the running stats untouched). Eval:
 * normalises with the running stats. Computed in f32; the result has x's
 * dtype promoted with weight's and bias's (a bf16 x with f32 weights: f32;
 * torch keeps x's), f32 under autocast, as the other norms. Differentiable
 * in x, weight and bias; the running stats are not. */
accel_tensor *accel_batch_norm(accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                               accel_tensor *weight, accel_tensor *bias, bool training, double momentum,
                               double eps);
/* torch.nn.functional.max_pool2d: x [N, C, H, W] or [C, H, W] (only N may
 * be 0, as torch: the pools refuse other empty dims); stride NULL
 * means kernel; padding (each <= half the kernel size, as torch checks it,
 * dilation aside) pads with -inf;
 * ceil_mode rounds the output size up (a last window must start inside the
 * input or its left padding). A NaN in a window wins. */
accel_tensor *accel_max_pool2d(accel_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2], bool ceil_mode);
/* torch.nn.functional.avg_pool2d (no divisor_override): the window's mean,
 * padding counted in the divisor when count_include_pad. */
accel_tensor *accel_avg_pool2d(accel_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], bool ceil_mode, bool count_include_pad);
/* torch.nn.functional.adaptive_avg_pool2d: output [.., Ho, Wo]; row window
 * floor(i H / Ho) .. ceil((i + 1) H / Ho), likewise columns. */
accel_tensor *accel_adaptive_avg_pool2d(accel_tensor *x, const int64_t output_size[2]);
/* torch.flatten: dims start_dim..end_dim (negative count from the end) as
 * one. A view when x is contiguous (accel_reshape). */
accel_tensor *accel_flatten(accel_tensor *x, int start_dim, int end_dim);

/* Cross-entropy over logits [..., C] and integer targets of the logits' shape
 * without C (PyTorch's rule with the classes last: [N] for [N, C], [] for [C])
 * or the same N targets flat; any other shape is a shape error, even with the
 * right count ([4, 1] for [4, 3]). Mean over targets != ignore_index (PyTorch
 * uses -100). 0-dim f32. */
accel_tensor *accel_cross_entropy(accel_tensor *logits, accel_tensor *targets,
                                  int64_t ignore_index);
/* Mean squared error, mean over all elements. 0-dim f32. */
accel_tensor *accel_mse_loss(accel_tensor *pred, accel_tensor *target);
/* Inverted dropout: zero with probability p and scale by 1/(1-p); identity when
 * !training or p == 0. The mask comes from rng (default generator if NULL). */
accel_tensor *accel_dropout(accel_tensor *x, double p, bool training, accel_rng *rng);

/* ---------------------------------------------------------------- devices */

/* Copy to another device (alias when already there). Differentiable. */
accel_tensor *accel_to_device(accel_tensor *a, accel_device dev);

/* accel_set_reference_kernels / accel_reference_kernels: core.h (the
 * backends' kernels read the switch, so it lives below them). */

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_OPS_H */
