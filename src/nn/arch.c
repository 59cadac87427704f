/* The architecture table (arch.h): what differs between the decoder-only
 * families, one row each. Adding a family that needs no new kind of block is
 * adding a row here. */
#include <string.h>

#include "arch.h"
#include "decoder_pipeline.h"
#include "family.h"
#include "nn_internal.h"

/* One family's module ops: its class names over the shared forwards. */
#define ARCH_OPS(P)                                                        \
    .causal_lm = {P "ForCausalLM", accel__decoder_no_forward, NULL},       \
    .model = {P "Model", accel__decoder_no_forward, NULL},                 \
    .layer = {P "DecoderLayer", accel__decoder_layer_call, NULL},          \
    .attn = {P "Attention", NULL, NULL}, .mlp = {P "MLP", accel__decoder_mlp_forward, NULL}, \
    .norm = {P "RMSNorm", accel__decoder_norm_forward, NULL}

/* transformers' XConfig() defaults: the fields the families share the values
 * of, and those that differ (kv heads 0: as many as the heads; head_dim 0:
 * hidden_size / heads; then any other fields). DEFAULTS: Llama's sizes. */
#define SIZED_DEFAULTS(type, vocab, hidden, inter, layers, heads, kv, hd, max_pos, window, max_window, ...)       \
    .defaults = {.vocab_size = vocab, .hidden_size = hidden, .intermediate_size = inter,                         \
                 .num_hidden_layers = layers, .num_attention_heads = heads, .num_key_value_heads = kv,           \
                 .head_dim = hd, .max_position_embeddings = max_pos, .rms_norm_eps = 1e-6, .rope_theta = 10000.0, \
                 .initializer_range = 0.02, .torch_dtype = ACCEL_F32, .model_type = type,                       \
                 .sliding_window = window, .max_window_layers = max_window, __VA_ARGS__}
#define DEFAULTS(type, vocab, inter, kv, hd, max_pos, window, max_window, ...)                                   \
    SIZED_DEFAULTS(type, vocab, 4096, inter, 32, 32, kv, hd, max_pos, window, max_window, .tie_word_embeddings = false, \
                   __VA_ARGS__)
/* transformers' bos_token_id and eos_token_id (-1: None); pad_token_id
 * None (Gemma's 0, Phi-3's 32000 and OLMo 2's 1 left out: a default id may
 * lie outside a small vocabulary, and transformers pads with eos without it) */
#define TOKENS(bos, eos)                                                                                  \
    .token_ids_set = true, .bos_token_id = bos, .eos_token_ids = {eos}, .n_eos_token_ids = (eos) >= 0, \
    .pad_token_id = -1
#define LLAMA_TOKENS TOKENS(1, 2)

