/* SentencePiece tokenizer.model files against the sentencepiece library
 * (fixtures of tools/gen_sentencepiece_fixtures.py: BPE as Llama 2 and Gemma,
 * Unigram with and without byte fallback, Unigram with the nmt_nfkc
 * precompiled charsmap, trained by sentencepiece on a
 * generated multilingual corpus): ids exactly, with and without BOS, decode of
 * the reference's ids and of random ids (control, unknown, bytes making
 * invalid UTF-8), decode(encode(x)) == x where the reference round-trips,
 * invalid UTF-8 as sentencepiece takes it; the loading rules (a snapshot's
 * tokenizer.json first); then hostile files: every malformation named, every
 * truncation and thousands of byte flips without a crash, hang or leak; and
 * examples/generate text to text on a directory with only a tokenizer.model. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "sibling_exe.h"
#include "tok_cases.h"
#include "tokenizer/tok_internal.h"

static const char *const MODELS[] = {"llama2", "gemma", "unigram", "unigram_bf", "nfkc"};

/* A case's text: "text", or "hex" for bytes that are not UTF-8 (malloc'd). */
static char *text_of(json_t *c, size_t *n) {
    json_t *t = json_object_get(c, "text");
    if (t) {
        *n = json_string_length(t);
        char *s = malloc(*n + 1);
        memcpy(s, json_string_value(t), *n + 1);
        return s;
    }
    const char *hex = json_string_value(json_object_get(c, "hex"));
    *n = strlen(hex) / 2;
    char *s = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        s[i] = (char)b;
    }
    return s;
}

/* *got: the decoded text, *len its length (the texts may hold NUL bytes). */
static bool decodes_to(const accel_tokenizer *t, const int64_t *ids, int64_t n, bool skip, const char *want, size_t wn,
                       char **got, size_t *len) {
    *got = NULL;
    return accel_tokenizer_decode(t, ids, n, skip, got, len) == ACCEL_OK && *len == wn && !memcmp(*got, want, wn);
}

static void check_model(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "data/sentencepiece/%s", name); /* a directory with tokenizer.model only */
    accel_tokenizer *t = accel_tokenizer_load(path);
    CHECK_MSG(t != NULL, "%s: %s", name, accel_last_error());
    snprintf(path, sizeof path, "data/sentencepiece/%s/expected.json", name);
    json_error_t err;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &err);
    CHECK_MSG(root != NULL, "%s: %s", path, err.text);
    if (!t || !root) {
        accel_tokenizer_free(t);
        json_decref(root);
        return;
    }
    int64_t bos = json_integer_value(json_object_get(root, "bos"));
    CHECK(accel_tokenizer_vocab_size(t) == json_integer_value(json_object_get(root, "vocab_size")));
    json_t *c;
    size_t i;
    int failures = 0, round_trips = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        size_t n;
        char *text = text_of(c, &n), *out = NULL;
        json_t *want = json_object_get(c, "ids");
        for (int special = 0; special <= 1; special++)
            tok_check_encode(t, name, text, n, special, want, special ? bos : -1, &failures);
        /* the reference's ids decode to the reference's text; where that is the input, it round-trips */
        int64_t m, *ref = tok_ids_of(want, &m);
        json_t *dec = json_object_get(c, "decoded");
        size_t len = 0;
        CHECK_MSG(decodes_to(t, ref, m, true, json_string_value(dec), json_string_length(dec), &out, &len),
                  "%s: decode of \"%.60s\": got \"%.80s\", want \"%.80s\"", name, text, out ? out : accel_last_error(),
                  json_string_value(dec));
        if (json_is_true(json_object_get(c, "round_trips"))) {
            round_trips++;
            CHECK(out && len == n && !memcmp(out, text, n));
        }
        free(out);
        free(ref);
        free(text);
    }
    CHECK(round_trips > 40);
    json_array_foreach(json_object_get(root, "decode_cases"), i, c) {
        int64_t m, *ids = tok_ids_of(json_object_get(c, "ids"), &m);
        json_t *dec = json_object_get(c, "decoded");
        char *out = NULL;
        size_t len = 0;
        CHECK_MSG(decodes_to(t, ids, m, true, json_string_value(dec), json_string_length(dec), &out, &len),
                  "%s: decode_cases[%zu]: got \"%.80s\", want \"%.80s\"", name, i, out ? out : accel_last_error(),
                  json_string_value(dec));
        free(out);
        free(ids);
    }
    json_decref(root);
    accel_tokenizer_free(t);
}

