/* The decoder-only causal LMs of the architecture table (arch.h): Llama,
 * Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma 3, Granite, Phi-3, OLMo 2, Phi, with transformers'
 * module tree, names, init and forward. One graph; the table's row says what differs. */
#include <math.h>
#include <string.h>

#include "accel/nn.h"
#include "arch.h"
#include "decoder_cp.h"
#include "decoder_pipeline.h"
#include "moe.h"
#include "nn_internal.h"
#include "ops/attention.h"
#include "ops/attention_masked.h"
#include "ops/norm.h"
#include "tp_internal.h"

accel_llama_config accel_llama_config_default(void) {
    accel_llama_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 11008;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 32;
    c.head_dim = 0;
    c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.initializer_range = 0.02;
    c.tie_word_embeddings = false;
    c.attention_bias = false;
    c.mlp_bias = false;
    c.torch_dtype = ACCEL_F32;
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.token_ids_set = true, c.bos_token_id = 1, c.eos_token_ids[0] = 2, c.n_eos_token_ids = 1, c.pad_token_id = -1;
    return c;
}

/* The layers whose MLP is a mixture of experts. */
static int64_t sparse_layers(const accel__arch *a, const accel_llama_config *c) {
    int64_t sparse = 0;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) sparse += accel__arch_layer_sparse(a, c, i);
    return sparse;
}

/* Bytes of all the weights (the head counted even when tied; `norms`
 * hidden-size norms a layer; a sparse layer's experts and router in place of
 * its MLP), or -1 when that overflows int64: every size here comes from a file. */
static int64_t weight_bytes(const accel__arch *a, const accel_llama_config *c, int64_t norms) {
    int64_t C = c->hidden_size, D = c->head_dim, qd, kvd, attn, mlp, moe, layer, t, total;
    int64_t sparse = sparse_layers(a, c);
    int64_t im = a->moe == ACCEL__MOE_QWEN ? c->moe_intermediate_size : c->intermediate_size, shared;
    /* || sequences the steps and stops at the first overflow */
    bool of = __builtin_mul_overflow(c->num_attention_heads, D, &qd) ||
              __builtin_mul_overflow(c->num_key_value_heads, D, &kvd) ||
              __builtin_add_overflow(qd, kvd, &t) || __builtin_add_overflow(t, kvd, &t) ||
              __builtin_add_overflow(t, qd, &t) || __builtin_mul_overflow(t, C, &attn) ||
              __builtin_mul_overflow(c->intermediate_size, C, &t) || __builtin_mul_overflow(t, 3, &mlp) ||
              /* an expert's three projections and its router row */
              __builtin_mul_overflow(im, C, &t) || __builtin_mul_overflow(t, 3, &t) ||
              __builtin_add_overflow(t, C, &t) || __builtin_mul_overflow(t, c->num_local_experts, &moe) ||
              /* Qwen2-MoE's shared expert and its gate's row */
              __builtin_mul_overflow(c->shared_expert_intermediate_size, C, &t) ||
              __builtin_mul_overflow(t, 3, &t) || __builtin_add_overflow(t, a->shared_expert ? C : 0, &shared) ||
              __builtin_add_overflow(moe, shared, &moe) ||
              __builtin_mul_overflow(C, norms, &t) || __builtin_add_overflow(attn, t, &layer) ||
              __builtin_mul_overflow(layer, c->num_hidden_layers, &total) ||
              __builtin_mul_overflow(mlp, c->num_hidden_layers - sparse, &t) ||
              __builtin_add_overflow(total, t, &total) || __builtin_mul_overflow(moe, sparse, &t) ||
              __builtin_add_overflow(total, t, &total) ||
              __builtin_mul_overflow(c->vocab_size, C, &t) || __builtin_mul_overflow(t, 2, &t) ||
              __builtin_add_overflow(total, t, &total) || __builtin_add_overflow(total, C, &total) ||
              __builtin_mul_overflow(total, (int64_t)accel_dtype_size(c->torch_dtype), &total);
    return of ? -1 : total;
}

/* The mixture-of-experts fields: set only on a family with experts, each in
 * its range and on the family that reads it (Mixtral's intermediate_size is
 * its experts'; Qwen's have moe_intermediate_size). */
static accel_status resolve_moe(const accel__arch *a, const accel_llama_config *c, const char *who) {
    bool mixtral = a->moe == ACCEL__MOE_MIXTRAL, qwen = a->moe == ACCEL__MOE_QWEN;
    struct { const char *key; bool set, has; } F[] = {
        {"num_local_experts", c->num_local_experts != 0, a->moe},
        {"num_experts_per_tok", c->num_experts_per_tok != 0, a->moe},
        {"output_router_logits", c->output_router_logits, a->moe},
        {"router_aux_loss_coef", c->router_aux_loss_coef != 0, a->moe},
        {"moe_intermediate_size", c->moe_intermediate_size != 0, qwen},
        {"decoder_sparse_step", c->decoder_sparse_step != 0, qwen},
        {"norm_topk_prob", c->norm_topk_prob, qwen},
        {"mlp_only_layers", c->n_mlp_only_layers != 0, qwen},
        {"shared_expert_intermediate_size", c->shared_expert_intermediate_size != 0, a->shared_expert},
        {"router_jitter_noise", c->router_jitter_noise != 0, mixtral},
    };
    for (size_t i = 0; i < sizeof F / sizeof *F; i++)
        if (F[i].set && !F[i].has)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is set, but %s models %s", who, F[i].key,
                                   a->model_type, a->moe ? "do not read it" : "have no experts");
    if (!a->moe) return ACCEL_OK;
    if (c->n_mlp_only_layers < 0 || c->n_mlp_only_layers > ACCEL_MAX_MLP_ONLY_LAYERS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: mlp_only_layers has %d entries: at most %d", who,
                               c->n_mlp_only_layers, ACCEL_MAX_MLP_ONLY_LAYERS);
    for (int k = 0; k < c->n_mlp_only_layers; k++)
        if (c->mlp_only_layers[k] < 0 || c->mlp_only_layers[k] >= c->num_hidden_layers)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: mlp_only_layers[%d] is %lld, not a layer index in [0, "
                                   "num_hidden_layers %lld)", who, k, (long long)c->mlp_only_layers[k],
                                   (long long)c->num_hidden_layers);
    const char *bad = NULL;
    if (c->num_local_experts < (mixtral ? 1 : 0) || c->num_local_experts > ACCEL_MOE_MAX_EXPERTS)
        bad = mixtral ? "num_local_experts must be in [1, 65536]" : "num_experts must be in [0, 65536]";
    else if (c->num_local_experts > 0 &&
             (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_local_experts))
        bad = "num_experts_per_tok must be in [1, the number of experts]";
    else if (qwen && c->num_local_experts > 0 && c->moe_intermediate_size <= 0)
        bad = "moe_intermediate_size must be positive";
    else if (a->shared_expert && c->num_local_experts > 0 && c->shared_expert_intermediate_size <= 0)
        bad = "shared_expert_intermediate_size must be positive";
    else if (c->decoder_sparse_step < 0)
        bad = "decoder_sparse_step must be >= 0";
    else if (!(c->router_aux_loss_coef >= 0 && isfinite(c->router_aux_loss_coef)))
        bad = "router_aux_loss_coef must be finite and >= 0";
    else if (!(c->router_jitter_noise >= 0 && c->router_jitter_noise < 1))
        bad = "router_jitter_noise must be in [0, 1)";
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s (experts %lld, per token %lld, moe_intermediate_size "
                               "%lld, decoder_sparse_step %lld, router_aux_loss_coef %g, router_jitter_noise %g)",
                               who, bad, (long long)c->num_local_experts, (long long)c->num_experts_per_tok,
                               (long long)c->moe_intermediate_size, (long long)c->decoder_sparse_step,
                               c->router_aux_loss_coef, c->router_jitter_noise);
    /* each within its bound, 65536 sparse layers of 65536 experts asked for 2^32 expert modules: memory
     * without end, even on the meta device (estimate-memory); the layers' count is bounded already */
    int64_t sparse = sparse_layers(a, c);
    if (sparse * c->num_local_experts > ACCEL_MOE_MAX_TOTAL_EXPERTS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %lld sparse layers of %lld experts make %lld experts, "
                               "over accel's limit of %d for a model", who, (long long)sparse,
                               (long long)c->num_local_experts, (long long)(sparse * c->num_local_experts),
                               ACCEL_MOE_MAX_TOTAL_EXPERTS);
    return ACCEL_OK;
}

/* Gemma2's and Granite's scalings: finite and >= 0, set only on their
 * family; Granite's 0 is transformers' default 1.0. */
static accel_status resolve_scalings(const accel__arch *a, accel_llama_config *c, const char *who) {
    struct { const char *key; double *v; bool has; } S[] = {
        {"attn_logit_softcapping", &c->attn_logit_softcapping, a->score_softcap},
        {"final_logit_softcapping", &c->final_logit_softcapping, a->softcap},
        {"query_pre_attn_scalar", &c->query_pre_attn_scalar, a->softcap},
        {"embedding_multiplier", &c->embedding_multiplier, a->multipliers},
        {"attention_multiplier", &c->attention_multiplier, a->multipliers},
        {"residual_multiplier", &c->residual_multiplier, a->multipliers},
        {"logits_scaling", &c->logits_scaling, a->multipliers},
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        if (!isfinite(*S[i].v) || *S[i].v < 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is %g: it must be a finite number >= 0", who,
                                   S[i].key, *S[i].v);
        if (*S[i].v != 0 && !S[i].has)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is set, but %s models have none", who, S[i].key,
                                   a->model_type);
        if (*S[i].v == 0 && S[i].has && a->multipliers) *S[i].v = 1.0;
    }
    return ACCEL_OK;
}

/* Gemma 3's layer types and local RoPE base: set only on its family, the
 * base finite and >= 0, the pattern >= 0 (0: transformers' defaults 10000
 * and 6), an explicit list one type a layer. */
static accel_status resolve_layer_types(const accel__arch *a, accel_llama_config *c, const char *who) {
    bool has = a->window == ACCEL__WINDOW_TYPES;
    if (!has && (c->rope_local_base_freq != 0 || c->sliding_window_pattern != 0 || c->n_layer_types != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is set, but %s models have no per-layer attention "
                               "types", who, c->rope_local_base_freq != 0 ? "rope_local_base_freq"
                               : c->sliding_window_pattern != 0 ? "sliding_window_pattern" : "n_layer_types",
                               a->model_type);
    if (!has) return ACCEL_OK;
    /* transformers has no windowless Gemma 3 (a null window fails its config), so a saved one would not load */
    if (c->sliding_window <= 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: sliding_window is %lld: %s models need a window > 0 for "
                               "their sliding_attention layers", who, (long long)c->sliding_window, a->model_type);
    if (!(isfinite(c->rope_local_base_freq) && c->rope_local_base_freq >= 0))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: rope_local_base_freq is %g: it must be a finite number > 0 "
                               "(0: 10000)", who, c->rope_local_base_freq);
    if (c->rope_local_base_freq == 0) c->rope_local_base_freq = a->defaults.rope_local_base_freq;
    if (c->n_layer_types < 0 || c->n_layer_types > ACCEL_MAX_LAYER_TYPES ||
        (c->n_layer_types > 0 && c->n_layer_types != c->num_hidden_layers))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: n_layer_types %d must be 0 (sliding_window_pattern) or "
                               "num_hidden_layers (%lld), at most %d", who, c->n_layer_types,
                               (long long)c->num_hidden_layers, ACCEL_MAX_LAYER_TYPES);
    if (c->sliding_window_pattern < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: sliding_window_pattern is %lld: it must be >= 1 (every "
                               "that many layers one full_attention layer; 0: 6)", who,
                               (long long)c->sliding_window_pattern);
    if (c->sliding_window_pattern == 0) c->sliding_window_pattern = a->defaults.sliding_window_pattern;
    return ACCEL_OK;
}

/* Whether the family's embedding has transformers' padding_idx (GPT-2's wte
 * and GPT-NeoX's embed_in have none). */
static bool has_padding_idx(const accel__arch *a) { return a->blocks != ACCEL__BLOCKS_GPT2 && !a->neox_blocks; }

/* embed_tokens' padding_idx: pad_token_id (-1: none), the family's (none) in
 * a config whose token ids are not set (a zeroed struct) */
static int64_t padding_idx(const accel__arch *a, const accel_llama_config *c) {
    return has_padding_idx(a) ? (c->token_ids_set ? c : &a->defaults)->pad_token_id : -1;
}

