/* Tokenizers against Hugging Face `tokenizers` (fixtures of
 * tools/gen_tokenizer_fixtures.py: gpt2, llama3, qwen2, llama2, bert, mistral,
 * misc1, misc2 pipelines and the Unigram ones, unigram and t5):
 * ids with and without special tokens, decode with and without skipping them,
 * round trips; then what a careful adversary tries: invalid UTF-8, unknown
 * components, malformed files, out-of-range ids, NULLs. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "sibling_exe.h"
#include "tok_cases.h"
#include "tokenizer/tok_internal.h"

static const char *const FAMILIES[] = {"gpt2", "llama3", "qwen2", "llama2", "bert", "mistral", "misc1", "misc2", "unigram", "t5", "unigram_ulp"};

static void check_family(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "data/tokenizers/%s", name);
    accel_tokenizer *t = accel_tokenizer_load(path);
    CHECK_MSG(t != NULL, "%s: %s", name, accel_last_error());
    if (!t) return;
    snprintf(path, sizeof path, "data/tokenizers/%s/expected.json", name);
    json_error_t err;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &err);
    CHECK_MSG(root != NULL, "%s: %s", path, err.text);
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    int failures = 0;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t n = json_string_length(json_object_get(c, "text"));
        for (int special = 1; special >= 0; special--)
            tok_check_encode(t, name, text, n, special, json_object_get(c, special ? "ids" : "ids_plain"), -1,
                             &failures);
        /* decode what the reference encoded */
        int64_t m, *rid = tok_ids_of(json_object_get(c, "ids"), &m);
        for (int skip = 0; skip <= 1; skip++) {
            char *out = NULL;
            size_t len = 0;
            json_t *e = json_object_get(c, skip ? "decoded_skip" : "decoded");
            const char *exp = json_string_value(e);
            accel_status st = accel_tokenizer_decode(t, rid, m, skip, &out, &len);
            CHECK_MSG(st == ACCEL_OK && out && len == json_string_length(e) && !memcmp(out, exp, len),
                      "%s: decode(skip_special_tokens=%d) of \"%.60s\": got \"%.80s\", want \"%.80s\"", name, skip,
                      text, out ? out : accel_last_error(), exp);
            free(out);
        }
        free(rid);
    }
    json_decref(root);
    accel_tokenizer_free(t);
}

static void test_families(void) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++) check_family(FAMILIES[i]);
}

static void test_lookups(void) {
    accel_tokenizer *t = accel_tokenizer_load("data/tokenizers/llama3/tokenizer.json");
    CHECK(t != NULL);
    if (!t) return;
    int64_t bos = accel_tokenizer_token_to_id(t, "<|begin_of_text|>");
    CHECK(bos == 0 && accel_tokenizer_is_special(t, bos));
    CHECK(!strcmp(accel_tokenizer_id_to_token(t, bos), "<|begin_of_text|>"));
    CHECK(accel_tokenizer_token_to_id(t, "no such token") == -1);
    CHECK(accel_tokenizer_vocab_size(t) == 902);
    CHECK(accel_tokenizer_id_to_token(t, 902) == NULL && accel_tokenizer_id_to_token(t, -1) == NULL);
    CHECK(!accel_tokenizer_is_special(t, 40));
    accel_tokenizer_free(t);
}

/* Invalid UTF-8 is refused naming its offset; ids outside the vocabulary name the id;
 * after each handled error the tokenizer keeps working. */
static void test_bad_input(void) {
    accel_tokenizer *t = accel_tokenizer_load("data/tokenizers/gpt2");
    CHECK(t != NULL);
    if (!t) return;
    static const char *const bad[] = {"ab\xff", "\xc3", "x\xe2\x82", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t *ids = (int64_t *)1, n = 7;
        CHECK(accel_tokenizer_encode(t, bad[i], strlen(bad[i]), true, &ids, &n) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "not UTF-8: byte");
        CHECK(ids == NULL && n == 0);
    }
    int64_t *ids = NULL, n = 0;
    CHECK(accel_tokenizer_encode(t, "ok", 2, true, &ids, &n) == ACCEL_OK && n > 0);
    free(ids);
    char *s = NULL;
    int64_t bogus[] = {5, 900000};
    CHECK(accel_tokenizer_decode(t, bogus, 2, false, &s, NULL) == ACCEL_ERR_INVALID_ARG && s == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "ids[1] = 900000 is not in the vocabulary");
    int64_t neg = -3;
    CHECK(accel_tokenizer_decode(t, &neg, 1, false, &s, NULL) == ACCEL_ERR_INVALID_ARG);
    /* an embedded NUL is text like any other */
    CHECK(accel_tokenizer_encode(t, "a\0b", 3, false, &ids, &n) == ACCEL_OK && n >= 2);
    CHECK(accel_tokenizer_decode(t, ids, n, false, &s, NULL) == ACCEL_OK);
    free(ids);
    free(s);
    /* NULLs */
    CHECK(accel_tokenizer_encode(NULL, "a", 1, true, &ids, &n) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_tokenizer_encode(t, NULL, 1, true, &ids, &n) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_tokenizer_encode(t, NULL, 0, true, &ids, &n) == ACCEL_OK && n == 0 && ids == NULL);
    CHECK(accel_tokenizer_decode(t, NULL, 0, true, &s, NULL) == ACCEL_OK && s && !*s);
    free(s);
    CHECK(accel_tokenizer_load(NULL) == NULL);
    accel_tokenizer_free(NULL);
    accel_tokenizer_free(t);
}