/* FNV-1a 64 of the ids' 4-byte little-endian values (tools/gen_spm_score_fixtures.py's). */
static uint64_t fnv1a64(const int64_t *ids, int64_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ ((uint64_t)(uint32_t)ids[i] >> (8 * b) & 0xFF)) * 0x100000001B3ull;
    return h;
}

/* sentencepiece 0.2.3's Unigram arithmetic where it decides the segmentation
 * (data/sentencepiece/unigram_bf/scores.json, tools/gen_spm_score_fixtures.py):
 * a tie of float sums after a long prefix holding a user-defined piece (whose
 * bonus is 0.1 a byte past the first), and a text whose path score passes
 * -100000, where the scores move back to 0. */
static void test_score_arithmetic(void) {
    accel_tokenizer *t = accel_tokenizer_load("data/sentencepiece/unigram_bf");
    json_error_t err;
    json_t *root = json_load_file("data/sentencepiece/unigram_bf/scores.json", 0, &err);
    CHECK_MSG(t && root, "%s", t ? err.text : accel_last_error());
    json_t *c;
    size_t i;
    int failures = 0, cases = 0;
    json_array_foreach(root ? json_object_get(root, "cases") : NULL, i, c) {
        size_t n;
        char *text = text_of(c, &n);
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *want = json_object_get(c, "ids");
        if (want) {
            tok_check_encode(t, name, text, n, false, want, -1, &failures);
        } else {
            int64_t *ids = NULL, m = 0;
            CHECK_MSG(accel_tokenizer_encode(t, text, n, false, &ids, &m) == ACCEL_OK, "%s", accel_last_error());
            char hash[17];
            snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a64(ids, m));
            CHECK_MSG(m == json_integer_value(json_object_get(c, "n_ids")) &&
                          !strcmp(hash, json_string_value(json_object_get(c, "fnv1a64"))),
                      "%s: %lld ids, hash %s; sentencepiece: %lld, %s", name, (long long)m, hash,
                      (long long)json_integer_value(json_object_get(c, "n_ids")),
                      json_string_value(json_object_get(c, "fnv1a64")));
            free(ids);
        }
        cases++;
        free(text);
    }
    CHECK(cases == 2 && failures == 0);
    json_decref(root);
    accel_tokenizer_free(t);
}

static void test_models(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) check_model(MODELS[i]);
}

/* Lookups, special tokens, decode with special tokens kept, and where a
 * tokenizer.model is taken from. */
