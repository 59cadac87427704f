/* src/io/hf_config.c — transformers' config.json of the decoder families of
 * the architecture table (src/nn/arch.h): llama, mistral, qwen2, qwen3,
 * gemma, gemma2, gemma3_text, granite, phi3, olmo2, gpt2, mixtral, qwen3_moe,
 * qwen2_moe, phi, gpt_neox, stablelm, starcoder2.
 *
 * Reads both the transformers 4.x layout (torch_dtype, rope_theta, rope_scaling)
 * and the 5.x one (dtype, rope_parameters); writes the 4.x layout, which both
 * read. A key that changes the model and accel does not implement is refused,
 * naming it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/io.h"
#include "core/core_internal.h"
#include "io/io_internal.h"
#include "nn/arch.h"

#define TRANSFORMERS_VERSION "4.46.0"

/* accel_rope_type's names in config.json */
static const char *const ROPE_NAMES[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};

static accel_status bad_type(const char *file, const char *key, const char *want) {
    return accel_set_error(ACCEL_ERR_FORMAT, "%s: '%s' must be %s", file, key, want);
}

/* A key transformers' strict config refuses as null (a bool or float field with no None). */
static accel_status not_null(json_t *root, const char *file, const char *key, const char *want) {
    json_t *v = json_object_get(root, key);
    return v && json_is_null(v) ? bad_type(file, key, want) : ACCEL_OK;
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


/* A list of head_dim / 2 numbers (longrope's factors). */
static accel_status get_factors(json_t *obj, const char *file, const char *key, float *out, int *n) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > ACCEL_ROPE_MAX_FACTORS)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: rope_scaling.%s must be a list of 1 to %d numbers", file, key,
                               ACCEL_ROPE_MAX_FACTORS);
    if (*n && (size_t)*n != json_array_size(v))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: rope_scaling.short_factor and long_factor differ in length",
                               file);
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        if (!json_is_number(x)) return bad_type(file, key, "a list of numbers");
        out[i] = (float)json_number_value(x);
    }
    return ACCEL_OK;
}

/* rope_scaling (4.x) / rope_parameters (5.x): the type and the fields it
 * uses; any other field is refused (a field transformers reads that accel
 * would not). */
static accel_status parse_rope(json_t *root, json_t *v, const char *file, const char *key, const accel__arch *a,
                               accel_llama_config *c) {
    if (!v || json_is_null(v)) return ACCEL_OK;
    if (!json_is_object(v)) return bad_type(file, key, "null or an object");
    json_t *t = json_object_get(v, "rope_type");
    if (!t) t = json_object_get(v, "type");
    if (t && !json_is_string(t)) return bad_type(file, key, "an object with a string rope_type");
    const char *name = t ? json_string_value(t) : "default";
    /* Phi3Config reads its earlier names "su" and "yarn" as longrope */
    if (a->longrope_only && (!strcmp(name, "su") || !strcmp(name, "yarn"))) name = "longrope";
    accel_rope_scaling *r = &c->rope_scaling;
    int type = -1;
    for (int i = 0; i < (int)(sizeof ROPE_NAMES / sizeof *ROPE_NAMES); i++)
        if (!strcmp(name, ROPE_NAMES[i])) type = i;
    if (type < 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "%s: %s of type \"%s\" is not supported (default, linear, dynamic, yarn, longrope, "
                               "llama3)", file, key, name);
    if (accel__arch_rope_check(a, (accel_rope_type)type, file, key)) return accel_last_status();
    r->type = (accel_rope_type)type;
    /* the keys each type reads (transformers' _validate_*_rope_parameters) */
    static const char *const KEYS[][9] = {
        {0},
        {"factor", 0},
        {"factor", 0},
        {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
         "mscale_all_dim", "truncate", 0},
        {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor", 0},
        {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor", 0},
    };
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        bool known = !strcmp(k, "rope_type") || !strcmp(k, "type") || !strcmp(k, "rope_theta") ||
                     !strcmp(k, "partial_rotary_factor");
        for (int i = 0; !known && KEYS[type][i]; i++) known = !strcmp(k, KEYS[type][i]);
        if (!known && !json_is_null(x))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s.%s is not implemented for rope type \"%s\"", file,
                                   key, k, name);
    }
    static const char *const REQUIRED[][3] = {
        {0}, {"factor", 0}, {"factor", 0}, {"factor", 0}, {"short_factor", "long_factor", 0},
        {"factor", "low_freq_factor", "high_freq_factor"},
    };
    for (int i = 0; i < 3 && REQUIRED[type][i]; i++) {
        json_t *req = json_object_get(v, REQUIRED[type][i]);
        if (!req || json_is_null(req))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s of type \"%s\" needs %s", file, key, name,
                                   REQUIRED[type][i]);
    }
    /* the top level's, read (and checked) before: not what an earlier rope_scaling set */
    json_t *top = json_object_get(root, "original_max_position_embeddings");
    int64_t top_orig = json_is_integer(top) ? json_integer_value(top) : 0;
    if (get_real(v, file, "factor", &r->factor) || get_real(v, file, "attention_factor", &r->attention_factor) ||
        get_real(v, file, "beta_fast", &r->beta_fast) || get_real(v, file, "beta_slow", &r->beta_slow) ||
        get_real(v, file, "mscale", &r->mscale) || get_real(v, file, "mscale_all_dim", &r->mscale_all_dim) ||
        get_real(v, file, "low_freq_factor", &r->low_freq_factor) ||
        get_real(v, file, "high_freq_factor", &r->high_freq_factor) ||
        get_int(v, file, "original_max_position_embeddings", &r->original_max_position_embeddings, false, true) ||
        get_real(v, file, "rope_theta", &c->rope_theta) ||
        get_real(v, file, "partial_rotary_factor", &c->partial_rotary_factor))
        return accel_last_status();
    /* a top-level original_max_position_embeddings wins (transformers' standardize_rope_params) */
    if (top_orig) r->original_max_position_embeddings = top_orig;
    json_t *tr = json_object_get(v, "truncate");
    if (tr && !json_is_null(tr)) {
        if (!json_is_boolean(tr)) return bad_type(file, "rope_scaling.truncate", "true or false");
        r->truncate_set = true;
        r->truncate = json_is_true(tr);
    }
    if (type == ACCEL_ROPE_LONGROPE) {
        int n = 0;
        if (get_factors(v, file, "short_factor", r->short_factor, &n) ||
            get_factors(v, file, "long_factor", r->long_factor, &n))
            return accel_last_status();
        r->n_factors = n;
    }
    return ACCEL_OK;
}

/* Gemma 3's RoPEs: rope_parameters keyed by layer type (transformers 5),
 * full_attention's the rope_theta and rope_scaling of the full_attention
 * layers, sliding_attention's (the plain RoPE only) rope_local_base_freq;
 * then a 4.x rope_scaling, which transformers merges into full_attention's. */
static accel_status parse_layer_ropes(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    /* null: transformers builds a sliding_attention RoPE of theta None, which no forward takes */
    if (not_null(root, file, "rope_local_base_freq", "a number > 0") ||
        get_real(root, file, "rope_local_base_freq", &c->rope_local_base_freq))
        return accel_last_status();
    if (!(c->rope_local_base_freq > 0)) return bad_type(file, "rope_local_base_freq", "a number > 0");
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return bad_type(file, "rope_parameters", "null or an object");
        const char *k;
        json_t *x;
        json_object_foreach(rp, k, x) {
            if (strcmp(k, "full_attention") != 0 && strcmp(k, "sliding_attention") != 0)
                return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: rope_parameters.%s: %s's rope_parameters are "
                                       "keyed by layer type (full_attention, sliding_attention)", file, k,
                                       a->model_type);
        }
        if (parse_rope(root, json_object_get(rp, "full_attention"), file, "rope_parameters.full_attention", a, c))
            return accel_last_status();
        /* the sliding layers' parameters read into a copy: only its theta is kept */
        accel_llama_config local = *c;
        local.rope_scaling.type = ACCEL_ROPE_DEFAULT;
        local.rope_theta = c->rope_local_base_freq;
        local.partial_rotary_factor = 0;
        if (parse_rope(root, json_object_get(rp, "sliding_attention"), file, "rope_parameters.sliding_attention", a,
                       &local))
            return accel_last_status();
        if (local.rope_scaling.type != ACCEL_ROPE_DEFAULT ||
            (local.partial_rotary_factor != 0 && local.partial_rotary_factor != 1))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: rope_parameters.sliding_attention of type \"%s\" or "
                                   "with a partial_rotary_factor is not implemented (the sliding_attention layers "
                                   "take the plain RoPE)", file, ROPE_NAMES[local.rope_scaling.type]);
        c->rope_local_base_freq = local.rope_theta;
    }
    /* transformers 5 merges a 4.x rope_scaling into full_attention's
     * {"rope_type": "default"}, where an old "type" key is never read (4.x
     * read it as the type): which RoPE the file means is not for accel to pick */
    json_t *rs = json_object_get(root, "rope_scaling");
    if (json_is_object(rs) && json_object_get(rs, "type") && !json_object_get(rs, "rope_type"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: rope_scaling.type: %s's rope_scaling needs its type under "
                               "rope_type (transformers 5 reads a \"type\" key there as the plain RoPE, 4.x as that "
                               "type)", file, a->model_type);
    return parse_rope(root, rs, file, "rope_scaling", a, c);
}

