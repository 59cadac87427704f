/* The fused attention's variant for the decoders (src/nn/llama.c): its
 * output in the layout o_proj reads. */
#ifndef ACCEL_OPS_ATTENTION_H
#define ACCEL_OPS_ATTENTION_H

#include "accel/ops.h"

/* accel_sdpa's o as [B, Tq, H, Dv] (contiguous), the layout the
 * projections' [B, T, H D] has: on a device whose sdpa kernels honour
 * strides (backend.h: sdpa_strided) the kernel writes it so and its
 * gradient is read as it arrives, no transposed copy either way; elsewhere
 * the transposed copy of accel_sdpa's. Differentiable. */
accel_tensor *accel__sdpa_heads_last(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale);

/* (rope.c) accel_rope_freqs over x [B, H, T, D] whose row b's position t is
 * pos[b T + t] (host, >= 0; position ids that differ between the rows of a
 * padded batch). */
accel_tensor *accel__rope_positions(accel_tensor *x, const int64_t *pos, const float *inv_freq,
                                    double attention_scaling);

#endif