static void test_lookups_and_loading(void) {
    accel_tokenizer *t = accel_tokenizer_load("data/sentencepiece/llama2/tokenizer.model");
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (!t) return;
    int64_t bos = accel_tokenizer_token_to_id(t, "<s>"), eos = accel_tokenizer_token_to_id(t, "</s>");
    CHECK(bos == 1 && eos == 2 && accel_tokenizer_token_to_id(t, "<unk>") == 0);
    CHECK(accel_tokenizer_is_special(t, bos) && accel_tokenizer_is_special(t, eos) && !accel_tokenizer_is_special(t, 0));
    CHECK(!strcmp(accel_tokenizer_id_to_token(t, 3), "<0x00>") && !accel_tokenizer_is_special(t, 3));
    CHECK(accel_tokenizer_token_to_id(t, "no such piece") == -1 && accel_tokenizer_id_to_token(t, 1000) == NULL);
    int64_t *ids = NULL, n = 0;
    CHECK(accel_tokenizer_encode(t, "Hello world", 11, true, &ids, &n) == ACCEL_OK && n >= 2 && ids[0] == bos);
    /* the control piece written out when kept: the first word's space then stays */
    char *s = NULL;
    CHECK(ids && accel_tokenizer_decode(t, ids, n, false, &s, NULL) == ACCEL_OK);
    CHECK_MSG(s && !strcmp(s, "<s> Hello world"), "decoded \"%s\"", s ? s : accel_last_error());
    free(s);
    CHECK(ids && accel_tokenizer_decode(t, ids, n, true, &s, NULL) == ACCEL_OK);
    CHECK_MSG(s && !strcmp(s, "Hello world"), "decoded \"%s\"", s ? s : accel_last_error());
    free(s);
    free(ids);
    int64_t bad[] = {5, 1000};
    CHECK(accel_tokenizer_decode(t, bad, 2, false, &s, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "ids[1] = 1000 is not in the vocabulary");
    CHECK(accel_tokenizer_encode(t, NULL, 0, true, &ids, &n) == ACCEL_OK && n == 1 && ids[0] == bos);
    free(ids);
    CHECK(accel_tokenizer_encode(t, "", 0, false, &ids, &n) == ACCEL_OK && n == 0 && ids == NULL);
    CHECK(accel_tokenizer_decode(t, NULL, 0, true, &s, NULL) == ACCEL_OK && s && !*s);
    free(s);
    accel_tokenizer_free(t);

    /* Gemma's BOS is <bos>, id 2 */
    t = accel_tokenizer_load("data/sentencepiece/gemma");
    CHECK(t && accel_tokenizer_encode(t, "hi", 2, true, &ids, &n) == ACCEL_OK && n >= 2 && ids[0] == 2);
    if (t) free(ids);
    accel_tokenizer_free(t);

    /* a snapshot with both files: tokenizer.json wins, as transformers'; with neither, both are named */
    char dir[] = "/tmp/accel_spm_dir_XXXXXX", cmd[512];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "cp data/tokenizers/gpt2/tokenizer.json data/sentencepiece/llama2/tokenizer.model %s/", dir);
    CHECK(system(cmd) == 0);
    t = accel_tokenizer_load(dir);
    CHECK(t && accel_tokenizer_vocab_size(t) == 900); /* gpt2's */
    accel_tokenizer_free(t);
    snprintf(cmd, sizeof cmd, "rm %s/tokenizer.json %s/tokenizer.model", dir, dir);
    CHECK(system(cmd) == 0);
    CHECK(accel_tokenizer_load(dir) == NULL && accel_last_status() == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "/tokenizer.json nor ");
    CHECK_STR_CONTAINS(accel_last_error(), "/tokenizer.model exists");
    /* a directory named like a model file; a missing one */
    snprintf(cmd, sizeof cmd, "%s/x.model", dir);
    CHECK(mkdir(cmd, 0700) == 0);
    CHECK(accel_tokenizer_load(cmd) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "neither");
    rmdir(cmd);
    rmdir(dir);
    CHECK(accel_tokenizer_load("/nonexistent/tokenizer.model") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "/nonexistent/tokenizer.model: no such file");
}

/* ------------------------------------------------------------ hostile files */

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n + 64);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

/* The fixture `model`'s bytes with `extra` appended (protobuf merges a
 * repeated message field: an appended piece is one more piece, an appended
 * trainer_spec overrides its fields), written to a file and loaded: the
 * error must contain needle and the file's name. */