/* rope_scaling (4.x) and rope_parameters (5.x), or Gemma 3's per layer type. */
static accel_status parse_ropes(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    if (a->window == ACCEL__WINDOW_TYPES) return parse_layer_ropes(root, file, a, c);
    if (parse_rope(root, json_object_get(root, "rope_scaling"), file, "rope_scaling", a, c)) return accel_last_status();
    return parse_rope(root, json_object_get(root, "rope_parameters"), file, "rope_parameters", a, c);
}

/* The string key's value, or NULL when absent or null. */
static const char *string_or_null(json_t *root, const char *key, bool *bad) {
    json_t *v = json_object_get(root, key);
    *bad = v && !json_is_null(v) && !json_is_string(v);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The activation: silu, or Gemma's gelu_pytorch_tanh, which transformers 4
 * reads from hidden_activation (absent: tanh) and 5 from hidden_act (Gemma,
 * where "gelu" means tanh) or hidden_activation (Gemma2). */
static accel_status check_activation(json_t *root, const char *file, const accel__arch *a) {
    bool bad_act, bad_activation;
    const char *act = string_or_null(root, "hidden_act", &bad_act);
    const char *activation = string_or_null(root, "hidden_activation", &bad_activation);
    if (!a->gemma_blocks) { /* Phi's MLP: gelu_new; GPT-NeoX's: gelu (exact) */
        if (a->neox_blocks) return ACCEL_OK; /* parse_neox reads its four */
        /* Starcoder2's MLP: gelu_pytorch_tanh */
        const char *want = a->phi_blocks ? "gelu_new" : a->starcoder2_blocks ? "gelu_pytorch_tanh" : "silu";
        if (bad_act || (act && strcmp(act, want) != 0))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: hidden_act must be \"%s\" (the only activation of "
                                   "%s models accel implements)", file, want, a->model_type);
        return ACCEL_OK;
    }
    if (bad_act || (act && strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu") != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: hidden_act must be \"gelu_pytorch_tanh\" or \"gelu\" "
                               "(transformers' Gemma reads both as gelu_pytorch_tanh)", file);
    if (bad_activation || (activation && strcmp(activation, "gelu_pytorch_tanh") != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: hidden_activation must be \"gelu_pytorch_tanh\" (the only "
                               "activation of %s models accel implements)", file, a->model_type);
    return ACCEL_OK;
}

/* o (an object or NULL) has partial_rotary_factor 0. */
static bool zero_key(json_t *o) {
    json_t *v = json_object_get(o, "partial_rotary_factor");
    return json_is_number(v) && json_number_value(v) == 0;
}

/* Keys transformers reads for these families that accel takes only at one
 * value (partial_rotary_factor: where the family has no partial rotary). */
static accel_status check_fixed(json_t *root, const char *file, const accel__arch *a, const accel_llama_config *c) {
    if (check_activation(root, file, a)) return accel_last_status();
    json_t *v = json_object_get(root, "use_bidirectional_attention");
    if (v && !json_is_null(v) && !json_is_false(v))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: use_bidirectional_attention is not implemented (accel's "
                               "decoders are causal)", file);
    static const char *const DROPOUTS[] = {"attention_dropout", "resid_pdrop", "embd_pdrop"};
    for (size_t i = 0; !a->dropouts && i < sizeof DROPOUTS / sizeof *DROPOUTS; i++) {
        v = json_object_get(root, DROPOUTS[i]);
        if (v && !json_is_null(v) && (!json_is_number(v) || json_number_value(v) != 0.0))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s other than 0.0 is not implemented (it would change "
                                   "training)", file, DROPOUTS[i]);
    }
    double prf = c->partial_rotary_factor;
    /* transformers rotates int(head_dim * 0) = 0 dims; the C struct's 0 is "unset" (1.0) */
    if (prf == 0 && (zero_key(root) || zero_key(json_object_get(root, "rope_scaling")) ||
                     zero_key(json_object_get(root, "rope_parameters"))))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: partial_rotary_factor 0 must be in (0, 1] (transformers "
                               "would rotate no dims, which accel does not implement)", file);
    if (prf != 0 && prf != 1.0 && !a->partial_rotary)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: partial_rotary_factor other than 1.0 is not implemented "
                               "for %s models", file, a->model_type);
    return ACCEL_OK;
}

/* A bias key: read when the family has that bias, else refused when true. */
static accel_status get_bias(json_t *root, const char *file, const char *key, const accel__arch *a, bool has,
                             bool *out) {
    if (has) return get_bool(root, file, key, out);
    bool on = false;
    if (get_bool(root, file, key, &on)) return accel_last_status();
    if (on && a->qkv_only_bias && !strcmp(key, "attention_bias")) /* Qwen2-MoE: its own key places them */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is true, but %s models take their q/k/v biases from "
                               "qkv_bias (o_proj has none)", file, key, a->model_type);
    if (on)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is true, but %s models have no such bias", file, key,
                               a->model_type);
    return ACCEL_OK;
}

/* layer_types of Gemma2 and Qwen2-MoE: absent, null, or transformers'
 * default (Gemma2: sliding on layers 0, 2, 4, ...; Qwen2-MoE: on the even
 * layers below max_window_layers with use_sliding_window), the one pattern
 * accel builds. */
static accel_status check_default_layer_types(json_t *root, const char *file, const accel__arch *a,
                                              const accel_llama_config *c) {
    json_t *lt = json_object_get(root, "layer_types");
    if (!lt || json_is_null(lt)) return ACCEL_OK;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->num_hidden_layers)
        return bad_type(file, "layer_types", "a list of num_hidden_layers strings");
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        json_t *x = json_array_get(lt, (size_t)i);
        bool sliding = a->window == ACCEL__WINDOW_EVEN ? i % 2 == 0 : accel__arch_layer_windowed(a, c, i);
        const char *want = sliding ? "sliding_attention" : "full_attention";
        if (!json_is_string(x) || strcmp(json_string_value(x), want) != 0)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: layer_types[%lld] is not \"%s\": only transformers' "
                                   "default %s is implemented", file, (long long)i, want,
                                   a->window == ACCEL__WINDOW_EVEN
                                       ? "alternation (sliding_attention on the even layers)"
                                       : "(sliding_attention on the even layers below max_window_layers with "
                                         "use_sliding_window)");
    }
    return ACCEL_OK;
}

/* Whether layer_types[i] (lt a list) is "sliding_attention"; an error for
 * anything but that and "full_attention". */
static accel_status layer_type_at(json_t *lt, int64_t i, const char *file, bool *sliding) {
    json_t *x = json_array_get(lt, (size_t)i);
    const char *s = json_is_string(x) ? json_string_value(x) : "";
    *sliding = !strcmp(s, "sliding_attention");
    if (!*sliding && strcmp(s, "full_attention") != 0)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: layer_types[%lld] must be \"full_attention\" or "
                               "\"sliding_attention\"", file, (long long)i);
    return ACCEL_OK;
}

/* Gemma 3's layer types as Gemma3TextConfig resolves them: layer_types, else
 * sliding_window_pattern (layer i full when (i + 1) % pattern == 0; 6 when
 * absent). */
static accel_status parse_layer_types(json_t *root, const char *file, accel_llama_config *c) {
    if (get_int(root, file, "sliding_window_pattern", &c->sliding_window_pattern, false, false))
        return accel_last_status();
    json_t *lt = json_object_get(root, "layer_types");
    c->n_layer_types = 0;
    if (!lt || json_is_null(lt)) return ACCEL_OK;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->num_hidden_layers)
        return bad_type(file, "layer_types", "a list of num_hidden_layers strings");
    if (c->num_hidden_layers > ACCEL_MAX_LAYER_TYPES)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: layer_types of more than %d layers is not implemented "
                               "(sliding_window_pattern is)", file, ACCEL_MAX_LAYER_TYPES);
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        bool sliding;
        if (layer_type_at(lt, i, file, &sliding)) return accel_last_status();
        c->layer_full[i] = !sliding;
    }
    c->n_layer_types = (int)c->num_hidden_layers;
    return ACCEL_OK;
}