/* The fixture `base`'s tokenizer.json with `value` set at JSON path key_path
 * (object keys separated by '.'), written to path (a mkstemp template) and
 * loaded; the file is left for the caller to unlink. */
static accel_tokenizer *load_edited(const char *base, const char *key_path, json_t *value, char *path) {
    json_error_t err;
    char file[256];
    snprintf(file, sizeof file, "data/tokenizers/%s/tokenizer.json", base);
    json_t *root = json_load_file(file, 0, &err);
    json_t *o = root;
    char keys[128];
    snprintf(keys, sizeof keys, "%s", key_path);
    char *save = NULL, *k = strtok_r(keys, ".", &save), *next;
    while ((next = strtok_r(NULL, ".", &save))) o = json_object_get(o, k), k = next;
    json_object_set_new(o, k, value);
    int fd = mkstemp(path);
    close(fd);
    json_dump_file(root, path, 0);
    json_decref(root);
    return accel_tokenizer_load(path);
}

/* The fixture `base` edited as load_edited: the load must fail with code and `needle`. */
static void check_refused_in(const char *base, const char *key_path, json_t *value, accel_status code, const char *needle) {
    char path[] = "/tmp/accel_tok_XXXXXX";
    accel_tokenizer *t = load_edited(base, key_path, value, path);
    CHECK_MSG(t == NULL && accel_last_status() == code, "%s: loaded or wrong status: %s", key_path, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    accel_tokenizer_free(t);
    unlink(path);
}

static void check_refused(const char *key_path, json_t *value, accel_status code, const char *needle) {
    check_refused_in("gpt2", key_path, value, code, needle);
}

/* A Precompiled normalizer whose charsmap is `b64` (base64), in the t5 fixture. */
static void check_charsmap_refused(const char *b64, const char *needle) {
    check_refused_in("t5", "normalizer", json_pack("{s:s,s:s}", "type", "Precompiled", "precompiled_charsmap", b64),
                     ACCEL_ERR_FORMAT, needle);
}

static void test_refusals(void) {
    check_refused("model.type", json_string("WordLevel"), ACCEL_ERR_UNSUPPORTED, "model type \"WordLevel\" is not supported");
    /* Unigram fields (the unigram fixture's model edited) */
    check_refused_in("unigram", "model.vocab", json_object(), ACCEL_ERR_FORMAT, "model.vocab: must be an array of [piece, score]");
    check_refused_in("unigram", "model.vocab", json_array(), ACCEL_ERR_FORMAT, "model.vocab: has 0 pieces");
    check_refused_in("unigram", "model.vocab", json_pack("[[s,f],[s]]", "a", -1.0, "b"), ACCEL_ERR_FORMAT,
                     "model.vocab[1]: must be [piece, score]");
    check_refused_in("unigram", "model.vocab", json_pack("[[s,s]]", "a", "x"), ACCEL_ERR_FORMAT,
                     "model.vocab[0]: must be [piece, score]");
    check_refused_in("unigram", "model.vocab", json_pack("[[i,f]]", 7, -1.0), ACCEL_ERR_FORMAT,
                     "model.vocab[0]: must be [piece, score]");
    check_refused_in("unigram", "model.vocab", json_pack("[[s,f],[s,f]]", "a", -1.0, "", -2.0), ACCEL_ERR_FORMAT,
                     "model.vocab[1]: the piece is empty");
    check_refused_in("unigram", "model.unk_id", json_integer(856), ACCEL_ERR_FORMAT, "model.unk_id: must be null or an id");
    check_refused_in("unigram", "model.unk_id", json_integer(-1), ACCEL_ERR_FORMAT, "model.unk_id: must be null or an id");
    check_refused_in("unigram", "model.unk_id", json_string("2"), ACCEL_ERR_FORMAT, "model.unk_id: must be null or an id");
    check_refused_in("unigram", "model.byte_fallback", json_string("yes"), ACCEL_ERR_FORMAT,
                     "\"byte_fallback\" must be true or false");
    /* Precompiled: not a string, not canonical base64, a broken charsmap, strings that are not UTF-8 */
    check_refused_in("t5", "normalizer", json_pack("{s:s}", "type", "Precompiled"), ACCEL_ERR_FORMAT,
                     "normalizer: \"precompiled_charsmap\" must be a string");
    check_refused_in("t5", "normalizer", json_pack("{s:s,s:i}", "type", "Precompiled", "precompiled_charsmap", 3),
                     ACCEL_ERR_FORMAT, "normalizer: \"precompiled_charsmap\" must be a string");
    check_charsmap_refused("QUJD!", "\"precompiled_charsmap\" is not base64");  /* length */
    check_charsmap_refused("QU*D", "\"precompiled_charsmap\" is not base64");   /* alphabet */
    check_charsmap_refused("QR==", "\"precompiled_charsmap\" is not base64");   /* bits after the padding */
    check_charsmap_refused("Q===", "\"precompiled_charsmap\" is not base64");   /* three pads */
    check_charsmap_refused("=QQQ", "\"precompiled_charsmap\" is not base64");   /* a pad first */
    check_charsmap_refused("", "\"precompiled_charsmap\" is broken: 0 bytes");
    check_charsmap_refused("QUJD", "\"precompiled_charsmap\" is broken: 3 bytes");
    check_charsmap_refused("CAAAAAAAAAA=", "is broken: 8 bytes, a trie of 8 bytes");  /* the trie runs past the blob */
    check_charsmap_refused("BgAAAAAAAAAAAA==", "is broken: 10 bytes, a trie of 6 bytes"); /* not whole units */
    check_charsmap_refused("AAAAAAAAAAA=", "is broken: 8 bytes, a trie of 0 bytes");
    check_charsmap_refused("BAAAAAAAAAD/", "\"precompiled_charsmap\": its strings are not UTF-8 (byte 0");
    check_refused("model.dropout", json_real(0.1), ACCEL_ERR_UNSUPPORTED, "\"dropout\" is set");
    check_refused("model.continuing_subword_prefix", json_string("##"), ACCEL_ERR_UNSUPPORTED,
                  "continuing_subword_prefix");
    check_refused("normalizer", json_pack("{s:s}", "type", "Nmt"), ACCEL_ERR_UNSUPPORTED, "normalizer type \"Nmt\"");
    check_refused("pre_tokenizer", json_pack("{s:s}", "type", "UnicodeScripts"), ACCEL_ERR_UNSUPPORTED,
                  "pre-tokenizer type \"UnicodeScripts\"");
    check_refused("decoder", json_pack("{s:s}", "type", "CTC"), ACCEL_ERR_UNSUPPORTED, "decoder type \"CTC\"");
    check_refused("post_processor", json_pack("{s:s}", "type", "Fancy"), ACCEL_ERR_UNSUPPORTED, "\"Fancy\"");
    check_refused("truncation", json_pack("{s:i}", "max_length", 8), ACCEL_ERR_UNSUPPORTED, "truncation");
    check_refused("pre_tokenizer", json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", "(unclosed",
                                             "behavior", "Isolated", "invert", 0),
                  ACCEL_ERR_FORMAT, "does not compile");
    check_refused("model.merges", json_pack("[[s,s]]", "no", "such"), ACCEL_ERR_FORMAT, "not in the vocabulary");
    check_refused("model.vocab", json_pack("{s:s}", "a", "x"), ACCEL_ERR_FORMAT, "is not an integer");
    check_refused("model.vocab", json_pack("{s:i}", "a", -1), ACCEL_ERR_FORMAT, "is not an integer");
    check_refused("added_tokens", json_pack("[{s:i,s:s}]", "id", 3, "content", ""), ACCEL_ERR_FORMAT, "is empty");
    check_refused("model", json_null(), ACCEL_ERR_FORMAT, "model: must be an object");
    /* an empty Metaspace replacement would loop forever searching for "" */
    check_refused("pre_tokenizer", json_pack("{s:s,s:s,s:s}", "type", "Metaspace", "replacement", "", "prepend_scheme", "always"),
                  ACCEL_ERR_FORMAT, "\"replacement\" must be one character");
    check_refused("decoder", json_pack("{s:s,s:s,s:s}", "type", "Metaspace", "replacement", "", "prepend_scheme", "always"),
                  ACCEL_ERR_FORMAT, "\"replacement\" must be one character");
    check_refused("decoder", json_pack("{s:s,s:s,s:s}", "type", "Metaspace", "replacement", "ab", "prepend_scheme", "always"),
                  ACCEL_ERR_FORMAT, "\"replacement\" must be one character");
    /* post-processor ids outside the vocabulary (gpt2's has 900 ids) */
    check_refused("post_processor", json_pack("{s:s,s:[s,i],s:[s,i]}", "type", "BertProcessing", "cls", "x", 900, "sep", "y", 1),
                  ACCEL_ERR_FORMAT, "post_processor: \"cls\" has id 900, outside the vocabulary");
    check_refused("post_processor", json_pack("{s:s,s:[{s:s,s:[{s:{s:s}}]}]}", "type", "Sequence", "processors", "type",
                                              "TemplateProcessing", "single", "SpecialToken", "id", "<x>"),
                  ACCEL_ERR_FORMAT, "special token \"<x>\" has no ids"); /* and the nested element is freed (ASan) */
    check_refused("post_processor", json_pack("{s:s,s:[{s:{s:s}}],s:{s:{s:[i]}}}", "type", "TemplateProcessing", "single",
                                              "SpecialToken", "id", "<x>", "special_tokens", "<x>", "ids", -1),
                  ACCEL_ERR_FORMAT, "\"special_tokens\" has id -1");
    /* a failing element of a nested Sequence: what the outer element allocated is freed (ASan) */
    check_refused("normalizer", json_pack("{s:s,s:[{s:s,s:[{s:s}]}]}", "type", "Sequence", "normalizers", "type", "Sequence",
                                          "normalizers", "type", "Nmt"),
                  ACCEL_ERR_UNSUPPORTED, "normalizer type \"Nmt\"");
    /* JSON of another kind, not JSON, a directory without tokenizer.json, a missing file */
    FILE *f = fopen("/tmp/accel_tok_array.json", "w");
    fputs("[1, 2]", f);
    fclose(f);
    CHECK(accel_tokenizer_load("/tmp/accel_tok_array.json") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "not a tokenizers tokenizer.json");
    unlink("/tmp/accel_tok_array.json");
    CHECK(accel_tokenizer_load("data/tokenizers/gpt2/../../st_small.safetensors") == NULL);
    CHECK(accel_tokenizer_load("data") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "data/tokenizer.json");
    CHECK(accel_tokenizer_load("/nonexistent/tokenizer.json") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "no such file");
}

/* A small BPE tokenizer.json: `parts` are its top-level components as JSON
 * members ("\"normalizer\": {...}, ..."; absent ones are none), loaded. */
static const char SMALL_VOCAB[] = "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"H\":6,\"e\":7,\"l\":8,\"o\":9,"
                                  "\"W\":10,\"r\":11,\"d\":12,\"oW\":13,\"!\":14,\"\\u00e9\":15,\"X\":16,\"\\u0301\":17,"
                                  "\"\\u093e\":18,\"<0x 1>\":19,\"<0x41>\":20}";

/* A tokenizer.json of these top-level members, loaded (NULL: see accel_last_error). */
static accel_tokenizer *json_tok(const char *members) {
    char path[] = "/tmp/accel_tok_json_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), unlink(path);
        return NULL;
    }
    fprintf(f, "{\"version\":\"1.0\",%s}", members);
    fclose(f);
    accel_tokenizer *t = accel_tokenizer_load(path);
    unlink(path);
    return t;
}

