/*
 * accel/nn.h — modules: named trees of parameters, and the models built from them.
 *
 * A module has a type name ("Linear", "LlamaDecoderLayer"), a local name
 * ("q_proj"), named parameters and buffers (persistent tensors it owns), and
 * named children (modules it owns). Full names are the dotted paths PyTorch
 * and transformers produce: "model.layers.0.self_attn.q_proj.weight".
 * Parameter order is PyTorch's state_dict order: a module's own parameters,
 * then its buffers, then each child in registration order.
 *
 * Ownership: accel_module_free frees the module, its children and its
 * tensors. Tied parameters (the same accel_tensor registered under two names)
 * are freed once. Freeing a model that an accelerator prepared or a dispatch
 * hooked first detaches it from them (docs/contract.md "Lifetimes"). A
 * child belongs to its parent: accel_module_free of a module that has a
 * parent is refused (ACCEL_ERR_STATE) and frees nothing; free the root.
 *
 * Defining a module of your own (see examples/custom_module.c):
 *
 *     static accel_tensor *mlp_forward(accel_module *m, accel_tensor *x) {
 *         return accel_module_call(m->children[1],
 *                  accel_relu(accel_module_call(m->children[0], x)));
 *     }
 *     static const accel_module_ops MLP_OPS = { "MLP", mlp_forward, NULL };
 *     accel_module *m = accel_module_new(&MLP_OPS, NULL);
 *     accel_module_add_child(m, "fc1", accel_linear_new(4, 8, true, dev, ACCEL_F32));
 *     accel_module_add_child(m, "fc2", accel_linear_new(8, 1, true, dev, ACCEL_F32));
 */
#ifndef ACCEL_NN_H
#define ACCEL_NN_H

#include "core.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel_module accel_module;
struct accel__link;

typedef struct accel_module_ops {
    const char *type_name;
    /* Single-tensor forward; NULL for modules with their own entry point. */
    accel_tensor *(*forward)(accel_module *m, accel_tensor *x);
    /* Frees m->impl (NULL: accel_free(m->impl)). */
    void (*free_impl)(accel_module *m);
} accel_module_ops;

/* Hooks run around a module's forward by accel_module_call (and by models
 * that call their submodules through accel_module_enter/exit). Used by
 * big-model dispatch to bring offloaded weights in and move activations. */
typedef struct accel_module_hook {
    /* May replace *x (e.g. move it to the execution device). */
    accel_status (*pre_forward)(accel_module *m, accel_tensor **x, void *ctx);
    /* May replace *y. Runs whenever pre_forward succeeded, also after a failed
     * forward (*y NULL), so it can undo what pre_forward set up. */
    accel_status (*post_forward)(accel_module *m, accel_tensor **y, void *ctx);
    void (*free_ctx)(void *ctx);
    void *ctx;
} accel_module_hook;

typedef struct accel_named_tensor {
    char *name;        /* local name, owned */
    accel_tensor *t;   /* owned unless tied (see accel_module_tie) */
    bool is_buffer;
    bool owned;
} accel_named_tensor;

/* Fields are read-only: a forward reads children/tensors/impl/training;
 * change the tree only through accel_module_add_child/add_param/add_buffer/
 * tie/set_hook/train (hook and links are the library's). */
struct accel_module {
    const accel_module_ops *ops;
    char *name;                    /* local name in the parent ("" for the root), owned */
    accel_module *parent;
    int n_children, cap_children;
    accel_module **children;
    int n_tensors, cap_tensors;
    accel_named_tensor *tensors;   /* parameters and buffers, in registration order */
    accel_module_hook *hook;       /* optional, owned */
    bool training;
    bool gradient_checkpointing;   /* see accel_module_set_gradient_checkpointing */
    void *impl;                    /* module-specific state */
    struct accel__link *links;     /* internal: who depends on it (an accelerator, a dispatch) */
    struct accel__member_index *member_index; /* internal (module.c): member names hashed */
    uint32_t magic;                /* internal: its liveness stamp while alive (core/handle.h) */
};

/* ---- building */
accel_module *accel_module_new(const accel_module_ops *ops, void *impl);
void accel_module_free(accel_module *m);
/* Takes ownership of child (freed on error too). Returns child (NULL on
 * error). A child that already has a parent, or that is m or one of m's
 * ancestors (a cycle), is refused and left to the tree that holds it. */