/* sliding_window, use_sliding_window, max_window_layers and layer_types as
 * the family's transformers config reads them. */
static accel_status parse_window(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    json_t *sw = json_object_get(root, "sliding_window");
    if (a->window == ACCEL__WINDOW_NONE) {
        if (sw && !json_is_null(sw))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: sliding_window is set, but %s models have none "
                                   "(a Mistral checkpoint needs model_type \"mistral\")", file, a->model_type);
        return ACCEL_OK;
    }
    /* Qwen2MoeConfig writes 0 where use_sliding_window is off (the others null);
     * Gemma 3 refuses null: its sliding layers need their window (transformers
     * fails on it) */
    if (sw && json_is_null(sw) && a->window != ACCEL__WINDOW_TYPES) c->sliding_window = 0;
    else if (get_int(root, file, "sliding_window", &c->sliding_window, a->window == ACCEL__WINDOW_QWEN2_MOE, false))
        return accel_last_status();
    if (a->window == ACCEL__WINDOW_ALL) return ACCEL_OK; /* every layer (Mistral ignores layer_types) */
    if (a->window == ACCEL__WINDOW_EVEN) return check_default_layer_types(root, file, a, c);
    if (a->window == ACCEL__WINDOW_TYPES) return parse_layer_types(root, file, c);
    bool use = false;
    if (get_bool(root, file, "use_sliding_window", &use)) return accel_last_status();
    /* Qwen2MoeConfig then makes the even layers sliding, and its forward fails on the missing window */
    if (use && a->window == ACCEL__WINDOW_QWEN2_MOE && sw && json_is_null(sw))
        return bad_type(file, "sliding_window", "a positive integer with use_sliding_window");
    if (!use) c->sliding_window = 0;
    if (a->window == ACCEL__WINDOW_USE_ALL) return ACCEL_OK; /* max_window_layers and layer_types unread */
    if (get_int(root, file, "max_window_layers", &c->max_window_layers, true, false)) return accel_last_status();
    if (a->window == ACCEL__WINDOW_QWEN2_MOE) return check_default_layer_types(root, file, a, c);
    json_t *lt = json_object_get(root, "layer_types");
    if (!lt || json_is_null(lt)) return ACCEL_OK;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->num_hidden_layers)
        return bad_type(file, "layer_types", "a list of num_hidden_layers strings");
    /* explicit layer types replace max_window_layers: full attention first, then sliding */
    int64_t first_sliding = c->num_hidden_layers;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        bool sliding;
        if (layer_type_at(lt, i, file, &sliding)) return accel_last_status();
        if (sliding && first_sliding == c->num_hidden_layers) first_sliding = i;
        if (!sliding && first_sliding < i && c->sliding_window)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: layer_types: a full_attention layer after a "
                                   "sliding_attention one is not implemented", file);
    }
    c->max_window_layers = first_sliding;
    return ACCEL_OK;
}

/* A boolean key accel implements at one value only for row a's models: any other is refused, naming it. */
static accel_status want_bool(json_t *root, const char *file, const accel__arch *a, const char *key, bool want) {
    bool v = want;
    if (get_bool(root, file, key, &v)) return accel_last_status();
    if (v != want)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s %s is not implemented for %s models", file, key,
                               v ? "true" : "false", a->model_type);
    return ACCEL_OK;
}

/* The mixture-of-experts keys of Mixtral's, Qwen3-MoE's and Qwen2-MoE's
 * configs (other families' configs are not read for them, as transformers'
 * are not). */
static accel_status parse_moe(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    if (!a->moe) return ACCEL_OK;
    bool qwen = a->moe == ACCEL__MOE_QWEN;
    if (not_null(root, file, "output_router_logits", "true or false") ||
        not_null(root, file, "router_aux_loss_coef", "a number") ||
        not_null(root, file, qwen ? "norm_topk_prob" : "router_jitter_noise", qwen ? "true or false" : "a number"))
        return accel_last_status();
    /* either name, as transformers 5's attribute maps read them: num_local_experts wins for Qwen3-MoE,
     * num_experts for Mixtral; Qwen2MoeConfig has no map and reads num_experts only */
    const char *first = qwen ? "num_experts" : "num_local_experts", *wins = qwen ? "num_local_experts" : "num_experts";
    if (get_int(root, file, first, &c->num_local_experts, qwen, false) ||
        (a->experts_alias && get_int(root, file, wins, &c->num_local_experts, qwen, false)) ||
        get_int(root, file, "num_experts_per_tok", &c->num_experts_per_tok, false, false) ||
        get_bool(root, file, "output_router_logits", &c->output_router_logits) ||
        get_real(root, file, "router_aux_loss_coef", &c->router_aux_loss_coef))
        return accel_last_status();
    if (!qwen) return get_real(root, file, "router_jitter_noise", &c->router_jitter_noise);
    if (get_int(root, file, "moe_intermediate_size", &c->moe_intermediate_size, false, false) ||
        get_int(root, file, "decoder_sparse_step", &c->decoder_sparse_step, false, false) ||
        get_bool(root, file, "norm_topk_prob", &c->norm_topk_prob))
        return accel_last_status();
    /* Qwen2MoeConfig's qkv_bias (q/k/v's biases, held in attention_bias; null fails its validation) */
    if (a->shared_expert && (get_int(root, file, "shared_expert_intermediate_size",
                                     &c->shared_expert_intermediate_size, false, false) ||
                             not_null(root, file, "qkv_bias", "true or false") ||
                             get_bool(root, file, "qkv_bias", &c->attention_bias)))
        return accel_last_status();
    /* null: [] (transformers'); the indices' range is accel_llama_config_check's */
    json_t *v = json_object_get(root, "mlp_only_layers");
    if (v && !json_is_null(v) && !json_is_array(v)) return bad_type(file, "mlp_only_layers", "a list of layer indices");
    size_t n = json_array_size(v);
    if (n > ACCEL_MAX_MLP_ONLY_LAYERS)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: mlp_only_layers has %zu entries: at most %d", file, n,
                               ACCEL_MAX_MLP_ONLY_LAYERS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: mlp_only_layers[%zu] must be an integer (a layer index)",
                                   file, i);
        c->mlp_only_layers[i] = json_integer_value(x);
    }
    c->n_mlp_only_layers = (int)n;
    return ACCEL_OK;
}

/* Gemma2's soft-capping and query scale, Granite's multipliers: read when
 * the family has them (a soft-capping null: none), else refused when set. */
static accel_status parse_scalings(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    const struct { const char *key; double *v; bool has, null_is_zero; } S[] = {
        {"attn_logit_softcapping", &c->attn_logit_softcapping, a->score_softcap, true},
        {"final_logit_softcapping", &c->final_logit_softcapping, a->softcap, true},
        {"query_pre_attn_scalar", &c->query_pre_attn_scalar, a->softcap, false},
        {"embedding_multiplier", &c->embedding_multiplier, a->multipliers, false},
        {"attention_multiplier", &c->attention_multiplier, a->multipliers, false},
        {"residual_multiplier", &c->residual_multiplier, a->multipliers, false},
        {"logits_scaling", &c->logits_scaling, a->multipliers, false},
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        json_t *v = json_object_get(root, S[i].key);
        if (!v || json_is_null(v)) {
            if (v && S[i].has && S[i].null_is_zero) *S[i].v = 0;
            continue;
        }
        if (!S[i].has)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s is set, but %s models have none", file, S[i].key,
                                   a->model_type);
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
            return bad_type(file, S[i].key, S[i].null_is_zero ? "null or a positive number" : "a positive number");
        *S[i].v = json_number_value(v);
    }
    return ACCEL_OK;
}

/* A probability key (GPT-2's and Phi's dropouts): a number in [0, 1]. */
static accel_status get_prob(json_t *root, const char *file, const char *key, double *out) {
    if (get_real(root, file, key, out)) return accel_last_status();
    if (!(*out >= 0 && *out <= 1)) return bad_type(file, key, "a number in [0, 1]");
    return ACCEL_OK;
}

/* PhiConfig's own keys: layer_norm_eps (its LayerNorms', not rms_norm_eps),
 * the dropouts, qk_layernorm. */
static accel_status parse_phi(json_t *root, const char *file, accel_llama_config *c) {
    if (get_real(root, file, "layer_norm_eps", &c->rms_norm_eps) ||
        get_prob(root, file, "attention_dropout", &c->attn_pdrop) ||
        get_prob(root, file, "resid_pdrop", &c->resid_pdrop) || get_prob(root, file, "embd_pdrop", &c->embd_pdrop) ||
        not_null(root, file, "qk_layernorm", "true or false") || get_bool(root, file, "qk_layernorm", &c->qk_layernorm))
        return accel_last_status();
    if (!(c->rms_norm_eps > 0)) return bad_type(file, "layer_norm_eps", "a number > 0");
    return ACCEL_OK;
}

