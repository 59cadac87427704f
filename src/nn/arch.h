/* The decoder-only architectures accel builds, as data: one row per
 * config.json model_type of what differs between the families (class names,
 * biases, norms, sliding windows, transformers' config defaults). llama.c
 * builds and runs every row with one graph; hf_config.c reads and writes them.
 * Internal to src/nn, src/io, src/cli, src/bigmodel (generation) and
 * src/accelerator (save_model's config.json). */
#ifndef ACCEL_NN_ARCH_H
#define ACCEL_NN_ARCH_H

#include "accel/nn.h"

/* Which layers attend through the config's sliding_window. */
typedef enum accel__window_rule {
    ACCEL__WINDOW_NONE,   /* no sliding window: a sliding_window key is refused */
    ACCEL__WINDOW_ALL,    /* every layer when sliding_window is set (Mistral) */
    ACCEL__WINDOW_QWEN2,  /* only with use_sliding_window, layers i >= max_window_layers (Qwen2/3) */
    ACCEL__WINDOW_EVEN,   /* layers 0, 2, 4, ... (transformers' default layer_types of Gemma2) */
    ACCEL__WINDOW_USE_ALL, /* only with use_sliding_window, then every layer (Qwen3-MoE) */
    /* only with use_sliding_window, the even layers i < max_window_layers
     * (Qwen2MoeConfig's default layer_types) */
    ACCEL__WINDOW_QWEN2_MOE,
    /* the sliding_attention layers of layer_types / sliding_window_pattern,
     * which also take plain RoPE of base rope_local_base_freq while the
     * full_attention ones take rope_theta and rope_scaling (Gemma 3) */
    ACCEL__WINDOW_TYPES,
} accel__window_rule;

/* The kind of blocks a family is built of. */
typedef enum accel__blocks {
    ACCEL__BLOCKS_LLAMA, /* RMSNorm, RoPE, q/k/v/o Linear, gated SiLU MLP (llama.c) */
    ACCEL__BLOCKS_GPT2,  /* learned positions (wpe, no RoPE), LayerNorm with bias, fused q/k/v
                          * Conv1D c_attn (weight [in, out]), gelu_new MLP, biases on every
                          * projection (gpt2.c builds the tree, llama.c runs it) */
} accel__blocks;

/* Child indices of GPT-2's modules (construction order, transformers'). */
enum { ACCEL__GPT2_WTE = 0, ACCEL__GPT2_WPE = 1, ACCEL__GPT2_H = 2, ACCEL__GPT2_LN_F = 3 };
enum { ACCEL__GPT2_C_ATTN = 0, ACCEL__GPT2_C_PROJ = 1 };                    /* GPT2Attention */
enum { ACCEL__GPT2_C_FC = 0, ACCEL__GPT2_MLP_C_PROJ = 1 }; /* GPT2MLP (PhiMLP: fc1, fc2; GPTNeoXMLP; Starcoder2MLP) */

/* What a family's sparse layers put in place of the MLP (docs/nn.md
 * "Mixtures of experts"; moe.c). */
typedef enum accel__moe {
    ACCEL__MOE_NONE,
    /* `block_sparse_moe`: gate (router), experts.N.{w1, w2, w3} (w2(silu(w1 x)
     * w3 x)); the top-k probabilities always renormalised and kept in f32
     * (Mixtral) */
    ACCEL__MOE_MIXTRAL,
    /* `mlp`: gate, experts.N.{gate,up,down}_proj (the family's MLP class);
     * renormalised with norm_topk_prob, rounded to the weights' dtype; dense
     * MLP layers where decoder_sparse_step and mlp_only_layers say (Qwen3-MoE;
     * Qwen2-MoE with shared_expert) */
    ACCEL__MOE_QWEN,
} accel__moe;