static void check_appended(const char *model, const void *extra, size_t n_extra, accel_status code, const char *needle) {
    char src[128], path[] = "/tmp/accel_spm_XXXXXX.model";
    snprintf(src, sizeof src, "data/sentencepiece/%s/tokenizer.model", model);
    size_t n = 0;
    uint8_t *b = read_all(src, &n);
    CHECK(b && n);
    if (!b) return;
    int fd = mkstemps(path, 6);
    CHECK(fd >= 0 && write(fd, b, n) == (ssize_t)n && write(fd, extra, n_extra) == (ssize_t)n_extra);
    close(fd);
    free(b);
    accel_tokenizer *t = accel_tokenizer_load(path);
    CHECK_MSG(t == NULL && accel_last_status() == code, "%s + %s: loaded or wrong status: %s", model, needle,
              accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    accel_tokenizer_free(t);
    unlink(path);
}

#define APPEND(model, bytes, code, needle) check_appended(model, bytes, sizeof bytes - 1, code, needle)

/* Models trained by sentencepiece as CHAR and WORD (tools/gen_sentencepiece_fixtures.py):
 * refused at load naming the type, never run as Unigram. */
static void test_char_word_refused(void) {
    static const struct {
        const char *path, *needle;
    } cases[] = {{"data/sentencepiece/char/tokenizer.model", "model_type 4 (CHAR) is not supported"},
                 {"data/sentencepiece/word", "model_type 3 (WORD) is not supported"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        accel_tokenizer *t = accel_tokenizer_load(cases[i].path);
        CHECK_MSG(t == NULL && accel_last_status() == ACCEL_ERR_UNSUPPORTED, "%s: loaded or wrong status: %s",
                  cases[i].path, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), cases[i].needle);
        CHECK_STR_CONTAINS(accel_last_error(), "/sentencepiece/");
        accel_tokenizer_free(t);
    }
}

static void test_refusals(void) {
    /* a broken normalizer_spec.precompiled_charsmap: too short, a trie past its end or not of whole units;
     * a denormalizer's is not implemented */
    APPEND("unigram", "\x1a\x04\x12\x02xy", ACCEL_ERR_FORMAT, "precompiled_charsmap is broken: 2 bytes");
    APPEND("unigram", "\x1a\x0a\x12\x08\x08\x00\x00\x00" "abcd", ACCEL_ERR_FORMAT, "a trie of 8 bytes");
    APPEND("unigram", "\x1a\x0a\x12\x08\x03\x00\x00\x00" "abcd", ACCEL_ERR_FORMAT, "a trie of 3 bytes");
    APPEND("unigram", "\x2a\x04\x12\x02xy", ACCEL_ERR_UNSUPPORTED, "denormalizer_spec.precompiled_charsmap is set");
    /* trainer_spec { model_type: WORD }, { treat_whitespace_as_suffix: true } */
    APPEND("llama2", "\x12\x02\x18\x03", ACCEL_ERR_UNSUPPORTED, "model_type 3 (WORD) is not supported");
    APPEND("llama2", "\x12\x02\x18\x07", ACCEL_ERR_UNSUPPORTED, "model_type 7 (not a ModelType)");
    APPEND("llama2", "\x12\x03\xc0\x01\x01", ACCEL_ERR_UNSUPPORTED, "treat_whitespace_as_suffix");
    /* pieces: a duplicate, a second unknown one, bytes where there is no byte fallback or not <0xXX>,
     * an empty one, a type out of range, a NUL, not UTF-8 */
    APPEND("llama2", "\x0a\x05\x0a\x03<s>\x0a\x07\x0a\x03<s>\x18\x03", ACCEL_ERR_FORMAT, "piece 1001 \"<s>\" is already defined");
    APPEND("llama2", "\x0a\x07\x0a\x03<u>\x18\x02", ACCEL_ERR_FORMAT, "a second unknown piece (the first is 0)");
    APPEND("unigram", "\x0a\x0a\x0a\x06<0x41>\x18\x06", ACCEL_ERR_FORMAT, "although trainer_spec.byte_fallback is false");
    APPEND("llama2", "\x0a\x0a\x0a\x06<0x4g>\x18\x06", ACCEL_ERR_FORMAT, "is not <0xXX>");
    APPEND("llama2", "\x0a\x02\x0a\x00", ACCEL_ERR_FORMAT, "piece 1000 is empty");
    APPEND("llama2", "\x0a\x05\x0a\x01q\x18\x09", ACCEL_ERR_FORMAT, "piece type 9 is not a SentencePiece.Type");
    APPEND("llama2", "\x0a\x05\x0a\x03q\x00r", ACCEL_ERR_FORMAT, "pieces.piece holds a NUL byte");
    APPEND("llama2", "\x0a\x04\x0a\x02\xc3\x28", ACCEL_ERR_FORMAT, "piece 1000 is not UTF-8");
    /* wire format: a wrong wire type, a group, an endless varint, a length past the end, a short float */
    APPEND("llama2", "\x08\x01", ACCEL_ERR_FORMAT, "a ModelProto field has wire type 0, not 2");
    APPEND("llama2", "\x0a\x03\x10\x01\x00", ACCEL_ERR_FORMAT, "pieces.score has wire type 0, not 5");
    APPEND("llama2", "\x0b", ACCEL_ERR_FORMAT, "wire type 3");
    APPEND("llama2", "\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", ACCEL_ERR_FORMAT, "a varint longer than 10 bytes");
    APPEND("llama2", "\x0a\xff\xff\xff\xff\x0f", ACCEL_ERR_FORMAT, "runs past the end of its message");
    APPEND("llama2", "\x0a\x02\x15\x00", ACCEL_ERR_FORMAT, "a score runs past its piece");
    /* a NaN and an infinite score (sentencepiece: "score is NaN or Inf") */
    APPEND("llama2", "\x0a\x08\x0a\x01q\x15\x00\x00\xc0\x7f", ACCEL_ERR_FORMAT, "a piece's score is NaN or infinite");
    APPEND("unigram", "\x0a\x08\x0a\x01q\x15\x00\x00\x80\xff", ACCEL_ERR_FORMAT, "a piece's score is NaN or infinite");
    APPEND("llama2", "\xf8", ACCEL_ERR_FORMAT, "a varint runs past the end of its message");
    /* no pieces; no unknown piece; byte_fallback with bytes missing */
    tok_spm *m = tok_spm_parse("empty", (const uint8_t *)"", 0);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "empty: no pieces");
    m = tok_spm_parse("one", (const uint8_t *)"\x0a\x03\x0a\x01" "a", 5);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "one: no piece of type UNKNOWN");
    m = tok_spm_parse("bf", (const uint8_t *)"\x0a\x07\x0a\x03<u>\x18\x02\x12\x03\x98\x02\x01", 14);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "bf: byte_fallback is set but piece <0x00> is missing");
    /* the smallest model: one unknown piece; everything is unknown, merged into one id */
    m = tok_spm_parse("unk", (const uint8_t *)"\x0a\x07\x0a\x03<u>\x18\x02", 9);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    tok_ids ids = {0};
    CHECK(m && tok_spm_encode(m, "ab c", 4, &ids) && ids.n == 1 && ids.v[0] == 0);
    free(ids.v);
    tok_spm_free(m);
}