static const accel__arch ARCHS[] = {
    {.model_type = "llama", ARCH_OPS("Llama"), .attention_bias = true, .mlp_bias = true,
     .window = ACCEL__WINDOW_NONE, DEFAULTS("llama", 32000, 11008, 0, 0, 2048, 0, 0, LLAMA_TOKENS)},
    {.model_type = "mistral", ARCH_OPS("Mistral"), .window = ACCEL__WINDOW_ALL,
     DEFAULTS("mistral", 32000, 14336, 8, 0, 4096 * 32, 4096, 0, LLAMA_TOKENS)},
    /* Qwen2/3: sliding_window (4096 when absent) only counts with use_sliding_window (default off) */
    {.model_type = "qwen2", ARCH_OPS("Qwen2"), .qkv_bias = true, .window = ACCEL__WINDOW_QWEN2,
     DEFAULTS("qwen2", 151936, 22016, 0, 0, 32768, 4096, 28, TOKENS(-1, -1))},
    {.model_type = "qwen3", ARCH_OPS("Qwen3"), .qk_norm = true, .attention_bias = true,
     .window = ACCEL__WINDOW_QWEN2, DEFAULTS("qwen3", 151936, 22016, 0, 128, 32768, 4096, 28, TOKENS(-1, -1))},
    {.model_type = "gemma", ARCH_OPS("Gemma"), .gemma_blocks = true, .attention_bias = true,
     SIZED_DEFAULTS("gemma", 256000, 3072, 24576, 28, 16, 16, 256, 8192, 0, 0, .tie_word_embeddings = true,
                    TOKENS(2, 1))},
    /* Gemma2: also the window on the even layers, soft-capped scores and logits */
    {.model_type = "gemma2", ARCH_OPS("Gemma2"), .gemma_blocks = true, .sandwich_norms = true, .softcap = true,
     .score_softcap = true, .attention_bias = true, .window = ACCEL__WINDOW_EVEN,
     SIZED_DEFAULTS("gemma2", 256000, 2304, 9216, 26, 8, 4, 256, 8192, 4096, 0, .tie_word_embeddings = true,
                    .attn_logit_softcapping = 50.0, .final_logit_softcapping = 30.0, .query_pre_attn_scalar = 256.0,
                    TOKENS(2, 1))},
    /* Gemma 3 (text): Gemma2's blocks with per-head q/k norms of its kind, the
     * window on the sliding_attention layers (five of each six), two RoPEs; no
     * soft-capping by default */
    {.model_type = "gemma3_text", .causal_lm = {"Gemma3ForCausalLM", accel__decoder_no_forward, NULL},
     .model = {"Gemma3TextModel", accel__decoder_no_forward, NULL},
     .layer = {"Gemma3DecoderLayer", accel__decoder_layer_call, NULL}, .attn = {"Gemma3Attention", NULL, NULL},
     .mlp = {"Gemma3MLP", accel__decoder_mlp_forward, NULL}, .norm = {"Gemma3RMSNorm", accel__decoder_norm_forward, NULL},
     .qk_norm = true, .gemma_blocks = true, .sandwich_norms = true, .softcap = true, .attention_bias = true,
     .window = ACCEL__WINDOW_TYPES,
     .defaults = {.vocab_size = 262208, .hidden_size = 2304, .intermediate_size = 9216, .num_hidden_layers = 26,
                  .num_attention_heads = 8, .num_key_value_heads = 4, .head_dim = 256,
                  .max_position_embeddings = 131072, .rms_norm_eps = 1e-6, .rope_theta = 1e6,
                  .initializer_range = 0.02, .tie_word_embeddings = true, .torch_dtype = ACCEL_F32,
                  .model_type = "gemma3_text", .sliding_window = 4096, .query_pre_attn_scalar = 256.0,
                  .rope_local_base_freq = 10000.0, .sliding_window_pattern = 6, TOKENS(2, 1)}},
    {.model_type = "granite", ARCH_OPS("Granite"), .multipliers = true, .attention_bias = true, .mlp_bias = true,
     DEFAULTS("granite", 32000, 11008, 0, 0, 2048, 0, 0, LLAMA_TOKENS)},
    /* Phi-3 (and Phi-4-mini, model_type phi3): fused projections, partial
     * rotary, longrope; hidden 3072 and eps 1e-5 by default */
    {.model_type = "phi3", ARCH_OPS("Phi3"), .fused_qkv = true, .fused_gate_up = true, .partial_rotary = true,
     .longrope_only = true, .longrope_regenerate = true, .window = ACCEL__WINDOW_ALL,
     .defaults = {.vocab_size = 32064, .hidden_size = 3072, .intermediate_size = 8192, .num_hidden_layers = 32,
                  .num_attention_heads = 32, .max_position_embeddings = 4096, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32, .model_type = "phi3",
                  .rope_scaling = {.original_max_position_embeddings = 4096}, TOKENS(1, 32000)}},
    /* OLMo 2: norms on the attention / MLP outputs, q/k norms over the whole projection; eps 1e-5 */
    {.model_type = "olmo2", ARCH_OPS("Olmo2"), .qk_norm_full = true, .norm_outputs = true, .attention_bias = true,
     .window = ACCEL__WINDOW_NONE,
     .defaults = {.vocab_size = 50304, .hidden_size = 4096, .intermediate_size = 11008, .num_hidden_layers = 32,
                  .num_attention_heads = 32, .max_position_embeddings = 2048, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "olmo2", TOKENS(-1, 50279)}},
    /* Mixtral: Mistral's attention, experts in block_sparse_moe; eps 1e-5, theta 1e6 */
    {.model_type = "mixtral", ARCH_OPS("Mixtral"), .window = ACCEL__WINDOW_ALL, .moe = ACCEL__MOE_MIXTRAL,
     .experts_alias = true, .moe_block = {"MixtralSparseMoeBlock", accel__moe_forward, NULL},
     .expert = {"MixtralBlockSparseTop2MLP", accel__moe_expert_forward, NULL},
     .defaults = {.vocab_size = 32000, .hidden_size = 4096, .intermediate_size = 14336, .num_hidden_layers = 32,
                  .num_attention_heads = 32, .num_key_value_heads = 8, .max_position_embeddings = 4096 * 32,
                  .rms_norm_eps = 1e-5, .rope_theta = 1e6, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "mixtral", .num_local_experts = 8, .num_experts_per_tok = 2,
                  .router_aux_loss_coef = 0.001, LLAMA_TOKENS}},
    /* Qwen3-MoE: Qwen3's attention (the window on every layer), experts in mlp */
    {.model_type = "qwen3_moe", ARCH_OPS("Qwen3Moe"), .qk_norm = true, .attention_bias = true,
     .window = ACCEL__WINDOW_USE_ALL, .moe = ACCEL__MOE_QWEN, .experts_alias = true,
     .moe_block = {"Qwen3MoeSparseMoeBlock", accel__moe_forward, NULL},
     .defaults = {.vocab_size = 151936, .hidden_size = 2048, .intermediate_size = 6144, .num_hidden_layers = 24,
                  .num_attention_heads = 32, .num_key_value_heads = 4, .max_position_embeddings = 32768,
                  .rms_norm_eps = 1e-6, .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "qwen3_moe", .sliding_window = 4096, .num_local_experts = 128,
                  .num_experts_per_tok = 8, .moe_intermediate_size = 768, .decoder_sparse_step = 1,
                  .router_aux_loss_coef = 0.001, TOKENS(-1, -1)}},
    /* GPT-2: GPT2Config() defaults (n_embd 768, n_layer 12, n_head 12, n_inner 4 n_embd,
     * n_positions 1024, layer_norm_epsilon 1e-5, dropouts 0.1, tied head) */
    {.model_type = "gpt2", .causal_lm = {"GPT2LMHeadModel", accel__decoder_no_forward, NULL},
     .model = {"GPT2Model", accel__decoder_no_forward, NULL}, .layer = {"GPT2Block", accel__decoder_layer_call, NULL},
     .attn = {"GPT2Attention", NULL, NULL}, .mlp = {"GPT2MLP", accel__gelu_mlp_forward, NULL},
     .norm = {"LayerNorm", accel__layer_norm_forward, NULL}, .window = ACCEL__WINDOW_NONE,
     .blocks = ACCEL__BLOCKS_GPT2, .dropouts = true,
     .defaults = {.vocab_size = 50257, .hidden_size = 768, .intermediate_size = 3072, .num_hidden_layers = 12,
                  .num_attention_heads = 12, .max_position_embeddings = 1024, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .tie_word_embeddings = true,
                  .torch_dtype = ACCEL_F32, .model_type = "gpt2", .attn_pdrop = 0.1, .resid_pdrop = 0.1,
                  .embd_pdrop = 0.1, TOKENS(50256, 50256)}},
    /* Qwen2-MoE: Qwen2's attention (q/k/v biases unless qkv_bias is false),
     * experts in mlp beside a shared expert; the window on the even layers
     * below max_window_layers */
    {.model_type = "qwen2_moe", ARCH_OPS("Qwen2Moe"), .attention_bias = true, .qkv_only_bias = true,
     .window = ACCEL__WINDOW_QWEN2_MOE,
     .moe = ACCEL__MOE_QWEN, .shared_expert = true, .moe_block = {"Qwen2MoeSparseMoeBlock", accel__moe_forward, NULL},
     .defaults = {.vocab_size = 151936, .hidden_size = 2048, .intermediate_size = 5632, .num_hidden_layers = 24,
                  .num_attention_heads = 16, .num_key_value_heads = 16, .max_position_embeddings = 32768,
                  .rms_norm_eps = 1e-6, .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "qwen2_moe", .attention_bias = true, .sliding_window = 4096, .max_window_layers = 28,
                  .num_local_experts = 60, .num_experts_per_tok = 4, .moe_intermediate_size = 1408,
                  .shared_expert_intermediate_size = 5632, .decoder_sparse_step = 1, .router_aux_loss_coef = 0.001,
                  TOKENS(-1, -1)}},
    /* Phi (phi-1, phi-1.5, phi-2): LayerNorm, parallel attention and MLP
     * from one norm, biases everywhere (lm_head too), half of each head
     * rotated by default; PhiConfig() defaults (hidden 2048, 24 layers, eps
     * 1e-5, dropouts 0) */
    {.model_type = "phi", .causal_lm = {"PhiForCausalLM", accel__decoder_no_forward, NULL},
     .model = {"PhiModel", accel__decoder_no_forward, NULL}, .layer = {"PhiDecoderLayer", accel__decoder_layer_call, NULL},
     .attn = {"PhiAttention", NULL, NULL}, .mlp = {"PhiMLP", accel__gelu_mlp_forward, NULL},
     .norm = {"LayerNorm", accel__layer_norm_forward, NULL}, .window = ACCEL__WINDOW_NONE, .partial_rotary = true,
     .parallel_residual = true, .phi_blocks = true, .layer_norms = true, .dropouts = true,
     .defaults = {.vocab_size = 51200, .hidden_size = 2048, .intermediate_size = 8192, .num_hidden_layers = 24,
                  .num_attention_heads = 32, .max_position_embeddings = 2048, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32, .model_type = "phi",
                  .partial_rotary_factor = 0.5, LLAMA_TOKENS}},
    /* GPT-NeoX (Pythia, GPT-NeoX-20B): LayerNorm, one fused per-head qkv,
     * a quarter of each head rotated, parallel attention and MLP from two
     * norms, an untied embed_out; GPTNeoXConfig() defaults (NeoX-20B's
     * sizes, eps 1e-5, attention_bias true, bos 0, eos 2) */
    {.model_type = "gpt_neox", .causal_lm = {"GPTNeoXForCausalLM", accel__decoder_no_forward, NULL},
     .model = {"GPTNeoXModel", accel__decoder_no_forward, NULL},
     .layer = {"GPTNeoXLayer", accel__decoder_layer_call, NULL}, .attn = {"GPTNeoXAttention", NULL, NULL},
     .mlp = {"GPTNeoXMLP", accel__gelu_exact_mlp_forward, NULL},
     .norm = {"LayerNorm", accel__layer_norm_forward, NULL}, .window = ACCEL__WINDOW_NONE, .partial_rotary = true,
     .attention_bias = true, .neox_blocks = true, .layer_norms = true, .residual_choice = true, .dropouts = true,
     .defaults = {.vocab_size = 50432, .hidden_size = 6144, .intermediate_size = 24576, .num_hidden_layers = 44,
                  .num_attention_heads = 64, .max_position_embeddings = 2048, .rms_norm_eps = 1e-5,
                  .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "gpt_neox", .attention_bias = true, .partial_rotary_factor = 0.25, TOKENS(0, 2)}},
    /* StableLM (stablelm-2-1_6b, stablelm-3b-4e1t): Llama's tree with
     * LayerNorms, a quarter of each head rotated, q/k/v biases per
     * use_qkv_bias, a SwiGLU MLP without biases, sequential unless
     * use_parallel_residual (then one norm), an untied head; StableLmConfig()
     * defaults (stablelm-3b's sizes, eps 1e-5, bos = eos = 0) */
    {.model_type = "stablelm", .causal_lm = {"StableLmForCausalLM", accel__decoder_no_forward, NULL},
     .model = {"StableLmModel", accel__decoder_no_forward, NULL},
     .layer = {"StableLmDecoderLayer", accel__decoder_layer_call, NULL}, .attn = {"StableLmAttention", NULL, NULL},
     .mlp = {"StableLmMLP", accel__decoder_mlp_forward, NULL}, .norm = {"LayerNorm", accel__layer_norm_forward, NULL},
     .window = ACCEL__WINDOW_NONE, .partial_rotary = true, .attention_bias = true, .qkv_only_bias = true,
     .layer_norms = true, .residual_choice = true, .stablelm_blocks = true, .dropouts = true,
     .defaults = {.vocab_size = 50304, .hidden_size = 2560, .intermediate_size = 6912, .num_hidden_layers = 32,
                  .num_attention_heads = 32, .num_key_value_heads = 32, .max_position_embeddings = 4096,
                  .rms_norm_eps = 1e-5, .rope_theta = 10000.0, .initializer_range = 0.02, .torch_dtype = ACCEL_F32,
                  .model_type = "stablelm", .partial_rotary_factor = 0.25, .sequential_residual = true,
                  TOKENS(0, 0)}},
    /* Starcoder2 (bigcode/starcoder2-3b, -7b, -15b): Llama's tree with
     * LayerNorms, biases on q/k/v/o and the MLP per use_bias, the MLP c_fc
     * -> gelu_pytorch_tanh -> c_proj, a window on every layer, a tied head;
     * Starcoder2Config() defaults (starcoder2-7b's sizes, eps 1e-5, bos = eos
     * = 50256) */
    {.model_type = "starcoder2", .causal_lm = {"Starcoder2ForCausalLM", accel__decoder_no_forward, NULL},
     .model = {"Starcoder2Model", accel__decoder_no_forward, NULL},
     .layer = {"Starcoder2DecoderLayer", accel__decoder_layer_call, NULL}, .attn = {"Starcoder2Attention", NULL, NULL},
     .mlp = {"Starcoder2MLP", accel__gelu_mlp_forward, NULL}, .norm = {"LayerNorm", accel__layer_norm_forward, NULL},
     .window = ACCEL__WINDOW_ALL, .attention_bias = true, .mlp_bias = true, .layer_norms = true,
     .starcoder2_blocks = true, .dropouts = true,
     .defaults = {.vocab_size = 49152, .hidden_size = 3072, .intermediate_size = 12288, .num_hidden_layers = 30,
                  .num_attention_heads = 24, .num_key_value_heads = 2, .max_position_embeddings = 4096,
                  .rms_norm_eps = 1e-5, .rope_theta = 10000.0, .initializer_range = 0.018042,
                  .tie_word_embeddings = true, .torch_dtype = ACCEL_F32, .model_type = "starcoder2",
                  .attention_bias = true, .mlp_bias = true, TOKENS(50256, 50256)}},
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
            m->ops == &a->mlp || m->ops == &a->norm || (a->moe && (m->ops == &a->moe_block || m->ops == &a->expert)))
            return a;
    }
    return NULL;
}