/* The config with defaults resolved (kv heads, head_dim), checked. */
static accel_status resolve_config(const accel_llama_config *in, accel_llama_config *c, const char *who) {
    *c = *in;
    if (!memchr(c->model_type, 0, sizeof c->model_type))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: model_type is not a terminated string", who);
    const accel__arch *a = accel__arch_find(c->model_type);
    if (!a)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not one accel builds (%s)", who,
                               c->model_type, accel__arch_names());
    if ((c->attention_bias && !a->attention_bias) || (c->mlp_bias && !a->mlp_bias))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is set, but %s models have no such bias", who,
                               c->attention_bias && !a->attention_bias ? "attention_bias" : "mlp_bias", a->model_type);
    if (c->sliding_window && a->window == ACCEL__WINDOW_NONE)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: sliding_window is set, but %s models have none", who,
                               a->model_type);
    if (resolve_scalings(a, c, who)) return accel_last_status();
    if (resolve_layer_types(a, c, who)) return accel_last_status();
    double prf = c->partial_rotary_factor;
    if (prf != 0 && prf != 1 && !a->partial_rotary)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not implemented for %s models "
                               "(only 1.0)", who, prf, a->model_type);
    if (accel__arch_rope_check(a, c->rope_scaling.type, who, "rope_scaling")) return accel_last_status();
    if (!(prf >= 0 && prf <= 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: partial_rotary_factor %g must be in (0, 1]", who, prf);
    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->head_dim == 0 && c->num_attention_heads > 0)
        c->head_dim = c->hidden_size / c->num_attention_heads;
    if (a->blocks == ACCEL__BLOCKS_GPT2 &&
        (c->num_key_value_heads != c->num_attention_heads || c->head_dim * c->num_attention_heads != c->hidden_size ||
         c->rope_scaling.type != ACCEL_ROPE_DEFAULT))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: gpt2 models have num_key_value_heads = num_attention_heads, "
                               "head_dim = hidden_size / num_attention_heads and no rope_scaling", who);
    /* transformers' q/k LayerNorms are of hidden_size / heads: head_dim must be that */
    if (c->qk_layernorm && (!(a->phi_blocks || a->stablelm_blocks) ||
                            (c->head_dim && c->head_dim * c->num_attention_heads != c->hidden_size)))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: qk_layernorm is %s", who,
                               a->phi_blocks || a->stablelm_blocks
                                   ? "only implemented with head_dim = hidden_size / num_attention_heads "
                                     "(transformers' q/k LayerNorms are that wide)"
                                   : "Phi's and StableLM's: the model has no q/k LayerNorms");
    /* GPTNeoXAttention: hidden_size / heads per head, as many kv heads as heads */
    if (a->neox_blocks && (c->num_key_value_heads != c->num_attention_heads ||
                           c->head_dim * c->num_attention_heads != c->hidden_size))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: gpt_neox models have num_key_value_heads = "
                               "num_attention_heads and head_dim = hidden_size / num_attention_heads (got %lld kv "
                               "heads of %lld heads, head_dim %lld)", who, (long long)c->num_key_value_heads,
                               (long long)c->num_attention_heads, (long long)c->head_dim);
    if (c->neox_hidden_act < 0 || c->neox_hidden_act > 3 || (c->neox_hidden_act && !a->neox_blocks))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: neox_hidden_act %d: 0 to 3 (gelu, gelu_fast, gelu_new, "
                               "gelu_pytorch_tanh), and gpt_neox models only (%s here)", who, c->neox_hidden_act,
                               a->model_type);
    if (c->sequential_residual && !a->residual_choice)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: sequential_residual (GPT-NeoX's and StableLM's "
                               "use_parallel_residual false) is set, but %s models have no parallel residual to turn "
                               "off", who, a->model_type);
    /* StableLmAttention: hidden_size / heads per head (a head_dim key is not read) */
    if (a->stablelm_blocks && c->head_dim * c->num_attention_heads != c->hidden_size)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: stablelm models have head_dim = hidden_size / "
                               "num_attention_heads (got head_dim %lld, %lld heads, hidden_size %lld)", who,
                               (long long)c->head_dim, (long long)c->num_attention_heads, (long long)c->hidden_size);
    /* StableLM's hidden_dropout acts on the MLP's output only: it has no embedding dropout */
    if (a->stablelm_blocks && c->embd_pdrop != 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: stablelm models have no embedding dropout: embd_pdrop "
                               "(%g) must be 0", who, c->embd_pdrop);
    /* Starcoder2's use_bias is one value: the attention's and the MLP's biases */
    if (a->starcoder2_blocks && c->attention_bias != c->mlp_bias)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: starcoder2 models have one use_bias for the attention and "
                               "the MLP: attention_bias (%d) must equal mlp_bias (%d)", who, c->attention_bias,
                               c->mlp_bias);
    /* GPT-NeoX's hidden_dropout is one value: the embeddings' and each branch's */
    if (a->neox_blocks && c->embd_pdrop != c->resid_pdrop)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: gpt_neox models have one hidden_dropout for the embeddings "
                               "and the branches: embd_pdrop (%g) must equal resid_pdrop (%g)", who, c->embd_pdrop,
                               c->resid_pdrop);
    if (accel__arch_gpt2_flags_check(a, c, who)) return accel_last_status();
    int64_t wpe; /* GPT-2's position table, which weight_bytes does not count */
    if (a->blocks == ACCEL__BLOCKS_GPT2 &&
        (c->max_position_embeddings <= 0 || __builtin_mul_overflow(c->max_position_embeddings, c->hidden_size, &wpe) ||
         wpe > INT64_MAX / 8))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: n_positions (%lld) must be positive, with n_positions x "
                               "n_embd (%lld) position embeddings addressable", who,
                               (long long)c->max_position_embeddings, (long long)c->hidden_size);
    if (!(c->attn_pdrop >= 0 && c->attn_pdrop <= 1) || !(c->resid_pdrop >= 0 && c->resid_pdrop <= 1) ||
        !(c->embd_pdrop >= 0 && c->embd_pdrop <= 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: attn_pdrop, resid_pdrop and embd_pdrop must be in [0, 1]",
                               who);
    if ((c->attn_pdrop || c->resid_pdrop || c->embd_pdrop) && !a->dropouts)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: attn_pdrop, resid_pdrop and embd_pdrop are GPT-2's, "
                               "Phi's, GPT-NeoX's, StableLM's and Starcoder2's dropouts: %s models have none", who,
                               a->model_type);
    const char *bad = NULL;
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 ||
        c->num_hidden_layers < 0 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0)
        bad = "sizes must be positive";
    else if (c->num_attention_heads % c->num_key_value_heads)
        bad = "num_attention_heads must be a multiple of num_key_value_heads";
    else if (c->head_dim <= 0 || c->head_dim % 2)
        bad = "head_dim (hidden_size / num_attention_heads) must be positive and even";
    else if (accel__rotary_dim(c) <= 0 || accel__rotary_dim(c) % 2)
        bad = "the rotary dims (head_dim * partial_rotary_factor) must be positive and even";
    else if (!accel_dtype_is_float(c->torch_dtype))
        bad = "torch_dtype must be a float dtype";
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: %s (hidden %lld, heads %lld, kv heads %lld, head_dim %lld)", who, bad,
                               (long long)c->hidden_size, (long long)c->num_attention_heads,
                               (long long)c->num_key_value_heads, (long long)c->head_dim);
    if (c->num_hidden_layers > ACCEL_LLAMA_MAX_LAYERS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: num_hidden_layers %lld is over accel's limit of %d",
                               who, (long long)c->num_hidden_layers, ACCEL_LLAMA_MAX_LAYERS);
    if (c->sliding_window < 0 || c->max_window_layers < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: sliding_window (%lld) and max_window_layers (%lld) must be >= 0",
                               who, (long long)c->sliding_window, (long long)c->max_window_layers);
    int64_t pad = padding_idx(a, c);
    if (has_padding_idx(a) && (pad < -1 || pad >= c->vocab_size))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: pad_token_id %lld (the embedding's padding_idx) must be -1 "
                               "(none) or below vocab_size %lld", who, (long long)pad, (long long)c->vocab_size);
    if (accel__rope_check(c, who)) return accel_last_status();
    if (resolve_moe(a, c, who)) return accel_last_status();
    if (weight_bytes(a, c, a->sandwich_norms ? 4 : 2) < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: the weights would take more than 2^63 bytes (vocab_size %lld, hidden_size "
                               "%lld, intermediate_size %lld, heads %lld x head_dim %lld, %lld layers)",
                               who, (long long)c->vocab_size, (long long)c->hidden_size,
                               (long long)c->intermediate_size, (long long)c->num_attention_heads,
                               (long long)c->head_dim, (long long)c->num_hidden_layers);
    return ACCEL_OK;
}

accel_status accel_llama_config_check(const accel_llama_config *cfg, const char *who) {
    accel_llama_config c;
    if (!cfg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_check: config is NULL");
    return resolve_config(cfg, &c, who ? who : "accel_llama_config_check");
}

/* Child indices, fixed by construction order (transformers' order; GPT-2's
 * wte is its model's child 0 too: ACCEL__GPT2_WTE). */
enum { ROOT_MODEL = 0, ROOT_LM_HEAD = 1 };
enum { MODEL_EMBED = 0, MODEL_LAYERS = 1, MODEL_NORM = 2 };

/* ---- KV cache */

struct accel_kv_cache {
    int n_layers;
    int64_t batch, max_len, len, kv_heads, head_dim;
    accel_tensor **k, **v; /* [n_layers], each [B, kv_heads, max_len, head_dim] */
};

/* A cache of n_layers layers, each K and V [batch, kv_heads, max_len, D] of
 * dtype dt on dev (c resolved). */
static accel_kv_cache *kv_cache_make(const accel_llama_config *c, accel_dtype dt, int64_t kv_heads, int64_t batch,
                                     int64_t max_len, accel_device dev, const char *who) {
    if (batch <= 0 || max_len <= 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: batch %lld and max_len %lld must be > 0", who, (long long)batch,
                        (long long)max_len);
        return NULL;
    }
    accel_kv_cache *kc = accel_calloc(1, sizeof *kc);
    if (!kc) return NULL;
    kc->n_layers = (int)c->num_hidden_layers;
    kc->batch = batch;
    kc->max_len = max_len;
    kc->kv_heads = kv_heads;
    kc->head_dim = c->head_dim;
    kc->k = accel_calloc((size_t)(kc->n_layers ? kc->n_layers : 1), sizeof *kc->k);
    kc->v = accel_calloc((size_t)(kc->n_layers ? kc->n_layers : 1), sizeof *kc->v);
    bool ok = kc->k && kc->v;
    int64_t shape[4] = {batch, kv_heads, max_len, c->head_dim};
    for (int i = 0; i < kc->n_layers && ok; i++) {
        kc->k[i] = accel_tensor_new(dt, 4, shape, dev);
        kc->v[i] = accel_tensor_new(dt, 4, shape, dev);
        ok = kc->k[i] && kc->v[i];
    }
    if (!ok) {
        accel_kv_cache_free(kc);
        return NULL;
    }
    return kc;
}

accel_kv_cache *accel_kv_cache_new(const accel_llama_config *cfg, int64_t batch, int64_t max_len,
                                   accel_device dev) {
    accel_llama_config c;
    if (!cfg) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_kv_cache_new: config is NULL");
        return NULL;
    }
    if (resolve_config(cfg, &c, "accel_kv_cache_new")) return NULL;
    return kv_cache_make(&c, c.torch_dtype, c.num_key_value_heads, batch, max_len, dev, "accel_kv_cache_new");
}

int64_t accel_kv_cache_bytes(const accel_kv_cache *kc) {
    int64_t n = 0;
    for (int i = 0; kc && i < kc->n_layers; i++) n += (int64_t)(accel_nbytes(kc->k[i]) + accel_nbytes(kc->v[i]));
    return n;
}

void accel_kv_cache_free(accel_kv_cache *kc) {
    if (!kc) return;
    for (int i = 0; i < kc->n_layers; i++) {
        if (kc->k) accel_tensor_free(kc->k[i]);
        if (kc->v) accel_tensor_free(kc->v[i]);
    }
    accel_free(kc->k);
    accel_free(kc->v);
    accel_free(kc);
}

int64_t accel_kv_cache_len(const accel_kv_cache *kc) { return kc ? kc->len : 0; }

void accel_kv_cache_reset(accel_kv_cache *kc) {
    if (kc) kc->len = 0;
}

/* Writes x [B, Hkv, T, D] at positions [pos, pos+T) of cache tensor c and
 * returns the view of positions [0, pos+T). A layer's cache lives where the
 * layer runs: the first append from another device moves it there (a model
 * dispatched across devices gets each layer's cache on that layer's device). */
