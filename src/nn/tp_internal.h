/* Tensor parallelism inside src/nn (not public API): what the decoder's
 * plan needs beyond accel/parallel.h. */
#ifndef ACCEL_NN_TP_INTERNAL_H
#define ACCEL_NN_TP_INTERNAL_H

#include "accel/parallel.h"

/* A Linear whose output rows this rank uses while it keeps the whole
 * weight, replicated on every rank of the group: the K/V projections when
 * a model has fewer KV heads than tp ranks (Megatron replicates those
 * heads), Phi-3's fused qkv_proj then. The weight goes through
 * accel_tp_copy_to_region before its rows are taken, so its gradient is the
 * sum of every rank's part: the whole gradient, the same on every rank. */
#define ACCEL__TP_REPLICA_ROWS ((accel_tp_style)100)

/* The slice a rank takes of a split dimension: n consecutive parts of
 * size[p] elements (q | k | v of a fused projection; n 1: the whole
 * dimension), of each part slice index[p] of count[p] equal ones. */
typedef struct accel__tp_parts {
    int n;
    int64_t size[ACCEL_TP_MAX_PARTS];
    int index[ACCEL_TP_MAX_PARTS], count[ACCEL_TP_MAX_PARTS];
} accel__tp_parts;

/* An RMSNorm (or a LayerNorm, per head: Phi's q_layernorm / k_layernorm,
 * weight and bias) whose weight, whole on every rank, normalizes this rank's
 * part of the activations: rows NULL, each head's own (Qwen3's q_norm /
 * k_norm over head_dim); else this rank's rows of a norm over the whole
 * width rows->size[0] (OLMo 2's q_norm / k_norm over every head), the sum
 * of squares summed over the group, each row held by `rep` ranks (the
 * replicated key/value heads). Its weight goes through
 * accel_tp_copy_to_region, so its gradient is every rank's part summed.
 * plus_one: Gemma's kind, x / rms * (1 + weight) in f32 (Gemma 3's per-head
 * q_norm / k_norm; never with rows: accel__arch_unsupported keeps such a row out). Replaces m's ops and impl
 * (the norm's eps given). */
accel_status accel__tp_replica_norm(accel_module *m, accel_pg *pg, double eps, const accel__tp_parts *rows, int rep,
                                    bool plus_one);

/* StableLM's q/k_layernorm m (StableLmLayerNormPerHead: norms.0 .. ,
 * each a LayerNorm [head_dim] without bias, whole on every rank) normalizing
 * this rank's heads, first .. first + n - 1 of x [B, T, n, D] (eps: the
 * norms'). The weights go through accel_tp_copy_to_region, so their
 * gradients are every rank's parts summed. Replaces m's ops and impl. */
accel_status accel__tp_norm_per_head(accel_module *m, accel_pg *pg, double eps, int64_t first);

/* One module of a plan: m (a Linear, Conv1D or Embedding) parallelized with
 * style over pg (sp: sequence parallel, as the plan entry's field), its
 * split dimension cut as `parts` says (for ACCEL__TP_REPLICA_ROWS: the rows
 * used, the weight kept whole). inner: m runs inside a region its caller
 * enters and leaves once for several modules (accel__tp_enter,
 * accel__tp_leave: a sparse block's router and experts), so it takes the
 * region's input as it is and a row-parallel one returns its partial sum
 * (with no bias, which each rank would add). */
accel_status accel__tp_parallelize_one(accel_module *m, accel_tp_style style, accel_pg *pg,
                                       const accel__tp_parts *parts, bool sp, bool inner, const char *path);

/* Into and out of tensor-parallel module m's region, as m's own forward
 * would enter and leave it: the input copied in (its gradient summed over
 * the group) or, under sequence parallelism, the sequence gathered; the
 * output summed over the group or reduce-scattered to this rank's positions
 * (generating with a KV cache: unsplit, as accel__tp_sequence_split says). */
accel_tensor *accel__tp_enter(const accel_module *m, accel_tensor *x);
accel_tensor *accel__tp_leave(const accel_module *m, accel_tensor *y);

/* The group of tensor-parallel module m (accel__tp_is_replica's too), its
 * tombstone once that group is freed (accel__tp_orphan; out of memory for
 * it, accel__pg_tombstone_unnamed); NULL when m is none. */
accel_pg *accel__tp_group(const accel_module *m);