/* GPTNeoXConfig's own keys: layer_norm_eps, attention_dropout,
 * hidden_dropout (the embeddings' and each branch's: embd_pdrop and
 * resid_pdrop), use_parallel_residual (null is false to transformers:
 * refused), rotary_emb_base and rotary_pct (the RoPE's base and partial
 * factor; rope_scaling / rope_parameters' own rope_theta and
 * partial_rotary_factor, read after, win; top-level rope_theta and
 * partial_rotary_factor are not GPTNeoXConfig's and stay unread, as there). */
/* GPT-NeoX's hidden_act names, by accel_llama_config.neox_hidden_act */
static const char *const NEOX_ACTS[4] = {"gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh"};

static accel_status parse_neox(json_t *root, const char *file, accel_llama_config *c) {
    double hidden = 0;
    bool parallel = true;
    if (get_real(root, file, "layer_norm_eps", &c->rms_norm_eps) ||
        get_prob(root, file, "attention_dropout", &c->attn_pdrop) || get_prob(root, file, "hidden_dropout", &hidden) ||
        not_null(root, file, "use_parallel_residual", "true or false") ||
        get_bool(root, file, "use_parallel_residual", &parallel) ||
        get_real(root, file, "rotary_emb_base", &c->rope_theta) ||
        get_real(root, file, "rotary_pct", &c->partial_rotary_factor))
        return accel_last_status();
    if (!(c->rms_norm_eps > 0)) return bad_type(file, "layer_norm_eps", "a number > 0");
    bool bad_act;
    const char *act = string_or_null(root, "hidden_act", &bad_act);
    c->neox_hidden_act = -1;
    for (int i = 0; i < 4 && act; i++)
        if (!strcmp(act, NEOX_ACTS[i])) c->neox_hidden_act = i;
    if (!act && !bad_act) c->neox_hidden_act = 0; /* absent or null: GPTNeoXConfig's gelu */
    if (c->neox_hidden_act < 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: hidden_act must be \"gelu\" or the tanh GELU \"gelu_fast\", "
                               "\"gelu_new\" or \"gelu_pytorch_tanh\" (the activations of gpt_neox models accel "
                               "implements)", file);
    /* the struct's 0 is "unset" (1.0): transformers would rotate no dims */
    if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
        return bad_type(file, "rotary_pct", "a number in (0, 1]");
    c->resid_pdrop = c->embd_pdrop = hidden;
    c->sequential_residual = !parallel;
    return ACCEL_OK;
}

/* StableLmConfig's own keys: layer_norm_eps, use_qkv_bias (q/k/v's
 * biases, held in attention_bias), use_parallel_residual (null is false to
 * transformers: refused), hidden_dropout (the MLP's output: resid_pdrop),
 * attention_dropout, qk_layernorm (a LayerNorm of its own per head of q and
 * k). rope_theta and partial_rotary_factor are read as the
 * other families'; an attention_bias key is not StableLmConfig's and stays
 * unread, as there. */
static accel_status parse_stablelm(json_t *root, const char *file, accel_llama_config *c) {
    bool parallel = !c->sequential_residual; /* the row's default: sequential */
    if (get_real(root, file, "layer_norm_eps", &c->rms_norm_eps) ||
        get_bool(root, file, "use_qkv_bias", &c->attention_bias) ||
        not_null(root, file, "use_parallel_residual", "true or false") ||
        get_bool(root, file, "use_parallel_residual", &parallel) ||
        get_prob(root, file, "hidden_dropout", &c->resid_pdrop) ||
        get_prob(root, file, "attention_dropout", &c->attn_pdrop) || get_bool(root, file, "qk_layernorm", &c->qk_layernorm))
        return accel_last_status();
    if (!(c->rms_norm_eps > 0)) return bad_type(file, "layer_norm_eps", "a number > 0");
    c->sequential_residual = !parallel;
    return ACCEL_OK;
}

/* Starcoder2Config's own keys: norm_epsilon, use_bias (the attention's and
 * the MLP's biases: attention_bias and mlp_bias; null, no biases to
 * transformers, refused), attention_dropout,
 * residual_dropout (each branch's output: resid_pdrop), embedding_dropout
 * (embd_pdrop). attention_bias / mlp_bias keys are not Starcoder2Config's
 * and stay unread, as there. */
static accel_status parse_starcoder2(json_t *root, const char *file, accel_llama_config *c) {
    if (get_real(root, file, "norm_epsilon", &c->rms_norm_eps) ||
        not_null(root, file, "use_bias", "true or false") || /* null: no biases to transformers */
        get_bool(root, file, "use_bias", &c->attention_bias) ||
        get_prob(root, file, "attention_dropout", &c->attn_pdrop) ||
        get_prob(root, file, "residual_dropout", &c->resid_pdrop) ||
        get_prob(root, file, "embedding_dropout", &c->embd_pdrop))
        return accel_last_status();
    if (!(c->rms_norm_eps > 0)) return bad_type(file, "norm_epsilon", "a number > 0");
    c->mlp_bias = c->attention_bias;
    return ACCEL_OK;
}

/* GPT2Config's keys (n_embd, n_layer, n_head, n_inner, n_positions,
 * layer_norm_epsilon, activation_function, ...) into the shared fields. */
static accel_status parse_gpt2(json_t *root, const char *file, const accel__arch *a, accel_llama_config *c) {
    int64_t inner = 0;
    bool scale = true;
    if (get_int(root, file, "vocab_size", &c->vocab_size, false, false) ||
        get_int(root, file, "n_embd", &c->hidden_size, false, false) ||
        get_int(root, file, "n_layer", &c->num_hidden_layers, true, false) ||
        get_int(root, file, "n_head", &c->num_attention_heads, false, false) ||
        get_int(root, file, "n_inner", &inner, false, true) ||
        get_int(root, file, "n_positions", &c->max_position_embeddings, false, false) ||
        get_real(root, file, "layer_norm_epsilon", &c->rms_norm_eps) ||
        get_real(root, file, "initializer_range", &c->initializer_range) ||
        get_bool(root, file, "tie_word_embeddings", &c->tie_word_embeddings) ||
        get_dtype(root, file, "torch_dtype", &c->torch_dtype) || get_dtype(root, file, "dtype", &c->torch_dtype) ||
        get_prob(root, file, "attn_pdrop", &c->attn_pdrop) || get_prob(root, file, "resid_pdrop", &c->resid_pdrop) ||
        get_prob(root, file, "embd_pdrop", &c->embd_pdrop) || get_bool(root, file, "scale_attn_weights", &scale) ||
        get_bool(root, file, "scale_attn_by_inverse_layer_idx", &c->scale_attn_by_inverse_layer_idx) ||
        get_bool(root, file, "reorder_and_upcast_attn", &c->reorder_and_upcast_attn) ||
        want_bool(root, file, a, "add_cross_attention", false))
        return accel_last_status();
    json_t *v = json_object_get(root, "activation_function");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "gelu_new") != 0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: activation_function must be \"gelu_new\" (the only GPT-2 "
                               "activation accel implements)", file);
    if (!(c->rms_norm_eps > 0)) return bad_type(file, "layer_norm_epsilon", "a number > 0");
    c->intermediate_size = inner ? inner : 4 * c->hidden_size; /* n_inner null: 4 n_embd */
    c->unscaled_attention = !scale;
    return ACCEL_OK;
}

/* bos_token_id, pad_token_id: a non-negative integer or null; eos_token_id: that, or a
 * list of 1 to ACCEL_MAX_EOS_TOKEN_IDS of them. Absent keeps the family's. */
static accel_status parse_token_ids(json_t *root, const char *file, accel_llama_config *c) {
    if (accel__config_get_token_id(root, file, "bos_token_id", &c->bos_token_id) ||
        accel__config_get_token_id(root, file, "pad_token_id", &c->pad_token_id))
        return accel_last_status();
    json_t *v = json_object_get(root, "eos_token_id");
    if (!v) return ACCEL_OK;
    json_t *one = json_is_array(v) ? NULL : v;
    size_t n = one ? !json_is_null(v) : json_array_size(v);
    bool ok = n <= ACCEL_MAX_EOS_TOKEN_IDS && (one || n > 0);
    for (size_t i = 0; i < n && ok; i++) {
        json_t *e = one ? one : json_array_get(v, i);
        ok = json_is_integer(e) && json_integer_value(e) >= 0;
        if (ok) c->eos_token_ids[i] = json_integer_value(e);
    }
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "a non-negative integer, null or a list of 1 to %d of them",
                 ACCEL_MAX_EOS_TOKEN_IDS);
        return bad_type(file, "eos_token_id", what);
    }
    c->n_eos_token_ids = (int)n;
    c->eos_is_list = !one;
    return ACCEL_OK;
}

