/* src/io/bert_config.c — transformers' config.json of model_type "bert",
 * "roberta" or "xlm-roberta" (BertConfig, RobertaConfig, XLMRobertaConfig),
 * read into and written from accel_bert_config (accel/bert.h).
 * Both the 4.x layout (torch_dtype, position_embedding_type) and the 5.x one
 * (dtype) are read. A key that changes the model and accel does not implement
 * is refused, naming it. */
#include <stdio.h>
#include <string.h>

#include "accel/bert.h"
#include "io/io_internal.h"

#define TRANSFORMERS_VERSION "4.46.0"

/* A string key that accel takes at one value only (absent or null: fine). */
static accel_status want_string(json_t *root, const char *file, const char *key, const char *only, const char *why) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), only))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s must be \"%s\" (%s)", file, key, only, why);
}

/* A boolean key that accel takes only false. */
static accel_status want_false(json_t *root, const char *file, const char *key, const char *why) {
    bool on = false;
    if (accel__config_get_bool(root, file, key, &on)) return accel_last_status();
    return on ? accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is true: %s", file, key, why) : ACCEL_OK;
}

/* A dropout probability: a number in [0, 1) (transformers' nn.Dropout
 * raises outside [0, 1]; p = 1, all zeros, is not implemented); null or
 * absent keeps *p. */
static accel_status get_prob(json_t *root, const char *file, const char *key, double *p) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (accel__config_get_real(root, file, key, p)) return accel_last_status();
    if (!(*p >= 0 && *p < 1))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s is %g: a dropout probability must be in [0, 1)%s", file,
                               key, *p, *p == 1 ? " (p = 1, every activation dropped, is not implemented)" : "");
    return ACCEL_OK;
}

static accel_status parse_act(json_t *root, const char *file, accel_bert_config *c) {
    json_t *v = json_object_get(root, "hidden_act");
    if (!v || json_is_null(v)) return ACCEL_OK;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (!strcmp(s, "gelu")) c->gelu_tanh = false;
    else if (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh")) c->gelu_tanh = true;
    else
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: hidden_act must be \"gelu\", \"gelu_new\" or "
                               "\"gelu_pytorch_tanh\" (the activations accel implements for bert)", file);
    return ACCEL_OK;
}

/* Whether "architectures" naming h's class picks h: the task heads do; the
 * masked LM and pre-training heads are only built when asked for
 * (accel_bert_from_pretrained_head): pre-trained encoders' configs say
 * BertForMaskedLM (bert-base-uncased) or BertForPreTraining, and are loaded
 * to be fine-tuned into a classifier. */
static bool picked_by_architectures(accel_bert_head h) {
    return h != ACCEL_BERT_MASKED_LM && h != ACCEL_BERT_PRETRAINING;
}

/* The head: the first entry of "architectures" that names one of
 * accel_bert_head's task heads (sequence, token, QA, next sentence, multiple
 * choice) of the config's model type (RobertaForTokenClassification for
 * "roberta"); none (BertModel, BertForMaskedLM, ...): sequence
 * classification, the head accel builds when asked nothing else. */
static accel_status parse_head(json_t *root, const char *file, accel_bert_config *c) {
    json_t *arch = json_object_get(root, "architectures");
    if (!arch || json_is_null(arch)) return ACCEL_OK;
    if (!json_is_array(arch))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: 'architectures' must be a list of class names", file);
    for (size_t i = 0; i < json_array_size(arch); i++) {
        const char *name = json_string_value(json_array_get(arch, i)); /* NULL: not a string, named by none */
        for (int h = 0; name && h < ACCEL_BERT_HEADS; h++) {
            const char *cls = accel_bert_class_name(c->model_type, (accel_bert_head)h); /* NULL: none in RoBERTa */
            if (cls && picked_by_architectures((accel_bert_head)h) && !strcmp(name, cls)) {
                c->head = (accel_bert_head)h;
                return ACCEL_OK;
            }
        }
    }
    return ACCEL_OK;
}

/* num_labels: the key when given, else the size of id2label (what
 * transformers' save_pretrained writes). problem_type picks sequence
 * classification's loss only; the other heads' ignore it. */
