/* GPT-2's module tree (GPT2LMHeadModel, transformers' names and init): the
 * blocks of the architecture table's gpt2 row. llama.c runs it with the
 * shared decoder forward (attention, KV cache, generation); what differs is
 * built here: learned position embeddings, LayerNorms with bias, Conv1D
 * projections (weight [in, out], fused q/k/v in c_attn), the gelu_new MLP. */
#include <math.h>

#include "arch.h"
#include "nn_internal.h"


/* An MLP of two projections (children ACCEL__GPT2_C_FC, ACCEL__GPT2_MLP_C_PROJ)
 * around gelu, the tanh approximation where `tanh`. */
static accel_tensor *gelu_mlp(accel_module *mlp, accel_tensor *x, bool tanh) {
    accel_module **p = mlp->children;
    return accel_module_call(p[ACCEL__GPT2_MLP_C_PROJ], accel_gelu(accel_module_call(p[ACCEL__GPT2_C_FC], x), tanh));
}

/* GPT2MLP: c_proj(gelu_new(c_fc(x))); gelu_new is the tanh approximation. */
accel_tensor *accel__gelu_mlp_forward(accel_module *mlp, accel_tensor *x) { return gelu_mlp(mlp, x, true); }

/* GPTNeoXMLP: the exact GELU, or the tanh one where its impl says so
 * (hidden_act gelu_fast, gelu_new, gelu_pytorch_tanh: llama.c's new_layer) */
accel_tensor *accel__gelu_exact_mlp_forward(accel_module *mlp, accel_tensor *x) {
    return gelu_mlp(mlp, x, mlp->impl && *(const bool *)mlp->impl);
}

static accel_module *layer_norm(const accel__arch *a, const accel_llama_config *c, accel_device dev) {
    return accel__layer_norm_create(&a->norm, c->hidden_size, c->rms_norm_eps, dev, c->torch_dtype);
}

/* GPT2Block i: children attn (c_attn, c_proj), mlp (c_fc, c_proj), ln_1, ln_2
 * in the order llama.c's layer indices name (attention, MLP, the norm before
 * each). transformers' _init_weights: normal(0, initializer_range), and for
 * the c_proj weights (the residual writers) initializer_range / sqrt(2 n_layer). */
static accel_module *new_block(const accel__arch *a, const accel_llama_config *c, int index, accel_device dev) {
    accel_module *layer = accel__decoder_layer_module(a, c, index);
    if (!layer) return NULL;
    int64_t C = c->hidden_size, I = c->intermediate_size;
    double std = c->initializer_range, proj_std = std / sqrt(2.0 * (double)c->num_hidden_layers);
    accel_module *attn = accel_module_add_child(layer, "attn", accel_module_new(&a->attn, NULL));
    accel_module *mlp = accel_module_add_child(layer, "mlp", accel_module_new(&a->mlp, NULL));
    bool ok = attn && mlp &&
              accel_module_add_child(attn, "c_attn", accel__conv1d_create(C, 3 * C, dev, c->torch_dtype, std)) &&
              accel_module_add_child(attn, "c_proj", accel__conv1d_create(C, C, dev, c->torch_dtype, proj_std)) &&
              accel_module_add_child(mlp, "c_fc", accel__conv1d_create(C, I, dev, c->torch_dtype, std)) &&
              accel_module_add_child(mlp, "c_proj", accel__conv1d_create(I, C, dev, c->torch_dtype, proj_std)) &&
              accel_module_add_child(layer, "ln_1", layer_norm(a, c, dev)) &&
              accel_module_add_child(layer, "ln_2", layer_norm(a, c, dev));
    if (!ok) {
        accel_module_free(layer);
        return NULL;
    }
    return layer;
}

accel_status accel__gpt2_build(accel_module *root, const accel__arch *a, const accel_llama_config *c,
                               accel_device dev) {
    accel_dtype dt = c->torch_dtype;
    double std = c->initializer_range;
    /* children in transformers' order (arch.h's ACCEL__GPT2_* indices): a
     * sequential device map puts wte and wpe together, before the blocks */
    accel_module *model = accel_module_add_child(root, "transformer", accel_module_new(&a->model, NULL));
    bool ok = model &&
              accel_module_add_child(model, "wte", accel__embedding_create(c->vocab_size, c->hidden_size, dev, dt, std)) &&
              accel_module_add_child(model, "wpe", accel__embedding_create(c->max_position_embeddings, c->hidden_size,
                                                                           dev, dt, std));
    accel_module *h = ok ? accel_module_add_child(model, "h", accel_module_new(&accel__module_list_ops, NULL)) : NULL;
    ok = h != NULL;
    for (int i = 0; ok && i < c->num_hidden_layers; i++) {
        char name[24];
        snprintf(name, sizeof name, "%d", i);
        ok = accel_module_add_child(h, name, new_block(a, c, i, dev)) != NULL;
    }
    /* A tied head gets its weight from wte: build it on meta. */
    ok = ok && accel_module_add_child(model, "ln_f", layer_norm(a, c, dev)) &&
         accel_module_add_child(root, "lm_head",
                                accel__linear_create(c->hidden_size, c->vocab_size, false,
                                                     c->tie_word_embeddings ? ACCEL_META_DEVICE : dev, dt, std));
    if (ok && c->tie_word_embeddings) ok = accel_module_tie(root, "lm_head.weight", "transformer.wte.weight") == ACCEL_OK;
    return ok ? ACCEL_OK : accel_last_status();
}