accel_module *accel_module_add_child(accel_module *m, const char *name, accel_module *child);
/* Takes ownership of t (freed on error too); marks it a parameter
 * (requires_grad) or buffer. A tensor that already is a parameter or buffer
 * of a module is refused and left to it (tie names with accel_module_tie).
 * A parameter must be floating-point (as torch's nn.Parameter, which
 * requires grad): an integer or bool one is refused (and freed); a buffer
 * may be of any dtype. */
accel_tensor *accel_module_add_param(accel_module *m, const char *name, accel_tensor *t);
accel_tensor *accel_module_add_buffer(accel_module *m, const char *name, accel_tensor *t);
/* Makes `dst_name` (full name) refer to the same tensor as `src_name`; the
 * tensor previously under dst_name is freed. */
accel_status accel_module_tie(accel_module *root, const char *dst_name, const char *src_name);

/* ---- running */
/* Runs hooks and ops->forward. */
accel_tensor *accel_module_call(accel_module *m, accel_tensor *x);
/* For models with their own forward signatures: run pre/post hooks of m
 * around a custom call. enter may replace *x; exit may replace *y. Once enter
 * succeeded, call exit even when the call failed (*y NULL). enter refuses a
 * NULL x and a *x that is not a live tensor (ACCEL_ERR_INVALID_ARG/_STATE,
 * no hook run; an earlier failure's error is kept), and a pre hook that
 * returns OK with *x NULL (ACCEL_ERR_STATE, after running the post hook with
 * no output). exit refuses a NULL y after running the post hook with no
 * output, and a post hook that returns OK having dropped a non-NULL *y. */
accel_status accel_module_enter(accel_module *m, accel_tensor **x);
accel_status accel_module_exit(accel_module *m, accel_tensor **y);
/* Replaces m's hook (freeing the old one's ctx); NULL removes it. On failure
 * (m NULL, out of memory) m has no hook and hook->ctx stays the caller's. */
accel_status accel_module_set_hook(accel_module *m, const accel_module_hook *hook);
void accel_module_train(accel_module *m, bool training); /* recursive */
/* Activation (gradient) checkpointing: m's forward runs under
 * accel_activation_checkpoint (autograd.h) with m's parameters, inside m's hooks, so its
 * intermediates are not kept for backward but recomputed there; gradients are
 * bit-identical. Honoured by accel_module_call and by a LlamaDecoderLayer run
 * inside the model (not with a KV cache: generation records no graph). On a
 * LlamaForCausalLM or LlamaModel it is set on every decoder layer, as
 * transformers' model.gradient_checkpointing_enable(); likewise on a BERT
 * root or BertModel (accel/bert.h) for every BertLayer. Refused
 * (ACCEL_ERR_UNSUPPORTED) on a module without a single-tensor forward. */
accel_status accel_module_set_gradient_checkpointing(accel_module *m, bool enable);

/* ---- naming and iteration */
/* Full dotted name of a module relative to the root ("" for the root). */
const char *accel_module_path(const accel_module *m, char *buf, size_t n);
accel_module *accel_module_find(accel_module *root, const char *path); /* "" = root */
accel_tensor *accel_module_get_tensor(accel_module *root, const char *full_name);

typedef struct accel_state_entry {
    const char *name;         /* full dotted name (owned by the dict) */
    accel_tensor *t;
    accel_module *owner;      /* module that holds it */
    bool is_buffer;
    bool is_tied_alias;       /* a second name for a tensor listed earlier */
} accel_state_entry;

typedef struct accel_state_dict {
    int n;
    accel_state_entry *entries;
    char *names;              /* storage for the names */
} accel_state_dict;

/* All parameters and buffers in state_dict order, tied aliases included
 * (marked). Free with accel_state_dict_free. */
accel_state_dict *accel_module_state_dict(accel_module *root);
void accel_state_dict_free(accel_state_dict *sd);
/* Parameters only (requires_grad), each tensor once, in order. */
int accel_module_parameters(accel_module *root, accel_tensor ***out); /* caller frees *out */
int64_t accel_module_num_params(accel_module *root); /* unique parameters + buffers numel */

/* ---- memory layout */
/* Gathers all unique parameters of each dtype into one contiguous 64-byte
 * aligned buffer on their device (all must be contiguous and on one device;
 * the memory comes from that device's backend; the tensors become views into
 * it), and likewise allocates
 * flat gradient buffers whose views become each parameter's .grad. Each
 * parameter starts at a multiple of `align_elems`; each buffer's length is
 * padded to a multiple of `pad_multiple` elements (ZeRO shards). */
