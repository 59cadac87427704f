/* src/io/hf_config.c — transformers' config.json for LlamaForCausalLM.
 *
 * Reads both the transformers 4.x layout (torch_dtype, rope_theta, rope_scaling)
 * and the 5.x one (dtype, rope_parameters); writes the 4.x layout, which both read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/io.h"
#include "io/io_internal.h"

#define TRANSFORMERS_VERSION "4.46.0"

static accel_status bad_type(const char *file, const char *key, const char *want) {
    return accel_set_error(ACCEL_ERR_FORMAT, "%s: '%s' must be %s", file, key, want);
}

/* Positive integer key; absent keeps *out. null keeps it only where
 * transformers' LlamaConfig derives the value from None (num_key_value_heads,
 * head_dim); for a size it has no default for, null would build a model of
 * accel's default size instead of the one the file describes. */
static accel_status get_int(json_t *root, const char *file, const char *key, int64_t *out, bool allow_zero,
                            bool null_ok) {
    json_t *v = json_object_get(root, key);
    if (!v) return ACCEL_OK;
    if (json_is_null(v)) {
        if (null_ok) return ACCEL_OK;
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: '%s' is null; it must be %s", file, key,
                               allow_zero ? "a non-negative integer" : "a positive integer");
    }
    if (!json_is_integer(v) || json_integer_value(v) < (allow_zero ? 0 : 1))
        return bad_type(file, key, allow_zero ? "a non-negative integer" : "a positive integer");
    *out = json_integer_value(v);
    return ACCEL_OK;
}

static accel_status get_real(json_t *root, const char *file, const char *key, double *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (!json_is_number(v)) return bad_type(file, key, "a number");
    *out = json_number_value(v);
    return ACCEL_OK;
}

static accel_status get_bool(json_t *root, const char *file, const char *key, bool *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (!json_is_boolean(v)) return bad_type(file, key, "true or false");
    *out = json_is_true(v);
    return ACCEL_OK;
}

static accel_status get_dtype(json_t *root, const char *file, const char *key, accel_dtype *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (!json_is_string(v)) return bad_type(file, key, "a dtype string such as \"float32\"");
    int dt = accel_dtype_parse(json_string_value(v));
    if (dt < 0 || !accel_dtype_is_float((accel_dtype)dt))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: '%s' is \"%s\", not a floating dtype accel knows", file,
                               key, json_string_value(v));
    *out = (accel_dtype)dt;
    return ACCEL_OK;
}

/* rope_scaling (4.x) / rope_parameters (5.x): only the default rope is implemented. */
static accel_status check_rope(json_t *root, const char *file, const char *key, double *theta) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (!json_is_object(v)) return bad_type(file, key, "null or an object");
    json_t *t = json_object_get(v, "rope_type");
    if (!t) t = json_object_get(v, "type");
    if (t && !json_is_string(t)) return bad_type(file, key, "an object with a string rope_type");
    if (t && strcmp(json_string_value(t), "default") != 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "%s: %s of type \"%s\" is not supported (only the default rope)", file, key,
                               json_string_value(t));
    return get_real(v, file, "rope_theta", theta);
}

static accel_status parse_config(json_t *root, const char *file, accel_llama_config *c) {
    if (!json_is_object(root)) return accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a JSON object", file);
    json_t *mt = json_object_get(root, "model_type");
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "llama") != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: model_type is %s%s%s, only \"llama\" is supported",
                               file, json_is_string(mt) ? "\"" : "",
                               json_is_string(mt) ? json_string_value(mt) : "not a string",
                               json_is_string(mt) ? "\"" : "");
    /* transformers' LlamaConfig defaults */
    *c = (accel_llama_config){.vocab_size = 32000,
                              .hidden_size = 4096,
                              .intermediate_size = 11008,
                              .num_hidden_layers = 32,
                              .num_attention_heads = 32,
                              .num_key_value_heads = 0,
                              .head_dim = 0,
                              .max_position_embeddings = 2048,
                              .rms_norm_eps = 1e-6,
                              .rope_theta = 10000.0,
                              .initializer_range = 0.02,
                              .tie_word_embeddings = false,
                              .attention_bias = false,
                              .mlp_bias = false,
                              .torch_dtype = ACCEL_F32};
    if (get_int(root, file, "vocab_size", &c->vocab_size, false, false) ||
        get_int(root, file, "hidden_size", &c->hidden_size, false, false) ||
        get_int(root, file, "intermediate_size", &c->intermediate_size, false, false) ||
        get_int(root, file, "num_hidden_layers", &c->num_hidden_layers, true, false) ||
        get_int(root, file, "num_attention_heads", &c->num_attention_heads, false, false) ||
        get_int(root, file, "num_key_value_heads", &c->num_key_value_heads, false, true) ||
        get_int(root, file, "head_dim", &c->head_dim, false, true) ||
        get_int(root, file, "max_position_embeddings", &c->max_position_embeddings, false, false) ||
        get_real(root, file, "rms_norm_eps", &c->rms_norm_eps) ||
        get_real(root, file, "rope_theta", &c->rope_theta) ||
        get_real(root, file, "initializer_range", &c->initializer_range) ||
        get_bool(root, file, "tie_word_embeddings", &c->tie_word_embeddings) ||
        get_bool(root, file, "attention_bias", &c->attention_bias) ||
        get_bool(root, file, "mlp_bias", &c->mlp_bias) ||
        get_dtype(root, file, "torch_dtype", &c->torch_dtype) ||
        get_dtype(root, file, "dtype", &c->torch_dtype) ||
        check_rope(root, file, "rope_scaling", &c->rope_theta) ||
        check_rope(root, file, "rope_parameters", &c->rope_theta))
        return accel_last_status();
    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
                               file, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (c->head_dim == 0 && c->hidden_size % c->num_attention_heads != 0)
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: hidden_size (%lld) is not a multiple of num_attention_heads (%lld) and "
                               "head_dim is not given",
                               file, (long long)c->hidden_size, (long long)c->num_attention_heads);
    if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0) || !(c->initializer_range >= 0))
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: rms_norm_eps and rope_theta must be > 0, initializer_range >= 0", file);
    /* what the model build needs (layer cap, overflow-checked sizes), as a format error of the file */
    if (accel_llama_config_check(c, file)) {
        char why[512];
        snprintf(why, sizeof why, "%s", accel_last_error());
        return accel_set_error(ACCEL_ERR_FORMAT, "%s", why);
    }
    return ACCEL_OK;
}

