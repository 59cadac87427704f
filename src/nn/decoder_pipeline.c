/* src/nn/decoder_pipeline.c — where a decoder model is cut into pipeline
 * stages (decoder_pipeline.h). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "accel/core.h"
#include "nn/arch.h"
#include "nn/decoder_pipeline.h"

/* Parameters of the module at path (0 when it has none or is absent). */
static int64_t params_at(accel_module *root, const char *path) {
    accel_module *m = accel_module_find(root, path);
    return m ? accel_module_num_params(m) : 0;
}

/* The path of the model's token embedding, "model.embed_tokens" (GPT-NeoX:
 * "gpt_neox.embed_in"), then `suffix`. */
static void embed_path(accel_module *llama, const char *suffix, char *out, size_t n) {
    const accel__arch *a = accel__arch_of_module(llama);
    snprintf(out, n, "%s.%s%s", accel__arch_base(a), accel__arch_embed(a), suffix);
}

static int n_layers(accel_module *llama, const char *who) {
    accel_module *layers = accel__decoder_layers(llama);
    char embed[40] = "";
    if (layers) embed_path(llama, "", embed, sizeof embed);
    if (!layers || !accel_module_find(llama, embed)) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: pipeline stages cut a decoder model built by accel_llama_new "
                        "(llama-style: model.embed_tokens, model.layers, model.norm, lm_head; GPT-NeoX's "
                        "gpt_neox.*); this model is not one (GPT-2's tree is not cut yet)", who);
        return -1;
    }
    return layers->n_children;
}

accel_status accel__decoder_stage_split(accel_module *llama, int stages, const int *explicit_layers,
                                        int *first_layer, const char *who) {
    int L = n_layers(llama, who);
    if (L < 0) return accel_last_status();
    const accel_llama_config *c = accel_llama_config_of(llama);
    if (c->output_router_logits && c->num_local_experts > 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: output_router_logits (the load-balancing loss of a "
                               "mixture of experts) is not implemented under pipeline parallelism", who);
    accel_module *layers = accel__decoder_layers(llama);
    if (stages < 1 || L < stages)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d pipeline stages for a model of %d layers: every "
                               "stage needs at least one layer", who, stages, L);
    first_layer[0] = 0;
    if (explicit_layers) {
        for (int s = 0; s < stages; s++) {
            if (explicit_layers[s] < 1)
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: stage %d is given %d layers (each stage needs "
                                       "at least one)", who, s, explicit_layers[s]);
            first_layer[s + 1] = first_layer[s] + explicit_layers[s];
            if (first_layer[s + 1] > L) break;
        }
        if (first_layer[stages] != L)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the stages' layer counts do not add up to the "
                                   "model's %d layers", who, L);
        return ACCEL_OK;
    }
    /* cost[i]: layer i's parameters, the ends' on the first and last layer */
    int64_t *pre = accel_malloc(((size_t)L + 1) * sizeof *pre);
    int64_t *best = accel_malloc((size_t)(stages + 1) * ((size_t)L + 1) * sizeof *best);
    int *cut = accel_malloc((size_t)(stages + 1) * ((size_t)L + 1) * sizeof *cut);
    if (!pre || !best || !cut) {
        accel_free(pre);
        accel_free(best);
        accel_free(cut);
        return accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", who);
    }
    /* the head's own parameters: the root's beyond the model's (a tied head has none) */
    const accel__arch *a = accel__arch_of_module(llama);
    char embed[40], norm[48]; /* model.norm (Phi's model.final_layernorm, GPT-NeoX's gpt_neox.final_layer_norm) */
    embed_path(llama, "", embed, sizeof embed);
    snprintf(norm, sizeof norm, "%s.%s", accel__arch_base(a), accel__arch_final_norm(a));
    int64_t first_extra = params_at(llama, embed);
    int64_t last_extra =
        params_at(llama, norm) + accel_module_num_params(llama) - params_at(llama, accel__arch_base(a));
    pre[0] = 0;
    for (int i = 0; i < L; i++)
        pre[i + 1] = pre[i] + accel_module_num_params(layers->children[i]) + (i == 0 ? first_extra : 0) +
                     (i == L - 1 ? last_extra : 0);
    /* best[k][j]: the smallest largest stage over layers [0, j) in k stages; cut[k][j] its last cut */