typedef struct accel_flat_buffer {
    accel_dtype dtype;
    accel_device device;      /* the parameters' device; params/grads are its memory */
    int64_t numel;            /* padded length */
    void *params;             /* owned, a device pointer of `device` */
    void *grads;              /* owned, a device pointer of `device` */
    int n;                    /* parameters in this buffer */
    accel_tensor **tensors;   /* owned array, borrowed tensors */
    int64_t *offsets;         /* element offset of each tensor */
} accel_flat_buffer;

typedef struct accel_flat_params {
    int n_buffers;
    accel_flat_buffer buffers[ACCEL_DTYPE_COUNT];
    accel_module *root;       /* internal: the module it was made from, NULL once freed */
} accel_flat_params;

accel_flat_params *accel_module_flatten(accel_module *root, int64_t align_elems,
                                        int64_t pad_multiple);
/* Frees the flat buffers after copying each parameter (and gradient) back
 * into its own memory (so the module stays usable). The module may be freed
 * first: then only the buffers are left to free. */
void accel_flat_params_free(accel_flat_params *fp);

/* ---- devices and meta */
/* Moves every tensor to dev (meta -> error: use to_empty). */
accel_status accel_module_to(accel_module *root, accel_device dev);
/* Materialises meta tensors on dev with dtype (or their own if dt < 0), zero-filled. */
accel_status accel_module_to_empty(accel_module *root, accel_device dev, int dt);
/* Builds modules on the meta device while active (no weight memory). Nestable,
 * per thread; an end with no open begin is ACCEL_ERR_STATE. */
void accel_init_empty_weights_begin(void);
accel_status accel_init_empty_weights_end(void);
/* The device new parameters are created on (meta inside init_empty_weights). */
accel_device accel_default_param_device(accel_device requested);

/* ---------------------------------------------------------------- layers */

/* Linear(in, out): weight [out, in], bias [out]; PyTorch's default init
 * (kaiming-uniform a=sqrt(5): U(-1/sqrt(in), 1/sqrt(in)) for both) from the
 * default generator. */
accel_module *accel_linear_new(int64_t in, int64_t out, bool bias, accel_device dev,
                               accel_dtype dt);
accel_module *accel_embedding_new(int64_t num, int64_t dim, accel_device dev, accel_dtype dt);
accel_module *accel_rms_norm_new(int64_t dim, double eps, accel_device dev, accel_dtype dt);
accel_module *accel_layer_norm_new(int64_t dim, double eps, bool affine, accel_device dev,
                                  accel_dtype dt);
/* Conv2d(in, out, kernel, stride, padding, dilation, groups, bias) as torch.nn:
 * weight [out, in / groups, kh, kw], bias [out]; stride, padding, dilation
 * NULL for torch's defaults (1, 0, 1). Init as torch: U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)) for both, fan_in = in / groups * kh * kw (kaiming-uniform
 * with a = sqrt(5)). Forward: accel_conv2d. Bad sizes (in or out not a
 * multiple of groups, a kernel < 1) are refused here, naming them. */
accel_module *accel_conv2d_new(int64_t in, int64_t out, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2], int64_t groups, bool bias,
                               accel_device dev, accel_dtype dt);
/* Conv1d: weight [out, in / groups, kernel]; accel_conv1d. */
accel_module *accel_conv1d_new(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                               int64_t dilation, int64_t groups, bool bias, accel_device dev, accel_dtype dt);
/* torch's padding_mode of a Conv1d / Conv2d: ACCEL_PAD_CONSTANT ("zeros",
 * the default), ACCEL_PAD_REFLECT, _REPLICATE or _CIRCULAR: each forward
 * pads x by the layer's padding in that mode (accel_pad, whose rules apply:
 * reflect's padding below the input's size...) and convolves it unpadded,
 * as torch's forward does. Another module or mode is an error. */
