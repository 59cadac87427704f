/* The architecture table (arch.h): what differs between the decoder-only
 * families, one row each. Adding a family that needs no new kind of block is
 * adding a row here. */
#include <string.h>

#include "arch.h"

/* One family's module ops: its class names over the shared forwards. */
#define ARCH_OPS(P)                                                        \
    .causal_lm = {P "ForCausalLM", accel__decoder_no_forward, NULL},       \
    .model = {P "Model", accel__decoder_no_forward, NULL},                 \
    .layer = {P "DecoderLayer", accel__decoder_layer_call, NULL},          \
    .attn = {P "Attention", NULL, NULL}, .mlp = {P "MLP", accel__decoder_mlp_forward, NULL}, \
    .norm = {P "RMSNorm", accel__rms_norm_forward, NULL}

/* transformers' XConfig() defaults: the fields the families share the values
 * of, and those that differ (kv heads 0: as many as the heads; head_dim 0:
 * hidden_size / heads). */
#define DEFAULTS(type, vocab, inter, kv, hd, max_pos, window, max_window)                                     \
    .defaults = {.vocab_size = vocab, .hidden_size = 4096, .intermediate_size = inter, .num_hidden_layers = 32, \
                 .num_attention_heads = 32, .num_key_value_heads = kv, .head_dim = hd,                           \
                 .max_position_embeddings = max_pos, .rms_norm_eps = 1e-6, .rope_theta = 10000.0,               \
                 .initializer_range = 0.02, .torch_dtype = ACCEL_F32, .model_type = type,                       \
                 .sliding_window = window, .max_window_layers = max_window}

static const accel__arch ARCHS[] = {
    {.model_type = "llama", ARCH_OPS("Llama"), .attention_bias = true, .mlp_bias = true,
     .window = ACCEL__WINDOW_NONE, DEFAULTS("llama", 32000, 11008, 0, 0, 2048, 0, 0)},
    {.model_type = "mistral", ARCH_OPS("Mistral"), .window = ACCEL__WINDOW_ALL,
     DEFAULTS("mistral", 32000, 14336, 8, 0, 4096 * 32, 4096, 0)},
    /* Qwen2/3: sliding_window (4096 when absent) only counts with use_sliding_window (default off) */
    {.model_type = "qwen2", ARCH_OPS("Qwen2"), .qkv_bias = true, .window = ACCEL__WINDOW_QWEN2,
     DEFAULTS("qwen2", 151936, 22016, 0, 0, 32768, 4096, 28)},
    {.model_type = "qwen3", ARCH_OPS("Qwen3"), .qk_norm = true, .attention_bias = true,
     .window = ACCEL__WINDOW_QWEN2, DEFAULTS("qwen3", 151936, 22016, 0, 128, 32768, 4096, 28)},
    /* GPT-2: GPT2Config() defaults (n_embd 768, n_layer 12, n_head 12, n_inner 4 n_embd,
     * n_positions 1024, layer_norm_epsilon 1e-5, dropouts 0.1, tied head) */
    {.model_type = "gpt2", .causal_lm = {"GPT2LMHeadModel", accel__decoder_no_forward, NULL},
     .model = {"GPT2Model", accel__decoder_no_forward, NULL}, .layer = {"GPT2Block", accel__decoder_layer_call, NULL},
     .attn = {"GPT2Attention", NULL, NULL}, .mlp = {"GPT2MLP", accel__gelu_mlp_forward, NULL},
     .norm = {"LayerNorm", accel__layer_norm_forward, NULL}, .window = ACCEL__WINDOW_NONE,
     .blocks = ACCEL__BLOCKS_GPT2,
     .defaults = {.vocab_size = 50257, .hidden_size = 768, .intermediate_size = 3072, .num_hidden_layers = 12,
                  .num_attention_heads = 12, .max_position_embeddings = 1024, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .tie_word_embeddings = true,
                  .torch_dtype = ACCEL_F32, .model_type = "gpt2", .attn_pdrop = 0.1, .resid_pdrop = 0.1,
                  .embd_pdrop = 0.1}},
};
#define N_ARCHS (sizeof ARCHS / sizeof *ARCHS)

const accel__arch *accel__arch_find(const char *model_type) {
    if (!model_type || !*model_type) return &ARCHS[0];
    for (size_t i = 0; i < N_ARCHS; i++)
        if (!strcmp(ARCHS[i].model_type, model_type)) return &ARCHS[i];
    return NULL;
}

const accel__arch *accel__arch_of_module(const accel_module *m) {
    if (!m) return NULL;
    for (size_t i = 0; i < N_ARCHS; i++) {
        const accel__arch *a = &ARCHS[i];
        if (m->ops == &a->causal_lm || m->ops == &a->model || m->ops == &a->layer || m->ops == &a->attn ||
            m->ops == &a->mlp || m->ops == &a->norm)
            return a;
    }
    return NULL;
}

const char *accel__arch_names(void) { return "\"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gpt2\""; }

const char *accel_module_decoder_layer_class(const accel_module *m) {
    for (; m; m = m->parent) {
        const accel__arch *a = accel__arch_of_module(m);
        if (a) return a->layer.type_name;
    }
    return NULL;
}
