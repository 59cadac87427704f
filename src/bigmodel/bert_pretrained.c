/* src/bigmodel/bert_pretrained.c — save_pretrained / from_pretrained for
 * BERT (accel/bert.h), in the layout transformers reads and writes
 * (config.json + safetensors, sharded with an index past max_shard_bytes). */
#include <stdio.h>
#include <string.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "bigmodel/bigmodel_internal.h"
#include "io/io_internal.h"

/* Entry i of sd is the masked LM's decoder tied to the word embeddings or
 * the head's bias: the names transformers' save_pretrained leaves out
 * (_tied_weights_keys), whichever of a tied pair the tree lists first
 * (XLM-RoBERTa's head comes before its word embeddings). A decoder loaded
 * untied (a checkpoint that held both with different values) shares no
 * tensor and is written, as transformers writes it. */
static bool is_tied_decoder(const accel_state_dict *sd, int i) {
    const char *name = sd->entries[i].name;
    if (strncmp(name, "cls.predictions.decoder.", 24) && strncmp(name, "lm_head.decoder.", 16)) return false;
    for (int j = 0; j < sd->n; j++)
        if (j != i && sd->entries[j].t == sd->entries[i].t) return true;
    return false;
}

static accel_status bert_config(const char *dir, const void *cfg) { return accel_bert_config_save(dir, cfg); }

accel_status accel_bert_save_pretrained(accel_module *m, const char *dir, int64_t max_shard_bytes) {
    if (!m || !dir) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_save_pretrained: NULL argument");
    const accel_bert_config *c0 = accel_bert_config_of(m);
    if (!c0 || strcmp(m->ops->type_name, accel_bert_class_name(c0->model_type, c0->head)) != 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_save_pretrained: the model is not a "
                               "BertFor<head> (or RoBERTa's) built by accel_bert_new (%s)", m->ops->type_name);
    accel_bert_config cfg = *c0;
    return accel__save_pretrained("accel_bert_save_pretrained", m, dir, max_shard_bytes, is_tied_decoder,
                                  &cfg.torch_dtype, bert_config, &cfg);
}

/* Whether dir holds weights: what the checkpoint loader resolves it to
 * (its own rule, not a list of names kept here: an index of another name
 * was missed, and the model came back initialised), or any index, whose
 * trouble (several, a broken one) the loader then names. */
static bool has_weights(const char *dir) {
    char *file = accel__checkpoint_resolve(dir);
    int count = 0;
    bool resolved = file != NULL;
    accel_free(file);
    if (!resolved) accel_free(accel__checkpoint_find_index(dir, &count));
    accel_clear_error();
    return resolved || count != 0;
}

/* A weight the checkpoint may lack: the task head a pre-trained encoder has
 * not been trained with (transformers initialises it and warns), the pooler
 * included (RoBERTa's multiple choice has one, its other heads none). A
 * model has only its own head's names (BERT's cls, RoBERTa's lm_head). */
static bool is_head(const char *name) {
    static const char *const HEADS[] = {"bert.pooler.", "roberta.pooler.", "classifier.", "qa_outputs.", "cls.",
                                        "lm_head."};
    for (size_t i = 0; i < sizeof HEADS / sizeof *HEADS; i++)
        if (!strncmp(name, HEADS[i], strlen(HEADS[i]))) return true;
    return false;
}

/* ck's name for the model's weight name, or NULL: the name itself, else
 * without the base model's prefix, "bert." or "roberta." (a bare
 * BertModel's or RobertaModel's checkpoint); each also with a LayerNorm's
 * weight/bias as gamma/beta, the names of the original Google BERT
 * checkpoints (transformers renames them on load). buf holds a rename. */
static const char *name_in(accel_checkpoint *ck, const char *name, const char *base, char *buf, size_t n) {
    size_t k = strlen(base);
    const char *forms[2] = {name, strncmp(name, base, k) || name[k] != '.' ? NULL : name + k + 1};
    for (int i = 0; i < 2 && forms[i]; i++) {
        const char *s = forms[i], *ln = strstr(s, "LayerNorm.");
        if (accel_checkpoint_shard_of(ck, s) >= 0) return s;
        if (!ln || (strcmp(ln + 10, "weight") && strcmp(ln + 10, "bias"))) continue;
        snprintf(buf, n, "%.*s%s", (int)(ln + 10 - s), s, ln[10] == 'w' ? "gamma" : "beta");
        if (accel_checkpoint_shard_of(ck, buf) >= 0) return buf;
    }
    return NULL;
}

/* A tied alias the checkpoint holds too (its values equal, or it was
 * untied: accel__untie_stored_twice): of t's shape, else refused as a
 * tensor of its own would be (transformers refuses it). */