#define AT(k, j) ((size_t)(k) * ((size_t)L + 1) + (size_t)(j))
    for (int j = 0; j <= L; j++) best[AT(1, j)] = pre[j], cut[AT(1, j)] = 0;
    for (int k = 2; k <= stages; k++)
        for (int j = k; j <= L; j++) {
            best[AT(k, j)] = INT64_MAX;
            for (int i = k - 1; i < j; i++) {
                int64_t v = best[AT(k - 1, i)] > pre[j] - pre[i] ? best[AT(k - 1, i)] : pre[j] - pre[i];
                if (v < best[AT(k, j)]) best[AT(k, j)] = v, cut[AT(k, j)] = i;
            }
        }
    first_layer[stages] = L;
    for (int k = stages; k > 1; k--) first_layer[k - 1] = cut[AT(k, first_layer[k])];
#undef AT
    accel_free(pre);
    accel_free(best);
    accel_free(cut);
    return ACCEL_OK;
}

static void hidden(accel_module *llama, int64_t *C, accel_dtype *dt) {
    *C = accel_llama_config_of(llama)->hidden_size;
    char embed[48];
    embed_path(llama, ".weight", embed, sizeof embed);
    *dt = accel_module_get_tensor(llama, embed)->dtype;
}

/* name's stage: a layer's by first_layer, the embedding's the first, the
 * final norm's and the head's the last. The names are the model tree's:
 * "model." or GPT-NeoX's "gpt_neox." (a name that is neither: the last). */
static int owner(const char *name, const int *first_layer, int stages) {
    int layer, at = 0;
    const char *rest = !strncmp(name, "model.", 6) ? name + 6 : !strncmp(name, "gpt_neox.", 9) ? name + 9 : NULL;
    if (rest && sscanf(rest, "layers.%d.%n", &layer, &at) == 1 && at > 0) {
        int s = 0;
        while (s + 1 < stages && layer >= first_layer[s + 1]) s++;
        return s;
    }
    bool embed = rest && (!strncmp(rest, "embed_tokens.", 13) || !strncmp(rest, "embed_in.", 9));
    return embed ? 0 : stages - 1; /* the norm, lm_head: the last */
}

/* The head's weight when it is the embedding's: the tree says, not the
 * config (a checkpoint holding both with different values loads them
 * untied under tie_word_embeddings, as transformers does). */
static accel_tensor *tied_embedding(accel_module *llama) {
    const accel__arch *a = accel__arch_of_module(llama);
    char embed[48], head[32];
    if (!a) return NULL;
    embed_path(llama, ".weight", embed, sizeof embed);
    snprintf(head, sizeof head, "%s.weight", accel__arch_head(a));
    accel_tensor *e = accel_module_get_tensor(llama, embed), *h = accel_module_get_tensor(llama, head);
    return e && e == h ? e : NULL;
}

/* GPT-2's, Phi's and GPT-NeoX's dropouts draw masks while the model trains. */
static accel_status recomputable(accel_module *llama, const char *who) {
    const accel_llama_config *c = accel_llama_config_of(llama);
    if (!c) return accel_last_status();
    if (!llama->training || !(c->attn_pdrop > 0 || c->resid_pdrop > 0 || c->embd_pdrop > 0)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: dropout while training (attn_pdrop %g, resid_pdrop %g, "
                           "embd_pdrop %g) is not built with pipeline parallelism: a stage recomputes each "
                           "micro-batch's forward in its backward, which would draw other masks (set them to 0, "
                           "or train without pp_size)", who, c->attn_pdrop, c->resid_pdrop, c->embd_pdrop);
}

const accel__family_stages accel__decoder_stages = {n_layers,         accel__decoder_stage_split,
                                                    accel__decoder_stage_forward, accel__causal_lm_loss,
                                                    hidden,           owner,
                                                    tied_embedding,   recomputable,
                                                    accel__decoder_stage_released};