static accel_status parse_labels(json_t *root, const char *file, accel_bert_config *c) {
    json_t *id2label = json_object_get(root, "id2label");
    if (id2label && !json_is_null(id2label)) {
        if (!json_is_object(id2label) || json_object_size(id2label) == 0)
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: 'id2label' must be a non-empty object", file);
        c->num_labels = (int64_t)json_object_size(id2label);
    }
    if (accel__config_get_int(root, file, "num_labels", &c->num_labels, false)) return accel_last_status();
    if (c->head != ACCEL_BERT_SEQUENCE_CLASSIFICATION) return ACCEL_OK; /* accel_bert_config_check's rules */
    json_t *pt = json_object_get(root, "problem_type");
    if (pt && !json_is_null(pt) &&
        (!json_is_string(pt) || strcmp(json_string_value(pt), "single_label_classification") != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: problem_type must be \"single_label_classification\" "
                               "(regression and multi-label losses are not implemented)", file);
    if (c->num_labels < 2)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: num_labels (id2label) is %lld: transformers makes that "
                               "a regression (problem_type \"regression\"), which accel does not implement",
                               file, (long long)c->num_labels);
    return ACCEL_OK;
}

int accel__bert_model_type_of(json_t *root) {
    json_t *mt = json_object_get(root, "model_type");
    for (int t = 0; t < ACCEL_BERT_MODEL_TYPES && json_is_string(mt); t++)
        if (!strcmp(json_string_value(mt), accel_bert_model_type_name((accel_bert_model_type)t))) return t;
    return -1;
}

static accel_status parse(json_t *root, const char *file, accel_bert_config *c) {
    if (!json_is_object(root)) return accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a JSON object", file);
    json_t *mt = json_object_get(root, "model_type");
    int t = accel__bert_model_type_of(root);
    if (t < 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: model_type is %s%s%s, not \"bert\", \"roberta\" or "
                               "\"xlm-roberta\"", file, json_is_string(mt) ? "\"" : "",
                               json_is_string(mt) ? json_string_value(mt) : "absent or not a string",
                               json_is_string(mt) ? "\"" : "");
    *c = accel_bert_config_default_for((accel_bert_model_type)t); /* the class's defaults for absent keys */
    if (accel__config_get_token_id(root, file, "pad_token_id", &c->pad_token_id)) return accel_last_status();
    json_t *pruned = json_object_get(root, "pruned_heads");
    if (accel__config_get_int(root, file, "vocab_size", &c->vocab_size, false) ||
        accel__config_get_int(root, file, "hidden_size", &c->hidden_size, false) ||
        accel__config_get_int(root, file, "num_hidden_layers", &c->num_hidden_layers, true) ||
        accel__config_get_int(root, file, "num_attention_heads", &c->num_attention_heads, false) ||
        accel__config_get_int(root, file, "intermediate_size", &c->intermediate_size, false) ||
        accel__config_get_int(root, file, "max_position_embeddings", &c->max_position_embeddings, false) ||
        accel__config_get_int(root, file, "type_vocab_size", &c->type_vocab_size, false) ||
        accel__config_get_real(root, file, "layer_norm_eps", &c->layer_norm_eps) ||
        accel__config_get_real(root, file, "initializer_range", &c->initializer_range) ||
        get_prob(root, file, "hidden_dropout_prob", &c->hidden_dropout_prob) ||
        get_prob(root, file, "attention_probs_dropout_prob", &c->attention_probs_dropout_prob) ||
        get_prob(root, file, "classifier_dropout", &c->classifier_dropout) ||
        accel__config_get_dtype(root, file, "torch_dtype", &c->torch_dtype) ||
        accel__config_get_dtype(root, file, "dtype", &c->torch_dtype) ||
        parse_act(root, file, c) || parse_head(root, file, c) || parse_labels(root, file, c) ||
        want_string(root, file, "position_embedding_type", "absolute",
                    "relative_key and relative_key_query positions are not implemented") ||
        want_false(root, file, "is_decoder", "a causal (decoder) BERT is not implemented") ||
        want_false(root, file, "add_cross_attention", "cross-attention is not implemented"))
        return accel_last_status();
    bool tie = true;
    if (accel__config_get_bool(root, file, "tie_word_embeddings", &tie)) return accel_last_status();
    c->untied_word_embeddings = !tie;
    if (pruned && !json_is_null(pruned) && (!json_is_object(pruned) || json_object_size(pruned) != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: pruned_heads is not empty: pruned attention heads are "
                               "not implemented", file);
    if (c->pad_token_id >= c->vocab_size)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: pad_token_id %lld is not below vocab_size %lld", file,
                               (long long)c->pad_token_id, (long long)c->vocab_size);
    /* what the model build needs, as a format error of the file */
    if (accel_bert_config_check(c, file)) {
        char why[512];
        snprintf(why, sizeof why, "%s", accel_last_error());
        return accel_set_error(ACCEL_ERR_FORMAT, "%s", why);
    }
    return ACCEL_OK;
}

