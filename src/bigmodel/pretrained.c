/* src/bigmodel/pretrained.c — save_pretrained / from_pretrained for Llama,
 * in the layout transformers reads and writes (config.json + safetensors,
 * sharded with an index past max_shard_size). */
#include <string.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "bigmodel/bigmodel_internal.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"
#include "nn/nn_internal.h"

#define DEFAULT_SHARD_BYTES 5000000000LL /* transformers' max_shard_size="5GB" */

/* What a save_pretrained writes into its staged directory. */
typedef struct pretrained_files {
    int n;
    const char **names;
    accel_tensor **ts;
    int64_t max;
    accel__config_writer config;
    const void *cfg;
} pretrained_files;

static accel_status write_pretrained(void *ctx, const char *dir) {
    const pretrained_files *pf = ctx;
    accel_status st = accel__write_sharded(dir, pf->n, pf->names, pf->ts, pf->max, ACCEL_WEIGHTS_SAFETENSORS, NULL,
                                           NULL);
    return st ? st : pf->config(dir, pf->cfg);
}

accel_status accel__save_pretrained(const char *fn, accel_module *m, const char *dir, int64_t max_shard_bytes,
                                    bool (*skip)(const accel_state_dict *sd, int i), accel_dtype *torch_dtype,
                                    accel__config_writer config, const void *cfg) {
    const char *away = accel__module_values_away(m); /* (ZeRO-3's pieces, tensor-parallel slices) */
    if (away) return accel_set_error(ACCEL_ERR_STATE, "%s: %s", fn, away);
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    const char **names = accel_calloc((size_t)sd->n + 1, sizeof *names);
    accel_tensor **ts = accel_calloc((size_t)sd->n + 1, sizeof *ts);
    accel_status st = names && ts ? ACCEL_OK : accel_last_status();
    int n = 0;
    for (int i = 0; i < sd->n && st == ACCEL_OK; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (skip(sd, i)) continue;
        if (e->t->device.type == ACCEL_DEV_META)
            st = accel_set_error(ACCEL_ERR_DEVICE, "%s: %s is on meta (offloaded or never loaded); save needs every "
                                 "weight materialised", fn, e->name);
        if (accel_dtype_is_float(e->t->dtype)) *torch_dtype = e->t->dtype;
        names[n] = e->name;
        ts[n++] = e->t;
    }
    /* the weights and config.json swapped in together: never new weights under the old config (but onto a
     * mount point, written in place: docs/io.md) */
    pretrained_files pf = {n, names, ts, max_shard_bytes > 0 ? max_shard_bytes : DEFAULT_SHARD_BYTES, config, cfg};
    if (st == ACCEL_OK) st = accel__save_staged(dir, fn, write_pretrained, &pf);
    accel_free(names);
    accel_free(ts);
    accel_state_dict_free(sd);
    return st;
}

/* lm_head.weight tied to the embeddings: transformers drops it. */
static bool is_tied_alias(const accel_state_dict *sd, int i) { return sd->entries[i].is_tied_alias; }

static accel_status llama_config(const char *dir, const void *cfg) { return accel_llama_config_save(dir, cfg); }

accel_status accel_save_pretrained(accel_module *llama, const char *dir, int64_t max_shard_bytes) {
    static const char FN[] = "accel_save_pretrained";
    if (!llama || !dir) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL argument", FN);
    const accel_llama_config *cfg0 = accel_llama_config_of(llama);
    if (!cfg0) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the model is not a Llama model", FN);
    accel_llama_config cfg = *cfg0;
    return accel__save_pretrained(FN, llama, dir, max_shard_bytes, is_tied_alias, &cfg.torch_dtype, llama_config, &cfg);
}

const char *const *accel__unexpected_to_ignore(accel_module *m) {
    static const char *const GPT2[] = {"attn.bias", "crossattention.bias", NULL};
    static const char *const NEOX[] = {"attention.bias", "attention.masked_bias", "rotary_emb\\.inv_freq", NULL};
    static const char *const ROTARY[] = {"rotary_emb\\.inv_freq", NULL};
    static const char *const BERT[] = {"(^|\\.)position_ids$", NULL};
    static const char *const NONE[] = {NULL};
    if (accel_bert_config_of(m)) return BERT; /* BERT, RoBERTa, XLM-RoBERTa: embeddings.position_ids */
    const accel_llama_config *c = accel_llama_config_of(m);
    accel_clear_error(); /* the lookup of the family that m is not */
    if (!c) return NONE;
    if (!strcmp(c->model_type, "gpt2")) return GPT2; /* attn.masked_bias is not in it: reported */
    if (!strcmp(c->model_type, "gpt_neox")) return NEOX;
    /* Gemma 3's buffers are rotary_emb.<layer type>_inv_freq: no pattern */
    return strcmp(c->model_type, "gemma3_text") ? ROTARY : NONE;
}

accel_module *accel__dispatch_pretrained(accel_module *m, const char *dir, const accel_device_map *map,
                                         const char *strategy, const accel_max_memory *max_memory,
                                         const accel_load_opts *opts, const accel__pretrained_load *pl,
                                         accel_dispatched **out) {
    if (!m) return NULL;
    const accel__pretrained_load none = {0}; /* the legacy renames only */
    const char *no_split[ACCEL_MAX_NO_SPLIT];
    accel_device_map_opts mo = {.no_split = no_split, .n_no_split = accel_module_no_split_classes(m, no_split)};
    accel__pretrained_load with = pl ? *pl : none;
    with.ignore_unexpected = accel__unexpected_to_ignore(m);
    accel_load_opts lo = opts ? *opts : (accel_load_opts){0};
    if (!lo.map_opts) lo.map_opts = &mo;
    if (!lo.base_model_prefix) lo.base_model_prefix = m->children[0]->name; /* "model", "transformer", "bert" */
    accel_dispatched *d = accel__load_checkpoint_and_dispatch(m, dir, map, strategy, max_memory, &lo, &with);
    if (!d) {
        accel_module_free(m);
        return NULL;
    }
    accel_module_train(m, false); /* transformers' from_pretrained returns model.eval() */
    *out = d;
    return m;
}

accel_module *accel_llama_from_pretrained(const char *dir, const accel_device_map *map, const char *strategy,
                                          const accel_max_memory *max_memory, const accel_load_opts *opts,
                                          accel_dispatched **out) {
    if (!dir || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_from_pretrained: NULL dir or out");
        return NULL;
    }
    *out = NULL;
    accel_llama_config cfg;
    if (accel_llama_config_load(dir, &cfg) != ACCEL_OK) return NULL;
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    return accel__dispatch_pretrained(m, dir, map, strategy, max_memory, opts, NULL, out);
}