static accel_tokenizer *small_tok(const char *parts, const char *merges) {
    char *members = NULL;
    if (asprintf(&members, "%s%s\"post_processor\":null,\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"vocab\":%s,"
                 "\"merges\":%s}", parts, *parts ? "," : "", SMALL_VOCAB, merges) < 0)
        return NULL;
    accel_tokenizer *t = json_tok(members);
    free(members);
    return t;
}

/* small_tok(parts, merges) encodes text (no special tokens) to want[0..n_want). */
static void check_small(const char *parts, const char *merges, const char *text, const int64_t *want, int64_t n_want) {
    accel_tokenizer *t = small_tok(parts, merges);
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (!t) return;
    int64_t *ids = NULL, n = 0;
    CHECK_MSG(accel_tokenizer_encode(t, text, strlen(text), false, &ids, &n) == ACCEL_OK, "%s", accel_last_error());
    bool same = n == n_want;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    CHECK_MSG(same, "\"%s\" with %s / %s", text, parts, merges);
    if (!same) tok_print_ids("got", ids, n);
    free(ids);
    accel_tokenizer_free(t);
}

#define ADDED(id, content, single_word, normalized)                                                             \
    "\"added_tokens\":[{\"id\":" #id ",\"content\":\"" content "\",\"single_word\":" #single_word                \
    ",\"lstrip\":false,\"rstrip\":false,\"normalized\":" #normalized ",\"special\":false}]"