const accel__arch *accel__arch_at(size_t i) { return i < N_ARCHS ? &ARCHS[i] : NULL; }

const char *accel__arch_unsupported(const accel__arch *a) {
    if (a->norm_outputs && (a->multipliers || a->sandwich_norms))
        return "norm_outputs with multipliers or sandwich_norms (its layer applies neither)";
    if (a->fused_gate_up && a->gemma_blocks)
        return "fused_gate_up with gemma_blocks (the fused MLP is always SiLU)";
    if (a->fused_qkv && (a->qk_norm || a->qk_norm_full))
        return "fused_qkv with q/k norms (the norms' child indices assume separate q/k/v projections)";
    if (a->qk_norm && a->qk_norm_full) return "qk_norm with qk_norm_full (one kind of q/k norm)";
    if (a->qk_norm_full && a->gemma_blocks)
        return "qk_norm_full with gemma_blocks (the tensor-parallel norm over the whole width scales by the weight, "
               "not 1 + weight)";
    if (a->moe && (a->fused_gate_up || a->blocks != ACCEL__BLOCKS_LLAMA))
        return "moe with fused_gate_up or GPT-2 blocks (the experts have separate SiLU-gated projections)";
    if (a->moe == ACCEL__MOE_MIXTRAL && a->gemma_blocks) return "Mixtral's experts with gemma_blocks (they are SiLU)";
    if (a->experts_alias && !a->moe) return "experts_alias without experts";
    if (a->parallel_residual && (a->norm_outputs || a->sandwich_norms))
        return "parallel_residual with norm_outputs or sandwich_norms (its layer has one norm, before both branches)";
    if (a->phi_blocks && (a->gemma_blocks || a->fused_qkv || a->fused_gate_up || a->qk_norm || a->qk_norm_full ||
                          a->qkv_bias || a->moe || a->blocks != ACCEL__BLOCKS_LLAMA))
        return "phi_blocks with gemma_blocks, fused projections, q/k norms, qkv_bias, experts or GPT-2 blocks (its "
               "projections, norms and MLP are its own)";
    if (a->neox_blocks && (a->gemma_blocks || a->phi_blocks || a->fused_qkv || a->fused_gate_up || a->qk_norm ||
                           a->qk_norm_full || a->qkv_bias || a->moe || a->parallel_residual || a->norm_outputs ||
                           a->sandwich_norms || a->blocks != ACCEL__BLOCKS_LLAMA))
        return "neox_blocks with another family's blocks, projections, norms or experts (its tree is its own; its "
               "parallel residual is the config's)";
    if ((a->phi_blocks || a->neox_blocks || a->stablelm_blocks || a->starcoder2_blocks) && !a->layer_norms)
        return "phi_blocks, neox_blocks, stablelm_blocks or starcoder2_blocks without layer_norms (their norms are "
               "LayerNorms with bias)";
    if (a->layer_norms && (a->gemma_blocks || a->qk_norm || a->qk_norm_full || a->norm_outputs || a->sandwich_norms ||
                           a->blocks != ACCEL__BLOCKS_LLAMA))
        return "layer_norms with gemma_blocks, RMSNorm q/k norms, output norms or GPT-2 blocks (the layer's norms are "
               "LayerNorms before each branch)";
    if (a->residual_choice && a->parallel_residual)
        return "residual_choice with parallel_residual (the config chooses the residual, or the row always has it "
               "parallel)";
    if ((a->stablelm_blocks || a->starcoder2_blocks) &&
        (a->phi_blocks || a->neox_blocks || (a->stablelm_blocks && a->starcoder2_blocks) || a->fused_qkv ||
         a->fused_gate_up || a->qkv_bias || a->moe))
        return "stablelm_blocks or starcoder2_blocks with another family's blocks, fused projections, qkv_bias or "
               "experts (their projections are Llama's q/k/v/o, their MLP their own)";
    if (a->qkv_only_bias && (!a->attention_bias || a->qkv_bias))
        return "qkv_only_bias without attention_bias or with qkv_bias (it places the config's attention_bias; "
               "qkv_bias is a bias on q/k/v always)";
    if (a->shared_expert && a->moe != ACCEL__MOE_QWEN)
        return "shared_expert without Qwen's sparse block (the shared expert is the family's MLP in `mlp`)";
    return NULL;
}

