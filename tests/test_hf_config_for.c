/* accel_llama_config_for against transformers' AutoConfig.for_model: every
 * decoder family's defaults as tests/data/hf_config_defaults.json holds them
 * (tools/gen_config_defaults_fixture.py), the sizes and whether the default
 * model has q/k/v biases (a model built on meta from the config: its q
 * projection's bias, whatever the family calls it); its refusals. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "accel/io.h"
#include "accel/nn.h"
#include "check.h"

static const char *const FIXTURE = "data/hf_config_defaults.json";

/* Whether the model of cfg (built on meta: shapes only) has a bias on its
 * first layer's q projection. */
static bool q_biased(const accel_llama_config *cfg) {
    static const char *const SUFFIX[] = {"q_proj.bias", "c_attn.bias", "query_key_value.bias", "qkv_proj.bias"};
    accel_module *m = accel_llama_new(cfg, ACCEL_META_DEVICE);
    CHECK_MSG(m != NULL, "%s: %s", cfg->model_type, accel_last_error());
    if (!m) return false;
    accel_state_dict *sd = accel_module_state_dict(m);
    bool found = false;
    for (int i = 0; sd && i < sd->n && !found; i++) {
        const char *name = sd->entries[i].name;
        size_t n = strlen(name);
        for (size_t k = 0; k < sizeof SUFFIX / sizeof *SUFFIX && !found; k++)
            found = n >= strlen(SUFFIX[k]) && !strcmp(name + n - strlen(SUFFIX[k]), SUFFIX[k]);
    }
    accel_state_dict_free(sd);
    accel_module_free(m);
    return found;
}

/* json's integer field `key` equals v (a field the family lacks is not checked). */
static void int_field(const char *mt, json_t *row, const char *key, int64_t v) {
    json_t *x = json_object_get(row, key);
    if (!x) return;
    CHECK_MSG(json_integer_value(x) == v, "%s: %s is %lld, transformers' %lld", mt, key, (long long)v,
              (long long)json_integer_value(x));
}

static void family_matches(const char *mt, json_t *row) {
    accel_llama_config c;
    bool ok = accel_llama_config_for(mt, &c) == ACCEL_OK;
    CHECK_MSG(ok, "%s: %s", mt, accel_last_error());
    if (!ok) return;
    CHECK_MSG(!strcmp(c.model_type, mt), "%s: model_type %s", mt, c.model_type);
    int_field(mt, row, "vocab_size", c.vocab_size);
    int_field(mt, row, "hidden_size", c.hidden_size);
    int_field(mt, row, "intermediate_size", c.intermediate_size);
    int_field(mt, row, "num_hidden_layers", c.num_hidden_layers);
    int_field(mt, row, "num_attention_heads", c.num_attention_heads);
    int_field(mt, row, "max_position_embeddings", c.max_position_embeddings);
    /* absent from the config: as many kv heads as heads */
    json_t *kv = json_object_get(row, "num_key_value_heads");
    CHECK_MSG(c.num_key_value_heads == (kv ? json_integer_value(kv) : c.num_attention_heads), "%s: kv heads %lld", mt,
              (long long)c.num_key_value_heads);
    CHECK_MSG(c.tie_word_embeddings == json_is_true(json_object_get(row, "tie_word_embeddings")), "%s: tie %d", mt,
              (int)c.tie_word_embeddings);
    CHECK_MSG(q_biased(&c) == json_is_true(json_object_get(row, "qkv_biased")), "%s: q/k/v biases %s", mt,
              json_is_true(json_object_get(row, "qkv_biased")) ? "missing" : "built");
}

/* jansson's allocator failing from its `fail_from`-th call on (counted by
 * calls; -1: never): what an out-of-memory does to the library's jansson. */
static int json_calls, fail_from = -1;

static void *failing_malloc(size_t n) {
    return fail_from >= 0 && json_calls++ >= fail_from ? NULL : malloc(n);
}

/* Out of memory at each of jansson's allocations in turn: every call either
 * succeeds or says out of memory (never "not UTF-8 text" for "llama"), *out
 * untouched on a failure. */
static void oom_named(void) {
    bool failed = true;
    json_set_alloc_funcs(failing_malloc, free);
    for (fail_from = 0; failed && fail_from < 64; fail_from++) {
        accel_llama_config c = accel_llama_config_default();
        c.vocab_size = 7;
        json_calls = 0;
        accel_status st = accel_llama_config_for("qwen2_moe", &c);
        failed = st != ACCEL_OK;
        if (failed) {
            CHECK_MSG(st == ACCEL_ERR_OOM, "allocation %d failing: status %d (%s)", fail_from, (int)st,
                      accel_last_error());
            CHECK_STR_CONTAINS(accel_last_error(), "out of memory");
            CHECK(c.vocab_size == 7);
        }
        accel_clear_error();
    }
    CHECK(!failed); /* some count of allocations is enough */
    CHECK(fail_from > 1); /* and the first ones failed */
    fail_from = -1;
    json_set_alloc_funcs(malloc, free);
}

/* A refusal: the status and the message, *out untouched. */
static void refused(const char *mt, accel_status code, const char *needle) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 7;
    CHECK(accel_llama_config_for(mt, &c) == code);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    CHECK(c.vocab_size == 7);
    accel_clear_error();
}

int main(void) {
    json_error_t err;
    json_t *fx = json_load_file(FIXTURE, 0, &err);
    CHECK_MSG(fx != NULL, "%s: %s", FIXTURE, err.text);
    json_t *families = json_object_get(fx, "families");
    CHECK(json_object_size(families) == 18); /* every decoder family accel builds */
    const char *mt;
    json_t *row;
    json_object_foreach(families, mt, row) family_matches(mt, row);
    json_decref(fx);

    /* "" is a config.json without model_type: Llama's */
    accel_llama_config c;
    CHECK(accel_llama_config_for("", &c) == ACCEL_OK && c.vocab_size == 32000 && !strcmp(c.model_type, "llama"));
    refused("bert", ACCEL_ERR_UNSUPPORTED, "model_type is \"bert\", accel builds");
    refused("gemma3", ACCEL_ERR_UNSUPPORTED, "builds the text-only \"gemma3_text\"");
    refused("\xff", ACCEL_ERR_INVALID_ARG, "model_type is not UTF-8 text");
    /* a long one is cut (at a character) so that the message still names the families */
    char long_type[3001];
    for (int i = 0; i < 1000; i++) memcpy(long_type + 3 * i, "\xe2\x82\xac", 3); /* 3-byte characters */
    long_type[3000] = 0;
    refused(long_type, ACCEL_ERR_UNSUPPORTED, "\xe2\x82\xac...\", accel builds \"llama\"");
    CHECK(accel_llama_config_for(NULL, &c) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_llama_config_for("llama", NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_for: NULL argument");
    accel_clear_error();
    oom_named();
    /* a handled error, then more calls */
    CHECK(accel_llama_config_for("qwen2_moe", &c) == ACCEL_OK && c.attention_bias);
    return check_summary();
}