accel_status accel_conv_set_padding_mode(accel_module *conv, accel_pad_mode mode);
/* BatchNorm1d (x [N, C] or [N, C, L]) and BatchNorm2d (x [N, C, H, W]) as
 * torch.nn: weight 1 and bias 0 (dtype dt) when affine; buffers
 * running_mean (0), running_var (1) (f32 [C]) and num_batches_tracked (i64,
 * 0-dim) when track_running_stats, saved and loaded under those names. In
 * training mode (accel_module_train) a forward normalises with the batch's
 * statistics, adds 1 to num_batches_tracked and updates the running stats
 * with momentum, or with 1 / num_batches_tracked (a cumulative average) when
 * momentum < 0 (torch's momentum=None); in eval mode it uses the running
 * stats (the batch's without them). Under DDP each rank normalises with its
 * own batch (as torch's BatchNorm); accel_convert_sync_batchnorm
 * (accel/parallel.h) makes them SyncBatchNorm (the global batch's). */
accel_module *accel_batch_norm1d_new(int64_t C, double eps, double momentum, bool affine, bool track_running_stats,
                                     accel_device dev, accel_dtype dt);
accel_module *accel_batch_norm2d_new(int64_t C, double eps, double momentum, bool affine, bool track_running_stats,
                                     accel_device dev, accel_dtype dt);
/* MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten (no parameters): the ops
 * of ops.h with these arguments (stride NULL: the kernel; padding NULL: 0;
 * dilation NULL: 1). The arguments are checked at the first forward. */
accel_module *accel_max_pool2d_new(const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2],
                                   const int64_t dilation[2], bool ceil_mode);
accel_module *accel_avg_pool2d_new(const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2],
                                   bool ceil_mode, bool count_include_pad);
accel_module *accel_adaptive_avg_pool2d_new(const int64_t output_size[2]);
accel_module *accel_flatten_new(int start_dim, int end_dim);
/* Children named "0", "1", ... run in order. */
accel_module *accel_sequential_new(int n, accel_module **children);
/* Activations as modules (no parameters), for Sequential. */
accel_module *accel_relu_module_new(void);
accel_module *accel_silu_module_new(void);
accel_module *accel_gelu_module_new(bool tanh_approx);

/* ---------------------------------------------------------------- Llama */

/* RoPE variants, transformers' rope_scaling / rope_parameters "rope_type". */
typedef enum accel_rope_type {
    ACCEL_ROPE_DEFAULT = 0,
    ACCEL_ROPE_LINEAR,   /* positions divided by factor */
    ACCEL_ROPE_DYNAMIC,  /* NTK: theta grown with the sequence past original_max_position_embeddings */
    ACCEL_ROPE_YARN,     /* NTK-by-parts blend and attention scaling (mscale) */
    ACCEL_ROPE_LONGROPE, /* per-dimension short/long factors (Phi-3) */
    ACCEL_ROPE_LLAMA3,   /* Llama 3.1's low/high frequency bands */
} accel_rope_type;

/* The most head_dim / 2 a longrope factor list may hold. */
#define ACCEL_ROPE_MAX_FACTORS 256
#define ACCEL_MAX_EOS_TOKEN_IDS 8 /* a config.json eos_token_id list this long at most */
#define ACCEL_MAX_MLP_ONLY_LAYERS 256 /* a config.json mlp_only_layers list this long at most */
/* The most layers an explicit per-layer attention type list (Gemma 3's
 * layer_types) may describe; longer models take sliding_window_pattern. */
#define ACCEL_MAX_LAYER_TYPES 256

/* rope_scaling's fields; 0 for a field the config leaves out (transformers'
 * default then applies, as in its modeling_rope_utils). */
typedef struct accel_rope_scaling {
    accel_rope_type type;
    double factor;                            /* linear, dynamic, yarn, longrope, llama3 */
    int64_t original_max_position_embeddings; /* dynamic, yarn, longrope, llama3 */
    double attention_factor;                  /* yarn, longrope */
    double beta_fast, beta_slow;              /* yarn (32, 1) */
    double mscale, mscale_all_dim;            /* yarn */
    bool truncate_set, truncate;              /* yarn: round the correction range (default true) */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int n_factors;                            /* longrope: head_dim / 2 */
    float short_factor[ACCEL_ROPE_MAX_FACTORS], long_factor[ACCEL_ROPE_MAX_FACTORS];
} accel_rope_scaling;

