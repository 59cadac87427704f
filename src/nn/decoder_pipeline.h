/* src/nn/decoder_pipeline.h — a decoder model (accel_llama_new's) cut into
 * pipeline stages by layer ranges (internal).
 *
 * Stage s of p runs layers [first_layer[s], first_layer[s + 1]) of the
 * decoder stack; stage 0 also the embeddings before them, the last stage the
 * final norm and lm_head after them (accel__decoder_stage_forward, llama.c).
 * GPT-2's tree is not cut (accel__decoder_stage_split refuses it). */
#ifndef ACCEL_NN_DECODER_PIPELINE_H
#define ACCEL_NN_DECODER_PIPELINE_H

#include "accel/nn.h"
#include "family.h"

/* decoder_pipeline.c: the decoder families' stage hooks (family.h), the
 * functions below behind the family table's row. */
extern const accel__family_stages accel__decoder_stages;

/* llama.c: the decoder layers' ModuleList of a causal LM root built by
 * accel_llama_new, else NULL (no error). */
accel_module *accel__decoder_layers(accel_module *llama);
/* llama.c: llama (a root of accel_llama_new) keeps only stage `stage` of
 * `stages`, the others' parameters on meta: its own forward (and so its
 * loss and generation) refuses from then on, ACCEL_ERR_STATE naming why,
 * instead of computing a result without data. */
void accel__decoder_stage_released(accel_module *llama, int stage, int stages);
/* llama.c: one stage's forward, training (no cache), inside the root's and
 * the model's hooks: first: x is ids [B, T] and the embeddings run first,
 * else x is the hidden state [B, T, C]; layers [lo, hi); last: the final
 * norm and lm_head after (logits [B, T, V]), else the hidden state. */
accel_tensor *accel__decoder_stage_forward(accel_module *llama, accel_tensor *x, int lo, int hi, bool first,
                                           bool last);
/* llama.c: transformers' ForCausalLMLoss of llama's logits [B, T, V] for ids
 * [B, T] (labels: ids shifted left; mean over B (T - 1) tokens; under tp the
 * logits are this rank's vocabulary columns and the loss the parallel one;
 * under cp they are this rank's chunks of the positions, accel_cp_shard of
 * ids, and the loss the whole sequence's, collective over the cp group).
 * NULL logits: NULL. */
accel_tensor *accel__causal_lm_loss(accel_module *llama, accel_tensor *logits, accel_tensor *ids);

/* The layer ranges of `stages` stages: first_layer[0..stages] (first_layer[0]
 * = 0, first_layer[stages] = the layer count). explicit_layers (NULL: none)
 * gives each stage's layer count (they must sum to the layer count, each >= 1);
 * else the split minimises the largest stage's parameter count, counting the
 * embeddings on stage 0 and the final norm and an untied lm_head on the
 * last (Megatron's balance, and what a stage holds in memory). Refuses fewer
 * layers than stages and a model this cannot cut, naming `who`. */
accel_status accel__decoder_stage_split(accel_module *llama, int stages, const int *explicit_layers,
                                        int *first_layer, const char *who);

#endif