/* Corner cases of the reference's semantics (the ids are those of Hugging Face
 * tokenizers 0.22 on the same tokenizer.json). */
static void test_reference_edges(void) {
    /* a duplicate merge: the last rank wins (the reference collects a HashMap) */
    check_small("", "[[\"a\",\"b\"],[\"b\",\"c\"],[\"a\",\"b\"]]", "abc", (const int64_t[]){0, 4}, 2);
    /* empty regex matches split: a lookahead cuts "HelloWorld" before the W */
    check_small("\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?=[A-Z])\"},\"behavior\":\"Isolated\","
                "\"invert\":false}",
                "[[\"o\",\"W\"]]", "HelloWorld", (const int64_t[]){6, 7, 8, 8, 9, 10, 9, 11, 8, 12}, 10);
    /* Replace with empty matches: none right where the previous match ended */
    check_small("\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"b*\"},\"content\":\"X\"}", "[]", "abbc",
                (const int64_t[]){16, 0, 16, 2, 16}, 5);
    check_small("\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\"\"},\"content\":\"X\"}", "[]", "abc",
                (const int64_t[]){16, 0, 16, 1, 16, 2, 16}, 7);
    /* StripAccents alone drops marks without decomposing: a precomposed e-acute stays */
    check_small("\"normalizer\":{\"type\":\"StripAccents\"}", "[]", "\xc3\xa9" "e\xcc\x81", (const int64_t[]){15, 7}, 2);
    /* a normalized added token is found as the normalizer makes it; one that normalizes to nothing never */
    check_small("\"normalizer\":{\"type\":\"Lowercase\"}," ADDED(21, "Abc", false, true), "[]", "xAbcabc",
                (const int64_t[]){21, 21}, 2);
    check_small("\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\"Q\"},\"content\":\"\"}," ADDED(21, "Q", false, true),
                "[]", "aQb", (const int64_t[]){0, 1}, 2);
    /* an added token the model knows takes the model's id */
    check_small(ADDED(21, "ab", false, false), "[]", "cab", (const int64_t[]){2, 3}, 2);
    /* single_word: marks (U+093E Mc, U+0301 Mn) are word characters, '!' is not */
    check_small(ADDED(21, "Wd", true, false), "[]", "\xe0\xa4\xbeWd c\xc3\xa9Wd \xcc\x81Wd !Wd",
                (const int64_t[]){18, 10, 12, 2, 15, 10, 12, 17, 10, 12, 14, 21}, 12);
    /* ByteFallback reads exactly two hex digits: "<0x 1>" is a token, not byte 1 */
    accel_tokenizer *t = small_tok("\"decoder\":{\"type\":\"ByteFallback\"}", "[]");
    char *out = NULL;
    CHECK(t && accel_tokenizer_decode(t, (const int64_t[]){19, 20, 0}, 3, false, &out, NULL) == ACCEL_OK);
    CHECK_MSG(out && !strcmp(out, "<0x 1>Aa"), "decoded \"%s\"", out ? out : "(null)");
    free(out);
    accel_tokenizer_free(t);
    /* a regex that exhausts PCRE2's match limit is an error, not "no match" */
    t = small_tok("\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a+)+$\"},\"behavior\":\"Isolated\","
                  "\"invert\":false}", "[]");
    CHECK(t != NULL);
    char text[64];
    memset(text, 'a', 40);
    text[40] = '!';
    int64_t *ids = (int64_t *)1, n = 3;
    CHECK(t && accel_tokenizer_encode(t, text, 41, false, &ids, &n) != ACCEL_OK && ids == NULL && n == 0);
    CHECK_STR_CONTAINS(accel_last_error(), "a regular expression failed on the text");
    CHECK_STR_CONTAINS(accel_last_error(), "limit");
    accel_tokenizer_free(t);
}