typedef struct accel__arch {
    const char *model_type;
    /* transformers' classes: the module type names of the tree. `layer` is
     * the family's _no_split_modules (and FSDP's transformer layer class). */
    accel_module_ops causal_lm, model, layer, attn, mlp, norm;
    /* with moe: the sparse block's class and an expert's (Qwen: `mlp`) */
    accel__moe moe;
    accel_module_ops moe_block, expert;
    /* Qwen2-MoE: the sparse block also has `shared_expert` (the family's MLP
     * of shared_expert_intermediate_size) and `shared_expert_gate` (Linear
     * hidden -> 1): sigmoid(gate(x)) * shared_expert(x) added to the routed output */
    bool shared_expert;
    /* the config names the expert count num_local_experts and num_experts,
     * one field read under either name and written under both (Mixtral's,
     * Qwen3-MoE's attribute maps; Qwen2-MoE reads num_experts only) */
    bool experts_alias;
    bool qkv_bias;       /* q/k/v always carry a bias, o_proj never (Qwen2); else attention_bias on all four */
    bool qk_norm;        /* q_norm/k_norm: the family's RMSNorm over head_dim of each head, before RoPE (Qwen3, Gemma 3) */
    bool qk_norm_full;   /* q_norm/k_norm: RMSNorm over the whole q / k projection, before the head split (OLMo 2) */
    bool fused_qkv;      /* one qkv_proj whose output is [q | k | v] (Phi-3) */
    bool fused_gate_up;  /* one gate_up_proj whose output is [gate | up] (Phi-3) */
    /* The layer's two norms (post_attention_layernorm, post_feedforward_layernorm)
     * apply to the attention and MLP outputs before the residual adds; no
     * input_layernorm (OLMo 2). Else input_layernorm and post_attention_layernorm
     * normalize the attention and MLP inputs. */
    bool norm_outputs;
    /* The config's partial_rotary_factor is honoured (RoPE on the first dims of
     * a head: Phi-3, Phi). */
    bool partial_rotary;
    /* RoPE of types default and longrope only, "su" and "yarn" read as
     * longrope (Phi3Config's validation; a config.json of another type would
     * not load back). */
    bool longrope_only;
    /* Generation re-runs the whole sequence without the cache when it first
     * passes longrope's original_max_position_embeddings, so every key gets the
     * long factors (Phi-3's prepare_inputs_for_generation). */
    bool longrope_regenerate;
    bool attention_bias; /* the config's attention_bias is honoured (else the family has none) */
    /* that attention_bias is on q/k/v_proj only, o_proj never (StableLM's
     * use_qkv_bias, Qwen2-MoE's qkv_bias) */
    bool qkv_only_bias;
    bool mlp_bias;       /* the config's mlp_bias is honoured */
    accel__window_rule window;
    /* Gemma: embeddings times sqrt(hidden_size) (rounded to the weights'
     * dtype), RMSNorm times (1 + weight) with weights initialised to 0, MLP
     * activation gelu_pytorch_tanh (else silu). */
    bool gemma_blocks;
    /* the attention's and the MLP's outputs normalised too: post_attention_layernorm
     * on the attention's output, pre_/post_feedforward_layernorm around the MLP (Gemma2) */
    bool sandwich_norms;
    bool softcap;        /* the config's final_logit_softcapping and query_pre_attn_scalar (Gemma2, Gemma 3) */
    /* the config's attn_logit_softcapping: soft-capped attention scores
     * (Gemma2; Gemma 3's config has the key, its attention never applies it) */
    bool score_softcap;
    bool multipliers;    /* the config's embedding/attention/residual_multiplier and logits_scaling (Granite) */
    /* One input_layernorm whose output feeds the attention and the MLP side
     * by side: x + attn(ln(x)) + mlp(ln(x)), no post_attention_layernorm
     * (Phi; GPT-NeoX's and StableLM's use_parallel_residual). */
    bool parallel_residual;
    /* Phi's blocks: LayerNorm with bias (eps: the config's layer_norm_eps),
     * a bias on q/k/v_proj, on the attention's output `dense` and on
     * lm_head, the MLP fc1 -> gelu_new -> fc2 (biases), the final norm
     * `final_layernorm`. */
    bool phi_blocks;
    /* GPT-NeoX's tree and blocks (GPTNeoXForCausalLM): gpt_neox.embed_in
     * (no padding_idx), gpt_neox.layers.N.{input_layernorm,
     * post_attention_layernorm} (LayerNorm with bias, eps layer_norm_eps),
     * attention.query_key_value (one Linear whose output is per head
     * [H, 3, D]: q, k, v of head 0, then of head 1, ...) and attention.dense
     * (biases: attention_bias), mlp.dense_h_to_4h -> exact (erf) gelu ->
     * mlp.dense_4h_to_h (biases always), gpt_neox.final_layer_norm,
     * embed_out (no bias). The layer is parallel, x + attn(ln1(x)) +
     * mlp(ln2(x)), unless the config's sequential_residual. */
    bool neox_blocks;
    /* The norms are LayerNorms with bias (eps: the config's layer_norm_eps or
     * norm_epsilon, held in rms_norm_eps): Phi, GPT-NeoX, StableLM, Starcoder2. */
    bool layer_norms;
    /* The config chooses the layer's residual: parallel, x + attn(ln1(x)) +
     * mlp(ln2(x)), unless its sequential_residual (GPT-NeoX; StableLM, whose
     * parallel layer has one input_layernorm and no post_attention_layernorm). */
    bool residual_choice;
    /* StableLM's blocks (StableLmForCausalLM): resid_pdrop
     * (hidden_dropout) on the MLP's output only, no embedding dropout; the
     * parallel layer summed x + attn + mlp in that order. */
    bool stablelm_blocks;
    /* Starcoder2's blocks (Starcoder2ForCausalLM): one use_bias for q/k/v/o
     * and the MLP (attention_bias = mlp_bias), the MLP c_fc ->
     * gelu_pytorch_tanh -> c_proj. */
    bool starcoder2_blocks;
    /* The config's dropouts act while training (attn_pdrop: the attention
     * probabilities; resid_pdrop: each branch's output; embd_pdrop: the
     * embeddings): GPT-2's, and Phi's attention_dropout, resid_pdrop,
     * embd_pdrop. Else the family has none. */
    bool dropouts;
    accel__blocks blocks;
    accel_llama_config defaults; /* the family's XConfig() defaults */
} accel__arch;