/* Every truncation of a model, and random byte flips of another: a clear
 * error or a tokenizer that encodes and decodes; never a crash (ASan), a
 * hang (ctest's timeout) or a leak. */
static void test_fuzz(void) {
    size_t n = 0;
    uint8_t *b = read_all("data/sentencepiece/unigram_bf/tokenizer.model", &n);
    CHECK(b && n > 1000);
    if (!b) return;
    static const char text[] = "Hello wörld 東京 😀 12345 <s> <mask> \t\n  end \xff\xc3";
    int loaded = 0, refused = 0;
    for (size_t k = 0; k <= n; k += k < 300 || k + 300 > n ? 1 : 7) {
        tok_spm *m = tok_spm_parse("cut", b, k);
        if (!m) {
            refused++;
            CHECK_MSG(strstr(accel_last_error(), "cut: ") != NULL, "%zu bytes: \"%s\"", k, accel_last_error());
            continue;
        }
        loaded++;
        tok_ids ids = {0};
        tok_buf out = {0};
        CHECK(tok_spm_encode(m, text, sizeof text - 1, &ids) && tok_spm_decode(m, ids.v, ids.n, true, &out));
        free(ids.v);
        free(out.p);
        tok_spm_free(m);
    }
    CHECK(loaded > 0 && refused > 0);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    uint8_t *f = malloc(n);
    for (int round = 0; round < 3000; round++) {
        memcpy(f, b, n);
        for (int j = 0; j < 1 + round % 4; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            f[x % n] = (uint8_t)(x >> 40);
        }
        tok_spm *m = tok_spm_parse("flip", f, n);
        if (!m) continue;
        tok_ids ids = {0};
        tok_buf out = {0};
        bool ok = tok_spm_encode(m, text, sizeof text - 1, &ids);
        for (size_t i = 0; ok && i < ids.n; i++) ok = ids.v[i] >= 0 && ids.v[i] < m->n;
        CHECK(ok && tok_spm_decode(m, ids.v, ids.n, round % 2, &out));
        free(ids.v);
        free(out.p);
        tok_spm_free(m);
    }
    free(f);
    free(b);
    /* byte flips inside the precompiled charsmap (a trie and strings read with every index checked) */
    b = read_all("data/sentencepiece/nfkc/tokenizer.model", &n);
    CHECK(b && n > 200000);
    if (!b) return;
    f = malloc(n);
    static const char nfkc_text[] = "ＡＢＣ ﬁ ① Ⅻ \u3000x\t\ty ｶﾞ é ǅ 😀 \xc3 end";
    int loaded_flipped = 0;
    for (int round = 0; round < 300; round++) {
        memcpy(f, b, n);
        for (int j = 0; j < 8; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            f[n - 1 - x % 240000] = (uint8_t)(x >> 40); /* the charsmap is the file's bulk, at its end */
        }
        tok_spm *m = tok_spm_parse("flip", f, n);
        if (!m) continue;
        loaded_flipped++;
        tok_ids ids = {0};
        tok_buf out = {0};
        CHECK(tok_spm_encode(m, nfkc_text, sizeof nfkc_text - 1, &ids) && tok_spm_decode(m, ids.v, ids.n, true, &out));
        free(ids.v);
        free(out.p);
        tok_spm_free(m);
    }
    CHECK(loaded_flipped > 0);
    free(f);
    free(b);
}