static accel_tensor *cache_append(accel_tensor *c, accel_tensor *x, int64_t pos) {
    if (!x) return NULL;
    if (!accel_device_eq(c->device, x->device) && accel_tensor_to_device_(c, x->device) != ACCEL_OK)
        return NULL;
    /* under tp x holds this rank's key/value heads: the cache's first ones */
    int64_t T = x->shape[2];
    int64_t shape[4] = {c->shape[0], x->shape[1], T, c->shape[3]};
    accel_tensor *slot = accel_view_raw(c, 4, shape, c->stride, pos * c->stride[2]);
    if (!slot || accel_copy_(slot, x) != ACCEL_OK) return NULL;
    shape[2] = pos + T;
    return accel_view_raw(c, 4, shape, c->stride, 0);
}

/* ---- a padded batch (accel_llama_forward_ex) */

/* What an attention_mask or position_ids bring to one forward, read once on
 * the host: the layers' masks and RoPE, GPT-2's positions. */
typedef struct pad_state {
    const uint8_t *keep;        /* [B, S] (S = cache length + T): 1 where the mask is 1; NULL: no 0 in it */
    const int64_t *key_range;   /* [B, 2]: row b keeps keys [lo, hi) only; NULL: some row keeps another pattern */
    const int64_t *positions;   /* [B, T]: the position ids; NULL: pos .. pos + T - 1 every row */
    /* [B, T]: the index of the first token of query t's packed sequence
     * (accel_llama_inputs' no_cache: packed_starts); NULL: no row restarts */
    const int64_t *seq_start;
    accel_tensor *position_ids; /* those as an i64 tensor on the ids' device (GPT-2's wpe) */
    int64_t pos;                /* the first position's index: the cache's length */
    /* one past the largest position (pos + T without position ids): dynamic
     * and longrope RoPE choose their frequencies by it, as transformers'
     * dynamic_rope_update takes max(position_ids) + 1 */
    int64_t rope_len;
    /* RoPE's cos/sin [B, T, rotary_dim / 2] of the positions, [local]: the
     * full layers' and Gemma 3's sliding layers' (rope_tables_once); NULL:
     * each layer builds its own (no positions, or a device of its own) */
    accel_tensor *rope_cos[2], *rope_sin[2];
    /* the explicit scores' padding masks, [W != 0]: the full layers' and the
     * windowed ones' (rope_and_masks_once); mask NULL: each layer makes its own */
    accel__pad_mask masks[2];
} pad_state;

/* ---- modules */

typedef struct layer_impl {
    const accel_llama_config *cfg; /* the root's (resolved), which outlives its layers */
    const accel__arch *arch;
    int index;
    bool windowed; /* attends to the last cfg->sliding_window keys only */
    bool local_rope; /* Gemma 3's sliding_attention layer: RoPE of base rope_local_base_freq */
    int64_t heads, kv_heads; /* the query and key/value heads this rank computes (all but under tp) */
} layer_impl;

/* The key/value heads llama's layers compute on this rank: the config's,
 * under tp this rank's (kv_heads / tp, or the one replicated head). */
static int64_t rank_kv_heads(accel_module *llama, const accel_llama_config *c) {
    accel_module *layers = accel__decoder_layers(llama);
    if (!layers || !layers->n_children) return c->num_key_value_heads;
    return ((const layer_impl *)layers->children[0]->impl)->kv_heads;
}

int64_t accel__decoder_rank_heads(accel_module *llama) {
    accel_module *layers = accel__decoder_layers(llama);
    if (!layers || !layers->n_children) return ((const accel_llama_config *)llama->impl)->num_attention_heads;
    return accel__decoder_layer_heads(layers->children[0]);
}

/* The cache holds the keys and values in the dtype the layers compute them
 * in: the weights' (the embedding's stands for them all), which a load's
 * dtype override makes differ from the config's torch_dtype. A cache of the
 * config's f32 beside bf16 weights made attention's output f32, and with it
 * the residual stream and every GEMM after it (each widening its bf16
 * weight per call): transformers' cache holds what the layers give it. */
accel_kv_cache *accel_llama_kv_cache_new(accel_module *llama, int64_t batch, int64_t max_len, accel_device dev) {
    const accel_llama_config *c = accel_llama_config_of(llama);
    if (!c) return NULL;
    accel_dtype dt = accel__module_tensor(llama->children[ROOT_MODEL]->children[MODEL_EMBED], "weight")->dtype;
    return kv_cache_make(c, dt, rank_kv_heads(llama, c), batch, max_len, dev, "accel_llama_kv_cache_new");
}

/* the norms: input_layernorm and post_attention_layernorm (with norm_outputs
 * post_attention_layernorm and post_feedforward_layernorm; with sandwich_norms
 * also pre_ and post_feedforward_layernorm) */
enum { LAYER_ATTN = 0, LAYER_MLP = 1, LAYER_IN_NORM = 2, LAYER_POST_NORM = 3, LAYER_PRE_FF_NORM = 4,
       LAYER_POST_FF_NORM = 5 };
enum { ATTN_Q = 0, ATTN_K = 1, ATTN_V = 2, ATTN_O = 3, ATTN_Q_NORM = 4, ATTN_K_NORM = 5 };
enum { ATTN_FUSED_O = 0, ATTN_QKV = 1 }; /* fused_qkv: transformers' Phi3Attention order */
enum { ATTN_NEOX_QKV = 0, ATTN_NEOX_DENSE = 1 }; /* neox_blocks: GPTNeoXAttention's order */
enum { MLP_GATE = 0, MLP_UP = 1, MLP_DOWN = 2 };
enum { MLP_GATE_UP = 0, MLP_FUSED_DOWN = 1 }; /* fused_gate_up */

/* Head h of x through its own norm, norms.h (norms: the ModuleList). */
static accel_tensor *call_head_norm(void *norms, int64_t h, accel_tensor *xh) {
    return accel_module_call(((accel_module *)norms)->children[h], xh);
}

/* StableLmLayerNormPerHead: x [B, T, n, D] -> each head h through norms.h, a
 * LayerNorm of its own over D (weight only); called head by head through
 * its module, as transformers does, so that a hook on one norm (a device
 * map down to norms.h) runs around its use. */
static accel_tensor *norm_per_head_forward(accel_module *m, accel_tensor *x) {
    accel_module *norms = m->children[0];
    if (x->ndim != 4 || x->shape[2] != norms->n_children) {
        accel_set_error(ACCEL_ERR_SHAPE, "StableLmLayerNormPerHead: x must be [B, T, %d, D] (one head per norm)",
                        norms->n_children);
        return NULL;
    }
    return accel__each_head(x, call_head_norm, norms);
}

static const accel_module_ops NORM_PER_HEAD_OPS = {"StableLmLayerNormPerHead", norm_per_head_forward, NULL};

/* StableLmLayerNormPerHead(head_dim, heads, layer_norm_eps): norms.0 ..
 * norms.{heads-1}, each nn.LayerNorm(head_dim, bias=False). */
static accel_module *norm_per_head(const accel_llama_config *c, int64_t heads, accel_device dev) {
    accel_module *m = accel_module_new(&NORM_PER_HEAD_OPS, NULL);
    accel_module *norms = accel_module_add_child(m, "norms", accel_module_new(&accel__module_list_ops, NULL));
    bool ok = norms != NULL;
    for (int64_t h = 0; ok && h < heads; h++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)h);
        ok = accel_module_add_child(norms, name, accel__layer_norm_no_bias_create(c->head_dim, c->rms_norm_eps, dev,
                                                                                  c->torch_dtype)) != NULL;
    }
    if (ok) return m;
    accel_module_free(m);
    return NULL;
}

/* q/k/v projection output x [B, T, n*D] -> [B, n, T, D], through the per-head
 * RMSNorm `norm` over D first when there is one (Qwen3's q_norm/k_norm). */
static accel_tensor *split_heads(accel_tensor *x, int64_t n, int64_t d, accel_module *norm) {
    if (!x) return NULL;
    int64_t shape[4] = {x->shape[0], x->shape[1], n, d};
    accel_tensor *h = accel_reshape(x, 4, shape);
    if (norm) h = accel_module_call(norm, h);
    return accel_transpose(h, 1, 2);
}

/* RoPE of x [B, H, T, D] at positions pos.. or, under context parallelism
 * over cp, of this rank's two chunks at their global positions (accel/cp.h). */
static accel_tensor *rope_all(accel_tensor *x, int64_t pos, accel_pg *cp, const float *inv, double scaling,
                              const pad_state *pad, bool local) {
    if (x && pad && pad->positions && pad->rope_cos[local] && accel_device_eq(pad->rope_cos[local]->device, x->device))
        return accel__rope_with_tables(x, pad->rope_cos[local], pad->rope_sin[local]);
    if (pad && pad->positions) return accel__rope_positions(x, pad->positions, inv, scaling);
    return cp ? accel_cp_rope_freqs(x, accel_pg_size(cp), accel_pg_rank(cp), inv, scaling)
              : accel_rope_freqs(x, pos, inv, scaling);
}

/* RoPE on the first rd dims of x [B, H, T, D], the rest passed through
 * (transformers' apply_rotary_pos_emb with a partial rotary_dim). */
static accel_tensor *rope(accel_tensor *x, int64_t pos, accel_pg *cp, const float *inv, double scaling, int64_t rd,
                          const pad_state *pad, bool local) {
    if (!x || rd == x->shape[3]) return rope_all(x, pos, cp, inv, scaling, pad, local);
    accel_tensor *rot = rope_all(accel_contiguous(accel_slice(x, 3, 0, rd, 1)), pos, cp, inv, scaling, pad, local);
    accel_tensor *pass = accel_slice(x, 3, rd, x->shape[3], 1);
    return rot && pass ? accel_concat(2, (accel_tensor *[]){rot, pass}, 3) : NULL;
}

/* x [B, T, C] -> q [B, T, H D], k and v [B, T, Hkv D] (the layer's heads:
 * this rank's under tp): one projection each, slices of the fused
 * qkv_proj's [q | k | v], or of GPT-NeoX's query_key_value per head. */
static void project_qkv(accel_module **p, const layer_impl *li, accel_tensor *x, accel_tensor **q, accel_tensor **k,
                        accel_tensor **v) {
    int64_t qd = li->heads * li->cfg->head_dim, kvd = li->kv_heads * li->cfg->head_dim;
    const accel__arch *a = li->arch;
    if (a->neox_blocks) { /* query_key_value: [B, T, H, 3, D] per head, viewed [B, T, H, 3 D] and cut in three */
        accel_tensor *qkv = accel_module_call(p[ATTN_NEOX_QKV], x), *part[3] = {NULL, NULL, NULL};
        int64_t D = li->cfg->head_dim, sizes[3] = {D, D, D};
        int64_t shape[4] = {qkv ? qkv->shape[0] : 0, qkv ? qkv->shape[1] : 0, li->heads, 3 * D};
        accel_tensor *h = qkv ? accel_reshape(qkv, 4, shape) : NULL;
        if (!h || accel_split(h, 3, 3, sizes, part) != ACCEL_OK) {
            *q = *k = *v = NULL;
            return;
        }
        int64_t flat[3] = {shape[0], shape[1], qd}; /* each [B, T, H, D] as [B, T, H D], the others' layout */
        *q = accel_reshape(accel_contiguous(part[0]), 3, flat);
        *k = accel_reshape(accel_contiguous(part[1]), 3, flat);
        *v = accel_reshape(accel_contiguous(part[2]), 3, flat);
        return;
    }
    if (!a->fused_qkv) {
        *q = accel_module_call(p[ATTN_Q], x);
        *k = accel_module_call(p[ATTN_K], x);
        *v = accel_module_call(p[ATTN_V], x);
        return;
    }
    accel_tensor *qkv = accel_module_call(p[ATTN_QKV], x);
    *q = qkv ? accel_contiguous(accel_slice(qkv, 2, 0, qd, 1)) : NULL;
    *k = qkv ? accel_contiguous(accel_slice(qkv, 2, qd, qd + kvd, 1)) : NULL;
    *v = qkv ? accel_contiguous(accel_slice(qkv, 2, qd + kvd, qd + 2 * kvd, 1)) : NULL;
}

/* The window of li's attention over a sequence of `end` positions (0:
 * none): it only bites once some query is W or more positions past a key. */
static int64_t layer_window(const layer_impl *li, int64_t end) {
    return li->windowed && end > li->cfg->sliding_window ? li->cfg->sliding_window : 0;
}

/* The generator of a dropout on activations sharded over the tp group (a
 * rank's heads; its positions under sequence parallelism): the model's own
 * per-rank stream once its plan made it tensor parallel, else NULL, the
 * default generator (decoder_cp.h). */
static accel_rng *sharded_dropout_rng(const accel_llama_config *c) {
    accel__decoder_tp_rng *r = accel__decoder_tp_rng_of(c);
    return r->on ? &r->rng : NULL;
}