/* The row of model_type ("" or NULL: llama), or NULL when accel has none. */
const accel__arch *accel__arch_find(const char *model_type);
/* The row whose classes include m's type (m built by accel_llama_new), or NULL. */
const accel__arch *accel__arch_of_module(const accel_module *m);
/* Row i of the table (0 ..), or NULL past its end. */
const accel__arch *accel__arch_at(size_t i);
/* NULL when llama.c runs every flag of row a as documented, else the
 * combination it would silently get wrong (no row may have one: a test walks
 * the table, so a row adding one fails there, not in a model). */
const char *accel__arch_unsupported(const accel__arch *a);
/* ACCEL_OK when row a takes RoPE of this type, else an error "who: key of type
 * ..." (longrope_only rows: default and longrope). */
accel_status accel__arch_rope_check(const accel__arch *a, accel_rope_type type, const char *who, const char *key);
/* ACCEL_OK unless c sets one of GPT-2's attention flags (unscaled_attention,
 * scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn) and row a is
 * not GPT-2: then ACCEL_ERR_UNSUPPORTED "who: <flag> ... is set, but <model_type>
 * models ...", as the build and config save both refuse it (the other
 * families' files have no key for it). */
accel_status accel__arch_gpt2_flags_check(const accel__arch *a, const accel_llama_config *c, const char *who);
/* Whether layer i of a model of row a and resolved config c attends to the
 * last c->sliding_window keys only. */
bool accel__arch_layer_windowed(const accel__arch *a, const accel_llama_config *c, int64_t i);
/* Whether layer i of a model of row a and resolved config c is a Gemma 3
 * sliding_attention layer: plain RoPE of base rope_local_base_freq (and the
 * window when sliding_window is set). */
bool accel__arch_layer_local(const accel__arch *a, const accel_llama_config *c, int64_t i);
/* Whether layer i of a model of row a and resolved config c has the sparse
 * block (a mixture of experts) in place of the MLP. */
bool accel__arch_layer_sparse(const accel__arch *a, const accel_llama_config *c, int64_t i);
/* Whether the layers of row a and config c have a norm over each head of q
 * and k before RoPE: the row's qk_norm (Qwen3, Gemma 3), Phi's with the
 * config's qk_layernorm (q_layernorm / k_layernorm, LayerNorms), StableLM's
 * with it (one LayerNorm of its own per head). */
bool accel__arch_qk_norm_heads(const accel__arch *a, const accel_llama_config *c);
/* The names of the attention's output projection ("o_proj"; Phi, GPT-NeoX:
 * "dense"), of the model's final norm ("norm"; Phi: "final_layernorm";
 * GPT-NeoX: "final_layer_norm"), of the base model ("model"; GPT-NeoX:
 * "gpt_neox"), of its token embedding ("embed_tokens"; GPT-NeoX: "embed_in")
 * and of the head ("lm_head"; GPT-NeoX: "embed_out"). */
const char *accel__arch_o_proj(const accel__arch *a);
const char *accel__arch_final_norm(const accel__arch *a);
const char *accel__arch_base(const accel__arch *a);
const char *accel__arch_embed(const accel__arch *a);
const char *accel__arch_head(const accel__arch *a);
/* Whether the layers of a model of row a and resolved config c add the
 * attention and the MLP side by side (Phi; GPT-NeoX unless
 * sequential_residual). */
bool accel__arch_parallel(const accel__arch *a, const accel_llama_config *c);
/* Whether the parallel layer's one input_layernorm feeds both branches and
 * the layer has no post_attention_layernorm (Phi; StableLM when parallel). */