/* When pg's owner lets it go (an accelerator freed, or un-preparing the
 * model, while m's tensor-parallel modules still compute over pg): each
 * module over pg gets a tombstone of it (dist/backend.h), so a later forward
 * fails at its first collective with `why` instead of reading the freed
 * group. accel__tp_adopt gives pg back to the modules whose tombstone stands
 * for it (a model prepared again by the same accelerator), known by its id
 * (and its size and this rank's place, which the slices were cut for): a
 * group made later at the freed one's address is another. A module whose
 * group is freed with no owner to tell it (accel_pg_free, the last
 * accel_dist_finalize) gets its tombstone at its next use. */
void accel__tp_orphan(accel_module *m, const accel_pg *pg, const char *why);
void accel__tp_adopt(accel_module *m, accel_pg *pg);

/* The weight [out, in] the GEMM of tensor-parallel Linear m reads: its
 * slice (column- or row-parallel) or the rows it uses (replicated rows);
 * false when m is not a tensor-parallel Linear (a Conv1D's, an Embedding,
 * a norm, a plain module). mixed_precision='fp8' converts m when both are
 * multiples of 16 (nn/fp8_modules.h). */
bool accel__tp_linear_gemm_shape(const accel_module *m, int64_t shape[2]);

/* Whether m holds whole tensors on every rank, each using its rows
 * (replicated key/value rows, the q/k norms): their gradients are summed
 * over the group by the forward's copy, never again. */
bool accel__tp_is_replica(const accel_module *m);

/* Whether this thread's sequence-parallel modules split the sequence (on:
 * the default) or run as plain tensor parallelism, their activations whole
 * on every rank (off: generation with a KV cache, whose decoding steps have
 * one position, as Megatron and vLLM generate without sequence
 * parallelism). Returns the previous setting, for the caller to restore. */
bool accel__tp_sequence_split(bool on);
/* Whether this thread's sequence-parallel modules split the sequence now. */
bool accel__tp_sequence_splits(void);

/* A new tensor of w's slice s (accel_tp_slice_of's elements), on w's
 * device, requiring grad as w does: a plan's cut of a whole weight, and
 * load_state's of a whole checkpoint tensor. NULL + error when w does not
 * fit s. */
accel_tensor *accel__tp_cut(accel_tensor *w, const accel_tp_slice *s);

/* Why a model of config c cannot run over tp ranks under its own plan
 * (accel_llama_parallelize): ACCEL_ERR_INVALID_ARG naming the size tp does
 * not divide (heads, key/value heads unless tp is their multiple,
 * intermediate_size unless only Qwen's experts would be cut, their
 * moe_intermediate_size, vocab_size), ACCEL_ERR_UNSUPPORTED for a family
 * with no plan; each message starts with who. ACCEL_OK when it can. Read by the
 * plan and by `accel estimate-memory --tp_size`, so the estimate refuses
 * what the runtime refuses. */
accel_status accel__llama_tp_check(const accel_llama_config *c, int tp, const char *who);

/* Applies the model's own tensor-parallel plan when it has one (a causal LM
 * of the architecture table: accel_llama_parallelize): 1 applied, 0 no plan
 * of its own (nothing done, no error), -1 refused (the error set). The
 * accelerator asks this, naming no family. */
int accel__tp_own_plan(accel_module *m, accel_pg *pg, bool sequence_parallel);

/* Whether m's own plan (accel_llama_parallelize) began cutting and failed
 * part-way (out of memory on this rank): the modules it cut are sliced, the
 * others whole, and such a model cannot be prepared. A plan of the user's
 * (accel_module_parallelize, any modules) is never partial here. */
bool accel__tp_own_plan_partial(accel_module *m);

/* The dropout stream of m when m is a causal LM root that its own plan
 * made tensor parallel (accel_llama_parallelize: this tp rank's generator,
 * for the activations sharded over the group, decoder_cp.h); NULL (no
 * error) otherwise. save_state and load_state keep it with the rank's
 * default generator. */
accel_rng *accel__tp_dropout_rng(accel_module *m);
/* The seed of tp rank tp_rank's dropout stream when the process's seed is
 * base: base + 2718 + tp_rank, as Megatron's model_parallel_cuda_manual_seed. */
static inline uint64_t accel__tp_dropout_seed(uint64_t base, int tp_rank) { return base + 2718u + (uint64_t)tp_rank; }

/* Sets the query and key/value heads a decoder layer computes (llama.c's
 * layer; the whole config's until the plan cuts them), and reads its query heads. */
void accel__decoder_layer_set_heads(accel_module *layer, int64_t heads, int64_t kv_heads);
int64_t accel__decoder_layer_heads(const accel_module *layer);

#endif