/* The bytes of the UTF-8 text s to show within max: all of it, or a cut
 * before a character that would cross max (never inside one). */
static int shown_bytes(const char *s, int max) {
    int n = 0;
    while (s[n] && n < max) n++;
    if (s[n])
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* s[n] a continuation byte: back to its lead */
    return n;
}

static accel_status parse_config(json_t *root, const char *file, accel_llama_config *c) {
    if (!json_is_object(root)) return accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a JSON object", file);
    json_t *mt = json_object_get(root, "model_type");
    const accel__arch *a = accel__arch_find(json_is_string(mt) ? json_string_value(mt) : NULL);
    if (json_is_string(mt) && !strcmp(json_string_value(mt), "gemma3"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: model_type \"gemma3\" (Gemma3ForConditionalGeneration, "
                               "images and text, its language model under text_config) is not implemented: accel "
                               "builds the text-only \"gemma3_text\" (Gemma3ForCausalLM)", file);
    if (mt && (!json_is_string(mt) || !a)) {
        const char *name = json_is_string(mt) ? json_string_value(mt) : "not a string";
        int shown = shown_bytes(name, 64); /* whole, a message's 1024 bytes cut the families off */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: model_type is %s%.*s%s%s, accel builds %s", file,
                               json_is_string(mt) ? "\"" : "", shown, name, name[shown] ? "..." : "",
                               json_is_string(mt) ? "\"" : "", accel__arch_names());
    }
    *c = a->defaults; /* transformers' defaults of the family */
    if (parse_token_ids(root, file, c)) return accel_last_status();
    if (a->blocks == ACCEL__BLOCKS_GPT2) {
        if (parse_gpt2(root, file, a, c)) return accel_last_status();
    } else if (get_int(root, file, "vocab_size", &c->vocab_size, false, false) ||
        get_int(root, file, "hidden_size", &c->hidden_size, false, false) ||
        get_int(root, file, "intermediate_size", &c->intermediate_size, false, false) ||
        get_int(root, file, "num_hidden_layers", &c->num_hidden_layers, true, false) ||
        get_int(root, file, "num_attention_heads", &c->num_attention_heads, false, false) ||
        get_int(root, file, "num_key_value_heads", &c->num_key_value_heads, false, true) ||
        get_int(root, file, "head_dim", &c->head_dim, false, true) ||
        get_int(root, file, "max_position_embeddings", &c->max_position_embeddings, false, false) ||
        get_int(root, file, "original_max_position_embeddings",
                &c->rope_scaling.original_max_position_embeddings, false, true) ||
        (a->phi_blocks          ? parse_phi(root, file, c)
         : a->neox_blocks       ? parse_neox(root, file, c)
         : a->stablelm_blocks   ? parse_stablelm(root, file, c)
         : a->starcoder2_blocks ? parse_starcoder2(root, file, c)
                                : get_real(root, file, "rms_norm_eps", &c->rms_norm_eps)) ||
        (!a->neox_blocks && get_real(root, file, "rope_theta", &c->rope_theta)) ||
        get_real(root, file, "initializer_range", &c->initializer_range) ||
        get_bool(root, file, "tie_word_embeddings", &c->tie_word_embeddings) ||
        (!a->neox_blocks && get_real(root, file, "partial_rotary_factor", &c->partial_rotary_factor)) ||
        /* StableLM's and Starcoder2's biases come from their own keys (above) */
        (!a->stablelm_blocks && !a->starcoder2_blocks &&
         /* Qwen2-MoE's is qkv_bias (parse_moe): an attention_bias key is refused when true */
         (get_bias(root, file, "attention_bias", a, a->attention_bias && !a->qkv_only_bias, &c->attention_bias) ||
          get_bias(root, file, "mlp_bias", a, a->mlp_bias, &c->mlp_bias))) ||
        get_dtype(root, file, "torch_dtype", &c->torch_dtype) ||
        get_dtype(root, file, "dtype", &c->torch_dtype) ||
        parse_ropes(root, file, a, c) ||
        check_fixed(root, file, a, c) ||
        parse_scalings(root, file, a, c) ||
        parse_window(root, file, a, c) ||
        parse_moe(root, file, a, c))
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

accel_status accel_llama_config_for(const char *model_type, accel_llama_config *out) {
    static const char *FN = "accel_llama_config_for";
    if (!model_type || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL argument", FN);
    if (!accel__is_utf8(model_type))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: model_type is not UTF-8 text", FN);
    /* valid text: a NULL from jansson is its out of memory */
    json_t *mt = json_string(model_type), *root = mt ? json_object() : NULL;
    accel_llama_config c = {0};
    accel_status st = !root || json_object_set_new(root, "model_type", mt)
                          ? accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", FN)
                          : parse_config(root, FN, &c);
    if (!root) json_decref(mt); /* else root owns it, set or not */
    json_decref(root);
    if (st == ACCEL_OK) *out = c;
    return st;
}

accel_status accel_generation_config_load(const char *dir, accel_llama_config *c) {
    if (!dir || !c) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generation_config_load: NULL argument");
    char *file = accel__path_join(dir, "generation_config.json");
    if (!file) return accel_last_status();
    accel_status st = ACCEL_OK;
    if (access(file, F_OK) == 0) { /* none: config.json's ids stand, as in transformers */
        json_t *root = accel__json_load_file(file);
        st = !root                 ? accel_last_status()
             : !json_is_object(root) ? accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a JSON object", file)
                                     : parse_token_ids(root, file, c);
        json_decref(root);
    }
    accel_free(file);
    return st;
}

/* The reals load accepts (JSON has no NaN or infinity). */
static accel_status check_reals(const accel_llama_config *c) {
    const struct { const char *key; double v; bool zero_ok; } R[] = {
        {"rms_norm_eps", c->rms_norm_eps, false},
        {"rope_theta", c->rope_theta, false},
        {"rope_local_base_freq", c->rope_local_base_freq, true},
        {"initializer_range", c->initializer_range, true},
        {"attn_logit_softcapping", c->attn_logit_softcapping, true},
        {"final_logit_softcapping", c->final_logit_softcapping, true},
        {"query_pre_attn_scalar", c->query_pre_attn_scalar, true},
        {"embedding_multiplier", c->embedding_multiplier, true},
        {"attention_multiplier", c->attention_multiplier, true},
        {"residual_multiplier", c->residual_multiplier, true},
        {"logits_scaling", c->logits_scaling, true},
        {"partial_rotary_factor", c->partial_rotary_factor, true},
        {"attn_pdrop", c->attn_pdrop, true},
        {"resid_pdrop", c->resid_pdrop, true},
        {"embd_pdrop", c->embd_pdrop, true},
        {"router_aux_loss_coef", c->router_aux_loss_coef, true},
        {"router_jitter_noise", c->router_jitter_noise, true},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++)
        if (!isfinite(R[i].v) || R[i].v < 0 || (R[i].v == 0 && !R[i].zero_ok))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_save: %s is %g: it must be a finite "
                                   "number %s 0", R[i].key, R[i].v, R[i].zero_ok ? ">=" : ">");
    return ACCEL_OK;
}

/* v, or d when v is 0 (unset). */
static double nonzero(double v, double d) { return v != 0 ? v : d; }

/* "key": v as Python writes a float; 0 as null (a soft-capping that is off). */
static void write_real(FILE *m, const char *key, double v) {
    char b[40] = "null";
    if (v != 0) accel__float_repr(b, sizeof b, v);
    fprintf(m, "  \"%s\": %s,\n", key, b);
}

/* "key": v as Python writes a float, 0 as 0.0. */
static void write_float(FILE *m, const char *key, double v) {
    char b[40];
    accel__float_repr(b, sizeof b, v);
    fprintf(m, "  \"%s\": %s,\n", key, b);
}

static void write_factors(FILE *m, const float *f, int n) {
    char b[40];
    fputs("[\n", m);
    for (int i = 0; i < n; i++) {
        accel__float_repr(b, sizeof b, (double)f[i]);
        fprintf(m, "      %s%s\n", b, i + 1 < n ? "," : "");
    }
    fputs("    ]", m);
}

/* rope_scaling as transformers 4.x writes it: null for the default rope, else
 * its type and the fields set, keys sorted, at indent 4. */
static void write_rope(FILE *m, const accel_rope_scaling *r) {
    if (r->type == ACCEL_ROPE_DEFAULT || (unsigned)r->type > ACCEL_ROPE_LLAMA3) {
        fputs("null", m);
        return;
    }
    bool longrope = r->type == ACCEL_ROPE_LONGROPE;
    const struct { const char *key; double v; bool on; } R[] = {
        {"attention_factor", r->attention_factor, r->attention_factor != 0},
        {"beta_fast", r->beta_fast, r->beta_fast != 0},
        {"beta_slow", r->beta_slow, r->beta_slow != 0},
        {"factor", r->factor, r->factor != 0},
        {"high_freq_factor", r->high_freq_factor, r->high_freq_factor != 0},
        {"long_factor", 0, longrope},
        {"low_freq_factor", r->low_freq_factor, r->low_freq_factor != 0},
        {"mscale", r->mscale, r->mscale != 0},
        {"mscale_all_dim", r->mscale_all_dim, r->mscale_all_dim != 0},
        {"original_max_position_embeddings", (double)r->original_max_position_embeddings,
         r->original_max_position_embeddings != 0},
        {"rope_type", 0, true},
        {"short_factor", 0, longrope},
        {"truncate", 0, r->truncate_set},
    };
    const char *sep = "{\n";
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        if (!R[i].on) continue;
        fprintf(m, "%s    \"%s\": ", sep, R[i].key);
        sep = ",\n";
        char b[40];
        if (!strcmp(R[i].key, "long_factor")) write_factors(m, r->long_factor, r->n_factors);
        else if (!strcmp(R[i].key, "short_factor")) write_factors(m, r->short_factor, r->n_factors);
        else if (!strcmp(R[i].key, "rope_type")) fprintf(m, "\"%s\"", ROPE_NAMES[r->type]);
        else if (!strcmp(R[i].key, "truncate")) fputs(r->truncate ? "true" : "false", m);
        else if (!strcmp(R[i].key, "original_max_position_embeddings")) fprintf(m, "%lld", (long long)R[i].v);
        else {
            accel__float_repr(b, sizeof b, R[i].v);
            fputs(b, m);
        }
    }
    fputs("\n  }", m);
}

