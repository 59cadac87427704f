/* src/bigmodel/mesh_memory.h — a transformer's parameters on one rank of a
 * tensor- x pipeline-parallel mesh, as `accel estimate-memory --tp_size
 * --pp_size` models them (docs/bigmodel.md "Per mesh") (internal).
 *
 * The model (Megatron-LM's split of a Llama-block transformer):
 * - tensor parallelism: q/k/v, gate/up (and the fused qkv_proj, gate_up_proj)
 *   split along their outputs, their biases too; o_proj and down_proj along
 *   their inputs, their biases whole; the embedding and lm_head split along
 *   the vocabulary; norms whole. Key/value heads: ceil(kv_heads / tp) a rank
 *   (fewer heads than tp: k_proj and v_proj, Phi-3's whole qkv_proj, kept
 *   whole on every rank, as accel's plan keeps them, each rank using its
 *   head's rows; Megatron would keep the one head); every split rounds up.
 *   GPT-2's Conv1D weights [in, out] as the plan cuts them: c_attn (per
 *   q | k | v part) and c_fc along their columns, their biases too; the two
 *   c_proj along their rows, their biases whole; wpe whole. Phi's dense as
 *   o_proj, fc1 and fc2 as up_proj and down_proj; its lm_head's bias split
 *   with the vocabulary. GPT-NeoX's query_key_value (rows per head) along
 *   its outputs by heads, dense_h_to_4h and dense_4h_to_h as up_proj and
 *   down_proj, embed_in and embed_out along the vocabulary.
 * - pipeline parallelism: the stages' layers as the runtime splits them
 *   (accel__decoder_stage_split, nn/decoder_pipeline.h: contiguous ranges
 *   minimising the largest stage's parameter count, the embedding counted on
 *   the first stage, the final norm and an untied lm_head on the last); the
 *   embedding on the first stage, the final norm and lm_head on the last, and
 *   a tied lm_head there as a copy of the embedding when pp > 1 (Megatron's
 *   shared word embeddings). A tree the runtime does not cut (GPT-2's) is
 *   refused when pp > 1, as the runtime refuses it.
 * Layers are found by name (model.layers.<i>, GPT-2's transformer.h.<i>); a
 * 2-D layer weight of no kind above is refused when tp > 1.
 * The rank reported is the one holding the most bytes. */
#ifndef ACCEL_BIGMODEL_MESH_MEMORY_H
#define ACCEL_BIGMODEL_MESH_MEMORY_H

#include <stdint.h>

#include "accel/nn.h"

typedef struct accel__mesh_bytes {
    int64_t param_bytes;  /* that rank's parameters and buffers, in the model's dtypes */
    int64_t largest_unit; /* its largest wrap unit: a decoder layer, or the embedding / lm_head */
    int stage;            /* its pipeline stage */
    int first_layer, n_layers; /* its decoder layers */
} accel__mesh_bytes;

/* m: built from cfg (on meta is enough: only shapes are read). tp, pp >= 1;
 * pp <= num_hidden_layers. Errors: ACCEL_ERR_INVALID_ARG naming the size, or
 * ACCEL_ERR_UNSUPPORTED naming a 2-D weight of a layer it cannot split or,
 * with pp > 1, a model the pipeline does not cut. */
accel_status accel__mesh_param_bytes(accel_module *m, const accel_llama_config *cfg, int tp, int pp,
                                     accel__mesh_bytes *out);

/* One state-dict entry's bytes on a rank of tp (1: its own), split as above;
 * -1 (error set) for a 2-D weight of a layer with no split modelled. */
int64_t accel__mesh_entry_bytes(const accel_state_entry *e, const accel_llama_config *cfg, int tp);

#endif