bool accel__arch_one_norm(const accel__arch *a, const accel_llama_config *c);
/* The model types accel builds, ", "-separated (for error messages). */
const char *accel__arch_names(void);

/* The dims of a head RoPE rotates: head_dim * partial_rotary_factor, rounded
 * down as transformers' int(); all of head_dim when the factor is 0. */
int64_t accel__rotary_dim(const accel_llama_config *c);
/* RoPE of a resolved config (rope_scaling.c): writes inv_freq [rotary_dim / 2]
 * for a forward whose positions end before seq_len and returns the attention
 * scaling that multiplies cos and sin. local: a Gemma 3 sliding_attention
 * layer's, the plain RoPE of base rope_local_base_freq (rope_scaling is the
 * full_attention layers'). */
double accel__rope_inv_freq(const accel_llama_config *c, bool local, int64_t seq_len, float *inv_freq);
/* ACCEL_OK when c's rope_scaling fields are usable, else an error naming the field. */
accel_status accel__rope_check(const accel_llama_config *c, const char *who);

/* A padded batch's attention_mask [B, cache length + T] and position ids
 * [B, T] as host int64 (either NULL: none), checked as accel_llama_forward_ex
 * checks the tensors: generation keeps them on the host, and a decode step
 * then neither uploads them nor reads them back. seq_start [B, T]: the
 * packed sequences of the positions as the forward finds them under
 * no_cache (each query's first token), where the caller found them already
 * (the loss, for its labels); NULL: the forward finds them. */
typedef struct accel__pad_host {
    const int64_t *mask, *positions, *seq_start;
} accel__pad_host;

/* accel_llama_forward with the head on the last position only: logits
 * [B, 1, V] (transformers' generate, logits_to_keep=1): a prompt's forward
 * for its next token multiplies one row by lm_head, not T. hp (NULL: none):
 * the pad state on the host, in's attention_mask and position_ids then NULL:
 * mask [B, cache length + T] and positions [B, T], read unchecked (the
 * caller holds them of those sizes). */
accel_tensor *accel__llama_forward_last(accel_module *llama, const accel_llama_inputs *in, const accel__pad_host *hp);

/* The forwards the rows' module ops point at (llama.c, layers.c). */
accel_tensor *accel__decoder_no_forward(accel_module *m, accel_tensor *ids);
accel_tensor *accel__decoder_layer_call(accel_module *layer, accel_tensor *x);
accel_tensor *accel__decoder_mlp_forward(accel_module *mlp, accel_tensor *x);
accel_tensor *accel__decoder_norm_forward(accel_module *m, accel_tensor *x);
accel_tensor *accel__rms_norm_forward(accel_module *m, accel_tensor *x);
/* Gemma's RMSNorm: x / rms(x) * (1 + weight). */
accel_tensor *accel__rms_norm_plus_one_forward(accel_module *m, accel_tensor *x);
accel_tensor *accel__layer_norm_forward(accel_module *m, accel_tensor *x);
/* GPT2MLP's c_proj(gelu_new(c_fc(x))), PhiMLP's fc2(gelu_new(fc1(x))) */
accel_tensor *accel__gelu_mlp_forward(accel_module *mlp, accel_tensor *x);
/* GPTNeoXMLP's dense_4h_to_h(gelu(dense_h_to_4h(x))), the exact (erf) gelu
 * (the tanh one where its impl says so); Starcoder2MLP's c_proj(gelu_pytorch_tanh(c_fc(x)))
 * is accel__gelu_mlp_forward */
accel_tensor *accel__gelu_exact_mlp_forward(accel_module *mlp, accel_tensor *x);
/* The sparse block of a's family (moe.c): [B, T, C] -> [B, T, C]. */
accel_tensor *accel__moe_forward(accel_module *block, accel_tensor *x);
/* Mixtral's expert: w2(silu(w1 x) * w3 x). */
accel_tensor *accel__moe_expert_forward(accel_module *expert, accel_tensor *x);

/* A decoder layer module of row a (type a->layer, index `index` of the
 * resolved config c, which outlives it) with no children yet (llama.c). */
accel_module *accel__decoder_layer_module(const accel__arch *a, const accel_llama_config *c, int index);
/* Adds GPT-2's tree under root (a GPT2LMHeadModel of row a): transformer
 * (wte, wpe, h.N, ln_f) and lm_head, tied when c says so (gpt2.c). */
accel_status accel__gpt2_build(accel_module *root, const accel__arch *a, const accel_llama_config *c,
                               accel_device dev);

#endif