/* Gemma 3's layer types, resolved (from the list or the pattern), as a
 * layer_types list: what transformers 5 writes and reads first. */
static void write_layer_types(FILE *m, const accel__arch *a, const accel_llama_config *c) {
    fputs("  \"layer_types\": [", m);
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        fprintf(m, "%s\n    \"%s\"", i ? "," : "",
                accel__arch_layer_local(a, c, i) ? "sliding_attention" : "full_attention");
    fputs(c->num_hidden_layers ? "\n  ],\n" : "],\n", m);
}

/* c's bos_token_id or eos_token_id key (the family's defaults when c has
 * none set), as json.dumps(indent=2) writes it. */
static void write_token_id(FILE *m, const accel__arch *a, const accel_llama_config *c, bool eos) {
    const accel_llama_config *t = c->token_ids_set ? c : &a->defaults;
    fprintf(m, "  \"%s_token_id\": ", eos ? "eos" : "bos");
    int n = eos ? t->n_eos_token_ids : t->bos_token_id >= 0;
    const int64_t *ids = eos ? t->eos_token_ids : &t->bos_token_id;
    if (n <= 0 || n > ACCEL_MAX_EOS_TOKEN_IDS) fprintf(m, "null");
    else if (!eos || !t->eos_is_list) fprintf(m, "%lld", (long long)ids[0]);
    else
        for (int i = 0; i < n; i++)
            fprintf(m, "%s%lld%s", i ? ",\n    " : "[\n    ", (long long)ids[i], i + 1 < n ? "" : "\n  ]");
    fprintf(m, ",\n");
}

/* c's pad_token_id (null for the family defaults: arch.c) */
static void write_pad_token_id(FILE *m, const accel__arch *a, const accel_llama_config *c) {
    const accel_llama_config *t = c->token_ids_set ? c : &a->defaults;
    if (t->pad_token_id >= 0) fprintf(m, "  \"pad_token_id\": %lld,\n", (long long)t->pad_token_id);
    else fprintf(m, "  \"pad_token_id\": null,\n");
}

/* GPT2Config's config.json (keys sorted as transformers writes them); n_inner
 * always explicit. */
static void write_gpt2(FILE *m, const accel__arch *a, const accel_llama_config *c, const char *init, const char *eps) {
    char attn[40], resid[40], embd[40];
    accel__float_repr(attn, sizeof attn, c->attn_pdrop);
    accel__float_repr(resid, sizeof resid, c->resid_pdrop);
    accel__float_repr(embd, sizeof embd, c->embd_pdrop);
    fprintf(m,
            "{\n  \"activation_function\": \"gelu_new\",\n"
            "  \"add_cross_attention\": false,\n"
            "  \"architectures\": [\n    \"%s\"\n  ],\n"
            "  \"attn_pdrop\": %s,\n",
            a->causal_lm.type_name, attn);
    write_token_id(m, a, c, false);
    fprintf(m, "  \"embd_pdrop\": %s,\n", embd);
    write_token_id(m, a, c, true);
    fprintf(m,
            "  \"initializer_range\": %s,\n"
            "  \"layer_norm_epsilon\": %s,\n"
            "  \"model_type\": \"%s\",\n"
            "  \"n_embd\": %lld,\n"
            "  \"n_head\": %lld,\n"
            "  \"n_inner\": %lld,\n"
            "  \"n_layer\": %lld,\n"
            "  \"n_positions\": %lld,\n",
            init, eps, a->model_type, (long long)c->hidden_size, (long long)c->num_attention_heads,
            (long long)c->intermediate_size, (long long)c->num_hidden_layers, (long long)c->max_position_embeddings);
    write_pad_token_id(m, a, c);
    fprintf(m,
            "  \"reorder_and_upcast_attn\": %s,\n"
            "  \"resid_pdrop\": %s,\n"
            "  \"scale_attn_by_inverse_layer_idx\": %s,\n"
            "  \"scale_attn_weights\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_cache\": true,\n"
            "  \"vocab_size\": %lld\n}\n",
            c->reorder_and_upcast_attn ? "true" : "false", resid,
            c->scale_attn_by_inverse_layer_idx ? "true" : "false", c->unscaled_attention ? "false" : "true",
            c->tie_word_embeddings ? "true" : "false", accel_dtype_name(c->torch_dtype), TRANSFORMERS_VERSION,
            (long long)c->vocab_size);
}

/* The sizes of a LayerNorm family's config (GPT-NeoX, StableLM), hidden_size
 * to num_hidden_layers, in transformers' sorted order. */
static void write_layer_norm_sizes(FILE *m, const accel__arch *a, const accel_llama_config *c, const char *init,
                                   const char *eps) {
    fprintf(m,
            "  \"hidden_size\": %lld,\n"
            "  \"initializer_range\": %s,\n"
            "  \"intermediate_size\": %lld,\n"
            "  \"layer_norm_eps\": %s,\n"
            "  \"max_position_embeddings\": %lld,\n"
            "  \"model_type\": \"%s\",\n"
            "  \"num_attention_heads\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n",
            (long long)c->hidden_size, init, (long long)c->intermediate_size, eps,
            (long long)c->max_position_embeddings, a->model_type, (long long)c->num_attention_heads,
            (long long)c->num_hidden_layers);
}

/* GPTNeoXConfig's keys, sorted as transformers writes them; the RoPE's base
 * and factor under the Hub's names rotary_emb_base and rotary_pct, which
 * transformers 4 and 5 both read. */
static void write_neox(FILE *m, const accel__arch *a, const accel_llama_config *c, const char *init, const char *eps,
                       const char *theta) {
    char prf[40];
    accel__float_repr(prf, sizeof prf, c->partial_rotary_factor ? c->partial_rotary_factor : 1.0);
    fprintf(m, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n  \"attention_bias\": %s,\n", a->causal_lm.type_name,
            c->attention_bias ? "true" : "false");
    write_float(m, "attention_dropout", c->attn_pdrop);
    write_token_id(m, a, c, false);
    write_token_id(m, a, c, true);
    fprintf(m, "  \"hidden_act\": \"%s\",\n", NEOX_ACTS[c->neox_hidden_act]);
    write_float(m, "hidden_dropout", c->resid_pdrop); /* = embd_pdrop (resolve_config) */
    write_layer_norm_sizes(m, a, c, init, eps);
    write_pad_token_id(m, a, c);
    fprintf(m, "  \"rope_scaling\": ");
    write_rope(m, &c->rope_scaling);
    fprintf(m,
            ",\n  \"rotary_emb_base\": %s,\n"
            "  \"rotary_pct\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_cache\": true,\n"
            "  \"use_parallel_residual\": %s,\n"
            "  \"vocab_size\": %lld\n}\n",
            theta, prf, c->tie_word_embeddings ? "true" : "false", accel_dtype_name(c->torch_dtype),
            TRANSFORMERS_VERSION, c->sequential_residual ? "false" : "true", (long long)c->vocab_size);
}