typedef struct accel_llama_config {
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;      /* 0 -> num_attention_heads */
    int64_t head_dim;                 /* 0 -> hidden_size / num_attention_heads */
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    double initializer_range;         /* std of normal init (0.02) */
    bool tie_word_embeddings;
    /* StableLM: use_qkv_bias, Qwen2-MoE: qkv_bias (q/k/v only); Starcoder2: use_bias (with mlp_bias, equal) */
    bool attention_bias;
    bool mlp_bias;
    accel_dtype torch_dtype;          /* dtype of the weights */
    /* The family (config.json model_type): "" or "llama", "mistral", "qwen2",
     * "qwen3", "gemma", "gemma2", "gemma3_text", "granite", "phi3", "olmo2",
     * "gpt2", "mixtral", "qwen3_moe", "qwen2_moe", "phi", "gpt_neox",
     * "stablelm", "starcoder2" (docs/nn.md: what each changes). */
    char model_type[16];
    /* Layers i >= max_window_layers attend to the last sliding_window keys
     * only (0: every layer attends to all); transformers' Mistral (all layers)
     * and Qwen2/Qwen3 with use_sliding_window. Gemma2: layers 0, 2, 4, ...
     * (max_window_layers unused). Gemma 3: its sliding_attention layers. */
    int64_t sliding_window;
    int64_t max_window_layers;
    /* Gemma 3 ("gemma3_text"; set on another family: refused). Its layers are
     * sliding_attention ones (the window; plain RoPE of base
     * rope_local_base_freq) or full_attention ones (rope_theta with
     * rope_scaling): layer i is full when layer_full[i], given for all
     * num_hidden_layers layers when n_layer_types > 0 (config.json's
     * layer_types), else when (i + 1) % sliding_window_pattern == 0. 0 for
     * rope_local_base_freq and sliding_window_pattern: transformers' 10000
     * and 6. */
    double rope_local_base_freq;
    int64_t sliding_window_pattern;
    int n_layer_types;
    bool layer_full[ACCEL_MAX_LAYER_TYPES];
    accel_rope_scaling rope_scaling;  /* zero: the default RoPE */
    /* Gemma2 (0: none): attention scores and final logits become
     * cap * tanh(x / cap); scores scaled by query_pre_attn_scalar^-0.5
     * (0: head_dim^-0.5). Gemma 3: the final logits' cap and the scale only
     * (transformers' Gemma 3 never caps scores: attn_logit_softcapping refused). */
    double attn_logit_softcapping, final_logit_softcapping, query_pre_attn_scalar;
    /* Granite (0: 1.0, transformers' default): embeddings times
     * embedding_multiplier, scores times attention_multiplier (instead of
     * head_dim^-0.5), each residual branch times residual_multiplier, logits
     * divided by logits_scaling. */
    double embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling;
    /* RoPE rotates the first int(head_dim * partial_rotary_factor) dims of
     * each head, the rest pass through (0 or 1: all; "phi3", "phi" and
     * "gpt_neox", whose config.json says rotary_pct). */
    double partial_rotary_factor;
    /* GPT-2 ("gpt2": learned positions up to max_position_embeddings =
     * n_positions, LayerNorm of epsilon rms_norm_eps = layer_norm_epsilon).
     * Its dropouts, as transformers' GPT-2 while the module trains
     * (accel_module_train; none in eval): embd_pdrop on the embeddings plus
     * positions, attn_pdrop on the attention probabilities, resid_pdrop on
     * each block's attention and MLP outputs; masks from the default
     * generator (accel_manual_seed). Phi ("phi") has them too (its
     * attention_dropout is attn_pdrop; embd_pdrop on the embeddings; its
     * LayerNorms' layer_norm_eps is rms_norm_eps). Set on another family:
     * refused. */
    double attn_pdrop, resid_pdrop, embd_pdrop;
    bool unscaled_attention;          /* scale_attn_weights false: scores not divided by sqrt(head_dim) */
    /* GPT-2's scale_attn_by_inverse_layer_idx: layer i's scores also divided
     * by i + 1 (with unscaled_attention: by i + 1 alone), on every attention
     * path. Its reorder_and_upcast_attn: kept for config save and otherwise
     * unread. transformers 5.25 reads it in its eager attention only
     * (attn_implementation "eager"); from_pretrained and from_config give
     * SDPA, where it changes nothing. Not built: eager's upcast (q k^T in f32
     * with autocast off). accel computes GPT-2's attention in f32 on both
     * paths, as torch's SDPA: the fused kernel's scores and softmax are f32
     * in every dtype, and its explicit-score path (attention dropout while
     * training; a padding mask that the fused kernel's key ranges do not
     * take) computes bf16/f16 q, k, v in f32, the output rounded once
     * (Gemma2's alone keeps eager's scores in the autocast dtype).
     * Any of the three set on another family: refused by accel_llama_new
     * and accel_llama_config_save alike. */
    bool scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn;
    /* qk_layernorm: q_layernorm / k_layernorm, a LayerNorm over each head of
     * q and k (eps rms_norm_eps) before RoPE: Phi's one LayerNorm [head_dim]
     * with a bias shared by the heads, StableLM's one of its own per head
     * (norms.h, weight only: StableLmLayerNormPerHead); set on another
     * family: refused. */
    bool qk_layernorm;
    /* GPT-NeoX's use_parallel_residual false: the MLP reads
     * post_attention_layernorm(x + attn(input_layernorm(x))) and adds to that
     * sum, where the default adds both branches to x side by side. GPT-NeoX
     * ("gpt_neox") reads its attention_dropout as attn_pdrop and its
     * hidden_dropout as both resid_pdrop (each branch's output) and
     * embd_pdrop (the embeddings), its layer_norm_eps as rms_norm_eps, its
     * rotary_pct as partial_rotary_factor. StableLM's use_parallel_residual
     * false too (its config.json's default: this field true), where its
     * parallel layer has one input_layernorm feeding both branches. Set on
     * another family: refused. */
    bool sequential_residual;
    /* GPT-NeoX's hidden_act: 0 "gelu" (the exact one), or the tanh
     * approximation under the name config.json gives it (written back as
     * read): 1 "gelu_fast" (GPT-NeoX-20B), 2 "gelu_new", 3
     * "gelu_pytorch_tanh". Another family: 0 (its activation is the row's). */
    int neox_hidden_act;
    /* The special token ids config.json has, written back by
     * accel_llama_config_save: bos_token_id (-1: null), eos_token_ids[0 ..
     * n_eos_token_ids) (0: null; a list when eos_is_list, else one number).
     * token_ids_set false (a zeroed struct): the family's transformers
     * defaults are written instead (Llama 1 / 2, Gemma 2 / 1, Phi-3 1 / 32000, ...). */
    bool token_ids_set;
    int64_t bos_token_id;
    int64_t eos_token_ids[ACCEL_MAX_EOS_TOKEN_IDS];
    int n_eos_token_ids;
    bool eos_is_list;
    /* pad_token_id (-1: null or absent): what accel_generate_batch's callers
     * (the CLI) pad finished rows with, and embed_tokens' padding_idx as
     * transformers' (every family but GPT-2): that row zeroed at init and
     * given no gradient by the lookup (a tied lm_head's still reaches it).
     * Read and written back; outside [-1, vocab_size) refused (GPT-2: any). */
    int64_t pad_token_id;
    /* Mixture of experts ("mixtral", "qwen3_moe", "qwen2_moe"; docs/nn.md "Mixtures of
     * experts"). num_local_experts (Qwen's num_experts; 0: every MLP dense)
     * expert MLPs in each sparse layer, of moe_intermediate_size (Mixtral:
     * intermediate_size); a router (`gate`, Linear hidden -> experts) picks
     * num_experts_per_tok of them per token by softmax probability, their
     * outputs weighted by those probabilities, renormalised to sum to 1
     * (always for Mixtral, with norm_topk_prob for Qwen). Layer i is sparse
     * when (i + 1) % decoder_sparse_step == 0 (0 or 1: every layer) and i is
     * not one of mlp_only_layers[0 .. n_mlp_only_layers) (Qwen), else a
     * dense MLP of intermediate_size. Qwen2-MoE's sparse layers also have a
     * shared expert (an MLP of shared_expert_intermediate_size every token
     * runs) scaled by sigmoid(shared_expert_gate(x)) and added to the
     * routed output. With output_router_logits,
     * accel_llama_loss adds router_aux_loss_coef times the load-balancing
     * loss. router_jitter_noise (Mixtral) scales the MoE input by uniform
     * noise in [1 - j, 1 + j] while the model trains. */
    int64_t num_local_experts;
    int64_t num_experts_per_tok;
    int64_t moe_intermediate_size;
    int64_t decoder_sparse_step;
    int64_t mlp_only_layers[ACCEL_MAX_MLP_ONLY_LAYERS]; /* layer indices in [0, num_hidden_layers) */
    int n_mlp_only_layers;
    int64_t shared_expert_intermediate_size;
    bool norm_topk_prob;
    bool output_router_logits;
    double router_aux_loss_coef;
    double router_jitter_noise;
} accel_llama_config;

