/*
 * accel/parallel.h — tensor parallelism (Megatron-LM's column/row-parallel
 * layers, PyTorch DTensor's parallelize_module) over a process group.
 *
 * The ranks of a tensor-parallel group (tp ranks) hold slices of a layer's
 * weights and see the same input batch. Two conjugate collectives carry the
 * activations between the slices and back, as in Megatron-LM:
 *
 *   copy to tp region     forward: identity      backward: all-reduce (sum)
 *   reduce from tp region forward: all-reduce    backward: identity
 *
 * A column-parallel Linear (weight rows split: each rank computes a slice of
 * the output features) takes its replicated input through the first; a
 * row-parallel Linear (weight columns split: each rank reads a slice of the
 * input features) sums the ranks' partial outputs through the second. A
 * column-parallel layer followed by a row-parallel one (an MLP, attention
 * with its heads split) needs one all-reduce forward and one backward.
 *
 *     accel_tp_plan_entry plan[] = {
 *         {"fc1", ACCEL_TP_COLWISE, false},      // [.., C] -> [.., H / tp]
 *         {"fc2", ACCEL_TP_ROWWISE, false},      // [.., H / tp] -> [.., C], all-reduced
 *     };
 *     accel_module_parallelize(mlp, plan, 2, tp_group);  // every rank of tp_group
 *
 * Every rank of the group calls these in the same order (they are
 * collectives of the group). CPU tensors (the group's collectives on host
 * memory). A group of one rank makes every call an identity.
 */
#ifndef ACCEL_PARALLEL_H
#define ACCEL_PARALLEL_H

#include "dist.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- collectives as ops
 * Differentiable; the result is a step tensor. */

/* torch.nn.SyncBatchNorm's functional form: accel_batch_norm whose training
 * statistics are the group's. Training over 2 ranks or more: every rank's
 * per-channel mean, sum of squared deviations and count are all-gathered
 * (one collective; ranks may hold different batch sizes, an empty one too),
 * x is normalised with the group's mean and biased variance and the running
 * stats take the group's mean and unbiased variance (over the group's
 * count); the backward all-reduces the per-channel sums of g and g * xhat
 * once and gives dx over the group's count, dweight and dbias this rank's
 * sums (DDP averages them as any gradient). Eval, or a group of one:
 * accel_batch_norm itself, no collective. Every rank calls it (and its
 * backward) in the same order; a dead peer gives the group's timeout error.
 * cpu tensors; pg NULL is an error. */
accel_tensor *accel_sync_batch_norm(accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                                    accel_tensor *weight, accel_tensor *bias, bool training, double momentum,
                                    double eps, accel_pg *pg);
/* torch.nn.SyncBatchNorm.convert_sync_batchnorm, in place: every
 * BatchNorm1d/2d in m's tree becomes a "SyncBatchNorm" module keeping its
 * tensors (weight, bias, running_mean, running_var, num_batches_tracked: the
 * same names, so state dicts load either way), eps, momentum and training
 * mode; a tree without BatchNorm is left as it is. It takes any input of 2
 * dims or more and synchronises training batches over pg (not owned: it
 * outlives the model, its training forwards and the backward through them,
 * which all-reduces over it). pg NULL: the data-parallel group of the accelerator
 * that prepares the model (accel_accelerator_dp_group: also right under tp
 * or pp), from prepare until the model is unprepared or the accelerator
 * freed; before prepare the default group (accel_dist_default_group) at
 * each forward; not distributed (no accel_dist_init), plain BatchNorm.
 * Converting again binds the new group. Call it before prepare, as torch.
 * NULL m: an error. */
accel_status accel_convert_sync_batchnorm(accel_module *m, accel_pg *pg);

/* Megatron's copy_to_tensor_model_parallel_region: x itself forward (a view),
 * and the sum over pg of the gradient backward (x's consumers on the other
 * ranks used it too). */
accel_tensor *accel_tp_copy_to_region(accel_tensor *x, accel_pg *pg);
/* Megatron's reduce_from_tensor_model_parallel_region: the sum over pg of x
 * forward; the gradient passed back unchanged (every rank's result is the
 * same tensor, so each rank's x gets the whole gradient). */
accel_tensor *accel_tp_reduce_from_region(accel_tensor *x, accel_pg *pg);
/* Megatron's gather_from_tensor_model_parallel_region: x [..., n] -> [...,
 * n * size(pg)], every rank's x along the last dim in rank order (a
 * column-parallel layer's output made whole: the logits under tp when
 * generating); backward, this rank's columns of the gradient. */
accel_tensor *accel_tp_gather_from_region(accel_tensor *x, accel_pg *pg);

