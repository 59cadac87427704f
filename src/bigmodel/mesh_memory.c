/* A transformer's parameters on one rank of a tp x pp mesh (mesh_memory.h). */
#include "mesh_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "nn/arch.h"
#include "nn/decoder_pipeline.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The last component of the owner's name ("q_proj" of "model.layers.3.self_attn.q_proj.weight"). */
static void module_of(const char *name, char *out, size_t n) {
    const char *end = strrchr(name, '.'), *start = end;
    while (start && start > name && start[-1] != '.') start--;
    snprintf(out, n, "%.*s", end ? (int)(end - start) : 0, end ? start : "");
}

/* The decoder layer an entry belongs to ("model.layers.<i>.", GPT-2's
 * "transformer.h.<i>."), or -1. */
static int layer_of(const char *name) {
    static const char *const LISTS[] = {"layers.", "h."};
    for (int k = 0; k < 2; k++)
        for (const char *at = strstr(name, LISTS[k]); at; at = strstr(at + 1, LISTS[k])) {
            const char *digits = at + strlen(LISTS[k]);
            if ((at == name || at[-1] == '.') && *digits >= '0' && *digits <= '9') return atoi(digits);
        }
    return -1;
}

/* The stage of layer li under first_layer[0..pp]. */
static int stage_of(const int *first_layer, int pp, int64_t li) {
    int s = 0;
    while (s + 1 < pp && li >= first_layer[s + 1]) s++;
    return s;
}

/* Rows of an output-split weight a rank keeps: q/k/v by heads. With fewer
 * key/value heads than tp the plan keeps k_proj and v_proj (Phi-3: the
 * whole qkv_proj) whole on every rank, each using its head's rows
 * (src/nn/decoder_tp.c): the whole rows. */
static int64_t split_rows(const char *mod, int64_t rows, const accel_llama_config *c, int tp) {
    int64_t heads = c->num_attention_heads, kv = c->num_key_value_heads ? c->num_key_value_heads : heads;
    int64_t hd = c->head_dim ? c->head_dim : c->hidden_size / heads;
    bool replicated = kv < tp;
    if (!strcmp(mod, "q_proj")) return ceil_div(heads, tp) * hd;
    if (!strcmp(mod, "k_proj") || !strcmp(mod, "v_proj")) return replicated ? rows : ceil_div(kv, tp) * hd;
    if (!strcmp(mod, "qkv_proj")) return replicated ? rows : (ceil_div(heads, tp) + 2 * ceil_div(kv, tp)) * hd;
    return ceil_div(rows, tp);
}

/* GPT-2's Conv1D projections (weight [in, out]) as the Linear the plan cuts
 * them as (src/nn/decoder_tp.c): c_attn the fused q | k | v, c_fc an up
 * projection, attn.c_proj and mlp.c_proj row-parallel; NULL for another. */
static const char *conv1d_as(const char *mod) {
    return !strcmp(mod, "c_attn") ? "qkv_proj" : !strcmp(mod, "c_fc") ? "up_proj" : !strcmp(mod, "c_proj") ? "down_proj"
                                                                                                           : NULL;
}

/* Phi's, GPT-NeoX's and Starcoder2's Linear projections as the plan cuts
 * them: dense as o_proj, fc1 / dense_h_to_4h / c_fc as an up projection,
 * fc2 / dense_4h_to_h / c_proj as a down one, GPT-NeoX's query_key_value
 * (rows per head [H, 3, D], as many kv heads as heads) by rows as an up
 * projection is; NULL for another. */
static const char *linear_as(const char *mod) {
    static const char *const AS[][2] = {{"dense", "o_proj"}, {"fc1", "up_proj"}, {"fc2", "down_proj"},
                                        {"dense_h_to_4h", "up_proj"}, {"dense_4h_to_h", "down_proj"},
                                        {"query_key_value", "up_proj"}, {"c_fc", "up_proj"},
                                        {"c_proj", "down_proj"}};
    for (size_t i = 0; i < sizeof AS / sizeof *AS; i++)
        if (!strcmp(mod, AS[i][0])) return AS[i][1];
    return NULL;
}

/* The vocabulary-split embedding (Llama's embed_tokens, GPT-2's wte,
 * GPT-NeoX's embed_in) and head (lm_head, GPT-NeoX's embed_out). */
static bool is_embedding(const char *mod) {
    return !strcmp(mod, "embed_tokens") || !strcmp(mod, "wte") || !strcmp(mod, "embed_in");
}
static bool is_head(const char *mod) { return !strcmp(mod, "lm_head") || !strcmp(mod, "embed_out"); }

/* Bytes of one entry on a rank of tp, or -1 (error set) for a 2-D weight of a
 * layer it does not know how to split. */