/* transformers' LlamaConfig defaults (vocab 32000, hidden 4096, ...). */
accel_llama_config accel_llama_config_default(void);
/* The type name of the decoder layers of the model m belongs to (m or any of
 * its ancestors built by accel_llama_new or accel_bert_new): "LlamaDecoderLayer",
 * "Qwen2DecoderLayer", ..., "BertLayer" (transformers' _no_split_modules, the
 * FSDP transformer layer class); NULL for other modules. */
const char *accel_module_decoder_layer_class(const accel_module *m);
/* transformers' _no_split_modules of the model m belongs to (as above), the
 * classes from_pretrained keeps whole on one device: the decoder layer class
 * and, for BERT, RoBERTa and XLM-RoBERTa, the embeddings' ("BertEmbeddings",
 * ...). Writes them (static strings) into out and returns how many; 0 for
 * other modules. */
#define ACCEL_MAX_NO_SPLIT 2
int accel_module_no_split_classes(const accel_module *m, const char *out[ACCEL_MAX_NO_SPLIT]);

/* The most decoder layers accel builds: the module tree is held in memory
 * (13 modules a layer); real checkpoints have well under 200. */
#define ACCEL_LLAMA_MAX_LAYERS 65536
/* The most experts of a mixture-of-experts layer accel builds (real
 * checkpoints have up to a few hundred). */