/* StableLmConfig's keys, sorted as transformers writes them, in the Hub's
 * layout (stablelm-2-1_6b: top-level rope_theta and partial_rotary_factor). */
static void write_stablelm(FILE *m, const accel__arch *a, const accel_llama_config *c, const char *init,
                           const char *eps, const char *theta) {
    char prf[40];
    accel__float_repr(prf, sizeof prf, c->partial_rotary_factor ? c->partial_rotary_factor : 1.0);
    fprintf(m, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", a->causal_lm.type_name);
    write_float(m, "attention_dropout", c->attn_pdrop);
    write_token_id(m, a, c, false);
    write_token_id(m, a, c, true);
    fprintf(m, "  \"hidden_act\": \"silu\",\n");
    write_float(m, "hidden_dropout", c->resid_pdrop);
    write_layer_norm_sizes(m, a, c, init, eps);
    fprintf(m, "  \"num_key_value_heads\": %lld,\n",
            (long long)(c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads));
    write_pad_token_id(m, a, c);
    fprintf(m, "  \"partial_rotary_factor\": %s,\n  \"qk_layernorm\": %s,\n  \"rope_scaling\": ", prf,
            c->qk_layernorm ? "true" : "false");
    write_rope(m, &c->rope_scaling);
    fprintf(m,
            ",\n  \"rope_theta\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_cache\": true,\n"
            "  \"use_parallel_residual\": %s,\n"
            "  \"use_qkv_bias\": %s,\n"
            "  \"vocab_size\": %lld\n}\n",
            theta, c->tie_word_embeddings ? "true" : "false", accel_dtype_name(c->torch_dtype), TRANSFORMERS_VERSION,
            c->sequential_residual ? "false" : "true", c->attention_bias ? "true" : "false",
            (long long)c->vocab_size);
}

/* Starcoder2Config's keys, sorted as transformers writes them, in the Hub's
 * layout (starcoder2-3b: top-level rope_theta; head_dim only where it is
 * not hidden_size / heads, which its attention reads then). */
static void write_starcoder2(FILE *m, const accel__arch *a, const accel_llama_config *c, const char *init,
                             const char *eps, const char *theta, int64_t hd) {
    fprintf(m, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", a->causal_lm.type_name);
    write_float(m, "attention_dropout", c->attn_pdrop);
    write_token_id(m, a, c, false);
    write_float(m, "embedding_dropout", c->embd_pdrop);
    write_token_id(m, a, c, true);
    if (hd * c->num_attention_heads != c->hidden_size) fprintf(m, "  \"head_dim\": %lld,\n", (long long)hd);
    fprintf(m,
            "  \"hidden_act\": \"gelu_pytorch_tanh\",\n"
            "  \"hidden_size\": %lld,\n"
            "  \"initializer_range\": %s,\n"
            "  \"intermediate_size\": %lld,\n"
            "  \"max_position_embeddings\": %lld,\n"
            "  \"model_type\": \"%s\",\n"
            "  \"norm_epsilon\": %s,\n"
            "  \"num_attention_heads\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n",
            (long long)c->hidden_size, init, (long long)c->intermediate_size, (long long)c->max_position_embeddings,
            a->model_type, eps, (long long)c->num_attention_heads, (long long)c->num_hidden_layers,
            (long long)(c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads));
    write_pad_token_id(m, a, c);
    write_float(m, "residual_dropout", c->resid_pdrop);
    fprintf(m, "  \"rope_scaling\": ");
    write_rope(m, &c->rope_scaling);
    fprintf(m, ",\n  \"rope_theta\": %s,\n", theta);
    if (c->sliding_window) fprintf(m, "  \"sliding_window\": %lld,\n", (long long)c->sliding_window);
    else fprintf(m, "  \"sliding_window\": null,\n");
    fprintf(m,
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_bias\": %s,\n"
            "  \"use_cache\": true,\n"
            "  \"vocab_size\": %lld\n}\n",
            c->tie_word_embeddings ? "true" : "false", accel_dtype_name(c->torch_dtype), TRANSFORMERS_VERSION,
            c->attention_bias ? "true" : "false", (long long)c->vocab_size);
}

accel_status accel_llama_config_save(const char *dir_or_path, const accel_llama_config *c) {
    if (!dir_or_path || !c) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_config_save: NULL argument");
    if (check_reals(c)) return accel_last_status();
    /* what the model build refuses, with its status: a field of another
     * family (GPT-2's layer scaling on a Llama, a bias the family has no key
     * for) has no key in this family's file and would be dropped without a
     * word; two fields one key holds (GPT-NeoX's hidden_dropout, Starcoder2's
     * use_bias) could not be written apart */
    if (accel_llama_config_check(c, "accel_llama_config_save")) return accel_last_status();
    const accel__arch *a = accel__arch_find(c->model_type);
    size_t len = strlen(dir_or_path);
    bool is_json = len >= 5 && strcmp(dir_or_path + len - 5, ".json") == 0;
    if (!is_json && accel__mkdir(dir_or_path)) return accel_last_status();
    char *file = is_json ? accel_strdup(dir_or_path) : accel__path_join(dir_or_path, "config.json");
    if (!file) return accel_last_status();
    int64_t kv = c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads;
    int64_t hd = c->head_dim ? c->head_dim : c->hidden_size / (c->num_attention_heads ? c->num_attention_heads : 1);
    char eps[40], theta[40], init[40];
    accel__float_repr(eps, sizeof eps, c->rms_norm_eps);
    accel__float_repr(theta, sizeof theta, c->rope_theta);
    accel__float_repr(init, sizeof init, c->initializer_range);
    const char *dt = accel_dtype_name(c->torch_dtype);
    char *text = NULL;
    size_t tlen = 0;
    FILE *m = open_memstream(&text, &tlen);
    if (!m) {
        accel_free(file);
        return accel_set_error(ACCEL_ERR_OOM, "accel_llama_config_save: out of memory");
    }
    if (a->blocks == ACCEL__BLOCKS_GPT2) {
        write_gpt2(m, a, c, init, eps);
        goto written;
    }
    if (a->neox_blocks) {
        write_neox(m, a, c, init, eps, theta);
        goto written;
    }
    if (a->stablelm_blocks) {
        write_stablelm(m, a, c, init, eps, theta);
        goto written;
    }
    if (a->starcoder2_blocks) {
        write_starcoder2(m, a, c, init, eps, theta, hd);
        goto written;
    }
    /* Keys sorted, as json.dumps(sort_keys=True, indent=2); vocab_size is last. */
    fprintf(m, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", a->causal_lm.type_name);
    if (a->attention_bias && !a->qkv_only_bias)
        fprintf(m, "  \"attention_bias\": %s,\n", c->attention_bias ? "true" : "false");
    write_float(m, "attention_dropout", c->attn_pdrop); /* 0 but for Phi's */
    /* Granite's multipliers: 0 is 1.0; Gemma2's query_pre_attn_scalar: 0 is head_dim */
    if (a->multipliers) write_real(m, "attention_multiplier", nonzero(c->attention_multiplier, 1.0));
    if (a->softcap) write_real(m, "attn_logit_softcapping", c->attn_logit_softcapping);
    write_token_id(m, a, c, false);
    if (a->dropouts) write_float(m, "embd_pdrop", c->embd_pdrop);
    bool qwen_moe = a->moe == ACCEL__MOE_QWEN;
    if (qwen_moe) fprintf(m, "  \"decoder_sparse_step\": %lld,\n", (long long)(c->decoder_sparse_step ? c->decoder_sparse_step : 1));
    if (a->multipliers) write_real(m, "embedding_multiplier", nonzero(c->embedding_multiplier, 1.0));
    write_token_id(m, a, c, true);
    if (a->softcap) write_real(m, "final_logit_softcapping", c->final_logit_softcapping);
    /* Gemma's activation under both names: transformers 4 reads hidden_activation, 5 hidden_act (Gemma) */
    const char *act = a->gemma_blocks ? "gelu_pytorch_tanh" : a->phi_blocks ? "gelu_new" : "silu";
    /* PhiConfig has no head_dim: written only where it is not hidden_size / heads (its attention reads it) */
    if (!a->phi_blocks || hd * c->num_attention_heads != c->hidden_size) fprintf(m, "  \"head_dim\": %lld,\n", (long long)hd);
    fprintf(m, "  \"hidden_act\": \"%s\",\n", act);
    if (a->gemma_blocks) fprintf(m, "  \"hidden_activation\": \"%s\",\n", act);
    fprintf(m,
            "  \"hidden_size\": %lld,\n"
            "  \"initializer_range\": %s,\n"
            "  \"intermediate_size\": %lld,\n",
            (long long)c->hidden_size, init, (long long)c->intermediate_size);
    if (a->phi_blocks) fprintf(m, "  \"layer_norm_eps\": %s,\n", eps);
    /* the list (transformers >= 4.53 reads it first) where accel reads it back */
    if (a->window == ACCEL__WINDOW_TYPES && (c->n_layer_types > 0 || c->num_hidden_layers <= ACCEL_MAX_LAYER_TYPES))
        write_layer_types(m, a, c);
    if (a->multipliers) write_real(m, "logits_scaling", nonzero(c->logits_scaling, 1.0));
    fprintf(m, "  \"max_position_embeddings\": %lld,\n", (long long)c->max_position_embeddings);
    if (a->window == ACCEL__WINDOW_QWEN2 || a->window == ACCEL__WINDOW_QWEN2_MOE)
        fprintf(m, "  \"max_window_layers\": %lld,\n", (long long)c->max_window_layers);
    if (a->mlp_bias) fprintf(m, "  \"mlp_bias\": %s,\n", c->mlp_bias ? "true" : "false");
    if (qwen_moe) { /* as json.dumps(indent=2) writes a list */
        fprintf(m, "  \"mlp_only_layers\": [");
        for (int i = 0; i < c->n_mlp_only_layers; i++)
            fprintf(m, "%s%lld", i ? ",\n    " : "\n    ", (long long)c->mlp_only_layers[i]);
        fprintf(m, "%s],\n", c->n_mlp_only_layers ? "\n  " : "");
    }
    fprintf(m, "  \"model_type\": \"%s\",\n", a->model_type);
    /* with no experts K and the experts' size are unused: the family's defaults keep the file loadable */
    int64_t per_tok = c->num_experts_per_tok ? c->num_experts_per_tok : a->defaults.num_experts_per_tok;
    if (qwen_moe)
        fprintf(m, "  \"moe_intermediate_size\": %lld,\n  \"norm_topk_prob\": %s,\n",
                (long long)(c->moe_intermediate_size ? c->moe_intermediate_size : a->defaults.moe_intermediate_size),
                c->norm_topk_prob ? "true" : "false");
    fprintf(m, "  \"num_attention_heads\": %lld,\n", (long long)c->num_attention_heads);
    if (qwen_moe)
        fprintf(m, "  \"num_experts\": %lld,\n  \"num_experts_per_tok\": %lld,\n", (long long)c->num_local_experts,
                (long long)per_tok);
    else if (a->moe)
        fprintf(m, "  \"num_experts_per_tok\": %lld,\n", (long long)per_tok);
    fprintf(m, "  \"num_hidden_layers\": %lld,\n  \"num_key_value_heads\": %lld,\n",
            (long long)c->num_hidden_layers, (long long)kv);
    /* transformers 5 writes num_local_experts for both; 4's Qwen3MoeConfig reads num_experts */
    if (a->experts_alias) fprintf(m, "  \"num_local_experts\": %lld,\n", (long long)c->num_local_experts);
    /* Phi3Config's top-level original_max_position_embeddings wins over rope_scaling's */
    if (a->defaults.rope_scaling.original_max_position_embeddings)
        fprintf(m, "  \"original_max_position_embeddings\": %lld,\n",
                (long long)(c->rope_scaling.original_max_position_embeddings
                                ? c->rope_scaling.original_max_position_embeddings
                                : a->defaults.rope_scaling.original_max_position_embeddings));
    if (a->moe) fprintf(m, "  \"output_router_logits\": %s,\n", c->output_router_logits ? "true" : "false");
    write_pad_token_id(m, a, c);
    if (a->partial_rotary) {
        char prf[40];
        accel__float_repr(prf, sizeof prf, c->partial_rotary_factor ? c->partial_rotary_factor : 1.0);
        fprintf(m, "  \"partial_rotary_factor\": %s,\n", prf);
    }
    if (!strcmp(a->model_type, "llama")) fprintf(m, "  \"pretraining_tp\": 1,\n");
    if (a->phi_blocks) fprintf(m, "  \"qk_layernorm\": %s,\n", c->qk_layernorm ? "true" : "false");
    if (a->qkv_only_bias) fprintf(m, "  \"qkv_bias\": %s,\n", c->attention_bias ? "true" : "false"); /* Qwen2-MoE */
    /* an int in transformers 5's Gemma2Config (which refuses 16.0) */
    double qpas = nonzero(c->query_pre_attn_scalar, (double)hd);
    if (a->softcap && qpas == floor(qpas) && qpas < 0x1p53)
        fprintf(m, "  \"query_pre_attn_scalar\": %lld,\n", (long long)qpas);
    else if (a->softcap) write_real(m, "query_pre_attn_scalar", qpas);
    if (a->multipliers) write_real(m, "residual_multiplier", nonzero(c->residual_multiplier, 1.0));
    if (a->dropouts) write_float(m, "resid_pdrop", c->resid_pdrop);
    if (!a->phi_blocks) fprintf(m, "  \"rms_norm_eps\": %s,\n", eps);
    if (a->window == ACCEL__WINDOW_TYPES)
        write_float(m, "rope_local_base_freq", nonzero(c->rope_local_base_freq, a->defaults.rope_local_base_freq));
    fprintf(m, "  \"rope_scaling\": ");
    write_rope(m, &c->rope_scaling);
    fprintf(m, ",\n  \"rope_theta\": %s,\n", theta);
    if (a->moe) write_float(m, "router_aux_loss_coef", c->router_aux_loss_coef);
    if (a->moe == ACCEL__MOE_MIXTRAL) write_float(m, "router_jitter_noise", c->router_jitter_noise);
    if (a->shared_expert) /* with no experts unused: the family's default keeps the file loadable */
        fprintf(m, "  \"shared_expert_intermediate_size\": %lld,\n",
                (long long)(c->shared_expert_intermediate_size ? c->shared_expert_intermediate_size
                                                               : a->defaults.shared_expert_intermediate_size));
    if (a->window != ACCEL__WINDOW_NONE) {
        if (c->sliding_window) fprintf(m, "  \"sliding_window\": %lld,\n", (long long)c->sliding_window);
        else fprintf(m, "  \"sliding_window\": null,\n");
    }
    /* a pattern's layer types as the pattern too: transformers 4.50 - 4.52 read only it */
    if (a->window == ACCEL__WINDOW_TYPES && c->n_layer_types == 0)
        fprintf(m, "  \"sliding_window_pattern\": %lld,\n",
                (long long)(c->sliding_window_pattern > 0 ? c->sliding_window_pattern
                                                          : a->defaults.sliding_window_pattern));
    fprintf(m,
            "  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"transformers_version\": \"%s\",\n"
            "  \"use_cache\": true,\n",
            c->tie_word_embeddings ? "true" : "false", dt, TRANSFORMERS_VERSION);
    if (a->window == ACCEL__WINDOW_QWEN2 || a->window == ACCEL__WINDOW_USE_ALL || a->window == ACCEL__WINDOW_QWEN2_MOE)
        fprintf(m, "  \"use_sliding_window\": %s,\n", c->sliding_window ? "true" : "false");
    fprintf(m, "  \"vocab_size\": %lld\n}\n", (long long)c->vocab_size);
written:
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

/* The key readers for the other config.json parsers of src/io (io_internal.h). */
accel_status accel__config_get_int(json_t *root, const char *file, const char *key, int64_t *out, bool allow_zero) {
    return get_int(root, file, key, out, allow_zero, false);
}
accel_status accel__config_get_real(json_t *root, const char *file, const char *key, double *out) {
    return get_real(root, file, key, out);
}
accel_status accel__config_get_bool(json_t *root, const char *file, const char *key, bool *out) {
    return get_bool(root, file, key, out);
}
accel_status accel__config_get_dtype(json_t *root, const char *file, const char *key, accel_dtype *out) {
    return get_dtype(root, file, key, out);
}
accel_status accel__config_get_token_id(json_t *root, const char *file, const char *key, int64_t *out) {
    json_t *v = json_object_get(root, key);
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) >= 0))
        return bad_type(file, key, "a non-negative integer or null");
    if (v) *out = json_is_null(v) ? -1 : json_integer_value(v);
    return ACCEL_OK;
}