/* t encodes text (n bytes, no special tokens) to want[0..n_want), or fails
 * with `error` in its message when error is set. */
static void check_ids(accel_tokenizer *t, const char *text, size_t n, const int64_t *want, int64_t n_want,
                      const char *error) {
    int64_t *ids = NULL, m = 0;
    accel_status st = accel_tokenizer_encode(t, text, n, false, &ids, &m);
    if (error) {
        CHECK_MSG(st != ACCEL_OK && ids == NULL, "\"%s\" encoded", text);
        CHECK_STR_CONTAINS(accel_last_error(), error);
        return;
    }
    bool same = st == ACCEL_OK && m == n_want;
    for (int64_t i = 0; same && i < m; i++) same = ids[i] == want[i];
    CHECK_MSG(same, "\"%s\": %s", text, st == ACCEL_OK ? "ids differ" : accel_last_error());
    if (!same) tok_print_ids("got", ids, m);
    free(ids);
}

/* The charsmap of one rule, "a" -> the string at offset `value` of "\xC3\xA9\0"
 * ("é"), as base64: a darts-clone trie of 128 units (the root's offset 1, "a"
 * at 1 ^ 0x61 = 96 with a leaf whose value unit is 97). */
static void one_rule_charsmap(uint32_t value, char *b64) {
    uint8_t blob[4 + 128 * 4 + 3] = {0};
    uint32_t unit[128] = {0};
    unit[0] = 1u << 10;
    unit[96] = 0x61 | 1u << 8 | 1u << 10;
    unit[97] = 1u << 31 | value;
    blob[1] = 2; /* 512 bytes of trie */
    for (int i = 0; i < 128; i++)
        for (int k = 0; k < 4; k++) blob[4 + 4 * i + k] = (uint8_t)(unit[i] >> (8 * k));
    memcpy(blob + 4 + 512, "\xC3\xA9", 3);
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = sizeof blob, k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)blob[i] << 16 | (i + 1 < n ? (uint32_t)blob[i + 1] << 8 : 0) | (i + 2 < n ? blob[i + 2] : 0);
        b64[k++] = a[v >> 18], b64[k++] = a[(v >> 12) & 63];
        b64[k++] = i + 1 < n ? a[(v >> 6) & 63] : '=', b64[k++] = i + 2 < n ? a[v & 63] : '=';
    }
    b64[k] = 0;
}

