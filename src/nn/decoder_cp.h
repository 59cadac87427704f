/* The decoder models' hooks for context parallelism (decoder_cp.c), called
 * by llama.c on a model given a cp group by accel_llama_context_parallelize
 * (accel/cp.h). The group lives in the model's root, not in the thread. */
#ifndef ACCEL_NN_DECODER_CP_H
#define ACCEL_NN_DECODER_CP_H

#include "accel/cp.h"
#include "accel/nn.h"
#include "arch.h"

/* A model's context-parallel setting: pg NULL when it runs unsharded. */
typedef struct accel__decoder_cp {
    accel_pg *pg; /* the caller's, kept alive while set */
    accel_cp_strategy strategy;
} accel__decoder_cp;

/* The dropout stream of a tensor-parallel decoder (Megatron's
 * model-parallel RNG tracker): on (set by accel_llama_parallelize) with this
 * tp rank's generator, seeded base + 2718 + tp rank, which draws the masks
 * of the activations sharded over the tp group (the attention's, on this
 * rank's heads; under sequence parallelism, seq_split, the embeddings' and
 * branches', on this rank's positions). Replicated activations draw from the
 * default generator, the same on every tp rank. */
typedef struct accel__decoder_tp_rng {
    bool on, seq_split;
    accel_rng rng;
} accel__decoder_tp_rng;

/* The impl of a causal LM root built by accel_llama_new: its resolved
 * config first (what accel_llama_config_of returns, and what its layers
 * point at), then its cp setting, which the layers read through that
 * pointer (accel__decoder_cp_of), whether its own tensor-parallel plan
 * (accel_llama_parallelize) began cutting and did not finish: a model cut
 * in part, which no retry can complete (decoder_tp.c), and the plan's
 * dropout stream (accel__decoder_tp_rng_of). */
typedef struct accel__decoder_root {
    accel_llama_config cfg;
    accel__decoder_cp cp;
    bool tp_cut_open;
    accel__decoder_tp_rng tp_rng;
    /* > 1 once a pipeline prepare moved the other stages' parameters to meta
     * (accel__decoder_stage_released): the stages this model was cut into,
     * pp_stage the one it kept. No unprepare brings them back; reset by the
     * forward once no parameter is on meta (a load gave them their data). */
    int pp_stages, pp_stage;
} accel__decoder_root;

/* The cp setting of the root whose config is c (a root's cfg member). */
static inline const accel__decoder_cp *accel__decoder_cp_of(const accel_llama_config *c) {
    return &((const accel__decoder_root *)(const void *)c)->cp;
}

/* The dropout stream of the root whose config is c. Not const: drawing
 * advances it, and the root it is part of is the model's own (writable)
 * impl, which the layers reach only through their const config pointer. */
static inline accel__decoder_tp_rng *accel__decoder_tp_rng_of(const accel_llama_config *c) {
    return &((accel__decoder_root *)(void *)(uintptr_t)c)->tp_rng;
}

/* Why a model of config c cannot run over cp ranks with strategy
 * (accel_llama_context_parallelize) as one rank of tp (1: none; tp divides
 * num_attention_heads): ACCEL_ERR_UNSUPPORTED for a family it does not run
 * (GPT-2: learned position embeddings), ACCEL_ERR_INVALID_ARG when the
 * all-to-all strategy cannot split the rank's query heads over cp; each
 * message starts with who. ACCEL_OK when it can. Read by the runtime, by
 * accel_llama_activation_bytes (.cp_size) and by `accel estimate-memory
 * --cp_size`, so the estimates refuse what the runtime refuses, in its
 * words (as accel__llama_tp_check, nn/tp_internal.h, for tp). */
accel_status accel__llama_cp_check(const accel_llama_config *c, int tp, int cp, accel_cp_strategy strategy,
                                   const char *who);

/* Why a model of config c cannot train over cp ranks although it runs
 * there in eval: the embeddings' or branches' dropout (resid_pdrop,
 * embd_pdrop above 0), whose masks every cp rank would draw alike
 * (ACCEL_ERR_UNSUPPORTED, the message starting with who); ACCEL_OK when it
 * can. Read by the forward while the model trains, and by the training
 * step's estimate (accel_llama_activation_bytes .cp_size, which `accel
 * estimate-memory --cp_size` with a batch reads), so it refuses what a
 * training step refuses. */
accel_status accel__llama_cp_dropout_check(const accel_llama_config *c, const char *who);

/* ACCEL_OK when the model of config c can run sharded on ids [B, 2c]: no KV
 * cache, an even number of positions, no embeddings' or branches' dropout
 * while training; else the refusal naming what cannot. */
accel_status accel__decoder_cp_check(const accel_llama_config *c, bool training, const accel_kv_cache *cache,
                                     const accel_tensor *ids);
/* The whole sequence's length when this rank of cp holds local_T positions. */
int64_t accel__decoder_cp_seq_len(const accel__decoder_cp *cp, int64_t local_T);
/* accel_cp_attention over cp's group with its strategy, with a sliding
 * window of W keys (0: none) and soft-capping at cap (0: none) applied on
 * the global positions, their explicit scores under bf16/f16 with the
 * numerics upcast names (accel__cp_attention: the family's, as its
 * one-process attention takes them). */
accel_tensor *accel__decoder_cp_attention(const accel__decoder_cp *cp, accel_tensor *q, accel_tensor *k,
                                          accel_tensor *v, double scale, int64_t W, double cap, bool upcast);
/* accel_llama_loss of the whole batch ids [B, T] on a model under cp: the
 * forward of this rank's chunks of ids, then accel__causal_lm_loss. */
accel_tensor *accel__decoder_cp_loss(accel_module *llama, const accel__decoder_cp *cp, accel_tensor *ids);
/* The unsharded mean loss from this rank's logits [B, 2c, V] of its chunks
 * (accel_cp_shard) and the whole sequence's labels [B, T] (i64, -100
 * ignored), of which it keeps the same chunks. tp (NULL: none): the group of
 * a vocab-parallel lm_head whose logits are this rank's columns from
 * vocab_start (cp x tp). */
accel_tensor *accel__decoder_cp_labels_loss(const accel__decoder_cp *cp, accel_tensor *logits, accel_tensor *labels,
                                            accel_pg *tp, int64_t vocab_start);

/* llama.c: the query heads llama's layers compute on this rank (the
 * config's; under tp heads / tp). */
int64_t accel__decoder_rank_heads(accel_module *llama);

/* The accelerator's (src/accelerator/cp.c): accel_llama_context_parallelize
 * on m when m is a causal LM root of accel_llama_new: 1 applied (or undone,
 * pg NULL), 0 not such a model (no error), -1 refused (the error set). */
int accel__cp_own_plan(accel_module *m, accel_pg *pg, accel_cp_strategy strategy);
/* The group recorded on m, NULL when none or m is not such a root (no error). */
accel_pg *accel__cp_model_group(const accel_module *m);

#endif