accel_status accel_llama_config_load(const char *path_or_dir, accel_llama_config *out) {
    if (!path_or_dir || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_load: NULL argument");
    char *file = accel__is_dir(path_or_dir) ? accel__path_join(path_or_dir, "config.json")
                                            : accel_strdup(path_or_dir);
    if (!file) return accel_last_status();
    json_t *root = accel__json_load_file(file);
    accel_status st = root ? parse_config(root, file, out) : accel_last_status();
    json_decref(root);
    accel_free(file);
    return st;
}

/* Python's repr(float): the shortest digits that read back exactly. */
static void py_float(char *buf, size_t n, double v) {
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, n, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    snprintf(buf, n, "%.*e", p - 1, v); /* exponent of the rounded digits */
    int exp10 = atoi(strchr(buf, 'e') + 1);
    if (exp10 < -4 || exp10 >= 16) return; /* keep exponent form, as repr does */
    int decimals = p - 1 - exp10;
    snprintf(buf, n, "%.*f", decimals > 0 ? decimals : 0, v);
    if (!strchr(buf, '.')) strncat(buf, ".0", n - strlen(buf) - 1);
}

/* The reals load accepts (JSON has no NaN or infinity; py_float needs finite values). */
static accel_status check_reals(const accel_llama_config *c) {
    const struct { const char *key; double v; bool zero_ok; } R[] = {
        {"rms_norm_eps", c->rms_norm_eps, false},
        {"rope_theta", c->rope_theta, false},
        {"initializer_range", c->initializer_range, true},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++)
        if (!isfinite(R[i].v) || R[i].v < 0 || (R[i].v == 0 && !R[i].zero_ok))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_save: %s is %g: it must be a finite "
                                   "number %s 0", R[i].key, R[i].v, R[i].zero_ok ? ">=" : ">");
    return ACCEL_OK;
}

accel_status accel_llama_config_save(const char *dir_or_path, const accel_llama_config *c) {
    if (!dir_or_path || !c) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_save: NULL argument");
    if (check_reals(c)) return accel_last_status();
    size_t len = strlen(dir_or_path);
    bool is_json = len >= 5 && strcmp(dir_or_path + len - 5, ".json") == 0;
    if (!is_json && accel__mkdir(dir_or_path)) return accel_last_status();
    char *file = is_json ? accel_strdup(dir_or_path) : accel__path_join(dir_or_path, "config.json");
    if (!file) return accel_last_status();
    int64_t kv = c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads;
    int64_t hd = c->head_dim ? c->head_dim : c->hidden_size / (c->num_attention_heads ? c->num_attention_heads : 1);
    char eps[40], theta[40], init[40];
    py_float(eps, sizeof eps, c->rms_norm_eps);
    py_float(theta, sizeof theta, c->rope_theta);
    py_float(init, sizeof init, c->initializer_range);
    const char *dt = accel_dtype_name(c->torch_dtype);
    char *text = NULL;
    size_t tlen = 0;
    FILE *m = open_memstream(&text, &tlen);
    if (!m) {
        accel_free(file);
        return accel_set_error(ACCEL_ERR_OOM, "accel_llama_config_save: out of memory");
    }
    /* Keys sorted, as json.dumps(sort_keys=True, indent=2). */
    fprintf(m,
            "{\n"
            "  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
            "  \"attention_bias\": %s,\n"
            "  \"attention_dropout\": 0.0,\n"
            "  \"bos_token_id\": 1,\n"
            "  \"eos_token_id\": 2,\n"
            "  \"head_dim\": %lld,\n"
            "  \"hidden_act\": \"silu\",\n"
            "  \"hidden_size\": %lld,\n"
            "  \"initializer_range\": %s,\n"
            "  \"intermediate_size\": %lld,\n"
            "  \"max_position_embeddings\": %lld,\n"
            "  \"mlp_bias\": %s,\n"
            "  \"model_type\": \"llama\",\n"
            "  \"num_attention_heads\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n"
            "  \"pretraining_tp\": 1,\n"
            "  \"rms_norm_eps\": %s,\n"
            "  \"rope_scaling\": null,\n"
            "  \"rope_theta\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_cache\": true,\n"
            "  \"vocab_size\": %lld\n"
            "}\n",
            c->attention_bias ? "true" : "false", (long long)hd, (long long)c->hidden_size, init,
            (long long)c->intermediate_size, (long long)c->max_position_embeddings,
            c->mlp_bias ? "true" : "false", (long long)c->num_attention_heads,
            (long long)c->num_hidden_layers, (long long)kv, eps, theta,
            c->tie_word_embeddings ? "true" : "false", dt, TRANSFORMERS_VERSION, (long long)c->vocab_size);
    fclose(m);
    accel__afile f;
    accel_status st = accel__afile_open(&f, file);
    if (!st) {
        st = accel__afile_write(&f, text, tlen);
        if (!st) st = accel__afile_commit(&f);
        else accel__afile_abort(&f);
    }
    free(text);
    accel_free(file);
    return st;
}