#define ACCEL_MOE_MAX_EXPERTS 65536
/* The most experts of all the sparse layers together: each is modules of its
 * own, a few KB of memory even on the meta device (2^18 of them: about 1 GB
 * and seconds to build; the largest real checkpoints have under 2^15). */
#define ACCEL_MOE_MAX_TOTAL_EXPERTS (1 << 18)
/* ACCEL_OK when accel_llama_new can build cfg: sizes positive, heads a multiple
 * of kv heads, head_dim even, at most ACCEL_LLAMA_MAX_LAYERS layers, and the
 * weights' bytes fit in int64 (every product overflow-checked). Else
 * ACCEL_ERR_INVALID_ARG, the message starting with `who` (a file name, say). */
accel_status accel_llama_config_check(const accel_llama_config *cfg, const char *who);

/* KV cache for generation: per layer K and V [B, Hkv, max_len, D], made on
 * dev; a layer's pair moves (once) to the device its layer runs on.
 * accel_kv_cache_new's is of the config's torch_dtype; accel_llama_kv_cache_new's
 * of the model's weights (what its layers compute k and v in: bf16 for an f32
 * checkpoint loaded with a bf16 dtype override).
 * accel_kv_cache_new sizes Hkv for the config's whole model;
 * accel_llama_kv_cache_new for the heads the model computes on this rank
 * (under tensor parallelism num_key_value_heads / tp, or the one replicated
 * head when there are fewer key/value heads than ranks). A model takes a
 * cache of at least its heads (a whole-model cache's first ones). The caller
 * frees it (accel_kv_cache_free). */
typedef struct accel_kv_cache accel_kv_cache;
accel_kv_cache *accel_kv_cache_new(const accel_llama_config *cfg, int64_t batch, int64_t max_len,
                                   accel_device dev);
accel_kv_cache *accel_llama_kv_cache_new(accel_module *llama, int64_t batch, int64_t max_len, accel_device dev);
void accel_kv_cache_free(accel_kv_cache *c);
int64_t accel_kv_cache_len(const accel_kv_cache *c);
/* The bytes its K and V tensors hold (0 for NULL). */
int64_t accel_kv_cache_bytes(const accel_kv_cache *c);
void accel_kv_cache_reset(accel_kv_cache *c);

/* LlamaForCausalLM: children "model" (embed_tokens, layers.N, norm) and
 * "lm_head" (GPT2LMHeadModel: "transformer" (wte, wpe, h.N, ln_f) and
 * "lm_head"; GPTNeoXForCausalLM: "gpt_neox" (embed_in, layers.N,
 * final_layer_norm) and "embed_out"; docs/nn.md). Weights initialised as transformers does (normal(0, initializer_range),
 * norms 1) from the default generator; inside init_empty_weights on meta. */
