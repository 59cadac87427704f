/* Attention with the masks and score transforms the fused sdpa kernel does
 * not have (transformers' sliding window, Gemma2's soft-capping), shared by
 * the decoders (src/nn/llama.c) and context parallelism's sharded attention
 * (attention_cp.c), which applies them at the chunks' global positions. */
#ifndef ACCEL_OPS_ATTENTION_MASKED_H
#define ACCEL_OPS_ATTENTION_MASKED_H

#include <stdint.h>

#include "accel/cp.h"

/* Attention where query t (at position pos + t) sees keys (at 0..) j with
 * pos + t - W < j <= pos + t (W 0: every j <= pos + t): transformers'
 * sliding-window mask, as an additive mask over explicit scores (ops every
 * backend has). Scores are scaled by `scale` (<= 0: 1/sqrt(D)), then
 * soft-capped to cap tanh(s / cap) when cap > 0 (Gemma2); the probabilities
 * go through dropout of probability drop (GPT-2's attn_pdrop while training;
 * 0: none), its mask drawn from drop_rng (NULL: the default generator; a
 * tensor-parallel decoder's own per-rank stream, for its rank's heads).
 * keep [B, S] (host; NULL: every key): batch row b sees key j
 * only where keep[b S + j] (a padded batch's attention_mask); a query row
 * that then sees no key (a left pad) gets 0 with unseen_zero (torch's
 * SDPA, transformers' default attention), else the mean of all S values
 * (its eager attention, Gemma 2's), finite either way. q [B, H, T, D],
 * k, v [B, Hkv, S, D] (H % Hkv == 0) -> [B, H, T, D]. Differentiable. */
accel_tensor *accel__masked_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                      const uint8_t *keep, bool unseen_zero, double scale, double cap, double drop,
                                      accel_rng *drop_rng);

/* A padded batch's additive mask for accel__masked_attention_pad, made
 * once for every layer of the same window W, grouped-query factor G
 * (heads / kv heads), first query position pos, dtype and device (a
 * forward's layers share it; each made its own, on the host, and uploaded
 * it): mask [B, 1, G T, S] and live [B, 1, G T, 1] (NULL when every query
 * row sees a key), as accel__masked_attention's keep gives them. */
typedef struct accel__pad_mask {
    int64_t W, G, pos;
    accel_dtype dt;
    accel_device dev;
    accel_tensor *mask, *live;
} accel__pad_mask;

/* *pm for keep [B, S] (host), queries at pos .. pos + T - 1 (step tensors). */
accel_status accel__pad_mask_make(accel__pad_mask *pm, const uint8_t *keep, int64_t B, int64_t G, int64_t T, int64_t S,
                                  int64_t pos, int64_t W, accel_dtype dt, accel_device dev);
/* Whether pm was made for q [B, H, T, D] and k [B, Hkv, S, D] at pos and W. */
bool accel__pad_mask_fits(const accel__pad_mask *pm, const accel_tensor *q, const accel_tensor *k, int64_t pos,
                          int64_t W);
/* accel__masked_attention with the padding mask pm (made for these
 * operands: refused otherwise; NULL: no padding). */
accel_tensor *accel__masked_attention_pad(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                          const accel__pad_mask *pm, bool unseen_zero, double scale, double cap,
                                          double drop, accel_rng *drop_rng);

/* The additive mask [rows, S] (f32, a step tensor on the cpu) of query row
 * r, at position pos + r % T (rows: T positions of one or more heads), over
 * the keys at positions k0 .. k0 + S - 1: 0 where it sees the key (at or
 * before it, and within W of it when W), -inf elsewhere. */
accel_tensor *accel__window_mask(int64_t rows, int64_t T, int64_t S, int64_t pos, int64_t k0, int64_t W);

/* accel_cp_attention with a sliding window of W keys (0: none) and
 * soft-capping at cap (0: none), both on the global positions of the
 * chunks: the decoders' attention under cp (src/nn/decoder_cp.c). */
accel_tensor *accel__cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                  accel_cp_strategy strategy, double scale, int64_t W, double cap);

#endif