/* Cross-entropy over vocabulary-parallel logits (Megatron's
 * vocab_parallel_cross_entropy): logits [..., V / tp] hold this rank's
 * columns [vocab_start, vocab_start + V / tp) of the full logits; targets as
 * accel_cross_entropy takes them (full vocabulary ids, or ignore_index).
 * Returns the mean over the targets != ignore_index of the full cross-entropy
 * on every rank, from two all-reduces (the maxima of the rows' logsumexps
 * over each rank's columns, then the sums of exp(lse - max), target logits
 * and owner counts): the [N, V] logits are never gathered. Fused: it keeps
 * the logits (an f32 copy when they are not contiguous f32) and [N] numbers
 * per row, and its backward writes the gradient, each rank's own columns of
 * (softmax - one-hot) / count, in one pass. A target that no rank's columns hold, or that several ranks'
 * (overlapping slices, whose ranges the error names), fails on every rank. */
accel_tensor *accel_tp_cross_entropy(accel_tensor *logits, accel_tensor *targets, int64_t vocab_start,
                                     int64_t ignore_index, accel_pg *pg);

/* Megatron's sequence parallelism: between the tensor-parallel regions the
 * activations [B, T, ...] are split along the sequence (dim 1), each rank
 * holding T / tp positions, so the norms and residual adds run on 1 / tp of
 * them. gather_seq: [B, T / tp, ...] -> [B, T, ...] (the ranks' slices in
 * rank order) forward, a reduce-scatter of the gradient backward (it enters
 * a column-parallel region); scatter_seq: [B, T, ...] partial sums ->
 * [B, T / tp, ...], this rank's slice of the sum over pg (a row-parallel
 * region's exit; T must be a multiple of the group's size), an all-gather
 * of the gradient backward. */
accel_tensor *accel_tp_gather_seq(accel_tensor *x, accel_pg *pg);
accel_tensor *accel_tp_scatter_seq(accel_tensor *x, accel_pg *pg);

/* ---------------------------------------------------------------- parallelize_module */

typedef enum accel_tp_style {
    /* Linear: weight rows (and bias) split; input replicated, output the
     * rank's slice of the features [.., out / tp]. (A transformers Conv1D,
     * weight [in, out]: its columns.) */
    ACCEL_TP_COLWISE = 0,
    /* Linear: weight columns split, bias kept whole; input the rank's slice
     * [.., in / tp] (or the whole input, which it slices itself), output the
     * sum over the ranks, replicated. (A Conv1D: its weight's rows.) */
    ACCEL_TP_ROWWISE,
    /* Embedding: rows (the vocabulary) split; ids of the full vocabulary in,
     * each rank looks up the ids its rows hold, zeros for the others, and
     * the sum over the ranks is the replicated output. A padding_idx (BERT's,
     * the decoders' pad_token_id) stays the rank's that holds its row. */
    ACCEL_TP_VOCAB_EMBEDDING,
} accel_tp_style;

typedef struct accel_tp_plan_entry {
    /* Module path relative to the root ("layers.0.mlp.up_proj"); '*' matches
     * any run of characters within one dotted name ("layers.*.mlp.up_proj"). */
    const char *pattern;
    accel_tp_style style;
    /* Sequence parallelism: COLWISE takes its input split along the
     * sequence (accel_tp_gather_seq instead of the copy), ROWWISE and
     * VOCAB_EMBEDDING give their output split (accel_tp_scatter_seq instead
     * of the all-reduce). The parameters outside the tp regions (norms, a
     * row-parallel bias) then see 1 / tp of the positions: their gradients
     * are summed by accel_module_tp_reduce_grads. */
    bool sequence_parallel;
} accel_tp_plan_entry;

/* Parallelizes every module of root whose path matches a plan entry (the
 * first matching entry wins): the module keeps only this rank's slice of
 * its full weights (rank accel_pg_rank(pg) of accel_pg_size(pg) equal
 * slices; sizes that do not divide are refused naming the module), as
 * parameters of the same names, and runs the style's forward over pg. Tied
 * parameters stay tied (the same slice). Refused, naming the entry or module:
 * a pattern matching nothing, a style on a module of the wrong type (COLWISE
 * and ROWWISE take a Linear, VOCAB_EMBEDDING an Embedding), a module already
 * parallelized, meta weights, a model already prepared by an accelerator.
 * COLWISE and ROWWISE also take transformers' Conv1D (GPT-2's projections).
 * Collective over pg only in that every rank must make the call (the slices
 * are cut locally: every rank starts from the same full weights, e.g. the
 * same seed or checkpoint). pg must outlive root. */
accel_status accel_module_parallelize(accel_module *root, const accel_tp_plan_entry *plan, int n_entries,
                                      accel_pg *pg);

/* Sums over pg the gradient of every parameter of root that is whole on
 * every rank (not a tp slice): under sequence parallelism each rank's holds
 * its positions' part only (Megatron's all-reduce of the sequence-parallel
 * gradients). Call it after the backward pass (after the last one of an
 * accumulation) and before clipping and the step; the accelerator does.
 * Collective over pg. Without sequence parallelism it is not needed (those
 * gradients are whole already) and would multiply them by the group's size. */