static accel_status alias_fits(accel_checkpoint *ck, const char *in_ck, const accel_tensor *t, const char *dir) {
    const accel_st_info *in = accel_checkpoint_find(ck, in_ck, NULL);
    if (!in) return accel_last_status();
    if (accel__st_shape_is(in, t)) return ACCEL_OK;
    char a[128], b[128];
    return accel_set_error(ACCEL_ERR_SHAPE, "accel_bert_from_pretrained: %s: tensor %s has shape %s, the model's %s",
                           dir, in_ck, accel_shape_str_n(in->ndim, in->shape, a, sizeof a),
                           accel_shape_str_n(t->ndim, t->shape, b, sizeof b));
}

/* Every weight of m by name from ck (name_in's forms). The checkpoint's
 * tensors none of them took (another head's: a sequence classifier's
 * pooler, a QA model's qa_outputs) are left unused, counted in a note, as
 * transformers does. */
static accel_status load_weights(accel_module *m, accel_checkpoint *ck, const char *dir) {
    accel_state_dict *sd = accel_module_state_dict(m);
    int nck = accel_checkpoint_count(ck);
    bool *used = sd ? accel_calloc((size_t)nck + 1, sizeof *used) : NULL;
    accel_status st = used ? ACCEL_OK : accel_last_status();
    int new_head = 0, unused = 0;
    const char *base = accel_bert_base_model_prefix(accel_bert_config_of(m)->model_type);
    for (int i = 0; sd && i < sd->n && st == ACCEL_OK; i++) {
        const char *name = sd->entries[i].name;
        char buf[512];
        const char *in_ck = name_in(ck, name, base, buf, sizeof buf);
        /* a tied alias (the masked LM's decoder) is loaded as what it is tied to; a file that has it
         * too (a ZeRO-3 save_model's, an old checkpoint's) has it used */
        bool own = !sd->entries[i].is_tied_alias;
        /* a tied tensor the file holds under another of its names: XLM-RoBERTa's tree lists
         * lm_head.decoder.weight first, transformers' file has the word embeddings' name */
        for (int j = 0; own && !in_ck && j < sd->n; j++)
            if (j != i && sd->entries[j].t == sd->entries[i].t) in_ck = name_in(ck, sd->entries[j].name, base, buf,
                                                                                  sizeof buf);
        if (own && in_ck) st = accel_checkpoint_load_into(ck, in_ck, sd->entries[i].t);
        else if (in_ck) st = alias_fits(ck, in_ck, sd->entries[i].t, dir);
        else if (own && is_head(name)) new_head++;
        else if (own)
            st = accel_set_error(ACCEL_ERR_FORMAT, "accel_bert_from_pretrained: %s has no weight %s", dir, name);
        for (int k = 0; in_ck && k < nck; k++)
            if (!strcmp(accel_checkpoint_name(ck, k), in_ck)) used[k] = true;
    }
    const char *const *ignored = accel__unexpected_to_ignore(m); /* embeddings.position_ids of old checkpoints */
    for (int k = 0; st == ACCEL_OK && k < nck; k++)
        unused += !used[k] && !accel__unexpected_ignored(ignored, accel_checkpoint_name(ck, k));
    const char *cls = m->ops->type_name;
    if (st == ACCEL_OK && new_head)
        fprintf(stderr, "accel: %s has no %s head weights (%d tensors): they are newly initialised; train the model "
                "before using its predictions\n", dir, cls, new_head);
    if (st == ACCEL_OK && unused)
        fprintf(stderr, "accel: %d weights of %s (another head's) were not used when initialising a %s\n", unused,
                dir, cls);
    accel_free(used);
    accel_state_dict_free(sd);
    return st;
}

/* The dispatched load's init_missing (bigmodel_internal.h): a head tensor
 * the checkpoint lacks (a BertModel's, a pre-training checkpoint's) is
 * materialised on dev and initialised as accel_bert_new's Linear does and
 * transformers' _init_weights: weight N(0, initializer_range), bias 0 (the
 * masked LM's LayerNorm weight 1). */
static int init_head(accel_tensor *t, const char *name, accel_device dev, accel_dtype dt, void *ctx) {
    const accel_bert_config *c = ctx;
    if (!is_head(name)) return 0;
    if (accel_tensor_materialize(t, dev, dt) != ACCEL_OK) return -1;
    size_t n = strlen(name);
    bool weight = n > 7 && !strcmp(name + n - 7, ".weight");
    if (weight && (strstr(name, "LayerNorm.") || strstr(name, "layer_norm.")))
        return accel_fill_(t, 1.0) == ACCEL_OK ? 1 : -1;
    return !weight || accel_rng_normal_(accel_default_rng(), t, 0.0, c->initializer_range) == ACCEL_OK ? 1 : -1;
}