/* The generator of the embeddings' and branches' dropout, whose [B, T, C]
 * activations are replicated over the tp group (the default generator,
 * alike on every rank: the replicas stay equal) unless sequence parallelism
 * splits them now (each rank's positions: its own stream). */
static accel_rng *hidden_dropout_rng(const accel_llama_config *c) {
    return accel__decoder_tp_rng_of(c)->seq_split && accel__tp_sequence_splits() ? sharded_dropout_rng(c) : NULL;
}

/* Whether the explicit scores of a's layers compute as torch's SDPA does
 * (attention_masked.h: bf16/f16 in f32, a query that sees no key 0) rather
 * than as transformers' eager attention (scores rounded to bf16/f16, such a
 * query the mean of the values): transformers builds every family with its
 * default attention, "sdpa", except Gemma 2, the soft-capping one, which it
 * builds "eager" (soft-capping is eager's alone). Under cp too: the sharded
 * attention takes the same choice (accel__decoder_cp_attention). */
static bool sdpa_numerics(const accel__arch *a) { return !a->score_softcap; }

/* Whether attention module attn of li takes the explicit scores
 * (attention_masked.h) on dev with window W: for the window, soft-capping,
 * GPT-2's dropout while training, and a padded batch or packed sequences
 * the fused kernel does not take (*ranged, *packed false). *ranged: a padded
 * batch whose rows each keep one run of keys (left or right padding), on a
 * device whose fused kernel reads key ranges, with the SDPA's rule for a
 * query that sees no key (a left pad's 0; Gemma 2's eager attention gives
 * the mean of the values). *packed: packed sequences on a device whose fused
 * kernel reads a key start per query (every query sees its own key: no
 * rule to choose, the numerics of an unpacked call). */
static bool explicit_scores(const accel_module *attn, const layer_impl *li, const pad_state *pad, int64_t W,
                            accel_device dev, bool *ranged, bool *packed) {
    const accel__arch *a = li->arch;
    const uint8_t *keep = pad ? pad->keep : NULL;
    const int64_t *starts = pad ? pad->seq_start : NULL;
    bool drop = a->dropouts && attn->training && li->cfg->attn_pdrop > 0;
    bool cap = a->score_softcap && li->cfg->attn_logit_softcapping > 0;
    *ranged = keep && !starts && pad->key_range && sdpa_numerics(a) && accel__sdpa_key_range_on(dev);
    *packed = starts && !keep && accel__sdpa_key_start_on(dev);
    bool fused = (!keep || *ranged) && (!starts || *packed);
    return (W || cap || drop || !fused) && dev.type != ACCEL_DEV_META;
}

static accel_tensor *attention_body(accel_module *attn, const layer_impl *li, accel_tensor *x, int64_t pos,
                                    accel_kv_cache *cache, const pad_state *pad) {
    const accel_llama_config *c = li->cfg;
    const accel__arch *a = li->arch;
    accel_module **p = attn->children;
    int64_t T = x->shape[1]; /* under sequence parallelism x holds T / tp positions: q the whole T */
    bool gpt2 = a->blocks == ACCEL__BLOCKS_GPT2;
    /* context parallel: x holds this rank's two chunks */
    const accel__decoder_cp *cp = accel__decoder_cp_of(c)->pg ? accel__decoder_cp_of(c) : NULL;
    accel_tensor *q, *k, *v;
    if (gpt2) {
        /* c_attn: [B, T, 3 H D] = q | k | v (GPT-2 has as many kv heads as heads) */
        accel_tensor *qkv = accel_module_call(p[ACCEL__GPT2_C_ATTN], x), *part[3] = {NULL, NULL, NULL};
        int64_t n = li->heads * c->head_dim, sizes[3] = {n, n, n};
        if (!qkv || accel_split(qkv, 2, 3, sizes, part) != ACCEL_OK) return NULL;
        T = qkv->shape[1];
        q = split_heads(part[0], li->heads, c->head_dim, NULL);
        k = split_heads(part[1], li->heads, c->head_dim, NULL);
        v = split_heads(part[2], li->heads, c->head_dim, NULL);
    } else {
        int64_t rd = accel__rotary_dim(c);
        project_qkv(p, li, x, &q, &k, &v);
        if (q) T = q->shape[1];
        if (a->qk_norm_full) { /* over all heads at once, before the split */
            q = accel_module_call(p[ATTN_Q_NORM], q);
            k = accel_module_call(p[ATTN_K_NORM], k);
        }
        bool heads_norm = accel__arch_qk_norm_heads(a, c);
        q = split_heads(q, li->heads, c->head_dim, heads_norm ? p[ATTN_Q_NORM] : NULL);
        k = split_heads(k, li->kv_heads, c->head_dim, heads_norm ? p[ATTN_K_NORM] : NULL);
        v = split_heads(v, li->kv_heads, c->head_dim, NULL);
        float *inv = accel_arena_alloc(accel_step_arena(), (size_t)(rd / 2) * sizeof *inv, 64);
        if (!inv) return NULL;
        int64_t rope_len = cp ? accel__decoder_cp_seq_len(cp, T) : pad ? pad->rope_len : pos + T;
        double scaling = accel__rope_inv_freq(c, li->local_rope, rope_len, inv);
        q = rope(q, pos, cp ? cp->pg : NULL, inv, scaling, rd, pad, li->local_rope); /* q, k [B, H(kv), T, D] */
        k = rope(k, pos, cp ? cp->pg : NULL, inv, scaling, rd, pad, li->local_rope);
    }
    if (cache && x->device.type != ACCEL_DEV_META) {
        k = cache_append(cache->k[li->index], k, pos);
        v = cache_append(cache->v[li->index], v, pos);
    }
    /* the window only bites once some query is W or more positions past a key
     * (under cp: of the whole sequence, T being this rank's chunks);
     * soft-capping needs the scores (on meta, shapes only: the fused op) */
    int64_t end = cp ? accel__decoder_cp_seq_len(cp, T) : pos + T;
    int64_t W = layer_window(li, end);
    double scale = a->multipliers                                 ? c->attention_multiplier
                   : a->softcap && c->query_pre_attn_scalar > 0 ? 1.0 / sqrt(c->query_pre_attn_scalar)
                   : c->unscaled_attention                       ? 1.0
                                                                 : 0.0;
    if (c->scale_attn_by_inverse_layer_idx && q) /* GPT-2's: one scaling, as transformers folds it */
        scale = (scale > 0.0 ? scale : 1.0 / sqrt((double)q->shape[3])) / (double)(li->index + 1);
    double cap = a->score_softcap ? c->attn_logit_softcapping : 0.0;
    double drop = a->dropouts && attn->training ? c->attn_pdrop : 0.0; /* GPT-2's attn_dropout, Phi's attention_dropout */
    accel_rng *drop_rng = sharded_dropout_rng(c); /* the probabilities of this rank's heads */
    bool ranged, packed, expl = explicit_scores(attn, li, pad, W, x->device, &ranged, &packed);
    bool sdpa = sdpa_numerics(a);
    /* the explicit scores' padding mask: the forward's for this window when it fits (made once,
     * pad_masks_once), else this layer's own; NULL without padding or packing */
    accel__pad_mask own = {0};
    const accel__pad_mask *pm = pad && expl && (pad->keep || pad->seq_start) ? &pad->masks[W != 0] : NULL;
    if (pm && q && k && !accel__pad_mask_fits(pm, q, k, pos, W, sdpa)) {
        if (accel__pad_mask_make(&own, pad->keep, pad->seq_start, q->shape[0], q->shape[2], k->shape[2], pos, W,
                                 accel__scores_dtype(q, sdpa), q->device) != ACCEL_OK)
            return NULL;
        pm = &own;
    }
    /* o [B, T, H, D]: the fused attention makes it so (no transposed copy
     * where its kernels take strides), the others' [B, H, T, D] transposed */
    accel_tensor *o = cp       ? accel__decoder_cp_attention(cp, q, k, v, scale, W, cap, sdpa)
                      : expl   ? accel__masked_attention_pad(q, k, v, pos, W, pm, sdpa, scale, cap, drop, drop_rng,
                                                             sdpa)
                      : ranged ? accel__sdpa_padded(q, k, v, pad->key_range, scale)
                      : packed ? accel__sdpa_packed(q, k, v, pad->seq_start, scale)
                               : accel__sdpa_heads_last(q, k, v, true, scale);
    if (o && (cp || expl)) o = accel_transpose(o, 1, 2);
    if (!o) return NULL;
    int64_t shape[3] = {x->shape[0], T, li->heads * c->head_dim};
    o = accel_reshape(o, 3, shape);
    return accel_module_call(p[gpt2            ? ACCEL__GPT2_C_PROJ
                               : a->fused_qkv   ? ATTN_FUSED_O
                               : a->neox_blocks ? ATTN_NEOX_DENSE
                                                : ATTN_O], o);
}

/* The hooks of attn around its body; exit runs after a failure too (nn.h). */
static accel_tensor *attention_forward(accel_module *attn, const layer_impl *li, accel_tensor *x,
                                       int64_t pos, accel_kv_cache *cache, const pad_state *pad) {
    if (accel_module_enter(attn, &x) != ACCEL_OK) return NULL;
    accel_tensor *y = x ? attention_body(attn, li, x, pos, cache, pad) : NULL;
    return accel_module_exit(attn, &y) == ACCEL_OK ? y : NULL;
}

accel_tensor *accel__decoder_mlp_forward(accel_module *mlp, accel_tensor *x) {
    accel_module **p = mlp->children;
    const accel__arch *a = accel__arch_of_module(mlp);
    if (a->fused_gate_up) { /* gate_up_proj(x) = [gate | up] (Phi3MLP's chunk(2)) */
        accel_tensor *gu = accel_module_call(p[MLP_GATE_UP], x);
        if (!gu) return NULL;
        int64_t I = gu->shape[gu->ndim - 1] / 2;
        accel_tensor *h = accel_swiglu(accel_contiguous(accel_slice(gu, gu->ndim - 1, 0, I, 1)),
                                       accel_contiguous(accel_slice(gu, gu->ndim - 1, I, 2 * I, 1)));
        return accel_module_call(p[MLP_FUSED_DOWN], h);
    }
    accel_tensor *g = accel_module_call(p[MLP_GATE], x), *u = accel_module_call(p[MLP_UP], x);
    /* act_fn(gate_proj(x)) * up_proj(x): silu (fused), Gemma's gelu_pytorch_tanh */
    accel_tensor *h = a->gemma_blocks ? accel_mul(accel_gelu(g, true), u) : accel_swiglu(g, u);
    return accel_module_call(p[MLP_DOWN], h);
}

accel_tensor *accel__decoder_norm_forward(accel_module *m, accel_tensor *x) {
    return accel__arch_of_module(m)->gemma_blocks ? accel__rms_norm_plus_one_forward(m, x)
                                                  : accel__rms_norm_forward(m, x);
}

/* x + branch (Granite: + branch residual_multiplier). */
static accel_tensor *residual(const layer_impl *li, accel_tensor *x, accel_tensor *branch) {
    if (li->arch->multipliers) branch = accel_mul_scalar(branch, li->cfg->residual_multiplier);
    return accel_add(x, branch);
}

/* GPT-2's and Phi's resid_dropout of a branch's output (the attention's and
 * the MLP's) while the layer trains; the other families have none. */
static accel_tensor *resid_dropout(accel_module *layer, const layer_impl *li, accel_tensor *branch) {
    if (!li->arch->dropouts) return branch;
    return accel_dropout(branch, li->cfg->resid_pdrop, layer->training, hidden_dropout_rng(li->cfg));
}

/* resid_dropout of the attention's output: none in StableLM (its
 * hidden_dropout acts on the MLP's output only). */
static accel_tensor *attn_resid_dropout(accel_module *layer, const layer_impl *li, accel_tensor *branch) {
    return li->arch->stablelm_blocks ? branch : resid_dropout(layer, li, branch);
}

