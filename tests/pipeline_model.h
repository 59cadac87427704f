/* The Llama the pipeline's tests and benchmark train (tests/test_pipeline.c,
 * tests/test_pipeline_checkpoint.c, bench/bench_pipeline.c), and the tests'
 * token batches. A model of the given sizes, f32 on the cpu, built after
 * accel_manual_seed(seed): the same on every rank. The caller owns it. */
#ifndef ACCEL_TESTS_PIPELINE_MODEL_H
#define ACCEL_TESTS_PIPELINE_MODEL_H

#include <stdio.h>
#include <string.h>

#include "accel/accel.h"

typedef struct pipeline_model {
    uint64_t seed;
    int64_t vocab, hidden, ffn, positions;
    int layers, heads, kv_heads;
    bool tied;
    /* NULL or "llama": a Llama; "gemma2": Gemma-2 with a sliding window of 4
     * keys on its even layers, attention and final logit soft-capping;
     * "gemma3_text": Gemma 3 with that window and a local RoPE base of 100 on
     * its even layers, linear RoPE scaling 2 on the odd ones, final logit
     * soft-capping; "phi": Phi (parallel attention and MLP, biases, a head
     * bias beside a tied embedding) rotating half of each head, with
     * qk_layernorm; "gpt_neox": GPT-NeoX (its own tree, per-head fused
     * query_key_value, parallel attention and MLP from two LayerNorms,
     * attention biases) with as many kv heads as heads, rotating half of
     * each head; "stablelm": StableLM's parallel residual (one
     * input_layernorm feeding both branches) with per-head q/k LayerNorms
     * (qk_layernorm), q/k/v biases, rotating half of each head;
     * "starcoder2": Starcoder2 (LayerNorms, biases everywhere, a window of
     * 4 keys, which bites at the tests' T = 12) */
    const char *family;
} pipeline_model;

static inline accel_module *pipeline_llama(pipeline_model p) {
    accel_manual_seed(p.seed);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.ffn;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.max_position_embeddings = p.positions;
    c.tie_word_embeddings = p.tied;
    if (p.family) snprintf(c.model_type, sizeof c.model_type, "%s", p.family);
    if (p.family && !strcmp(p.family, "gemma2"))
        c.sliding_window = 4, c.attn_logit_softcapping = 5, c.final_logit_softcapping = 10, c.query_pre_attn_scalar = 8;
    if (p.family && !strcmp(p.family, "gemma3_text"))
        c.sliding_window = 4, c.sliding_window_pattern = 2, c.rope_local_base_freq = 100, c.final_logit_softcapping = 10,
        c.rope_scaling = (accel_rope_scaling){.type = ACCEL_ROPE_LINEAR, .factor = 2};
    if (p.family && !strcmp(p.family, "phi")) c.partial_rotary_factor = 0.5, c.qk_layernorm = true;
    if (p.family && !strcmp(p.family, "gpt_neox"))
        c.num_key_value_heads = p.heads, c.partial_rotary_factor = 0.5, c.attention_bias = true;
    if (p.family && !strcmp(p.family, "stablelm"))
        c.partial_rotary_factor = 0.5, c.qk_layernorm = true, c.attention_bias = true, c.sequential_residual = false;
    if (p.family && !strcmp(p.family, "starcoder2")) c.attention_bias = c.mlp_bias = true, c.sliding_window = 4;
    c.torch_dtype = ACCEL_F32;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* Rows [row0, row0 + rows) of step s's batch [rows, t] of ids below vocab:
 * deterministic, different rows and steps different. */
static inline accel_tensor *pipeline_batch(int s, int row0, int rows, int t, int vocab) {
    int64_t ids[64 * 16];
    if (rows * t > 64 * 16) return NULL;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < t; k++) ids[r * t + k] = ((row0 + r) * 7 + k * 3 + s * 11 + (row0 + r) * k) % vocab;
    return accel_from_data(ACCEL_I64, ACCEL_SHAPE(rows, t), ids);
}

#endif