/* dir's config with the head (and num_labels when > 0): the config's
 * (head < 0) or the caller's. */
static bool load_config(const char *dir, int head, int64_t num_labels, accel_bert_config *cfg, const char *fn) {
    if (!dir) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dir is NULL", fn);
        return false;
    }
    if (head >= ACCEL_BERT_HEADS) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: head %d is not an accel_bert_head", fn, head);
        return false;
    }
    if (accel_bert_config_load(dir, cfg) != ACCEL_OK) return false;
    if (head >= 0) cfg->head = (accel_bert_head)head;
    if (num_labels > 0) cfg->num_labels = num_labels;
    return accel_bert_config_check(cfg, fn) == ACCEL_OK; /* the chosen head's rules (QA: 2 labels) */
}

static accel_module *from_pretrained(const char *dir, int head, int64_t num_labels, accel_device dev,
                                     const char *fn) {
    accel_bert_config cfg;
    if (!load_config(dir, head, num_labels, &cfg, fn)) return NULL;
    accel_module *m = accel_bert_new(&cfg, dev);
    if (m) accel_module_train(m, false); /* transformers' from_pretrained returns model.eval() */
    if (!m || !has_weights(dir)) return m;
    accel_checkpoint *ck = accel_checkpoint_open(dir);
    /* the checkpoint's names as load_weights reads them: the legacy renames, without the base model's prefix */
    const accel__pretrained_load legacy = {0};
    const accel_load_opts lo = {.base_model_prefix = accel_bert_base_model_prefix(cfg.model_type)};
    if (!ck || accel__untie_stored_twice(m, ck, &lo, &legacy) != ACCEL_OK || load_weights(m, ck, dir) != ACCEL_OK) {
        accel_checkpoint_close(ck);
        accel_module_free(m);
        return NULL;
    }
    accel_checkpoint_close(ck);
    return m;
}

accel_module *accel_bert_from_pretrained(const char *dir, accel_device dev) {
    return from_pretrained(dir, -1, 0, dev, "accel_bert_from_pretrained");
}

accel_module *accel_bert_from_pretrained_head(const char *dir, accel_bert_head head, int64_t num_labels,
                                              accel_device dev) {
    if ((int)head < 0) { /* -1 is from_pretrained's "the config's" */
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_from_pretrained_head: head %d is not an accel_bert_head",
                        (int)head);
        return NULL;
    }
    return from_pretrained(dir, (int)head, num_labels, dev, "accel_bert_from_pretrained_head");
}

static accel_module *dispatched(const char *dir, int head, int64_t num_labels, const accel_device_map *map,
                                const char *strategy,
                                const accel_max_memory *max_memory, const accel_load_opts *opts,
                                accel_dispatched **out, const char *fn) {
    if (!dir || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL dir or out", fn);
        return NULL;
    }
    *out = NULL;
    accel_bert_config cfg;
    if (!load_config(dir, head, num_labels, &cfg, fn)) return NULL;
    accel_init_empty_weights_begin();
    accel_module *m = accel_bert_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    /* the config lives in the root (accel_bert_config_of) for as long as the load */
    accel__pretrained_load pl = {.init_missing = init_head, .ctx = m ? (void *)accel_bert_config_of(m) : NULL};
    /* a bare base model's names: XLM-RoBERTa's root has its head first, not the base model */
    accel_load_opts lo = opts ? *opts : (accel_load_opts){0};
    if (!lo.base_model_prefix) lo.base_model_prefix = accel_bert_base_model_prefix(cfg.model_type);
    return accel__dispatch_pretrained(m, dir, map, strategy, max_memory, &lo, &pl, out);
}

accel_module *accel_bert_from_pretrained_dispatched(const char *dir, const accel_device_map *map,
                                                   const char *strategy, const accel_max_memory *max_memory,
                                                   const accel_load_opts *opts, accel_dispatched **out) {
    return dispatched(dir, -1, 0, map, strategy, max_memory, opts, out, "accel_bert_from_pretrained_dispatched");
}

accel_module *accel_bert_from_pretrained_head_dispatched(const char *dir, int head, int64_t num_labels,
                                                        const accel_device_map *map,
                                                        const char *strategy, const accel_max_memory *max_memory,
                                                        const accel_load_opts *opts, accel_dispatched **out) {
    static const char *FN = "accel_bert_from_pretrained_head_dispatched";
    if (head < 0) {
        if (out) *out = NULL;
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: head %d is not an accel_bert_head", FN, head);
        return NULL;
    }
    return dispatched(dir, head, num_labels, map, strategy, max_memory, opts, out, FN);
}
