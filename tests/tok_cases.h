/* What the tokenizer tests share (test_tokenizer.c, test_sentencepiece.c):
 * a fixture's id lists, and one encode checked against the reference's ids
 * with the first few mismatches printed. */
#ifndef ACCEL_TESTS_TOK_CASES_H
#define ACCEL_TESTS_TOK_CASES_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "check.h"

/* The JSON array a as ids (malloc'd, *n of them). */
static inline int64_t *tok_ids_of(json_t *a, int64_t *n) {
    *n = (int64_t)json_array_size(a);
    int64_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int64_t i = 0; i < *n; i++) v[i] = json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* got[n] is want, after `first` when first >= 0 (the BOS id sentencepiece's
 * reference leaves out of its list). */
static inline bool tok_ids_equal(const int64_t *got, int64_t n, json_t *want, int64_t first) {
    size_t off = first >= 0;
    if ((size_t)n != json_array_size(want) + off || (off && got[0] != first)) return false;
    for (int64_t i = (int64_t)off; i < n; i++)
        if (got[i] != json_integer_value(json_array_get(want, (size_t)i - off))) return false;
    return true;
}

static inline void tok_print_ids(const char *what, const int64_t *ids, int64_t n) {
    fprintf(stderr, "  %s:", what);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %lld", (long long)ids[i]);
    fprintf(stderr, "\n");
}

/* encode(text[n], special) of tokenizer `name` is want (after `first`, as
 * tok_ids_equal); the first three failures (*failures counts them) print
 * both lists. */
static inline void tok_check_encode(const accel_tokenizer *t, const char *name, const char *text, size_t n,
                                    bool special, json_t *want, int64_t first, int *failures) {
    int64_t *ids = NULL, k = 0;
    accel_status st = accel_tokenizer_encode(t, text, n, special, &ids, &k);
    bool ok = st == ACCEL_OK && tok_ids_equal(ids, k, want, first);
    CHECK_MSG(ok, "%s: encode(\"%.60s\", add_special_tokens=%d): %s", name, text, special,
              st ? accel_last_error() : "ids differ");
    if (!ok && (*failures)++ < 3) {
        tok_print_ids("got ", ids, k);
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "  want: %s\n", w);
        free(w);
    }
    free(ids);
}

/* A Hub-style directory made from dir (a mkdtemp template) holding a tiny
 * random Llama of `vocab` ids, config.json and weights, for
 * examples/generate to run on once the test copies a tokenizer in. */
static inline bool tok_tiny_model(char *dir, int64_t vocab) {
    if (!mkdtemp(dir)) return false;
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = vocab, cfg.hidden_size = 32, cfg.intermediate_size = 64, cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2, cfg.max_position_embeddings = 64;
    cfg.torch_dtype = ACCEL_F32;
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    bool ok = m && accel_save_pretrained(m, dir, 0) == ACCEL_OK;
    accel_module_free(m);
    return ok;
}

/* The shell command cmd's output into out (n bytes, NUL-terminated); its
 * status as pclose gives it, -1 when it did not start. */
static inline int tok_shell(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    size_t k = p ? fread(out, 1, n - 1, p) : 0;
    out[k] = 0;
    return p ? pclose(p) : -1;
}

#endif