accel_status accel__arch_rope_check(const accel__arch *a, accel_rope_type type, const char *who, const char *key) {
    static const char *const NAMES[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
    if (!a->longrope_only || type == ACCEL_ROPE_DEFAULT || type == ACCEL_ROPE_LONGROPE) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s of type \"%s\" is not one %s models take (default, longrope)",
                           who, key, (unsigned)type < 6 ? NAMES[type] : "(invalid)", a->model_type);
}

accel_status accel__arch_gpt2_flags_check(const accel__arch *a, const accel_llama_config *c, const char *who) {
    if (a->blocks == ACCEL__BLOCKS_GPT2) return ACCEL_OK;
    if (c->unscaled_attention)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: unscaled_attention (GPT-2's scale_attn_weights false) is set, "
                               "but %s models always scale", who, a->model_type);
    if (c->scale_attn_by_inverse_layer_idx || c->reorder_and_upcast_attn)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s (GPT-2's) is set, but %s models have no such setting", who,
                               c->scale_attn_by_inverse_layer_idx ? "scale_attn_by_inverse_layer_idx"
                                                                  : "reorder_and_upcast_attn",
                               a->model_type);
    return ACCEL_OK;
}

const char *accel__arch_names(void) {
    return "\"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma\", \"gemma2\", \"gemma3_text\", \"granite\", \"phi3\", "
           "\"olmo2\", \"gpt2\", \"mixtral\", \"qwen3_moe\", \"qwen2_moe\", \"phi\", \"gpt_neox\", \"stablelm\", "
           "\"starcoder2\"";
}

