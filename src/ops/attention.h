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

/* Whether dev's sdpa kernels read key ranges (accel__sdpa_padded runs there). */
bool accel__sdpa_key_range_on(accel_device dev);

/* accel__sdpa_heads_last, causal, with batch row b's keys limited to
 * [key_range[2 b], key_range[2 b + 1]) (host int64 [B, 2]: a padded batch's
 * valid keys, 0 <= lo <= hi <= Tk, copied): a query row that then sees no
 * key (a left pad's) gets 0, and passes no gradient, as torch's SDPA gives
 * it under a boolean mask that hides every key. On a backend whose sdpa
 * kernels read key ranges (backend.h: sdpa_key_range; the CPU's), refused
 * elsewhere. Differentiable. */
accel_tensor *accel__sdpa_padded(accel_tensor *q, accel_tensor *k, accel_tensor *v, const int64_t *key_range,
                                 double scale);

/* Whether dev's sdpa kernels read a key start per query (accel__sdpa_packed
 * runs there). */
bool accel__sdpa_key_start_on(accel_device dev);

/* accel__sdpa_heads_last, causal, with query i of batch row b seeing no key
 * before key_start[b Tq + i] (host int64 [B, Tq], 0 <= each <= Tk, copied):
 * packed sequences, each query within its own, as transformers' mask of
 * find_packed_sequence_indices gives. A query that then sees no key gets 0,
 * as in accel__sdpa_padded. On a backend whose sdpa kernels read key
 * starts (backend.h: sdpa_key_start; the CPU's), refused elsewhere.
 * Differentiable. */
accel_tensor *accel__sdpa_packed(accel_tensor *q, accel_tensor *k, accel_tensor *v, const int64_t *key_start,
                                 double scale);

/* (rope.c) accel_rope_freqs over x [B, H, T, D] whose row b's position t is
 * pos[b T + t] (host, >= 0; position ids that differ between the rows of a
 * padded batch). */
accel_tensor *accel__rope_positions(accel_tensor *x, const int64_t *pos, const float *inv_freq,
                                    double attention_scaling);
/* (rope.c) accel__rope_positions' tables cos, sin [B, T, half] (f32 on dev;
 * NULL on meta) of positions pos [B T] (host, >= 0): built once, they serve
 * every x of those positions (a padded forward's q and k of every layer
 * whose RoPE has the same inv_freq [half] and scaling). */
accel_status accel__rope_tables(const int64_t *pos, int64_t B, int64_t T, int64_t half, const float *inv_freq,
                                double attention_scaling, accel_device dev, accel_tensor **cos, accel_tensor **sin);
/* RoPE of x [B, H, T, 2 half] by accel__rope_tables' cos and sin (on x's
 * device), as accel__rope_positions; differentiable. */
accel_tensor *accel__rope_with_tables(accel_tensor *x, accel_tensor *cos, accel_tensor *sin);

#endif