accel_status accel_bert_config_load(const char *path_or_dir, accel_bert_config *out) {
    if (!path_or_dir || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_config_load: NULL argument");
    char *file = accel__is_dir(path_or_dir) ? accel__path_join(path_or_dir, "config.json")
                                            : accel_strdup(path_or_dir);
    if (!file) return accel_last_status();
    json_t *root = accel__json_load_file(file);
    accel_status st = root ? parse(root, file, out) : accel_last_status();
    json_decref(root);
    accel_free(file);
    return st;
}

/* The keys of transformers' BertFor<head> (RobertaFor<head>, ...) config.json;
 * id2label names are LABEL_<i> (the names of a loaded config are not kept). */
static json_t *to_json(const accel_bert_config *c) {
    json_t *j = json_object(), *arch = json_array(), *id2label = json_object(), *label2id = json_object();
    if (!j || !arch || !id2label || !label2id) {
        json_decref(j);
        json_decref(arch);
        json_decref(id2label);
        json_decref(label2id);
        return NULL;
    }
    json_array_append_new(arch, json_string(accel_bert_class_name(c->model_type, c->head)));
    for (int64_t i = 0; i < c->num_labels; i++) {
        char k[32], v[40];
        snprintf(k, sizeof k, "%lld", (long long)i);
        snprintf(v, sizeof v, "LABEL_%lld", (long long)i);
        json_object_set_new(id2label, k, json_string(v));
        json_object_set_new(label2id, v, json_integer(i));
    }
    json_object_set_new(j, "architectures", arch);
    json_object_set_new(j, "id2label", id2label);
    json_object_set_new(j, "label2id", label2id);
    json_object_set_new(j, "model_type", json_string(accel_bert_model_type_name(c->model_type)));
    json_object_set_new(j, "add_cross_attention", json_false());
    json_object_set_new(j, "is_decoder", json_false());
    json_object_set_new(j, "position_embedding_type", json_string("absolute"));
    json_object_set_new(j, "hidden_act", json_string(c->gelu_tanh ? "gelu_new" : "gelu"));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "type_vocab_size", json_integer(c->type_vocab_size));
    json_object_set_new(j, "pad_token_id", c->pad_token_id >= 0 ? json_integer(c->pad_token_id) : json_null());
    json_object_set_new(j, "tie_word_embeddings", json_boolean(!c->untied_word_embeddings));
    json_object_set_new(j, "layer_norm_eps", json_real(c->layer_norm_eps));
    json_object_set_new(j, "initializer_range", json_real(c->initializer_range));
    json_object_set_new(j, "hidden_dropout_prob", json_real(c->hidden_dropout_prob));
    json_object_set_new(j, "attention_probs_dropout_prob", json_real(c->attention_probs_dropout_prob));
    json_object_set_new(j, "classifier_dropout", c->classifier_dropout >= 0 ? json_real(c->classifier_dropout)
                                                                              : json_null());
    json_object_set_new(j, "torch_dtype", json_string(accel_dtype_name(c->torch_dtype)));
    json_object_set_new(j, "transformers_version", json_string(TRANSFORMERS_VERSION));
    json_object_set_new(j, "use_cache", json_true());
    return j;
}

accel_status accel_bert_config_save(const char *dir_or_path, const accel_bert_config *c) {
    if (!dir_or_path || !c) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_config_save: NULL argument");
    if (accel_bert_config_check(c, "accel_bert_config_save")) return accel_last_status();
    size_t len = strlen(dir_or_path);
    bool is_json = len >= 5 && strcmp(dir_or_path + len - 5, ".json") == 0;
    if (!is_json && accel__mkdir(dir_or_path)) return accel_last_status();
    char *file = is_json ? accel_strdup(dir_or_path) : accel__path_join(dir_or_path, "config.json");
    json_t *j = file ? to_json(c) : NULL;
    accel_status st = !file ? accel_last_status()
                      : !j  ? accel_set_error(ACCEL_ERR_OOM, "accel_bert_config_save: out of memory")
                            : accel__json_save_file(file, j);
    json_decref(j);
    accel_free(file);
    return st;
}