bool accel__arch_qk_norm_heads(const accel__arch *a, const accel_llama_config *c) {
    return a->qk_norm || ((a->phi_blocks || a->stablelm_blocks) && c->qk_layernorm);
}

const char *accel__arch_o_proj(const accel__arch *a) { return a->phi_blocks || a->neox_blocks ? "dense" : "o_proj"; }

const char *accel__arch_final_norm(const accel__arch *a) {
    return a->phi_blocks ? "final_layernorm" : a->neox_blocks ? "final_layer_norm" : "norm";
}

const char *accel__arch_base(const accel__arch *a) { return a->neox_blocks ? "gpt_neox" : "model"; }

const char *accel__arch_embed(const accel__arch *a) { return a->neox_blocks ? "embed_in" : "embed_tokens"; }

const char *accel__arch_head(const accel__arch *a) { return a->neox_blocks ? "embed_out" : "lm_head"; }

bool accel__arch_parallel(const accel__arch *a, const accel_llama_config *c) {
    return a->parallel_residual || (a->residual_choice && !c->sequential_residual);
}

bool accel__arch_one_norm(const accel__arch *a, const accel_llama_config *c) {
    return accel__arch_parallel(a, c) && !a->neox_blocks;
}

bool accel__arch_layer_local(const accel__arch *a, const accel_llama_config *c, int64_t i) {
    if (a->window != ACCEL__WINDOW_TYPES) return false;
    if (c->n_layer_types > 0) return i < c->n_layer_types && !c->layer_full[i];
    /* 0: the row's default (6), as accel_llama_new resolves it */
    int64_t pattern = c->sliding_window_pattern > 0 ? c->sliding_window_pattern : a->defaults.sliding_window_pattern;
    return (i + 1) % pattern != 0;
}

