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
 * (its eager attention, Gemma 2's), finite either way. upcast: the
 * numerics of torch's SDPA (transformers' default attention) for bf16/f16
 * (accel__scores_attention), else those of transformers' eager attention.
 * q [B, H, T, D], k, v [B, Hkv, S, D] (H % Hkv == 0) -> [B, H, T, D].
 * Differentiable. */
accel_tensor *accel__masked_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                      const uint8_t *keep, bool unseen_zero, double scale, double cap, double drop,
                                      accel_rng *drop_rng, bool upcast);

/* What accel__scores_attention reads beside q, k, v and the mask. */
typedef struct accel__scores_opts {
    double scale;         /* of the scores; <= 0: 1/sqrt(D) */
    double cap;           /* soft-capping cap tanh(s / cap) when > 0 (Gemma2) */
    double drop;          /* dropout probability on the probabilities (0: none) */
    accel_rng *drop_rng;  /* its generator (NULL: the default one) */
    accel_tensor *live;   /* [B, 1, R or T, 1] as the mask: 0 zeroes a row's probabilities (a query that sees no
                           * key); NULL: none */
    bool upcast;          /* bf16/f16: compute in f32 as torch's SDPA (below) */
} accel__scores_opts;

/* softmax(q k^T scale (soft-capped) + mask) v over explicit scores, the
 * probabilities zeroed where live is 0 and dropped out: q [B, Hkv, R, D]
 * (R rows per key/value head), k, v [B, Hkv, S, D], mask additive,
 * broadcast to [B, Hkv, R, S], or [B, 1, T, S] with T > 1 rows that R is a
 * multiple of, repeated over each T rows (the G query heads of a key/value
 * head share one mask of their T positions), made the scores' dtype and
 * device (NULL: none) -> [B, Hkv, R, D]; live likewise. Where q's dtype (the autocast's when on) is
 * bf16/f16: with o->upcast as torch's SDPA computes them, q, k, v rounded
 * to that dtype and made f32, everything in f32 with the autocast off, the
 * output rounded once to that dtype; without, as transformers' eager
 * attention: the scores rounded to it before the softmax. f32: the same
 * either way. The decoders' (accel__masked_attention) and BERT's
 * attention. Differentiable. */
accel_tensor *accel__scores_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, accel_tensor *mask,
                                      const accel__scores_opts *o);

/* The dtype the scores (and so a padding mask) of accel__scores_attention
 * take for q: f32 where it upcasts, else q's. _of: for the compute dtype
 * (the autocast's, else the weights') a forward's layers share. */
accel_dtype accel__scores_dtype(const accel_tensor *q, bool upcast);
accel_dtype accel__scores_dtype_of(accel_dtype compute, bool upcast);

/* A padded batch's additive mask for accel__masked_attention_pad, made
 * once for every layer of the same window W, first query position pos,
 * dtype and device (a forward's layers share it; each made its own, on the
 * host, and uploaded it): mask [B, 1, T, S] and live [B, 1, T, 1] (NULL
 * when every query row sees a key), as accel__masked_attention's keep gives
 * them, one for the T positions that every query head's rows repeat (not G
 * copies for the G query heads of a key/value head). The dtype is the
 * scores' (accel__scores_dtype). */
typedef struct accel__pad_mask {
    int64_t W, pos;
    accel_dtype dt;
    accel_device dev;
    accel_tensor *mask, *live;
} accel__pad_mask;

/* *pm for keep [B, S] (host; NULL: every key) and start [B, T] (host;
 * NULL: none): query t of row b also sees no key before start[b T + t]
 * (the first token of its packed sequence), queries at pos .. pos + T - 1
 * (step tensors). */
accel_status accel__pad_mask_make(accel__pad_mask *pm, const uint8_t *keep, const int64_t *start, int64_t B, int64_t T,
                                  int64_t S, int64_t pos, int64_t W, accel_dtype dt, accel_device dev);
/* Whether pm was made for q [B, H, T, D] and k [B, Hkv, S, D] at pos and
 * W, in the dtype of their scores with upcast. */
bool accel__pad_mask_fits(const accel__pad_mask *pm, const accel_tensor *q, const accel_tensor *k, int64_t pos,
                          int64_t W, bool upcast);
/* accel__masked_attention with the padding mask pm (made for these
 * operands: refused otherwise; NULL: no padding). */
accel_tensor *accel__masked_attention_pad(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                          const accel__pad_mask *pm, bool unseen_zero, double scale, double cap,
                                          double drop, accel_rng *drop_rng, bool upcast);

/* The additive mask [rows, S] (f32, a step tensor on the cpu) of query row
 * r, at position pos + r % T (rows: T positions of one or more heads), over
 * the keys at positions k0 .. k0 + S - 1: 0 where it sees the key (at or
 * before it, and within W of it when W), -inf elsewhere. */
accel_tensor *accel__window_mask(int64_t rows, int64_t T, int64_t S, int64_t pos, int64_t k0, int64_t W);

/* accel_cp_attention with a sliding window of W keys (0: none) and
 * soft-capping at cap (0: none), both on the global positions of the
 * chunks, their explicit scores under bf16/f16 with upcast's numerics (as
 * accel__masked_attention's): the decoders' attention under cp
 * (src/nn/decoder_cp.c). */
accel_tensor *accel__cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                  accel_cp_strategy strategy, double scale, int64_t W, double cap, bool upcast);

#endif