/* x [B, T, C] -> [B, T, C]. */
static accel_tensor *layer_body(accel_module *layer, accel_tensor *x, int64_t pos, accel_kv_cache *cache,
                                const pad_state *pad) {
    const layer_impl *li = layer->impl;
    accel_module **p = layer->children;
    if (li->arch->norm_outputs) { /* OLMo 2: x + norm(attn(x)), then h + norm(mlp(h)) */
        accel_tensor *h = accel_add(x, accel_module_call(p[LAYER_IN_NORM],
                                                         attention_forward(p[LAYER_ATTN], li, x, pos, cache, pad)));
        return accel_add(h, accel_module_call(p[LAYER_POST_NORM], accel_module_call(p[LAYER_MLP], h)));
    }
    bool sandwich = li->arch->sandwich_norms; /* Gemma2: the branches' outputs normalised too */
    /* Phi: x + attn(ln(x)) + mlp(ln(x)); GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
     * (transformers' order of the sums: a + m and m + a are the same floats) */
    if (accel__arch_parallel(li->arch, li->cfg)) {
        accel_tensor *n = accel_module_call(p[LAYER_IN_NORM], x);
        accel_tensor *a = attn_resid_dropout(layer, li, attention_forward(p[LAYER_ATTN], li, n, pos, cache, pad));
        accel_tensor *n2 = accel__arch_one_norm(li->arch, li->cfg) ? n : accel_module_call(p[LAYER_POST_NORM], x);
        accel_tensor *m = resid_dropout(layer, li, accel_module_call(p[LAYER_MLP], n2));
        /* StableLM: residual + attn + mlp */
        return li->arch->stablelm_blocks ? accel_add(accel_add(x, a), m) : accel_add(accel_add(a, m), x);
    }
    accel_tensor *a = attention_forward(p[LAYER_ATTN], li,
                                        accel_module_call(p[LAYER_IN_NORM], x), pos, cache, pad);
    a = attn_resid_dropout(layer, li, a);
    if (sandwich) a = accel_module_call(p[LAYER_POST_NORM], a);
    accel_tensor *h = residual(li, x, a);
    accel_tensor *m = accel_module_call(p[sandwich ? LAYER_PRE_FF_NORM : LAYER_POST_NORM], h);
    m = resid_dropout(layer, li, accel_module_call(p[LAYER_MLP], m));
    if (sandwich) m = accel_module_call(p[LAYER_POST_FF_NORM], m);
    return residual(li, h, m);
}

/* A layer and the padded batch (NULL: none) it runs on, and the state of
 * the model's tp dropout stream (sharded_dropout_rng) when it first ran:
 * what a checkpointed layer's recompute needs (step arena, alive until the
 * backward). The tape replays the default generator's state; the tp
 * stream's is replayed here, as Megatron's checkpoint restores its tracker,
 * so the recomputed masks are the forward's. */
typedef struct layer_run {
    accel_module *layer;
    const pad_state *pad;
    accel_rng *tp_rng; /* NULL: the model has none */
    accel_rng tp_first;
    bool ran;
} layer_run;

static accel_tensor *layer_run_body(void *ctx, accel_tensor *x) {
    layer_run *r = ctx;
    if (!r->tp_rng || !r->ran) {
        if (r->tp_rng) r->tp_first = *r->tp_rng;
        r->ran = true;
        return layer_body(r->layer, x, 0, NULL, r->pad);
    }
    accel_rng now = *r->tp_rng; /* a recompute: the first run's masks, then the stream where it is */
    *r->tp_rng = r->tp_first;
    accel_tensor *y = layer_body(r->layer, x, 0, NULL, r->pad);
    *r->tp_rng = now;
    return y;
}

/* Checkpointing (when set) runs inside the layer's hooks: a ZeRO-3 unit's
 * parameters are gathered for the recompute by its backward node, which runs
 * before the checkpoint node. Generation (a cache) records no graph. */
static accel_tensor *layer_forward(accel_module *layer, accel_tensor *x, int64_t pos,
                                   accel_kv_cache *cache, const pad_state *pad) {
    if (accel_module_enter(layer, &x) != ACCEL_OK) return NULL;
    const layer_impl *li = layer->impl;
    layer_run *run = !cache && x ? accel_arena_alloc(accel_step_arena(), sizeof *run, 8) : NULL;
    if (run) *run = (layer_run){.layer = layer, .pad = pad, .tp_rng = sharded_dropout_rng(li->cfg)};
    accel_tensor *y = !x      ? NULL
                      : cache ? layer_body(layer, x, pos, cache, pad)
                              : (run ? accel__module_run(layer, layer_run_body, run, x) : NULL);
    return accel_module_exit(layer, &y) == ACCEL_OK ? y : NULL;
}

/* Gemma's embedding scale: sqrt(hidden_size) as transformers keeps it (an f32
 * tensor) rounded to the embedding weight's dtype (embed_scale.to(weight.dtype)):
 * the weights' dtype now, which a load's dtype override makes differ from the
 * config's torch_dtype. */
static double gemma_embed_scale(const accel_llama_config *c, accel_module *embed) {
    float s = (float)sqrt((double)c->hidden_size);
    accel_dtype dt = accel__module_tensor(embed, "weight")->dtype;
    if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16(s));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(s));
    return s;
}

/* The index of the layers' ModuleList among the model's children. */
static int layers_index(const accel__arch *a) {
    return a->blocks == ACCEL__BLOCKS_GPT2 ? ACCEL__GPT2_H : MODEL_LAYERS;
}

/* GPT-2's learned positions pos..pos+T-1: wpe rows [T, C], on the device of
 * h; a padded batch's position ids: [B, T, C]. */
static accel_tensor *position_embeddings(accel_module *wpe, accel_tensor *h, int64_t pos, int64_t T,
                                         const pad_state *pad) {
    /* a padded batch's ids of positions [pos, pos + T): this rank's columns
     * under sequence parallelism (pos past the cache's length) */
    if (pad && pad->positions) {
        accel_tensor *p = pad->position_ids;
        int64_t c0 = pos - pad->pos;
        if (p && T != p->shape[1]) p = accel_slice(p, 1, c0, c0 + T, 1);
        return h && p ? accel_module_call(wpe, p) : NULL;
    }
    accel_tensor *p = h ? accel_arange(ACCEL_I64, pos, pos + T) : NULL;
    if (p && !accel_device_eq(p->device, h->device)) p = accel_to_device(p, h->device);
    return p ? accel_module_call(wpe, p) : NULL;
}

/* The embeddings of ids [B, T] (scaled: Gemma, Granite; GPT-2: plus learned
 * positions), then the embd_pdrop dropout while the model trains (GPT-2,
 * Phi): [B, T, C]. */
static accel_tensor *embed(accel_module *model, const accel_llama_config *c, const accel__arch *a,
                           accel_tensor *ids, int64_t pos, const pad_state *pad) {
    accel_module **mp = model->children;
    int64_t T = ids ? ids->shape[1] : 0;
    accel_tensor *h = accel_module_call(mp[MODEL_EMBED], ids); /* [B, T, C] */
    if (a->gemma_blocks) h = accel_mul_scalar(h, gemma_embed_scale(c, mp[MODEL_EMBED]));
    if (a->multipliers) h = accel_mul_scalar(h, c->embedding_multiplier);
    if (a->blocks == ACCEL__BLOCKS_GPT2 && h) {
        /* under sequence parallelism h holds this rank's T / tp of the positions */
        int64_t Tl = h->shape[1], first = pos;
        accel_pg *tp;
        if (Tl != T && accel_module_tp_info(mp[MODEL_EMBED], NULL, &tp, NULL, NULL)) first += accel_pg_rank(tp) * Tl;
        h = accel_add(h, position_embeddings(mp[ACCEL__GPT2_WPE], h, first, Tl, pad));
    }
    return a->dropouts && h ? accel_dropout(h, c->embd_pdrop, model->training, hidden_dropout_rng(c)) : h;
}

/* Layers [lo, hi) of the stack, then the final norm when `norm`. */
static accel_tensor *run_layers(accel_module *model, const accel__arch *a, accel_tensor *h, int lo, int hi, bool norm,
                                int64_t pos, accel_kv_cache *cache, const pad_state *pad) {
    int li = layers_index(a);
    accel_module *layers = model->children[li];
    for (int i = lo; i < hi && h; i++) h = layer_forward(layers->children[i], h, pos, cache, pad);
    return norm ? accel_module_call(model->children[li + 1], h) : h; /* the final norm, after the layers */
}

/* LlamaModel / GPT2Model: embeddings, layers, final norm, inside the model's hooks. */
static accel_tensor *model_forward(accel_module *model, const accel_llama_config *c, const accel__arch *a,
                                   accel_tensor *ids, int64_t pos, accel_kv_cache *cache, const pad_state *pad) {
    accel_tensor *h = ids;
    if (accel_module_enter(model, &h) != ACCEL_OK) return NULL;
    h = h ? embed(model, c, a, h, pos, pad) : NULL;
    h = run_layers(model, a, h, 0, c->num_hidden_layers, true, pos, cache, pad);
    return accel_module_exit(model, &h) == ACCEL_OK ? h : NULL;
}

/* lm_head (Gemma2: capped, Granite: scaled): [B, T, C] -> logits [B, T, V]. */
static accel_tensor *lm_head(accel_module *llama, const accel_llama_config *c, const accel__arch *a, accel_tensor *h) {
    accel_tensor *logits = accel_module_call(llama->children[ROOT_LM_HEAD], h); /* [B, T, V] */
    if (a->softcap && c->final_logit_softcapping > 0) /* Gemma2: cap tanh(logits / cap) */
        logits = accel_mul_scalar(accel_tanh(accel_mul_scalar(logits, 1.0 / c->final_logit_softcapping)),
                                  c->final_logit_softcapping);
    if (a->multipliers) logits = accel_mul_scalar(logits, 1.0 / c->logits_scaling); /* Granite */
    return logits;
}

/* accel_module_call runs the hooks and the checkpointing around it. */
accel_tensor *accel__decoder_layer_call(accel_module *layer, accel_tensor *x) {
    return layer_body(layer, x, 0, NULL, NULL);
}

/* The row of a causal LM root built here, else NULL. */
static const accel__arch *root_arch(const accel_module *m) {
    const accel__arch *a = accel__arch_of_module(m);
    return a && m->ops == &a->causal_lm ? a : NULL;
}

bool accel__decoder_checkpoint_layers(accel_module *m, bool enable) {
    const accel__arch *a = accel__arch_of_module(m);
    if (!a) return false;
    if (m->ops == &a->causal_lm) m = m->children[ROOT_MODEL];
    if (m->ops != &a->model) return false;
    accel_module *layers = m->children[layers_index(a)];
    for (int i = 0; i < layers->n_children; i++) layers->children[i]->gradient_checkpointing = enable;
    return true;
}

/* The whole model's single-tensor entry points (ids -> logits / hidden states). */
accel_tensor *accel__decoder_no_forward(accel_module *m, accel_tensor *ids) {
    if (root_arch(m)) return accel_llama_forward(m, ids, NULL);
    accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: call accel_llama_forward on the causal LM root", m->ops->type_name);
    return NULL;
}

static accel_module *linear(const accel_llama_config *c, int64_t in, int64_t out, bool bias,
                            accel_device dev) {
    return accel__linear_create(in, out, bias, dev, c->torch_dtype, c->initializer_range);
}

/* ACCEL__NORM_IN_RESIDUAL where the residual stream is summed with the
 * projections' outputs themselves (not with their normalised outputs: OLMo
 * 2, Gemma 2) and the norm reads the sum itself, else 0. */
static unsigned branch_sums(const accel__arch *a) {
    return a->norm_outputs || a->sandwich_norms ? 0 : ACCEL__NORM_IN_RESIDUAL;
}

/* The family's norm over dim: RMSNorm, Phi's and GPT-NeoX's LayerNorm with bias (of eps
 * layer_norm_eps, held in rms_norm_eps). roles: what an RMSNorm's output and
 * input are to the layer (ops/norm.h). */
