/* The tiny Llama the ZeRO-3 tests train: two layers, grouped-query attention
 * (4 heads, 2 key/value heads), vocab 40, hidden 16, ffn 24, 16 positions,
 * tied embeddings (an alias in its state dict: embedding and head share a
 * wrap unit). Seeded, on the CPU, f32. The caller owns the module. */
#ifndef ACCEL_TESTS_TINY_LLAMA_H
#define ACCEL_TESTS_TINY_LLAMA_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"

/* The tiny model's config (a test may widen it: tests/test_prepare_rankfail.c). */
static inline accel_llama_config tiny_llama_config(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = true;
    c.torch_dtype = ACCEL_F32;
    return c;
}

/* The tiny model's config as another family of the architecture table:
 * "mistral" (a window of 4), "qwen2" (its q/k/v biases, the family's own),
 * "gemma", "gemma2" (a window of 4 on layer 0, soft-capped scores and
 * logits, query_pre_attn_scalar 8), "gemma3_text" (its default's layer types
 * by sliding_window_pattern 2: layer 0 sliding with a window of 4, layer 1
 * full with linear RoPE scaling; soft-capped logits), "granite" (its four multipliers),
 * "mixtral" (2 of 8 experts), "qwen3_moe" (2 of 16 experts of ffn 12),
 * "qwen2_moe" (2 of 8 experts of ffn 12 beside a shared expert of ffn 8;
 * layer 0 dense by mlp_only_layers; q/k/v biases), "phi" (half of each head rotated, as
 * PhiConfig's default; qk_layernorm; tied, its head's bias its own),
 * "gpt_neox" (as many kv heads as heads, half of each head rotated,
 * attention biases; tied), "stablelm" (sequential, its config.json's
 * default; q/k/v biases, half of each head rotated; tied), "starcoder2"
 * (biases everywhere, a window of 4; tied). */
static inline accel_llama_config tiny_family_config(const char *model_type) {
    accel_llama_config c = tiny_llama_config();
    snprintf(c.model_type, sizeof c.model_type, "%s", model_type);
    if (!strcmp(model_type, "mistral")) c.sliding_window = 4;
    if (!strcmp(model_type, "gemma2"))
        c.sliding_window = 4, c.attn_logit_softcapping = 5, c.final_logit_softcapping = 10, c.query_pre_attn_scalar = 8;
    if (!strcmp(model_type, "gemma3_text"))
        c.sliding_window = 4, c.sliding_window_pattern = 2, c.final_logit_softcapping = 10, c.query_pre_attn_scalar = 8,
        c.rope_scaling = (accel_rope_scaling){.type = ACCEL_ROPE_LINEAR, .factor = 2};
    if (!strcmp(model_type, "gpt2")) c.num_key_value_heads = 4; /* as many kv heads as heads */
    if (!strcmp(model_type, "phi")) c.partial_rotary_factor = 0.5, c.qk_layernorm = true;
    if (!strcmp(model_type, "gpt_neox")) c.num_key_value_heads = 4, c.partial_rotary_factor = 0.5, c.attention_bias = true;
    if (!strcmp(model_type, "stablelm")) c.sequential_residual = true, c.partial_rotary_factor = 0.5, c.attention_bias = true;
    if (!strcmp(model_type, "starcoder2")) c.attention_bias = c.mlp_bias = true, c.sliding_window = 4;
    /* more experts than a micro-batch's tokens choose: some get none on a rank */
    if (!strcmp(model_type, "mixtral")) c.num_local_experts = 8, c.num_experts_per_tok = 2;
    if (!strcmp(model_type, "qwen3_moe"))
        c.num_local_experts = 16, c.num_experts_per_tok = 2, c.moe_intermediate_size = 12, c.decoder_sparse_step = 1;
    if (!strcmp(model_type, "qwen2_moe")) {
        c.num_local_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 12, c.decoder_sparse_step = 1;
        c.shared_expert_intermediate_size = 8, c.n_mlp_only_layers = 1, c.mlp_only_layers[0] = 0;
        c.attention_bias = true; /* its qkv_bias: q/k/v biases, as Qwen2MoeConfig's default */
    }
    if (!strcmp(model_type, "granite"))
        c.embedding_multiplier = 6, c.attention_multiplier = 0.2, c.residual_multiplier = 0.4, c.logits_scaling = 4;
    return c;
}

/* The tiny model of tiny_family_config(model_type), seeded, with
 * qk_layernorm turned on where qk (StableLM's per-head q/k norms), kept as
 * the family has it otherwise (Phi's on). */
static inline accel_module *tiny_family_qk(uint64_t seed, const char *model_type, bool qk) {
    accel_manual_seed(seed);
    accel_llama_config c = tiny_family_config(model_type);
    if (qk) c.qk_layernorm = true;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static inline accel_module *tiny_family(uint64_t seed, const char *model_type) {
    return tiny_family_qk(seed, model_type, false);
}

/* Whether m (a tiny model of 2 layers, 4 query heads, 2 key/value heads)
 * has StableLM's per-head q/k norms: one per head. */
static inline bool has_per_head_qk_norms(accel_module *m) {
    return accel_module_get_tensor(m, "model.layers.1.self_attn.q_layernorm.norms.3.weight") &&
           accel_module_get_tensor(m, "model.layers.1.self_attn.k_layernorm.norms.1.weight");
}

static inline accel_module *tiny_llama(uint64_t seed) { return tiny_family(seed, "llama"); }

#endif
