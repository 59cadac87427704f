/*
 * accel/cp.h — context parallelism: one sequence split across the ranks of a
 * process group (the `cp` mesh dimension), as torchtitan's context parallel
 * and DeepSpeed Ulysses.
 *
 * Layout (load-balanced for causal attention): a sequence of T positions is
 * cut into 2*cp chunks of c = T / (2*cp); rank i holds chunks i and
 * 2*cp-1-i, in that order, as its local sequence of 2c positions. Every
 * rank then does the same attention work (chunk i sees i+1 chunks of keys,
 * chunk 2*cp-1-i sees 2*cp-i: 2*cp+1 in all).
 *
 *     // every rank of pg holds q [B, H, 2c, D], k and v [B, Hkv, 2c, D]: its chunks
 *     accel_tensor *o = accel_cp_attention(pg, q, k, v, ACCEL_CP_ALLGATHER, 0);
 *     // o [B, H, 2c, D]: rows of the causal attention over the whole sequence
 *
 * Every rank of pg calls these ops in the same order with the same shapes
 * (they are collectives, forward and backward). CPU tensors only.
 */
#ifndef ACCEL_CP_H
#define ACCEL_CP_H

#include "accel/autograd.h"
#include "accel/dist.h"
#include "accel/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum accel_cp_strategy {
    /* K and V all-gathered along the sequence; each rank's queries attend
     * causally to the keys before them; the backward reduce-scatters dK, dV. */
    ACCEL_CP_ALLGATHER = 0,
    /* Ulysses: all-to-all from sequence-sharded to head-sharded (H/cp heads
     * over the whole sequence), causal attention, all-to-all back.
     * H % cp == 0; kv heads are split too when Hkv % cp == 0, else repeated
     * to H first. */
    ACCEL_CP_ALLTOALL,
} accel_cp_strategy;

/* Differentiable collectives over pg (world ranks).
 * all_gather: x [...] -> [world, ...], block k being rank k's x; the
 * backward reduce-scatters (sums) the gradient back to each rank's block.
 * all_to_all: x [world, ...] -> [world, ...], block k of the output being
 * rank k's block `rank`; the backward is the all_to_all of the gradient. */
accel_tensor *accel_cp_all_gather(accel_pg *pg, accel_tensor *x);
accel_tensor *accel_cp_all_to_all(accel_pg *pg, accel_tensor *x);

/* Causal attention over the whole sequence from the local chunks (layout
 * above): q [B, H, 2c, D], k and v [B, Hkv, 2c, D] (H % Hkv == 0);
 * scale <= 0 means 1/sqrt(D). Output [B, H, 2c, D], the rows of this rank's
 * chunks; differentiable in q, k, v. f32, bf16 or f16 (and autocast), as
 * accel_sdpa. Memory: the all-gather strategy keeps per call only what is
 * this rank's share (its chunks' log-sum-exp per query row, f32, and
 * gradients); the gathered K and V are a scratch of the call, gathered
 * again by the backward. The all-to-all strategy keeps its heads'
 * log-sum-exp per query row. The decoders under cp also apply sliding
 * windows and soft-capping (at the chunks' global positions) through this
 * op, by explicit scores: under the all-to-all strategy they keep the
 * probabilities of blocks of queries (n <= 16 of them, 64-row multiples)
 * over the band of keys each sees ((n+1)/(2n) of the [T, T] square per
 * head; rows + W keys a row when windowed). */
accel_tensor *accel_cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                 accel_cp_strategy strategy, double scale);

/* The global position of local position t (0 <= t < 2c) of `rank` among
 * `cp` ranks with chunks of c: what RoPE needs. -1 + error for arguments out
 * of those ranges. */
int64_t accel_cp_position(int64_t t, int64_t c, int cp, int rank);

/* RoPE (accel_rope_freqs) on this rank's chunks x [B, H, 2c, D]: each chunk
 * rotated at its global positions. inv_freq [D/2], attention_scaling as
 * accel_rope_freqs's. */
accel_tensor *accel_cp_rope_freqs(accel_tensor *x, int cp, int rank, const float *inv_freq,
                                  double attention_scaling);

/* Cross-entropy over the sharded sequence, equal to the unsharded one:
 * logits [..., C] and targets as accel_cross_entropy's, this rank's tokens.
 * The sum of this rank's token losses over the global count of targets !=
 * ignore_index (all-reduced over pg) is this rank's share; the result, a
 * 0-dim f32, is the sum of the shares (all-reduced): the unsharded mean on
 * every rank. Its backward gives each rank the gradient of its own share
 * only, so the gradients of the ranks' replicas of a parameter add up (SUM
 * over pg) to the unsharded gradient. Collective over pg (forward only):
 * a failure on one rank (a target out of range, bad arguments) fails every
 * rank of pg at once, the others saying that a partner failed. */
accel_tensor *accel_cp_cross_entropy(accel_pg *pg, accel_tensor *logits, accel_tensor *targets,
                                     int64_t ignore_index);

/* ---------------------------------------------------------------- decoders
 * The causal LMs of accel_llama_new (nn.h) run context-parallel once given
 * a group: accel_llama_forward takes this rank's chunks of the ids ([B, 2c])
 * and gives their logits; accel_llama_loss takes the whole batch ([B, T],
 * the same on every rank of pg), keeps this rank's chunks of the ids and of
 * the shifted labels, and returns the unsharded mean loss
 * (accel_cp_cross_entropy). The group and strategy are recorded on the model
 * (as accel_llama_parallelize records tp's), so two models in one process,
 * or on two threads, each run with their own. Sliding windows (Mistral,
 * Qwen2, Gemma2) and attention soft-capping (Gemma2) apply at the global
 * positions. Refused here, naming it: GPT-2's learned positions; refused by
 * accel_llama_forward: a KV cache (generation: undo cp first); by
 * accel_llama_loss: a T that is not a multiple of 2*cp. pg NULL undoes
 * it (strategy ignored); the caller keeps pg alive while set. The
 * Accelerator applies its cp group at accel_accelerator_prepare and undoes
 * it when it lets the model go (accel_accelerator_free). */
accel_status accel_llama_context_parallelize(accel_module *llama, accel_pg *pg, accel_cp_strategy strategy);
/* The cp group recorded on the model (NULL when it runs unsharded, or is not
 * a causal LM of accel_llama_new: then with an error); *strategy when not NULL. */
accel_pg *accel_llama_cp_group(accel_module *llama, accel_cp_strategy *strategy);

/* This rank's chunks of a [B, T] batch (i64 token ids or labels, or any
 * dtype): [B, 2c], chunks rank and 2*cp-1-rank. T % (2*cp) != 0 is refused
 * naming both. A step tensor, not differentiable. Every rank of a cp group
 * gets the same batch and keeps its own chunks. */
accel_tensor *accel_cp_shard(const accel_tensor *batch, int cp, int rank);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_CP_H */