accel_status accel_module_tp_reduce_grads(accel_module *root, accel_pg *pg);

/* How a module was parallelized: true with *style, the group (once that
 * group is freed, a stand-in with its rank and size on which every call fails
 * with ACCEL_ERR_STATE naming it; out of memory for that stand-in, one of no
 * group, rank 0 of 1, whose calls fail so too) and the slice
 * [*start, *start + local) of the split dimension (rows for COLWISE and
 * VOCAB_EMBEDDING, columns for ROWWISE) of *full (its whole size) when m is
 * a parallelized Linear or Embedding whose slice is that one range; false (no
 * error) otherwise, also for the slices one range does not describe (a
 * Conv1D's, a fused projection's parts: accel_module_tp_slice describes
 * every parameter). Any out pointer may be NULL. */
bool accel_module_tp_info(const accel_module *m, accel_tp_style *style, accel_pg **pg, int64_t *start,
                          int64_t *full);

/* The most parts a split dimension has (a fused q | k | v projection's). */
#define ACCEL_TP_MAX_PARTS 3

/* Which elements of the whole tensor a rank's slice holds: along dimension
 * `dim` the whole is n_parts consecutive parts of full[p] elements (a fused
 * projection's q | k | v or gate | up; one part otherwise), and the slice is
 * elements [start[p], start[p] + local[p]) of each part (offsets within the
 * part), concatenated in part order. */
typedef struct accel_tp_slice {
    int dim;
    int n_parts;
    int64_t full[ACCEL_TP_MAX_PARTS], start[ACCEL_TP_MAX_PARTS], local[ACCEL_TP_MAX_PARTS];
} accel_tp_slice;

/* True with *s when t, a parameter of module m, is this rank's slice of a
 * whole tensor (a parallelized module's weight, a column-parallel bias);
 * false (no error) when t is whole on every rank (a row-parallel bias,
 * replicated key/value rows, norms) or m is not parallelized. */
bool accel_module_tp_slice(const accel_module *m, const accel_tensor *t, accel_tp_slice *s);

/* This rank's slice s of whole (the whole tensor's shape along s->dim):
 * a step tensor (a view for one part), differentiable. NULL + error when
 * whole does not fit s. */
accel_tensor *accel_tp_slice_of(accel_tensor *whole, const accel_tp_slice *s);

/* The decoder families' own plan (Megatron-LM's) on a causal LM built by
 * accel_llama_new or loaded: in every layer q_proj, k_proj, v_proj, gate_proj
 * and up_proj column-parallel, o_proj and down_proj row-parallel, so each rank
 * computes heads / tp query heads and kv_heads / tp key/value heads; with
 * fewer key/value heads than ranks (tp a multiple of kv_heads) each is
 * replicated on tp / kv_heads ranks: k_proj and v_proj stay whole on every
 * rank, each using its head's rows, their gradients summed over pg.
 * embed_tokens is vocab-parallel and lm_head column-parallel (kept tied when
 * tied): accel_llama_forward then returns this rank's vocabulary columns of
 * the logits [B, T, V / tp] (rows [rank V / tp, (rank + 1) V / tp)), and
 * accel_llama_loss takes them through accel_tp_cross_entropy. Refused,
 * naming the size: heads, intermediate_size or vocab_size not multiples of
 * tp, kv_heads neither a multiple nor a divisor of tp. Every family has the
 * plan: Qwen3's per-head q/k norms stay whole on every rank, their
 * gradients summed over pg; OLMo 2's q/k norms over all the heads keep
 * their weights whole too, each rank using its heads' rows, the mean square
 * summed over pg; Phi-3's fused qkv_proj and gate_up_proj are cut per part
 * (q, k, v; gate, up), qkv_proj kept whole when kv heads are replicated;
 * GPT-2's Conv1D c_attn (per q/k/v part) and c_fc column-parallel, the
 * c_projs row-parallel, wte vocab-parallel; GPT-NeoX's query_key_value
 * column-parallel (its rows are per head: each rank its heads' q, k and v),
 * dense and dense_4h_to_h row-parallel, dense_h_to_4h column-parallel,
 * embed_in / embed_out by vocabulary. With a KV cache
 * (accel_llama_forward, accel_generate) the logits are gathered: [B, T, V]
 * on every rank, each caching its own key/value heads.
 * sequence_parallel: Megatron's sequence parallelism on top (every entry of
 * the plan with .sequence_parallel): the residual stream, norms and
 * embeddings' output hold T / tp positions (T, the ids' length, a multiple
 * of tp), the lm_head gathers them; accel_module_tp_reduce_grads after each
 * backward (the accelerator calls it); no KV cache then. */
accel_status accel_llama_parallelize(accel_module *llama, accel_pg *pg, bool sequence_parallel);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_PARALLEL_H */