static int64_t rank_bytes(const accel_state_entry *e, const accel_llama_config *c, int tp, bool in_layer) {
    const accel_tensor *t = e->t;
    int64_t el = (int64_t)accel_dtype_size(t->dtype), numel = accel_numel(t);
    if (tp == 1) return numel * el;
    char mod[64];
    module_of(e->name, mod, sizeof mod);
    bool bias = !strcmp(e->name + strlen(e->name) - 5, ".bias");
    /* a weight's output dimension: a Linear's rows, a Conv1D's columns */
    /* Conv1D only in GPT-2 (Starcoder2's c_fc / c_proj are Linears) */
    const accel__arch *a = accel__arch_find(c->model_type);
    const char *as = a && a->blocks == ACCEL__BLOCKS_GPT2 ? conv1d_as(mod) : NULL;
    int out = as && t->ndim == 2 ? 1 : 0;
    if (!as) as = linear_as(mod);
    if (as) snprintf(mod, sizeof mod, "%s", as);
    /* w1, w3, w2: Mixtral's experts' gate, up and down (Qwen's are named as an MLP's) */
    static const char *const COLUMN[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "qkv_proj",
                                         "gate_up_proj", "w1", "w3"};
    for (size_t i = 0; i < sizeof COLUMN / sizeof *COLUMN; i++)
        if (!strcmp(mod, COLUMN[i])) {
            int64_t rows = t->ndim ? t->shape[out] : 1;
            return split_rows(mod, rows, c, tp) * (numel / (rows ? rows : 1)) * el;
        }
    if (!strcmp(mod, "o_proj") || !strcmp(mod, "down_proj") || !strcmp(mod, "w2")) /* split along the inputs */
        return bias ? numel * el : numel / t->shape[1 - out] * ceil_div(t->shape[1 - out], tp) * el;
    if (is_embedding(mod) || is_head(mod))
        return ceil_div(t->shape[0], tp) * (t->ndim > 1 ? t->shape[1] : 1) * el;
    /* a sparse block's router and Qwen2-MoE's shared expert's gate: whole on every rank */
    if (!strcmp(mod, "gate") || !strcmp(mod, "shared_expert_gate")) return numel * el;
    if (in_layer && t->ndim == 2 && !e->is_buffer) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s [%lld, %lld]: no tensor-parallel split is modelled for "
                        "this weight (%s)", e->name, (long long)t->shape[0], (long long)t->shape[1], mod);
        return -1;
    }
    return numel * el; /* norms, buffers: whole on every rank */
}

int64_t accel__mesh_entry_bytes(const accel_state_entry *e, const accel_llama_config *cfg, int tp) {
    return rank_bytes(e, cfg, tp, layer_of(e->name) >= 0);
}

accel_status accel__mesh_param_bytes(accel_module *m, const accel_llama_config *cfg, int tp, int pp,
                                     accel__mesh_bytes *out) {
    int64_t L = cfg->num_hidden_layers;
    if (tp < 1 || pp < 1 || pp > L)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "tp_size %d and pp_size %d must be >= 1, pp_size at most the "
                               "%lld decoder layers", tp, pp, (long long)L);
    /* the stages' layers as the runtime splits them (pipeline.c: balanced by parameter count) */
    int *split = accel_malloc(((size_t)pp + 1) * sizeof *split);
    if (!split) return accel_last_status();
    split[0] = 0, split[pp] = (int)L;
    if (pp > 1 && accel__decoder_stage_split(m, pp, NULL, split, "--pp_size") != ACCEL_OK) {
        accel_free(split);
        return accel_last_status();
    }
    accel_state_dict *sd = accel_module_state_dict(m);
    int64_t *stage = accel_calloc((size_t)pp, sizeof *stage), *largest = accel_calloc((size_t)pp, sizeof *largest);
    int64_t *layer = accel_calloc((size_t)L, sizeof *layer), embed = 0, head = 0;
    accel_status st = sd && stage && largest && layer ? ACCEL_OK
                                                      : accel_set_error(ACCEL_ERR_OOM, "the mesh's sizes: out of memory");
    for (int i = 0; !st && i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        char mod[64];
        module_of(e->name, mod, sizeof mod);
        bool head_entry = is_head(mod);
        bool is_embed = is_embedding(mod) || !strcmp(mod, "wpe");
        /* a tied lm_head is the embedding: its own copy on the last stage only when that is another stage */
        if (e->is_tied_alias && !(head_entry && pp > 1)) continue;
        int li = layer_of(e->name);
        if (li >= L) li = (int)L - 1; /* not a config the model was built from: counted on the last layer */
        int64_t b = rank_bytes(e, cfg, tp, li >= 0);
        if (b < 0) st = ACCEL_ERR_UNSUPPORTED;
        else if (li >= 0) layer[li] += b, stage[stage_of(split, pp, li)] += b;
        else if (is_embed) embed += b, stage[0] += b;
        else if (head_entry) head += b, stage[pp - 1] += b;
        else stage[pp - 1] += b; /* the final norm */
    }
    if (!st) {
        for (int64_t i = 0; i < L; i++) {
            int64_t *big = &largest[stage_of(split, pp, i)];
            if (layer[i] > *big) *big = layer[i];
        }
        if (embed > largest[0]) largest[0] = embed;
        if (head > largest[pp - 1]) largest[pp - 1] = head;
        int worst = 0;
        for (int s = 1; s < pp; s++)
            if (stage[s] > stage[worst]) worst = s;
        *out = (accel__mesh_bytes){stage[worst], largest[worst], worst, split[worst], split[worst + 1] - split[worst]};
    }
    accel_free(stage);
    accel_free(largest);
    accel_free(layer);
    accel_free(split);
    accel_state_dict_free(sd);
    return st;
}