static accel_module *rms_norm(const accel__arch *a, const accel_llama_config *c, int64_t dim, accel_device dev,
                              unsigned roles) {
    if (a->layer_norms)
        return accel__layer_norm_create(&a->norm, dim, c->rms_norm_eps, dev, c->torch_dtype);
    accel_module *m = accel__rms_norm_create(&a->norm, dim, c->rms_norm_eps, dev, c->torch_dtype, roles);
    /* Gemma's norms scale by 1 + weight: their weights start at 0 */
    accel_tensor *w = m && a->gemma_blocks ? accel__module_tensor(m, "weight") : NULL;
    if (w && w->device.type != ACCEL_DEV_META && accel_fill_(w, 0.0) != ACCEL_OK) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel__decoder_layer_module(const accel__arch *a, const accel_llama_config *c, int index) {
    layer_impl *li = accel_malloc(sizeof *li);
    if (!li) return NULL;
    li->cfg = c;
    li->arch = a;
    li->index = index;
    li->heads = c->num_attention_heads;
    li->kv_heads = c->num_key_value_heads;
    li->windowed = accel__arch_layer_windowed(a, c, index);
    li->local_rope = accel__arch_layer_local(a, c, index);
    accel_module *layer = accel_module_new(&a->layer, li);
    if (!layer) accel_free(li);
    return layer;
}

void accel__decoder_layer_set_heads(accel_module *layer, int64_t heads, int64_t kv_heads) {
    layer_impl *li = layer->impl;
    li->heads = heads;
    li->kv_heads = kv_heads;
}

int64_t accel__decoder_layer_heads(const accel_module *layer) { return ((const layer_impl *)layer->impl)->heads; }

static accel_module *new_layer(const accel__arch *a, const accel_llama_config *c, int index, accel_device dev) {
    accel_module *layer = accel__decoder_layer_module(a, c, index);
    if (!layer) return NULL;
    int64_t C = c->hidden_size, D = c->head_dim, I = c->intermediate_size;
    int64_t qd = c->num_attention_heads * D, kvd = c->num_key_value_heads * D;
    /* Phi: every projection has a bias; GPT-NeoX: the MLP's always */
    /* StableLM, Qwen2-MoE: attention_bias (use_qkv_bias, qkv_bias) on q/k/v only */
    bool qkvb = a->qkv_bias || c->attention_bias || a->phi_blocks;
    bool ob = (!a->qkv_bias && !a->qkv_only_bias && c->attention_bias) || a->phi_blocks;
    bool mb = c->mlp_bias || a->phi_blocks || a->neox_blocks;
    accel_module *attn = accel_module_add_child(layer, a->neox_blocks ? "attention" : "self_attn",
                                                accel_module_new(&a->attn, NULL));
    /* a sparse layer's block in the MLP's place (Mixtral's named block_sparse_moe) */
    bool sparse = accel__arch_layer_sparse(a, c, index);
    accel_module *block = NULL;
    if (sparse) {
        block = accel__moe_block_create(a, c, dev);
    } else if (a->neox_blocks && c->neox_hidden_act) { /* the tanh GELU: a flag in its impl (gpt2.c) */
        bool *tanh = accel_malloc(sizeof *tanh);
        if (tanh) *tanh = true;
        if (tanh && !(block = accel_module_new(&a->mlp, tanh))) accel_free(tanh);
    } else {
        block = accel_module_new(&a->mlp, NULL);
    }
    accel_module *mlp = accel_module_add_child(layer, sparse && a->moe == ACCEL__MOE_MIXTRAL ? "block_sparse_moe" : "mlp",
                                               block);
    /* qk_norm: per head over D; qk_norm_full: over the whole projection */
    /* Phi's qk_layernorm: q_layernorm / k_layernorm, one LayerNorm [D] each;
     * StableLM's: a LayerNorm [D] of its own per head (norm_per_head) */
    bool heads_norm = accel__arch_qk_norm_heads(a, c);
    int64_t qn = heads_norm ? D : qd, kn = heads_norm ? D : kvd;
    /* the input norm's input: the embeddings in the first layer */
    unsigned in_sum = index > 0 ? branch_sums(a) : 0;
    bool ok = attn && mlp &&
              (a->neox_blocks /* query_key_value [3 H D, C], per head q, k, v; dense */
                   ? accel_module_add_child(attn, "query_key_value", linear(c, C, 3 * qd, qkvb, dev)) &&
                         accel_module_add_child(attn, "dense", linear(c, qd, C, ob, dev))
               : a->fused_qkv ? accel_module_add_child(attn, "o_proj", linear(c, qd, C, ob, dev)) &&
                                  accel_module_add_child(attn, "qkv_proj", linear(c, C, qd + 2 * kvd, qkvb, dev))
                            : accel_module_add_child(attn, "q_proj", linear(c, C, qd, qkvb, dev)) &&
                                  accel_module_add_child(attn, "k_proj", linear(c, C, kvd, qkvb, dev)) &&
                                  accel_module_add_child(attn, "v_proj", linear(c, C, kvd, qkvb, dev)) &&
                                  accel_module_add_child(attn, accel__arch_o_proj(a), linear(c, qd, C, ob, dev))) &&
              (!(heads_norm || a->qk_norm_full) ||
               (a->stablelm_blocks
                    ? accel_module_add_child(attn, "q_layernorm", norm_per_head(c, c->num_attention_heads, dev)) &&
                          accel_module_add_child(attn, "k_layernorm", norm_per_head(c, c->num_key_value_heads, dev))
                    : accel_module_add_child(attn, a->phi_blocks ? "q_layernorm" : "q_norm",
                                             rms_norm(a, c, qn, dev, 0)) &&
                          accel_module_add_child(attn, a->phi_blocks ? "k_layernorm" : "k_norm",
                                                 rms_norm(a, c, kn, dev, 0)))) &&
              (sparse ||
               /* PhiMLP: fc1, gelu_new, fc2 (accel__gelu_mlp_forward); GPTNeoXMLP:
                * dense_h_to_4h, gelu, dense_4h_to_h (accel__gelu_exact_mlp_forward) */
               /* Starcoder2MLP: c_fc, gelu_pytorch_tanh, c_proj (accel__gelu_mlp_forward) */
               (a->phi_blocks || a->neox_blocks || a->starcoder2_blocks
                    ? accel_module_add_child(mlp, a->phi_blocks ? "fc1" : a->neox_blocks ? "dense_h_to_4h" : "c_fc",
                                             linear(c, C, I, mb, dev)) &&
                          accel_module_add_child(mlp,
                                                 a->phi_blocks ? "fc2" : a->neox_blocks ? "dense_4h_to_h" : "c_proj",
                                                 linear(c, I, C, mb, dev))
                    : (a->fused_gate_up ? accel_module_add_child(mlp, "gate_up_proj", linear(c, C, 2 * I, mb, dev)) != NULL
                                  : accel_module_add_child(mlp, "gate_proj", linear(c, C, I, mb, dev)) &&
                                        accel_module_add_child(mlp, "up_proj", linear(c, C, I, mb, dev))) &&
                accel_module_add_child(mlp, "down_proj", linear(c, I, C, mb, dev)))) &&
              /* the layer's forward (above): the input norm feeds the
               * attention, the second norm the MLP, unless the branches'
               * outputs are normalised (OLMo 2's outputs; Gemma 2's sandwich,
               * where pre_feedforward_layernorm feeds the MLP); a norm's
               * input is a sum with a projection's output where they are
               * not; with one norm (Phi, StableLM's parallel layer) the
               * input norm feeds both */
              accel_module_add_child(layer, a->norm_outputs ? "post_attention_layernorm" : "input_layernorm",
                                     rms_norm(a, c, C, dev, a->norm_outputs ? 0 : ACCEL__NORM_OUT_TO_GEMMS | in_sum)) &&
              (accel__arch_one_norm(a, c) ||
               accel_module_add_child(layer, a->norm_outputs ? "post_feedforward_layernorm" : "post_attention_layernorm",
                                      rms_norm(a, c, C, dev, a->norm_outputs || a->sandwich_norms
                                                                 ? 0 : ACCEL__NORM_OUT_TO_GEMMS | branch_sums(a)))) &&
              (!a->sandwich_norms ||
               (accel_module_add_child(layer, "pre_feedforward_layernorm", rms_norm(a, c, C, dev, ACCEL__NORM_OUT_TO_GEMMS)) &&
                accel_module_add_child(layer, "post_feedforward_layernorm", rms_norm(a, c, C, dev, 0))));
    if (!ok) {
        accel_module_free(layer);
        return NULL;
    }
    return layer;
}

accel_module *accel_llama_new(const accel_llama_config *cfg, accel_device dev) {
    if (!cfg) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_new: config is NULL");
        return NULL;
    }
    /* the root's impl: the config its layers point at, its cp setting, no tp dropout stream (decoder_cp.h) */
    accel__decoder_root *r = accel_malloc(sizeof *r);
    if (!r) return NULL;
    r->cp = (accel__decoder_cp){NULL, ACCEL_CP_ALLGATHER};
    r->tp_cut_open = false;
    r->tp_rng = (accel__decoder_tp_rng){.on = false};
    r->pp_stages = r->pp_stage = 0;
    accel_llama_config *c = &r->cfg;
    if (resolve_config(cfg, c, "accel_llama_new")) {
        accel_free(r);
        return NULL;
    }
    const accel__arch *a = accel__arch_find(c->model_type);
    snprintf(c->model_type, sizeof c->model_type, "%s", a->model_type);
    accel_module *root = accel_module_new(&a->causal_lm, r);
    if (!root) {
        accel_free(r);
        return NULL;
    }
    if (a->blocks == ACCEL__BLOCKS_GPT2) { /* GPT-2's own tree (gpt2.c) */
        if (accel__gpt2_build(root, a, c, dev) == ACCEL_OK) return root;
        accel_module_free(root);
        return NULL;
    }
    /* GPT-NeoX's names: gpt_neox, embed_in, final_layer_norm, embed_out (arch.h) */
    accel_module *model = accel_module_add_child(root, accel__arch_base(a), accel_module_new(&a->model, NULL));
    bool ok = model &&
              accel_module_add_child(model, accel__arch_embed(a), /* nn.Embedding(padding_idx=pad_token_id) */
                                     accel__padded_embedding_create(c->vocab_size, c->hidden_size, dev, c->torch_dtype,
                                                                    c->initializer_range, padding_idx(a, c)));
    accel_module *layers = ok ? accel_module_add_child(model, "layers", accel_module_new(&accel__module_list_ops, NULL))
                              : NULL;
    ok = ok && layers;
    for (int i = 0; ok && i < c->num_hidden_layers; i++) {
        char name[24];
        snprintf(name, sizeof name, "%d", i);
        ok = accel_module_add_child(layers, name, new_layer(a, c, i, dev)) != NULL;
    }
    /* A tied head gets its weight from embed_tokens: build it on meta (Phi's
     * where it is: its bias is its own). */
    ok = ok &&
         accel_module_add_child(model, accel__arch_final_norm(a),
                                rms_norm(a, c, c->hidden_size, dev, ACCEL__NORM_OUT_TO_GEMMS | branch_sums(a))) &&
         accel_module_add_child(root, accel__arch_head(a),
                                linear(c, c->hidden_size, c->vocab_size, a->phi_blocks,
                                       c->tie_word_embeddings && !a->phi_blocks ? ACCEL_META_DEVICE : dev));
    if (ok && c->tie_word_embeddings) {
        char head[24], embed[40];
        snprintf(head, sizeof head, "%s.weight", accel__arch_head(a));
        snprintf(embed, sizeof embed, "%s.%s.weight", accel__arch_base(a), accel__arch_embed(a));
        ok = accel_module_tie(root, head, embed) == ACCEL_OK;
    }
    if (!ok) {
        accel_module_free(root);
        return NULL;
    }
    return root;
}

const accel_llama_config *accel_llama_config_of(accel_module *llama) {
    if (!root_arch(llama)) {
        (llama ? accel_set_error : accel_propagate_error)(ACCEL_ERR_INVALID_ARG,
                        "accel_llama_config_of: not a causal LM built by accel_llama_new (LlamaForCausalLM, ...)");
        return NULL;
    }
    return llama->impl;
}

/* t [B, n] of integers (an attention_mask, ids or position_ids, named
 * `what`) as host int64 [B n] (step arena); NULL + error naming it for
 * another shape or dtype. A mask (mask_dtypes) may also be uint8 or bool;
 * ids and position ids only int64 or int32, as torch's embedding and rope
 * take them. */
static int64_t *host_ints(accel_tensor *t, int64_t B, int64_t n, const char *what, const char *want,
                          bool mask_dtypes) {
    if (!accel_tensor_check(t, "accel_llama_forward", what)) return NULL;
    bool ints = t->dtype == ACCEL_I64 || t->dtype == ACCEL_I32 ||
                (mask_dtypes && (t->dtype == ACCEL_U8 || t->dtype == ACCEL_BOOL));
    if (t->ndim != 2 || t->shape[0] != B || t->shape[1] != n || !ints || t->device.type == ACCEL_DEV_META) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_forward: %s must be %s [%lld, %lld] (%s, with data), got %s %s",
                        what, want, (long long)B, (long long)n,
                        mask_dtypes ? "int64, int32, uint8 or bool" : "int64 or int32", accel_dtype_name(t->dtype),
                        accel_shape_str(t, b, sizeof b));
        return NULL;
    }
    accel_tensor *w = accel_to_dtype(accel_contiguous(t), ACCEL_I64);
    int64_t *h = w ? accel_arena_alloc(accel_step_arena(), (size_t)(B * n > 0 ? B * n : 1) * sizeof *h, 64) : NULL;
    return h && accel_tensor_to_host(w, h) == ACCEL_OK ? h : NULL;
}

/* *out: the key range [B, 2] of keep [B, S] (step arena): row b's one run
 * of ones [lo, hi) ([0, 0) for a row of zeros); NULL where some row has a 0
 * between ones. An error only out of memory. */