bool accel__arch_layer_windowed(const accel__arch *a, const accel_llama_config *c, int64_t i) {
    if (c->sliding_window <= 0) return false;
    switch (a->window) {
    case ACCEL__WINDOW_EVEN: return i % 2 == 0;
    case ACCEL__WINDOW_TYPES: return accel__arch_layer_local(a, c, i);
    case ACCEL__WINDOW_USE_ALL: return true;
    case ACCEL__WINDOW_QWEN2_MOE: return i % 2 == 0 && i < c->max_window_layers;
    case ACCEL__WINDOW_NONE: return false;
    default: return i >= c->max_window_layers;
    }
}

bool accel__arch_layer_sparse(const accel__arch *a, const accel_llama_config *c, int64_t i) {
    if (!a->moe || c->num_local_experts <= 0) return false;
    for (int k = 0; k < c->n_mlp_only_layers; k++)
        if (c->mlp_only_layers[k] == i) return false;
    return c->decoder_sparse_step <= 1 || (i + 1) % c->decoder_sparse_step == 0;
}

/* ---- the decoder-only families' row of the family table (family.h) */

static const char *decoder_layer_class(const accel_module *m) {
    const accel__arch *a = accel__arch_of_module(m);
    return a ? a->layer.type_name : NULL;
}

static bool decoder_config_dtype(const accel_module *m, accel_dtype *dt) {
    const accel__arch *a = accel__arch_of_module(m);
    if (!a || m->ops != &a->causal_lm) return false; /* only the causal LM root has a config.json */
    *dt = ((const accel_llama_config *)m->impl)->torch_dtype;
    return true;
}

const accel__family accel__decoder_family = {"decoder", decoder_layer_class, NULL, accel__decoder_checkpoint_layers,
                                             decoder_config_dtype, &accel__decoder_stages};