accel_module *accel_llama_new(const accel_llama_config *cfg, accel_device dev);
const accel_llama_config *accel_llama_config_of(accel_module *llama);
/* ids [B, T] (i64) -> logits [B, T, V] (in the model's dtype; f32 under autocast). cache may be NULL;
 * with a cache, positions continue from accel_kv_cache_len and the cache grows.
 * Tensor-parallel (accel_llama_parallelize), the logits are this rank's
 * vocabulary columns without a cache, the whole vocabulary's with one (every
 * rank in step); with a cache sequence parallelism does not split T. */
accel_tensor *accel_llama_forward(accel_module *llama, accel_tensor *ids, accel_kv_cache *cache);
/* Mean next-token cross-entropy of ids [B, T] (labels = ids shifted, as
 * transformers does with labels=input_ids). */
accel_tensor *accel_llama_loss(accel_module *llama, accel_tensor *ids);

/* A forward's inputs beyond the ids (transformers' input_ids,
 * attention_mask, position_ids, past_key_values). Zero-initialise it:
 * every field but ids may be left NULL. */
typedef struct accel_llama_inputs {
    accel_tensor *ids;            /* [B, T] int64/int32 */
    /* [B, S] of 0 (masked: a pad) or 1, int64, int32, uint8 or bool, S = T,
     * or with a cache its length + T (the whole sequence, as transformers
     * takes it: the cache keeps every position's keys, pads' too, and the
     * mask of each call says which count). Key j is seen by query t of row
     * b when mask[b][j] is 1, j <= the query's index (causal) and, in a
     * windowed layer, j > index - sliding_window, the indices counting pads.
     * A query that sees no key (a left pad) gets finite don't-care values.
     * NULL, or a mask of ones: exactly accel_llama_forward. */
    accel_tensor *attention_mask;
    /* [B, T] int64/int32 >= 0 (GPT-2: < n_positions): the RoPE positions or
     * GPT-2's learned ones; NULL: cache length .. cache length + T - 1 in
     * every row, as transformers' forward without position_ids (its
     * generate derives them from the mask: accel_generate_batch). Dynamic
     * and longrope RoPE take their frequencies from the largest one + 1
     * (transformers' max(position_ids) + 1), for every row. */
    accel_tensor *position_ids;
    accel_kv_cache *cache;        /* NULL: none; else as accel_llama_forward's */
    /* transformers' forward with use_cache=False (gradient checkpointing
     * while training, DataCollatorWithFlattening's packed batches): given
     * position_ids and no attention_mask, a row holds packed sequences, a
     * new one wherever position[t] - position[t - 1] != 1, and query t sees
     * only the keys of its own sequence (causally, and within a window in a
     * windowed layer); the loss (accel_llama_loss_ex) ignores the labels at
     * each sequence's first token (DataCollatorWithFlattening's -100), so
     * no sequence predicts the next one's first token. A batch with no
     * restart, an attention_mask given (even of ones: transformers then
     * detects no packing) or no position_ids: as false. false (zero): the
     * forward of transformers with its cache (use_cache=True, the configs'
     * default), which attends over the whole row. Refused with a cache. */
    bool no_cache;
} accel_llama_inputs;

/* accel_llama_forward with in's attention_mask and position_ids (docs/nn.md
 * "Padded batches"): logits [B, T, V]; a padded batch whose rows each keep
 * one run of keys takes the fused attention with a key range a row (on the
 * CPU), other masks, windows and soft-capping the explicit scores (the
 * sliding-window path); an unpadded one is accel_llama_forward; under
 * tensor parallelism with sequence parallelism too; packed sequences
 * (no_cache) the explicit scores. Refused: under context
 * parallelism (ACCEL_ERR_UNSUPPORTED naming attention_mask); a
 * mask of another shape or dtype, of values other than 0/1, position ids
 * out of range (ACCEL_ERR_SHAPE / ACCEL_ERR_INVALID_ARG naming them);
 * no_cache with a cache (ACCEL_ERR_INVALID_ARG). */
accel_tensor *accel_llama_forward_ex(accel_module *llama, const accel_llama_inputs *in);
/* accel_llama_loss of in->ids [B, T>=2] (no cache) with in's attention_mask
 * [B, T] and position_ids: the labels at masked positions are ignored
 * (transformers' labels -100 there), the mean over the others; packed
 * sequences (no_cache) ignore each one's first label. With
 * output_router_logits the load-balancing loss's statistics leave the
 * masked tokens out (transformers' masked means). */
accel_tensor *accel_llama_loss_ex(accel_module *llama, const accel_llama_inputs *in);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_NN_H */