static accel_status key_ranges(const uint8_t *keep, int64_t B, int64_t S, const int64_t **out) {
    *out = NULL;
    int64_t *r = accel_arena_alloc(accel_step_arena(), (size_t)(2 * B + 1) * sizeof *r, 64);
    if (!r) return accel_last_status();
    for (int64_t b = 0; b < B; b++) {
        const uint8_t *row = keep + b * S;
        int64_t lo = 0, hi = S;
        while (lo < S && !row[lo]) lo++;
        while (hi > lo && !row[hi - 1]) hi--;
        for (int64_t j = lo; j < hi; j++)
            if (!row[j]) return ACCEL_OK; /* a hole: no ranges */
        r[2 * b] = hi > lo ? lo : 0, r[2 * b + 1] = hi > lo ? hi : 0;
    }
    *out = r;
    return ACCEL_OK;
}

/* *out: the packed sequences of positions p [B, T] (step arena) as
 * transformers' find_packed_sequence_indices finds them, a new one wherever
 * p[t] - p[t - 1] != 1 in a row: (*out)[b T + t] the index of the first
 * token of t's. NULL when no row restarts (transformers then masks as
 * without packing). An error only out of memory. */
static accel_status packed_starts(const int64_t *p, int64_t B, int64_t T, const int64_t **out) {
    *out = NULL;
    int64_t *s = accel_arena_alloc(accel_step_arena(), (size_t)(B * T > 0 ? B * T : 1) * sizeof *s, 64);
    if (!s) return accel_last_status();
    bool restarts = false;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t *row = p + b * T; /* p[t] == p[t - 1] + 1 without its overflow */
            s[b * T + t] = t && row[t - 1] < INT64_MAX && row[t] == row[t - 1] + 1 ? s[b * T + t - 1] : t;
            restarts |= s[b * T + t] != 0;
        }
    if (restarts) *out = s;
    return ACCEL_OK;
}

/* in's attention_mask and position_ids (or hp's, on the host: then in's
 * are NULL) read into *pad; *padded false when neither changes the forward
 * (no mask, or one of ones only, and no position ids: today's forward, bit
 * for bit). pos: the cache's length. With in->no_cache, no mask and
 * position ids that restart: their packed sequences (pad->seq_start). */
static accel_status pad_read(const accel_llama_inputs *in, const accel__pad_host *hp, const accel_llama_config *c,
                             int64_t pos, pad_state *pad, bool *padded) {
    int64_t B = in->ids->shape[0], T = in->ids->shape[1], S = pos + T;
    *pad = (pad_state){.pos = pos, .rope_len = S};
    if (in->attention_mask || hp->mask) {
        const int64_t *m = hp->mask ? hp->mask
                                    : host_ints(in->attention_mask, B, S, "attention_mask",
                                                "[B, T] of ids, or with a KV cache [B, cache length + T]:", true);
        if (!m) return accel_last_status();
        uint8_t *keep = accel_arena_alloc(accel_step_arena(), (size_t)(B * S > 0 ? B * S : 1), 64);
        if (!keep) return accel_last_status();
        bool zero = false;
        for (int64_t i = 0; i < B * S; i++) {
            if (m[i] != 0 && m[i] != 1)
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_forward: attention_mask[%lld][%lld] is "
                                       "%lld: it must hold 0 (masked) or 1", (long long)(i / S), (long long)(i % S),
                                       (long long)m[i]);
            keep[i] = (uint8_t)m[i];
            zero |= !m[i];
        }
        pad->keep = zero ? keep : NULL;
        if (zero && key_ranges(keep, B, S, &pad->key_range)) return accel_last_status();
    }
    if (in->position_ids || hp->positions) {
        const int64_t *p = hp->positions ? hp->positions : host_ints(in->position_ids, B, T, "position_ids",
                                                                      "[B, T] as ids:", false);
        if (!p) return accel_last_status();
        /* GPT-2's learned positions have rows up to n_positions only */
        bool gpt2 = accel__arch_find(c->model_type)->blocks == ACCEL__BLOCKS_GPT2;
        for (int64_t i = 0; i < B * T; i++)
            if (p[i] < 0 || (gpt2 && p[i] >= c->max_position_embeddings))
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_forward: position_ids[%lld][%lld] is %lld: "
                                       "it must be >= 0%s", (long long)(i / T), (long long)(i % T), (long long)p[i],
                                       gpt2 ? " and below n_positions of this gpt2 model" : "");
        /* the positions the forward takes without them (pos + t in every row): its own path, as a
         * mask of ones is */
        bool plain = true;
        for (int64_t i = 0; plain && i < B * T; i++) plain = p[i] == pos + i % T;
        pad->positions = plain ? NULL : p;
        /* transformers detects packing only without a mask (even one of ones) and without a cache; the
         * loss found them already */
        pad->seq_start = hp->seq_start;
        if (!hp->seq_start && in->no_cache && !in->attention_mask && !hp->mask &&
            packed_starts(p, B, T, &pad->seq_start) != ACCEL_OK)
            return accel_last_status();
        if (!plain) {
            pad->rope_len = 0;
            for (int64_t i = 0; i < B * T; i++) /* saturated: a position of INT64_MAX is taken (test_review_window) */
                if (p[i] >= pad->rope_len) pad->rope_len = p[i] < INT64_MAX ? p[i] + 1 : INT64_MAX;
        }
        if (!plain && gpt2) { /* only GPT-2's learned positions read them as a tensor */
            pad->position_ids = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, T), in->ids->device);
            if (!pad->position_ids || accel_tensor_from_host(pad->position_ids, p) != ACCEL_OK)
                return accel_last_status();
        }
    }
    *padded = pad->keep || pad->positions;
    return ACCEL_OK;
}

/* pad's RoPE tables (pad_state) for the positions' seq_len-long sequence,
 * each kind of layer's once, on dev (the ids'; a layer elsewhere builds
 * its own): in the step arena before any layer runs, where a checkpointed
 * layer's recompute finds them (its own allocations are given back). */
static accel_status rope_tables_once(accel_module *llama, const accel_llama_config *c, int64_t B, int64_t T,
                                     int64_t seq_len, accel_device dev, pad_state *pad) {
    accel_module *layers = accel__decoder_layers(llama);
    if (!pad->positions || !layers || root_arch(llama)->blocks == ACCEL__BLOCKS_GPT2) return ACCEL_OK;
    int64_t rd = accel__rotary_dim(c);
    for (int i = 0; i < layers->n_children; i++) {
        bool local = ((const layer_impl *)layers->children[i]->impl)->local_rope;
        if (pad->rope_cos[local]) continue;
        float *inv = accel_arena_alloc(accel_step_arena(), (size_t)(rd / 2 + 1) * sizeof *inv, 64);
        if (!inv) return accel_last_status();
        double scaling = accel__rope_inv_freq(c, local, seq_len, inv);
        accel_status st = accel__rope_tables(pad->positions, B, T, rd / 2, inv, scaling, dev, &pad->rope_cos[local],
                                             &pad->rope_sin[local]);
        if (st != ACCEL_OK) return st;
        if (!pad->rope_cos[local]) return ACCEL_OK; /* meta: none */
    }
    return ACCEL_OK;
}

/* pad's padding masks (pad_state) for the layers that take the explicit
 * scores, one a window, made as rope_tables_once's tables are: on dev (the
 * ids'), in the dtype of the layers' scores (accel__scores_dtype_of the
 * dtype they compute in: the autocast's, else the weights', the
 * embedding's standing for them); a layer that computes
 * elsewhere or otherwise makes its own. After llama's hooks have begun
 * (autocast). */
static accel_status pad_masks_once(accel_module *llama, int64_t B, int64_t T, int64_t pos, accel_device dev,
                                   pad_state *pad) {
    accel_module *layers = accel__decoder_layers(llama);
    if ((!pad->keep && !pad->seq_start) || !layers) return ACCEL_OK;
    accel_dtype dt = accel_autocast_dtype() != ACCEL_F32
                         ? accel_autocast_dtype()
                         : accel__module_tensor(llama->children[ROOT_MODEL]->children[MODEL_EMBED], "weight")->dtype;
    for (int i = 0; i < layers->n_children; i++) {
        const layer_impl *li = layers->children[i]->impl;
        int64_t W = layer_window(li, pos + T);
        bool ranged, packed;
        if (!explicit_scores(layers->children[i]->children[LAYER_ATTN], li, pad, W, dev, &ranged, &packed) ||
            pad->masks[W != 0].mask)
            continue;
        accel_status st = accel__pad_mask_make(&pad->masks[W != 0], pad->keep, pad->seq_start, B, T, pos + T, pos, W,
                                               accel__scores_dtype_of(dt, sdpa_numerics(li->arch)), dev);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

/* Whether a parameter of m is on meta (true when they cannot be listed: the caller refuses then). */
static bool any_param_on_meta(accel_module *m) {
    accel_tensor **p = NULL;
    int n = accel_module_parameters(m, &p);
    bool meta = n < 0;
    for (int i = 0; i < n && !meta; i++) meta = p[i]->device.type == ACCEL_DEV_META;
    accel_free(p);
    if (n < 0) accel_clear_error();
    return meta;
}

/* accel_llama_forward_ex; `last`: the logits of the last position only, [B, 1, V]; hp: the attention_mask
 * and position ids on the host (in's NULL), or none. */
static accel_tensor *forward(accel_module *llama, const accel_llama_inputs *in, bool last, const accel__pad_host *hp) {
    const accel_llama_config *c = accel_llama_config_of(llama);
    if (!c) return NULL;
    accel__decoder_root *r = llama->impl;
    /* a load that gave every parameter its data back (accel_load_checkpoint_in_model after the pipeline)
     * makes the model whole again */
    if (r->pp_stages > 1 && !any_param_on_meta(llama)) r->pp_stages = r->pp_stage = 0;
    if (r->pp_stages > 1) { /* else the meta layers give a result without data, failing only in its backward */
        accel_set_error(ACCEL_ERR_STATE, "accel_llama_forward: the model holds only pipeline stage %d of %d (a "
                        "pipeline prepare moved the other stages' parameters to meta, without data, and no unprepare "
                        "or accel_accelerator_free brings them back): train it with accel_accelerator_pipeline_step "
                        "while prepared, save it with accel_accelerator_save_model, or build or load it anew",
                        r->pp_stage, r->pp_stages);
        return NULL;
    }
    if (!in) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_forward_ex: inputs are NULL");
        return NULL;
    }
    accel_tensor *ids = in->ids;
    accel_kv_cache *cache = in->cache;
    if (!accel_tensor_check(ids, "accel_llama_forward", "ids")) return NULL;
    if (ids->ndim != 2 || (ids->dtype != ACCEL_I64 && ids->dtype != ACCEL_I32)) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_forward: ids must be [B, T] int64/int32, got %s %s",
                        accel_dtype_name(ids->dtype), accel_shape_str(ids, b, sizeof b));
        return NULL;
    }
    if (in->no_cache && cache) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_forward: no_cache is set (transformers' use_cache=False) "
                        "and a KV cache is given: pass one or the other");
        return NULL;
    }
    int64_t pos = cache ? cache->len : 0, T = ids->shape[1];
    /* (position ids: pad_read checks them; a padded row's positions lag its indices) */
    if (accel__arch_find(c->model_type)->blocks == ACCEL__BLOCKS_GPT2 && !in->position_ids && !hp->positions &&
        pos + T > c->max_position_embeddings) {
        accel_set_error(ACCEL_ERR_SHAPE,
                        "accel_llama_forward: positions %lld..%lld run past n_positions (%lld) of this gpt2 "
                        "model: its learned position embeddings have no row for them",
                        (long long)pos, (long long)(pos + T - 1), (long long)c->max_position_embeddings);
        return NULL;
    }
    accel_pg *tp = NULL;
    accel_module_tp_info(llama->children[ROOT_LM_HEAD], NULL, &tp, NULL, NULL);
    int64_t kv_heads = rank_kv_heads(llama, c);
    /* head_dim too: a cache of another model's head size was refused only by
     * the first layer's copy into it, naming neither the cache nor the model */
    if (cache && (cache->n_layers != c->num_hidden_layers || cache->batch != ids->shape[0] ||
                  pos + T > cache->max_len || cache->kv_heads < kv_heads || cache->head_dim != c->head_dim)) {
        accel_set_error(ACCEL_ERR_SHAPE,
                        "accel_llama_forward: KV cache (layers %d, batch %lld, %lld key/value heads of %lld dims, "
                        "%lld of %lld used) cannot take %lld more positions for batch %lld of %d layers of %lld "
                        "key/value heads of %lld dims",
                        cache->n_layers, (long long)cache->batch, (long long)cache->kv_heads,
                        (long long)cache->head_dim, (long long)pos, (long long)cache->max_len, (long long)T,
                        (long long)ids->shape[0], (int)c->num_hidden_layers, (long long)kv_heads,
                        (long long)c->head_dim);
        return NULL;
    }
    if (accel__decoder_cp_of(c)->pg && accel__decoder_cp_check(c, llama->training, cache, ids) != ACCEL_OK) return NULL;
    bool given = in->attention_mask || in->position_ids || hp->mask || hp->positions;
    if (given && accel__decoder_cp_of(c)->pg) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_llama_forward: attention_mask and position_ids under context "
                        "parallelism are not implemented (the sharded attention has no padding mask)");
        return NULL;
    }
    /* in the step arena: a checkpointed layer's recompute reads it in the backward */
    pad_state *pad = given ? accel_arena_alloc(accel_step_arena(), sizeof *pad, 8) : NULL;
    bool padded = false;
    if (given && (!pad || pad_read(in, hp, c, pos, pad, &padded) != ACCEL_OK)) return NULL;
    if (padded && rope_tables_once(llama, c, ids->shape[0], T, pad->rope_len, ids->device, pad) != ACCEL_OK)
        return NULL;
    /* Generating under sequence parallelism: a decoding step's one position
     * cannot be split over the ranks, so the tp regions run whole on every
     * rank, without the sequence's scatter and gather (Megatron and vLLM
     * generate without it); the same weights, the same results. */
    bool split = cache && tp ? accel__tp_sequence_split(false) : true;
    /* The root's hooks run too: the Accelerator's autocast, a dispatch's
     * return of the logits to the device of the ids. */
    accel_tensor *h = ids, *logits = NULL;
    if (accel_module_enter(llama, &h) == ACCEL_OK) {
        const accel__arch *a = root_arch(llama);
        h = padded && pad_masks_once(llama, ids->shape[0], T, pos, ids->device, pad) != ACCEL_OK
                ? NULL
                : model_forward(llama->children[ROOT_MODEL], c, a, h, pos, cache, padded ? pad : NULL);
        if (last && h && h->shape[1] > 1) h = accel_slice(h, 1, h->shape[1] - 1, h->shape[1], 1);
        logits = lm_head(llama, c, a, h);
        /* generating under tp: every rank gets the whole vocabulary's logits */
        if (cache && tp && logits) logits = accel_tp_gather_from_region(logits, tp);
        if (accel_module_exit(llama, &logits) != ACCEL_OK) logits = NULL;
    }
    accel__tp_sequence_split(split);
    if (logits && cache) cache->len += T;
    return logits;
}

