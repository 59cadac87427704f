/* Fuzz target: the tokenizer.json loader and the encode/decode pipeline.
 *
 * Input: a byte string. If it starts with 'J', the rest is loaded as a
 * tokenizer.json (from memory); if with 'S', as a SentencePiece
 * tokenizer.model: a tokenizer it accepts encodes and decodes a fixed
 * multilingual text. Otherwise the input is text: each fixture tokenizer of
 * tests/data/tokenizers encodes it (invalid UTF-8 must be refused, nothing
 * else) and decodes the ids; the byte-level gpt2 pipeline, which has no
 * normalizer, must give the text back byte for byte (special tokens kept).
 * Each SentencePiece fixture of tests/data/sentencepiece encodes any bytes
 * (as sentencepiece, invalid UTF-8 included) and decodes its ids. An input
 * starting with 'T' is a chat template: one that loads renders a fixed
 * conversation with tools to text or to an error of its own, never a crash.
 *
 * Built as fuzz_safetensors.c is (tests/tokenizer.cmake): a libFuzzer target
 * with clang, else a replay driver over a seed folder (tests/fuzz_replay.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "tokenizer/tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const FAMILIES[] = {"gpt2", "llama3", "qwen2", "llama2", "bert", "mistral", "misc1", "misc2", "unigram", "t5"};
enum { N_FAMILIES = sizeof FAMILIES / sizeof *FAMILIES };

static const char *const SPM_MODELS[] = {"llama2", "gemma", "unigram", "unigram_bf", "nfkc"};
enum { N_SPM = sizeof SPM_MODELS / sizeof *SPM_MODELS };

/* The SentencePiece fixtures, loaded once (ACCEL_FUZZ_SENTENCEPIECE: their folder,
 * default data/sentencepiece). */
static accel_tokenizer **spm_fixtures(void) {
    static accel_tokenizer *t[N_SPM];
    static bool loaded;
    if (loaded) return t;
    loaded = true;
    const char *dir = getenv("ACCEL_FUZZ_SENTENCEPIECE");
    for (int i = 0; i < N_SPM; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir ? dir : "data/sentencepiece", SPM_MODELS[i]);
        if (!(t[i] = accel_tokenizer_load(path))) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", accel_last_error());
            abort();
        }
    }
    return t;
}

/* A model that loaded encodes any bytes to ids in its vocabulary, which decode. */
static void spm_round_trip(const tok_spm *m, const char *text, size_t n) {
    tok_ids ids = {0};
    tok_buf out = {0};
    if (!tok_spm_encode(m, text, n, &ids)) abort(); /* out of memory: not on these sizes */
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || ids.v[i] >= m->n) {
            fprintf(stderr, "fuzz_tokenizer: SentencePiece id %lld outside the vocabulary\n", (long long)ids.v[i]);
            abort();
        }
    if (!tok_spm_decode(m, ids.v, ids.n, true, &out)) abort();
    free(ids.v);
    free(out.p);
}

/* The fixtures, loaded once (ACCEL_FUZZ_TOKENIZERS: their folder, default data/tokenizers). */
static accel_tokenizer **fixtures(void) {
    static accel_tokenizer *t[N_FAMILIES];
    static bool loaded;
    if (loaded) return t;
    loaded = true;
    const char *dir = getenv("ACCEL_FUZZ_TOKENIZERS");
    for (int i = 0; i < N_FAMILIES; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir ? dir : "data/tokenizers", FAMILIES[i]);
        if (!(t[i] = accel_tokenizer_load(path))) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", accel_last_error());
            abort();
        }
    }
    return t;
}

/* Encodes (with special tokens) and decodes; returns the decoded text
 * (malloc'd) or NULL after a refusal. A real tokenizer (`real`) encodes
 * every valid text; a fuzzed tokenizer.json may refuse one with an error (a
 * Unigram model without unk_id meeting a character it lacks: the tokenizers
 * library refuses it too). */
static char *round_trip(const accel_tokenizer *t, const char *text, size_t n, bool skip_special, bool real,
                        size_t *len) {
    int64_t *ids = NULL, k = 0;
    if (accel_tokenizer_encode(t, text, n, true, &ids, &k) != ACCEL_OK) {
        if (real && tok_utf8_invalid_at(text, n) == n) { /* valid text must always encode */
            fprintf(stderr, "fuzz_tokenizer: valid UTF-8 refused: %s\n", accel_last_error());
            abort();
        }
        return NULL;
    }
    char *out = NULL;
    if (accel_tokenizer_decode(t, ids, k, skip_special, &out, len) != ACCEL_OK) {
        fprintf(stderr, "fuzz_tokenizer: decode of its own ids failed: %s\n", accel_last_error());
        abort();
    }
    free(ids);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'J') {
        accel_tokenizer *t = tok_load_json_text("fuzz/tokenizer.json", (const char *)data + 1, size - 1);
        static const char text[] = "Hello wörld 東京 😀 12345 <s> [CLS] \t\n  end";
        size_t len;
        if (t) free(round_trip(t, text, sizeof text - 1, true, false, &len));
        accel_tokenizer_free(t);
        accel_clear_error();
        return 0;
    }
    if (size > 0 && data[0] == 'T') {
        accel_chat_template *ct = accel_chat_template_new((const char *)data + 1, size - 1);
        static const char vars[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
                                   "\"content\": \"Hello {{ x }}\"}, {\"role\": \"assistant\", \"content\": \"<think>r</think>a\", "
                                   "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}], "
                                   "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                                   "\"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";
        char *text = NULL;
        if (ct && accel_chat_template_render_json(ct, vars, sizeof vars - 1, &text, NULL) != ACCEL_OK &&
            !strstr(accel_last_error(), "chat template")) {
            fprintf(stderr, "fuzz_tokenizer: a render failed without its own message: %s\n", accel_last_error());
            abort();
        }
        free(text);
        accel_chat_template_free(ct);
        accel_clear_error();
        return 0;
    }
    if (size > 0 && data[0] == 'S') {
        tok_spm *m = tok_spm_parse("fuzz/tokenizer.model", data + 1, size - 1);
        static const char text[] = "Hello wörld 東京 😀 12345 <s> <mask> \t\n  end \xff\xc3";
        if (m) spm_round_trip(m, text, sizeof text - 1);
        tok_spm_free(m);
        accel_clear_error();
        return 0;
    }
    accel_tokenizer **sp = spm_fixtures();
    for (int i = 0; i < N_SPM; i++) spm_round_trip(sp[i]->spm, (const char *)data, size);
    accel_tokenizer **t = fixtures();
    for (int i = 0; i < N_FAMILIES; i++) {
        size_t len = 0;
        char *out = round_trip(t[i], (const char *)data, size, i != 0, true, &len);
        if (out && i == 0 && (len != size || memcmp(out, data, size))) {
            fprintf(stderr, "fuzz_tokenizer: gpt2 decode(encode(x)) != x (%zu bytes in, %zu out)\n", size, len);
            abort();
        }
        free(out);
    }
    accel_clear_error();
    return 0;
}

#define FUZZ_NAME "fuzz_tokenizer"
#define FUZZ_DEFAULT_SEEDS "data/fuzz_seeds_tokenizer"
#include "fuzz_replay.h"