/* Unigram and Precompiled corners (ids of Hugging Face tokenizers 0.23.3 on the same files). */
static void test_unigram_edges(void) {
    /* a piece given twice maps to its last id, as tokenizers' map; no unk_id: an
     * uncovered character fails the encode (tokenizers' MissingUnkId) */
    accel_tokenizer *t = json_tok("\"model\":{\"type\":\"Unigram\",\"unk_id\":null,\"byte_fallback\":false,"
                                  "\"vocab\":[[\"a\",-1.0],[\"b\",-2.0],[\"a\",-3.0],[\"ab\",-5.0]]}");
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (t) {
        check_ids(t, "abab", 4, (const int64_t[]){3, 3}, 2, NULL);
        check_ids(t, "aab", 3, (const int64_t[]){2, 3}, 2, NULL);
        check_ids(t, "abc", 3, NULL, 0, "no unk_id");
        CHECK(accel_tokenizer_id_to_token(t, 0) && !strcmp(accel_tokenizer_id_to_token(t, 0), "a"));
        CHECK(accel_tokenizer_token_to_id(t, "a") == 2);
    }
    accel_tokenizer_free(t);
    /* the best path's sums are doubles: "ab" at -2.00000001 loses to "a" "b" (in
     * float the two would tie, and the first found, "ab", would stay) */
    t = json_tok("\"model\":{\"type\":\"Unigram\",\"unk_id\":null,"
                 "\"vocab\":[[\"a\",-1.0],[\"b\",-1.0],[\"ab\",-2.00000001]]}");
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (t) check_ids(t, "abab", 4, (const int64_t[]){0, 1, 0, 1}, 4, NULL);
    accel_tokenizer_free(t);
    /* byte_fallback spells an unknown run in <0xXX> pieces only when all its bytes
     * have one, else the run is one unknown id */
    t = json_tok("\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":[[\"<unk>\",0.0],"
                 "[\"a\",-1.0],[\"<0xC3>\",-2.0],[\"<0xA9>\",-2.0],[\"<0xB6>\",-2.0]]}");
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (t) {
        check_ids(t, "a\xC3\xA9" "a", 4, (const int64_t[]){1, 2, 3, 1}, 4, NULL);        /* aéa */
        check_ids(t, "a\xC3\xBC" "a", 4, (const int64_t[]){1, 0, 1}, 3, NULL);           /* aüa: no <0xBC> */
        check_ids(t, "\xC3\xA9\xC3\xBC", 4, (const int64_t[]){0}, 1, NULL);             /* éü fused */
    }
    accel_tokenizer_free(t);
    /* Precompiled: "a" -> "é"; a rule at the strings' end deletes; one inside a
     * character or past the strings fails the encode (tokenizers panics) */
    static const struct {
        uint32_t value;
        int64_t want[4], n;
        const char *error;
    } cases[] = {{0, {1, 3, 0, 1}, 4, NULL}, {3, {3, 0}, 2, NULL}, {1, {0}, 0, "inside a character"},
                 {5, {0}, 0, "inside a character or past its strings"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char b64[1024], members[1400];
        one_rule_charsmap(cases[i].value, b64);
        snprintf(members, sizeof members,
                 "\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"%s\"},"
                 "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0.0],[\"\\u00e9\",-1.0],"
                 "[\"a\",-1.0],[\"b\",-1.0]]}", b64);
        t = json_tok(members);
        CHECK_MSG(t != NULL, "%s", accel_last_error());
        if (t) check_ids(t, "ab\0a", 4, cases[i].want, cases[i].n, cases[i].error);
        accel_tokenizer_free(t);
    }
}

/* BERT's uncased pipeline with a normalized added token "NewWord": found in any
 * case, as the lowercasing normalizer makes it (tokenizers gives 1200 1200). */
static void test_normalized_added(void) {
    json_error_t err;
    json_t *root = json_load_file("data/tokenizers/bert/tokenizer.json", 0, &err);
    CHECK(root != NULL);
    if (!root) return;
    json_array_append_new(json_object_get(root, "added_tokens"),
                          json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 1200, "content", "NewWord", "single_word", 0,
                                    "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    char path[] = "/tmp/accel_tok_bert_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    json_dump_file(root, path, 0);
    json_decref(root);
    accel_tokenizer *t = accel_tokenizer_load(path);
    unlink(path);
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    int64_t *ids = NULL, n = 0;
    CHECK(t && accel_tokenizer_encode(t, "NewWord newword", 15, false, &ids, &n) == ACCEL_OK);
    bool same = n == 2 && ids[0] == 1200 && ids[1] == 1200;
    CHECK(same);
    if (!same) tok_print_ids("got", ids, n);
    free(ids);
    accel_tokenizer_free(t);
}

/* The gpt2 fixture with the pre-tokenizer `pre` before its byte-level mapping
 * encodes text (no special tokens) to want[0..n_want): every character has
 * ids there, so the ids show where `pre` split. */
static void check_pre_split(json_t *pre, const char *text, const int64_t *want, int64_t n_want) {
    char path[] = "/tmp/accel_tok_pre_XXXXXX";
    char *dump = json_dumps(pre, JSON_COMPACT);
    json_t *seq = json_pack("{s:s,s:[o,{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers", pre, "type",
                            "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    accel_tokenizer *t = load_edited("gpt2", "pre_tokenizer", seq, path);
    unlink(path);
    CHECK_MSG(t != NULL, "%s: %s", dump, accel_last_error());
    int64_t *ids = NULL, n = 0;
    bool same = t && accel_tokenizer_encode(t, text, strlen(text), false, &ids, &n) == ACCEL_OK && n == n_want;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    CHECK_MSG(same, "%s on \"%s\"", dump, text);
    if (!same) tok_print_ids("got", ids, n);
    free(ids);
    free(dump);
    accel_tokenizer_free(t);
}

static json_t *split(const char *regex, const char *behavior) {
    return json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", regex, "behavior", behavior,
                     "invert", 0);
}

/* What tools/sweep_tokenizers.py found, pinned (ids of tokenizers 0.23.3). The
 * reference's regular expressions are Oniguruma's: \w holds marks, and U+00B2
 * outside a bracket class but not inside one; \s is White_Space (without
 * U+180E, which PCRE2's \s adds); \h is a hex digit, \v U+000B; \b the
 * boundary of that \w. A Removed split shows in the ids what matched. */
static void test_sweep_regex(void) {
    check_pre_split(split("[]\\w]+", "Removed"), "t \xc2\xb2", (const int64_t[]){221, 127, 111}, 3);
    check_pre_split(split("[\\w]+", "Removed"), "a\xc2\xa0\xe1\xa0\x8e\xc2\xb2",
                    (const int64_t[]){127, 255, 158, 255, 237, 127, 111}, 7);
    check_pre_split(split("\\w+", "Removed"), " \xcc\x81" "d\x0bx", (const int64_t[]){221, 200}, 2);
    check_pre_split(split("\\s+", "Removed"), "\xe1\xa0\x8e" "1n", (const int64_t[]){158, 255, 237, 17, 78}, 5);
    check_pre_split(split("\\h+|\\v", "Isolated"), "dtheh", (const int64_t[]){68, 298, 69, 72}, 4);
    /* \uHHHH is a code point (PCRE2 would refuse it); an escaped backslash before u is not */
    check_pre_split(split("[\\u00e9x]+|\\u0041", "Removed"), "caf\xc3\xa9 xAB\\u0041",
                    (const int64_t[]){67, 576, 221, 34, 60, 85, 16, 800, 17}, 9);
    check_pre_split(json_pack("{s:s}", "type", "Whitespace"), "e\xcc\x81x x\xc2\xb2! a\xe1\xa0\x8e!",
                    (const int64_t[]){69, 137, 224, 88, 88, 127, 111, 1, 65, 158, 255, 237, 1}, 13);
    /* Whitespace runs on Rust's regex crate, whose \w (Word) holds U+200D: the joiner
     * goes with the letters, not with the emoji after it */
    check_pre_split(json_pack("{s:s}", "type", "Whitespace"), "\xe2\x80\x8d\xf0\x9f\x8c\x88 the\xe2\x80\x8dthe",
                    (const int64_t[]){440, 236, 315, 235, 231, 452, 440, 236, 452}, 9);
    /* \b, shown by a Replace normalizer writing "|" at each boundary (none at the
     * start: there tokenizers' encode writes it twice, docs/tokenizer.md) */
    char path[] = "/tmp/accel_tok_b_XXXXXX";
    accel_tokenizer *t = load_edited("gpt2", "normalizer",
                                     json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "Regex", "\\b",
                                               "content", "|"), path);
    unlink(path);
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (t) check_ids(t, "!x\xc2\xb2 e\xcc\x81!", 9, (const int64_t[]){1, 92, 88, 127, 111, 92, 221, 92, 69, 137, 224, 92, 1}, 13, NULL);
    accel_tokenizer_free(t);
    /* GPT-2's own pattern: U+180E is not \s, so it joins the punctuation before it */
    t = accel_tokenizer_load("data/tokenizers/gpt2");
    CHECK(t != NULL);
    if (t) check_ids(t, "!\xe1\xa0\x8e a\xe1\xa0\x8e", 9, (const int64_t[]){1, 158, 255, 237, 259, 158, 255, 237}, 8, NULL);
    accel_tokenizer_free(t);
    /* what Oniguruma means and PCRE2 cannot say is refused, naming it */
    static const char *const refused[][2] = {
        {"[[:alpha:]]", "a POSIX bracket class"}, {"[^\\W\\d]", "\\W inside a bracket class"},
        {"[\\H]", "\\H inside a bracket class"}, {"x\\V", "\\V"}, {"[a[b]]", "a nested bracket class"},
        {"[a-z&&[^aeiou]]", "a class intersection (&&)"},
        /* a "[" that opens no class (a comment, \c[), \Q..\E (letters to Oniguruma), a range from a
         * class escape: each read otherwise by PCRE2 (a reviewer's finds) */
        {"(?#[)\\w", "a comment group (?#...)"}, {"(?ix) [a] \\w", "the extended mode (?x)"},
        {"\\c[\\w", "\\c"}, {"\\Qa\\E", "\\Q"}, {"[\\h-z]", "a range from \\h in a bracket class"},
        {"[^\\w-z]", "a range from \\w in a bracket class"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        check_refused("pre_tokenizer", split(refused[i][0], "Isolated"), ACCEL_ERR_UNSUPPORTED, refused[i][1]);
}

/* BertNormalizer's clean_text drops control characters as the reference's
 * Unicode 8.0 tables have them: unassigned code points (U+05C9) and format
 * characters assigned since (U+0890, U+110CD) stay, and are unknown here;
 * U+00AD, U+200B, private use U+E000 go (ids of tokenizers 0.23.3). */
static void test_bert_control(void) {
    accel_tokenizer *t = accel_tokenizer_load("data/tokenizers/bert");
    CHECK(t != NULL);
    if (!t) return;
    check_ids(t, "a\xd7\x89" "b", 4, (const int64_t[]){1}, 1, NULL);
    check_ids(t, "a\xe0\xa2\x90" "b x\xf0\x91\x83\x8dy", 12, (const int64_t[]){1, 1}, 2, NULL);
    check_ids(t, "a\xc2\xad" "b\xe2\x80\x8b" "c\xee\x80\x80" "d", 12, (const int64_t[]){218, 131, 132}, 3, NULL);
    accel_tokenizer_free(t);
}

/* The reference's Unicode 8.0-era punctuation and mark tables
 * (tok_unicode_lag.h): U+111C9 and U+166D are punctuation to BertPreTokenizer,
 * U+061D (assigned since) is not; StripAccents drops U+1CF2 and U+1DE6, keeps
 * U+111C9 and U+07FD (ids of tokenizers 0.23.3). */
static void test_unicode_tables(void) {
    static const char text[] = "a\xf0\x91\x87\x89" "b \xe1\x99\xad\xe1\x9a\x9a x\xd8\x9dy";
    static const char marks[] = "e\xe1\xb3\xb2 x\xf0\x91\x87\x89 \xdf\xbd\xe1\xb7\xa6";
    accel_tokenizer *bert = accel_tokenizer_load("data/tokenizers/bert"), *misc1 = accel_tokenizer_load("data/tokenizers/misc1");
    CHECK(bert && misc1);
    if (bert) check_ids(bert, text, sizeof text - 1, (const int64_t[]){21, 1, 22, 1, 1, 1}, 6, NULL);
    if (misc1) {
        check_ids(misc1, text, sizeof text - 1, (const int64_t[]){18, 0, 19, 0, 0, 0, 0, 39}, 8, NULL);
        check_ids(misc1, marks, sizeof marks - 1, (const int64_t[]){22, 0, 0, 0}, 4, NULL);
    }
    accel_tokenizer_free(bert);
    accel_tokenizer_free(misc1);
}

/* A random code point (xorshift64 state *x): mostly ASCII, else any scalar
 * value (no surrogates), a third of those from the first planes' scripts. */
static uint32_t random_cp(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    uint32_t r = (uint32_t)(*x >> 32), c;
    switch (r % 4) {
    case 0: case 1: return 0x20 + r / 4 % 0x5F;
    case 2: c = r / 4 % 0x3000; break;
    default: c = r / 4 % 0x110000; break;
    }
    return c >= 0xD800 && c <= 0xDFFF ? c - 0x800 : c;
}

/* Byte-level BPE loses nothing: decode(encode(x)) == x for random UTF-8 (no
 * normalizer in gpt2 and llama3; special tokens spliced in come back as text). */
static void test_byte_level_round_trip(void) {
    static const char *const names[] = {"gpt2", "llama3"};
    for (size_t f = 0; f < 2; f++) {
        char path[64];
        snprintf(path, sizeof path, "data/tokenizers/%s", names[f]);
        accel_tokenizer *t = accel_tokenizer_load(path);
        CHECK(t != NULL);
        if (!t) continue;
        const char *special = f ? "<|eot_id|>" : "<|endoftext|>";
        uint64_t x = 0x9E3779B97F4A7C15u + f;
        int failures = 0;
        for (int i = 0; i < 2000 && failures < 3; i++) {
            tok_buf text = {0};
            int len = (int)(random_cp(&x) % 40);
            for (int k = 0; k < len; k++) {
                uint32_t c = random_cp(&x);
                if (c % 97 == 0) tok_buf_put(&text, special, strlen(special));
                else tok_buf_putc(&text, c);
            }
            int64_t *ids = NULL, n = 0;
            char *back = NULL;
            size_t blen = 0;
            bool ok = accel_tokenizer_encode(t, text.p, text.n, false, &ids, &n) == ACCEL_OK &&
                      accel_tokenizer_decode(t, ids, n, false, &back, &blen) == ACCEL_OK && blen == text.n &&
                      (!blen || !memcmp(back, text.p, blen));
            CHECK_MSG(ok, "%s: random text %d (%zu bytes) does not round-trip: %s", names[f], i, text.n,
                      back ? back : accel_last_error());
            failures += !ok;
            free(ids);
            free(back);
            free(text.p);
        }
        accel_tokenizer_free(t);
    }
}

/* Lowercase and BertNormalizer's lowercase are per character, as the reference's:
 * a word-final capital sigma is σ, not ς (ids of tokenizers 0.23.3). */
static void test_lowercase_sigma(void) {
    static const char *const normalizers[] = {"{\"type\":\"Lowercase\"}",
                                              "{\"type\":\"BertNormalizer\",\"clean_text\":false,\"handle_chinese_chars\""
                                              ":false,\"strip_accents\":false,\"lowercase\":true}"};
    for (size_t i = 0; i < 2; i++) {
        char path[] = "/tmp/accel_tok_lower_XXXXXX";
        accel_tokenizer *t = load_edited("gpt2", "normalizer", json_loads(normalizers[i], 0, NULL), path);
        unlink(path);
        CHECK_MSG(t != NULL, "%s", accel_last_error());
        if (t)
            check_ids(t, "\xce\x9f\xce\x94\xce\x9f\xce\xa3 s\xce\xa3. \xc4\xb0", 16,
                      (const int64_t[]){139, 124, 139, 113, 139, 124, 140, 226, 267, 140, 226, 14, 221, 73, 137, 230}, 16,
                      NULL);
        accel_tokenizer_free(t);
    }
}

/* Two tokenizers at once, freed in either order. */
static void test_two_handles(void) {
    accel_tokenizer *a = accel_tokenizer_load("data/tokenizers/bert"), *b = accel_tokenizer_load("data/tokenizers/llama2");
    CHECK(a && b);
    int64_t *x = NULL, *y = NULL, nx = 0, ny = 0;
    CHECK(accel_tokenizer_encode(a, "hello", 5, true, &x, &nx) == ACCEL_OK);
    CHECK(accel_tokenizer_encode(b, "hello", 5, true, &y, &ny) == ACCEL_OK);
    CHECK(nx >= 3 && x[0] == accel_tokenizer_token_to_id(a, "[CLS]") && x[nx - 1] == accel_tokenizer_token_to_id(a, "[SEP]"));
    CHECK(ny >= 2 && y[0] == accel_tokenizer_token_to_id(b, "<s>"));
    accel_tokenizer_free(a);
    free(x);
    accel_tokenizer_free(b);
    free(y);
}

/* examples/generate goes text to text on a Hub-style directory: a tiny random
 * Llama over the llama3 fixture's vocabulary with its tokenizer.json. */
static void test_generate_text(void) {
    char gen[8192], dir[] = "/tmp/accel_tok_model_XXXXXX", cmd[16384];
    if (!sibling_exe("generate", gen, sizeof gen)) {
        CHECK(!"generate is built next to the tests");
        return;
    }
    CHECK_MSG(tok_tiny_model(dir, 902), "%s: %s", dir, accel_last_error());
    snprintf(cmd, sizeof cmd, "cp data/tokenizers/llama3/tokenizer.json %s/ && %s %s --prompt 'Hello world' --new-tokens 3 2>&1",
             dir, gen, dir);
    char out[8192];
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    /* BOS then the fixture's ids of "Hello world", then 3 new ids; the text starts with the prompt */
    CHECK_STR_CONTAINS(out, "generated_ids=[0, 40, 69, 76, 76, 79, 423, ");
    CHECK_STR_CONTAINS(out, "text=\"Hello world");
    snprintf(cmd, sizeof cmd, "%s %s --prompt \"$(printf 'bad \\377')\" 2>&1; rc=$?; rm -rf %s; exit $rc", gen, dir, dir);
    CHECK(tok_shell(cmd, out, sizeof out) > 0); /* ran, and failed */
    CHECK_STR_CONTAINS(out, "generate: --prompt: accel_tokenizer_encode: the text is not UTF-8: byte 4");
    snprintf(cmd, sizeof cmd, "%s %s/missing --prompt hi 2>&1", gen, dir); /* dir is gone by now */
    CHECK(tok_shell(cmd, out, sizeof out) > 0); /* ran, and failed */
    CHECK_STR_CONTAINS(out, "/missing: no such file");
}

int main(void) {
    RUN(test_families);
    RUN(test_lookups);
    RUN(test_bad_input);
    RUN(test_refusals);
    RUN(test_reference_edges);
    RUN(test_unigram_edges);
    RUN(test_normalized_added);
    RUN(test_sweep_regex);
    RUN(test_bert_control);
    RUN(test_unicode_tables);
    RUN(test_byte_level_round_trip);
    RUN(test_lowercase_sigma);
    RUN(test_two_handles);
    RUN(test_generate_text);
    return check_summary();
}