/* Whether llama's logits are vocabulary-parallel (a tp plan's lm_head):
 * then *tp its group and *v0 the first of this rank's columns. */
static bool vocab_parallel(accel_module *llama, accel_pg **tp, int64_t *v0) {
    return accel_module_tp_info(llama->children[ROOT_LM_HEAD], NULL, tp, v0, NULL);
}

static const accel__pad_host NO_HOST_PAD;

accel_tensor *accel_llama_forward(accel_module *llama, accel_tensor *ids, accel_kv_cache *cache) {
    return forward(llama, &(accel_llama_inputs){.ids = ids, .cache = cache}, false, &NO_HOST_PAD);
}

accel_tensor *accel_llama_forward_ex(accel_module *llama, const accel_llama_inputs *in) {
    return forward(llama, in, false, &NO_HOST_PAD);
}

accel_tensor *accel__llama_forward_last(accel_module *llama, const accel_llama_inputs *in, const accel__pad_host *hp) {
    if (in && hp && (in->attention_mask || in->position_ids)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_forward: attention_mask and position_ids given twice "
                        "(as tensors and on the host)");
        return NULL;
    }
    return forward(llama, in, true, hp ? hp : &NO_HOST_PAD);
}

/* The labels of a padded or packed batch: ids [B, T] shifted left, -100
 * where the attention_mask (m, its host copy; NULL: none) is 0, at each
 * packed sequence's first token (starts: packed_starts'; NULL: none) and at
 * the end (transformers' labels -100 at the pads, DataCollatorWithFlattening's
 * at the sequences' first tokens, then its shift), i64 on the ids' device. */
static accel_tensor *masked_labels(accel_tensor *ids, const int64_t *m, const int64_t *starts) {
    int64_t B = ids->shape[0], T = ids->shape[1];
    const int64_t *id = host_ints(ids, B, T, "ids", "[B, T]", false);
    int64_t *l = id ? accel_arena_alloc(accel_step_arena(), (size_t)(B * T) * sizeof *l, 64) : NULL;
    if (!l) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, n = 1; t < T; t++, n++)
            l[b * T + t] = n < T && (!m || m[b * T + n]) && (!starts || starts[b * T + n] != n) ? id[b * T + n] : -100;
    accel_tensor *labels = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, T), ids->device);
    return labels && accel_tensor_from_host(labels, l) == ACCEL_OK ? labels : NULL;
}

static accel_tensor *labels_loss(accel_module *llama, accel_tensor *logits, accel_tensor *labels);

accel_tensor *accel_llama_loss(accel_module *llama, accel_tensor *ids) {
    return accel_llama_loss_ex(llama, &(accel_llama_inputs){.ids = ids});
}

accel_tensor *accel_llama_loss_ex(accel_module *llama, const accel_llama_inputs *in) {
    if (!in) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_loss: inputs are NULL");
        return NULL;
    }
    accel_tensor *ids = in->ids;
    if (!accel_tensor_check(ids, "accel_llama_loss", "ids")) return NULL;
    if (ids->ndim != 2 || ids->shape[1] < 2 || ids->device.type == ACCEL_DEV_META || in->cache) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_loss: ids must be [B, T>=2] with data, and no KV cache, got %s%s",
                        accel_shape_str(ids, b, sizeof b), in->cache ? " and a cache" : "");
        return NULL;
    }
    /* the logits go to the loss, not to the caller: an Accelerator's autocast
     * hook leaves them 16-bit (no f32 copy of [B, T, V] and of its gradient;
     * the cross-entropy reads them in f32 as the copy would have held them) */
    accel_module *kept = accel__module_keep_outputs(llama);
    const accel__decoder_cp *cp = root_arch(llama) ? accel__decoder_cp_of(llama->impl) : NULL;
    accel__decoder_root *root = cp ? llama->impl : NULL;
    const accel_llama_config *c = root ? &root->cfg : NULL;
    /* with output_router_logits: plus the load-balancing loss of the sparse layers' routers */
    bool balance = c && c->output_router_logits && c->num_local_experts > 0;
    if (balance && cp->pg) {
        accel__module_keep_outputs(kept);
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_llama_loss: output_router_logits (the load-balancing loss of "
                        "the experts' routers) is not implemented under context parallelism");
        return NULL;
    }
    /* the mask read once: the labels' -100s and, with the balance, the tokens its statistics keep
     * (transformers' masked means) */
    int64_t B = ids->shape[0], T = ids->shape[1];
    const int64_t *m = in->attention_mask
                           ? host_ints(in->attention_mask, B, T, "attention_mask", "without a cache [B, T] as ids:", true)
                           : NULL;
    /* packed sequences (no_cache, positions that restart, no mask): the positions read once and their
     * sequences found once, for the forward and the labels (-100 at each sequence's first token) */
    bool packing = in->no_cache && in->position_ids && !in->attention_mask;
    const int64_t *p = packing ? host_ints(in->position_ids, B, T, "position_ids", "[B, T] as ids:", false) : NULL;
    const int64_t *starts = NULL;
    bool read = (!in->attention_mask || m) && (!packing || (p && packed_starts(p, B, T, &starts) == ACCEL_OK));
    uint8_t *keep = m && balance ? accel_arena_alloc(accel_step_arena(), (size_t)(B * T), 64) : NULL;
    for (int64_t i = 0; keep && i < B * T; i++) keep[i] = m[i] != 0;
    accel__moe_aux *aux =
        read && balance && (!in->attention_mask || keep) ? accel__moe_aux_begin(c, keep, B * T) : NULL;
    if (!read || (balance && !aux)) {
        accel__module_keep_outputs(kept);
        return NULL;
    }
    accel__moe_aux *outer = balance ? accel__moe_aux_collect(aux) : NULL;
    accel_tensor *loss;
    if (cp && cp->pg && !in->attention_mask && !in->position_ids) {
        loss = accel__decoder_cp_loss(llama, cp, ids); /* else the forward's refusal */
    } else if (in->attention_mask) { /* the forward reads the host copy m, not the tensor again */
        loss = labels_loss(llama,
                           forward(llama, &(accel_llama_inputs){.ids = ids, .position_ids = in->position_ids}, false,
                                   &(accel__pad_host){.mask = m}),
                           masked_labels(ids, m, NULL));
    } else if (packing) { /* the forward takes p and its sequences as found here (none restarting: it looks again) */
        accel_tensor *logits = forward(llama, &(accel_llama_inputs){.ids = ids, .no_cache = true}, false,
                                       &(accel__pad_host){.positions = p, .seq_start = starts});
        loss = starts ? labels_loss(llama, logits, masked_labels(ids, NULL, starts))
                      : accel__causal_lm_loss(llama, logits, ids);
    } else {
        loss = accel__causal_lm_loss(llama, accel_llama_forward_ex(llama, in), ids);
    }
    if (balance) {
        accel__moe_aux_collect(outer);
        accel_tensor *lb = loss ? accel__moe_aux_loss(aux, loss) : NULL;
        loss = lb ? accel_add(loss, accel_mul_scalar(lb, c->router_aux_loss_coef)) : NULL;
    }
    accel__module_keep_outputs(kept);
    return loss;
}

accel_tensor *accel__causal_lm_loss(accel_module *llama, accel_tensor *logits, accel_tensor *ids) {
    if (!logits) return NULL;
    /* transformers' ForCausalLMLoss: labels = ids shifted left, padded with
     * ignore_index at the end, so the logits need no slicing. */
    int64_t B = ids->shape[0], T = ids->shape[1];
    accel_tensor *pad = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, 1), ids->device);
    if (!pad || accel_fill_(pad, -100) != ACCEL_OK) return NULL;
    accel_tensor *ids64 = ids->dtype == ACCEL_I64 ? ids : accel_to_dtype(ids, ACCEL_I64);
    accel_tensor *labels = ids64 ? accel_concat(2, (accel_tensor *[]){accel_slice(ids64, 1, 1, T, 1), pad}, 1) : NULL;
    return labels_loss(llama, logits, labels);
}

/* The mean cross-entropy of logits [B, T, V] against labels [B, T] (i64, -100 ignored). */
static accel_tensor *labels_loss(accel_module *llama, accel_tensor *logits, accel_tensor *labels) {
    if (!logits || !labels) return NULL;
    /* logits [B, T, V] with labels [B, T]: no reshape between the head and
     * the loss, so the loss's gradient becomes the head's output gradient as
     * it is (no copy of [B T, V]). Under tp the logits are this rank's
     * vocabulary columns (decoder_tp.c); under cp this rank's chunks of the
     * positions, the labels' chunks kept to match (decoder_cp.c). */
    accel_pg *tp = NULL;
    int64_t v0 = 0;
    bool vp = vocab_parallel(llama, &tp, &v0);
    const accel__decoder_cp *cp = accel__decoder_cp_of(llama->impl);
    if (cp->pg) return accel__decoder_cp_labels_loss(cp, logits, labels, tp, v0);
    return vp ? accel_tp_cross_entropy(logits, labels, v0, -100, tp) : accel_cross_entropy(logits, labels, -100);
}

/* ---------------------------------------------------------------- pipeline stages (decoder_pipeline.c) */

accel_module *accel__decoder_layers(accel_module *llama) {
    const accel__arch *a = root_arch(llama);
    return a ? llama->children[ROOT_MODEL]->children[layers_index(a)] : NULL;
}

void accel__decoder_stage_released(accel_module *llama, int stage, int stages) {
    accel__decoder_root *r = llama->impl;
    r->pp_stage = stage, r->pp_stages = stages;
}

accel_tensor *accel__decoder_stage_forward(accel_module *llama, accel_tensor *x, int lo, int hi, bool first,
                                           bool last) {
    const accel__arch *a = root_arch(llama);
    const accel_llama_config *c = llama->impl;
    accel_module *model = llama->children[ROOT_MODEL];
    accel_tensor *h = x;
    if (accel_module_enter(llama, &h) != ACCEL_OK || accel_module_enter(model, &h) != ACCEL_OK) return NULL;
    if (first && h) h = embed(model, c, a, h, 0, NULL);
    h = run_layers(model, a, h, lo, hi, last, 0, NULL, NULL);
    if (accel_module_exit(model, &h) != ACCEL_OK) return NULL;
    if (last && h) h = lm_head(llama, c, a, h);
    return accel_module_exit(llama, &h) == ACCEL_OK ? h : NULL;
}