/* examples/generate goes text to text on a Hub-style directory holding only
 * config.json, the weights and a SentencePiece tokenizer.model: a tiny random
 * Llama over the llama2 fixture's 1000 pieces. */
static void test_generate_text(void) {
    char gen[8192], dir[] = "/tmp/accel_spm_model_XXXXXX", cmd[16384];
    if (!sibling_exe("generate", gen, sizeof gen)) {
        CHECK(!"generate is built next to the tests");
        return;
    }
    CHECK_MSG(tok_tiny_model(dir, 1000), "%s: %s", dir, accel_last_error());
    /* the prompt's ids: BOS, then the fixture's ids of "Hello world" */
    accel_tokenizer *t = accel_tokenizer_load("data/sentencepiece/llama2");
    int64_t *ids = NULL, n = 0;
    CHECK(t && accel_tokenizer_encode(t, "Hello world", 11, true, &ids, &n) == ACCEL_OK && n >= 2);
    char want[256] = "generated_ids=[";
    for (int64_t i = 0; ids && i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%lld, ", (long long)ids[i]);
    free(ids);
    accel_tokenizer_free(t);
    snprintf(cmd, sizeof cmd,
             "cp data/sentencepiece/llama2/tokenizer.model %s/ && %s %s --prompt 'Hello world' --new-tokens 3 2>&1; "
             "rc=$?; rm -rf %s; exit $rc", dir, gen, dir, dir);
    char out[8192];
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    CHECK_STR_CONTAINS(out, want);
    CHECK_STR_CONTAINS(out, "text=\"Hello world");
}

int main(void) {
    RUN(test_models);
    RUN(test_score_arithmetic);
    RUN(test_lookups_and_loading);
    RUN(test_char_word_refused);
    RUN(test_refusals);
    RUN(test_fuzz);
    RUN(test_generate_text);
    return check_summary();
}
