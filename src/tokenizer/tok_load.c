/* tokenizer.json -> the components of tok_internal.h. Every field a component
 * reads is checked for its type; an unknown component type, or an option this
 * implementation does not honour, fails the load naming the file and the JSON
 * path of the field (never a silent approximation). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../io/io_internal.h"
#include "core/core_internal.h"
#include "tok_internal.h"

/* The JSON path of the field being read, for messages: "normalizer.normalizers[1].type". */
typedef struct ctx {
    const char *path;
} ctx;

static bool fail(const ctx *c, accel_status st, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail(const ctx *c, accel_status st, const char *where, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    accel_set_error(st, "%s: %s: %s", c->path, where, msg);
    return false;
}

static bool oom(const ctx *c, const char *where) { return fail(c, ACCEL_ERR_OOM, where, "out of memory"); }

/* Optional fields: absent or null gives the default; a wrong type is an error. */
static bool get_bool(const ctx *c, json_t *o, const char *key, bool dflt, bool *out, const char *where) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return *out = dflt, true;
    if (!json_is_boolean(v)) return fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return true;
}

static const char *get_str(const ctx *c, json_t *o, const char *key, const char *where, bool required) {
    json_t *v = json_object_get(o, key);
    if ((!v || json_is_null(v)) && !required) return NULL;
    if (!json_is_string(v)) {
        fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" must be a string", key);
        return NULL;
    }
    return json_string_value(v);
}

/* A string field holding exactly one character (a Rust char in the reference):
 * an empty one would make the pieces that search for it loop forever. */
static const char *get_char(const ctx *c, json_t *o, const char *key, const char *where, uint32_t *cp) {
    const char *s = get_str(c, o, key, where, true);
    uint32_t ignored;
    size_t n = s ? strlen(s) : 0;
    if (s && (!n || tok_utf8_next(s, n, cp ? cp : &ignored) != n)) {
        fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" must be one character", key);
        return NULL;
    }
    return s;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Fields that must be absent, null or false for this implementation to be exact. */
static bool refuse_set(const ctx *c, json_t *o, const char *key, const char *where) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v) || json_is_false(v)) return true;
    if (json_is_string(v) && !*json_string_value(v)) return true;
    return fail(c, ACCEL_ERR_UNSUPPORTED, where, "\"%s\" is set, which accel's tokenizer does not implement", key);
}

/* {"String": s} or {"Regex": r} */
static pcre2_code *pattern_of(const ctx *c, json_t *o, const char *where) {
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) return tok_regex_compile(json_string_value(s), TOK_RE_STRING, c->path, where);
    if (json_is_string(r)) return tok_regex_compile(json_string_value(r), TOK_RE_ONIGURUMA, c->path, where);
    fail(c, ACCEL_ERR_FORMAT, where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
    return NULL;
}

static const char *type_of(const ctx *c, json_t *o, const char *where) {
    if (!json_is_object(o)) {
        fail(c, ACCEL_ERR_FORMAT, where, "must be an object");
        return NULL;
    }
    return get_str(c, o, "type", where, true);
}

/* ------------------------------------------------------------ normalizers */

static bool load_normalizer(const ctx *c, json_t *o, tok_normalizer *nz, const char *where);

static bool load_seq(const ctx *c, json_t *o, const char *key, const char *where, size_t elem, void **out, int *n,
                     bool (*one)(const ctx *, json_t *, void *, const char *)) {
    json_t *arr = json_object_get(o, key);
    if (!json_is_array(arr)) return fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" must be an array", key);
    *out = calloc(json_array_size(arr) ? json_array_size(arr) : 1, elem);
    if (!*out) return oom(c, where);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", where, key, i);
        (*n)++; /* counted first: a failing element's partial allocations are freed with the rest */
        if (!one(c, v, (char *)*out + i * elem, sub)) return false;
    }
    return true;
}

static bool one_normalizer(const ctx *c, json_t *o, void *dst, const char *where) {
    return load_normalizer(c, o, dst, where);
}

/* Precompiled: "precompiled_charsmap", SentencePiece's charsmap in base64 (tok_charsmap.c). */
static bool load_precompiled(const ctx *c, json_t *o, tok_normalizer *nz, const char *where) {
    json_t *v = json_object_get(o, "precompiled_charsmap");
    if (!json_is_string(v)) return fail(c, ACCEL_ERR_FORMAT, where, "\"precompiled_charsmap\" must be a string");
    uint8_t *blob;
    size_t n;
    bool oom_;
    if (!tok_base64_decode(json_string_value(v), json_string_length(v), &blob, &n, &oom_))
        return oom_ ? oom(c, where) : fail(c, ACCEL_ERR_FORMAT, where, "\"precompiled_charsmap\" is not base64");
    accel_status st = tok_charsmap_read(&nz->cmap, blob, n);
    uint32_t trie = n > 4 ? (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24 : 0;
    free(blob);
    if (st == ACCEL_ERR_OOM) return oom(c, where);
    if (st != ACCEL_OK)
        return fail(c, ACCEL_ERR_FORMAT, where,
                    "\"precompiled_charsmap\" is broken: %zu bytes, a trie of %u bytes (a non-zero multiple of 4 that fits)",
                    n, trie);
    /* tokenizers reads the replacement strings as a Rust String */
    size_t bad = tok_utf8_invalid_at(nz->cmap.norm, nz->cmap.norm_len);
    if (bad < nz->cmap.norm_len)
        return fail(c, ACCEL_ERR_FORMAT, where, "\"precompiled_charsmap\": its strings are not UTF-8 (byte %zu of them)",
                    bad);
    return true;
}

static bool load_normalizer(const ctx *c, json_t *o, tok_normalizer *nz, const char *where) {
    const char *type = type_of(c, o, where);
    if (!type) return false;
    static const struct {
        const char *name;
        tok_norm_kind kind;
    } plain[] = {{"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD},
                 {"Lowercase", NORM_LOWERCASE}, {"StripAccents", NORM_STRIP_ACCENTS}};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(type, plain[i].name)) return nz->kind = plain[i].kind, true;
    if (!strcmp(type, "Strip")) {
        nz->kind = NORM_STRIP;
        return get_bool(c, o, "strip_left", false, &nz->left, where) &&
               get_bool(c, o, "strip_right", false, &nz->right, where);
    }
    if (!strcmp(type, "Replace")) {
        nz->kind = NORM_REPLACE;
        const char *content = get_str(c, o, "content", where, true);
        if (!content || !(nz->pattern = pattern_of(c, o, where))) return false;
        return (nz->content = dup_str(content)) || oom(c, where);
    }
    if (!strcmp(type, "Prepend")) {
        nz->kind = NORM_PREPEND;
        const char *p = get_str(c, o, "prepend", where, true);
        return p && ((nz->content = dup_str(p)) || oom(c, where));
    }
    if (!strcmp(type, "BertNormalizer")) {
        nz->kind = NORM_BERT;
        json_t *sa = json_object_get(o, "strip_accents");
        if (!get_bool(c, o, "clean_text", true, &nz->clean_text, where) ||
            !get_bool(c, o, "handle_chinese_chars", true, &nz->chinese_chars, where) ||
            !get_bool(c, o, "lowercase", true, &nz->lowercase, where))
            return false;
        /* strip_accents null follows lowercase, as BERT's uncased models expect */
        if (!sa || json_is_null(sa)) nz->strip_accents = nz->lowercase;
        else if (json_is_boolean(sa)) nz->strip_accents = json_is_true(sa);
        else return fail(c, ACCEL_ERR_FORMAT, where, "\"strip_accents\" must be true, false or null");
        return true;
    }
    if (!strcmp(type, "Precompiled")) return nz->kind = NORM_PRECOMPILED, load_precompiled(c, o, nz, where);
    if (!strcmp(type, "Sequence")) {
        nz->kind = NORM_SEQUENCE;
        return load_seq(c, o, "normalizers", where, sizeof *nz, (void **)&nz->seq, &nz->n_seq, one_normalizer);
    }
    return fail(c, ACCEL_ERR_UNSUPPORTED, where, "normalizer type \"%s\" is not supported", type);
}

/* ------------------------------------------------------------ pre-tokenizers */

/* GPT-2's pattern, which ByteLevel(use_regex=true) splits with. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* The Whitespace pre-tokenizer's \w+|[^\w\s]+, which the reference runs on Rust's
 * regex crate, not Oniguruma: its \w is Unicode's Word property (Alphabetic,
 * marks, Nd, Pc, Join_Control: U+200D joins a word, U+00B2 does not), \s White_Space. */
#define RUST_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
static const char WHITESPACE_PATTERN[] = "[" RUST_WORD "]+|[^" RUST_WORD "\\p{White_Space}]+";

static bool load_pretokenizer(const ctx *c, json_t *o, tok_pretokenizer *pt, const char *where);

static bool one_pretokenizer(const ctx *c, json_t *o, void *dst, const char *where) {
    return load_pretokenizer(c, o, dst, where);
}

static bool load_pretokenizer(const ctx *c, json_t *o, tok_pretokenizer *pt, const char *where) {
    const char *type = type_of(c, o, where);
    if (!type) return false;
    if (!strcmp(type, "ByteLevel")) {
        pt->kind = PRE_BYTE_LEVEL;
        if (!get_bool(c, o, "add_prefix_space", true, &pt->add_prefix_space, where) ||
            !get_bool(c, o, "use_regex", true, &pt->use_regex, where))
            return false;
        return !pt->use_regex || (pt->pattern = tok_regex_compile(GPT2_PATTERN, TOK_RE_ONIGURUMA, c->path, where));
    }
    if (!strcmp(type, "Split")) {
        pt->kind = PRE_SPLIT;
        const char *b = get_str(c, o, "behavior", where, true);
        if (!b || !get_bool(c, o, "invert", false, &pt->invert, where)) return false;
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int k = 0;
        while (k < 5 && strcmp(b, names[k])) k++;
        if (k == 5) return fail(c, ACCEL_ERR_UNSUPPORTED, where, "Split behavior \"%s\" is not supported", b);
        pt->behavior = (tok_split_behavior)k;
        return (pt->pattern = pattern_of(c, o, where)) != NULL;
    }
    if (!strcmp(type, "Metaspace")) {
        pt->kind = PRE_METASPACE;
        const char *r = get_char(c, o, "replacement", where, NULL);
        if (!r || !get_bool(c, o, "split", true, &pt->split, where)) return false;
        const char *scheme = get_str(c, o, "prepend_scheme", where, false);
        bool add_prefix_space = true; /* the older spelling of prepend_scheme */
        if (!scheme && !get_bool(c, o, "add_prefix_space", true, &add_prefix_space, where)) return false;
        if (!scheme) pt->prepend_scheme = add_prefix_space ? PREPEND_ALWAYS : PREPEND_NEVER;
        else if (!strcmp(scheme, "always")) pt->prepend_scheme = PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) pt->prepend_scheme = PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) pt->prepend_scheme = PREPEND_NEVER;
        else return fail(c, ACCEL_ERR_FORMAT, where, "prepend_scheme \"%s\" is none of always, first, never", scheme);
        return (pt->replacement = dup_str(r)) || oom(c, where);
    }
    if (!strcmp(type, "Whitespace")) {
        pt->kind = PRE_WHITESPACE;
        return (pt->pattern = tok_regex_compile(WHITESPACE_PATTERN, TOK_RE_PCRE2, c->path, where)) != NULL;
    }
    if (!strcmp(type, "WhitespaceSplit")) return pt->kind = PRE_WHITESPACE_SPLIT, true;
    if (!strcmp(type, "BertPreTokenizer")) return pt->kind = PRE_BERT, true;
    if (!strcmp(type, "Digits")) {
        pt->kind = PRE_DIGITS;
        return get_bool(c, o, "individual_digits", false, &pt->individual_digits, where);
    }
    if (!strcmp(type, "Sequence")) {
        pt->kind = PRE_SEQUENCE;
        return load_seq(c, o, "pretokenizers", where, sizeof *pt, (void **)&pt->seq, &pt->n_seq, one_pretokenizer);
    }
    return fail(c, ACCEL_ERR_UNSUPPORTED, where, "pre-tokenizer type \"%s\" is not supported", type);
}

/* ------------------------------------------------------------ model */

static bool load_vocab(const ctx *c, json_t *model, tok_model *m) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return fail(c, ACCEL_ERR_FORMAT, "model.vocab", "must be an object of token: id");
    const char *k;
    size_t klen;
    json_t *v;
    int64_t top = -1;
    json_object_keylen_foreach(vocab, k, klen, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1)
            return fail(c, ACCEL_ERR_FORMAT, "model.vocab", "the id of \"%s\" is not an integer in [0, 2^31)", k);
        if (json_integer_value(v) > top) top = json_integer_value(v);
    }
    m->n_token = top + 1;
    if (!(m->token = calloc((size_t)m->n_token + 1, sizeof *m->token))) return oom(c, "model.vocab");
    json_object_keylen_foreach(vocab, k, klen, v) {
        int64_t id = json_integer_value(v);
        if (m->token[id]) return fail(c, ACCEL_ERR_FORMAT, "model.vocab", "id %lld is given to two tokens", (long long)id);
        if (!(m->token[id] = malloc(klen + 1))) return oom(c, "model.vocab");
        memcpy(m->token[id], k, klen + 1);
        if (!tok_strmap_put(&m->vocab, k, klen, id)) return oom(c, "model.vocab");
    }
    return true;
}

static bool unk_of(const ctx *c, json_t *model, tok_model *m, const char *key) {
    const char *unk = get_str(c, model, key, "model", false);
    m->unk = -1;
    if (!unk) return !json_object_get(model, key) || json_is_null(json_object_get(model, key)) ||
                    fail(c, ACCEL_ERR_FORMAT, "model", "\"%s\" must be a string", key);
    m->unk = tok_strmap_get(&m->vocab, unk, strlen(unk));
    return m->unk >= 0 || fail(c, ACCEL_ERR_FORMAT, "model", "%s \"%s\" is not in the vocabulary", key, unk);
}

/* One merge: ["a", "b"] (tokenizers >= 0.20) or "a b". */
static bool load_merge(const ctx *c, tok_model *m, json_t *v, size_t rank) {
    char where[64];
    snprintf(where, sizeof where, "model.merges[%zu]", rank);
    const char *a, *b;
    size_t na, nb;
    if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
        json_is_string(json_array_get(v, 1))) {
        a = json_string_value(json_array_get(v, 0)), na = json_string_length(json_array_get(v, 0));
        b = json_string_value(json_array_get(v, 1)), nb = json_string_length(json_array_get(v, 1));
    } else if (json_is_string(v)) {
        a = json_string_value(v);
        const char *sp = strchr(a, ' ');
        if (!sp || strchr(sp + 1, ' ')) return fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" is not two tokens", a);
        na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
    } else {
        return fail(c, ACCEL_ERR_FORMAT, where, "must be [\"a\", \"b\"] or \"a b\"");
    }
    int64_t ia = tok_strmap_get(&m->vocab, a, na), ib = tok_strmap_get(&m->vocab, b, nb);
    char *ab = malloc(na + nb + 1);
    if (!ab) return oom(c, where);
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    int64_t iab = tok_strmap_get(&m->vocab, ab, na + nb);
    free(ab);
    if (ia < 0 || ib < 0 || iab < 0)
        return fail(c, ACCEL_ERR_FORMAT, where, "\"%.*s\" + \"%.*s\": %s is not in the vocabulary", (int)na, a, (int)nb,
                    b, ia < 0 ? "the first" : ib < 0 ? "the second" : "their concatenation");
    return tok_pairmap_put(&m->merges, (int32_t)ia, (int32_t)ib, (int32_t)rank, (int32_t)iab) || oom(c, where);
}

/* A score as tokenizers holds it. serde_json (without its float_roundtrip
 * feature, as tokenizers builds it) reads a decimal as its significand, an
 * integer, converted to double and then multiplied or divided by a power of
 * ten: two roundings, so up to an ULP off the value strtod gives, and the best
 * path's ties follow those ULPs. jansson keeps only the value, so the text is
 * taken back as the value's shortest decimal form, which is what tokenizers
 * (ryu) and Python write: a score written with more digits than that may
 * differ from tokenizers' by an ULP. pow10[i]: 10^i correctly rounded. */
static double serde_f64(double x, const double *pow10) {
    if (x == 0 || !isfinite(x)) return x;
    char digits[18];
    int first, p = accel__shortest_digits(x, digits, &first);
    uint64_t sig = 0;
    for (int i = 0; i < p; i++) sig = sig * 10 + (uint64_t)(digits[i] - '0');
    int exp = first - (p - 1);
    double f = (double)sig; /* serde_json's f64_from_parts */
    for (;;) {
        int a = exp < 0 ? -exp : exp;
        if (a <= 308) {
            f = exp >= 0 ? f * pow10[a] : f / pow10[a];
            break;
        }
        if (f == 0 || exp >= 0) break; /* not reached from a finite double's digits */
        f /= 1e308;
        exp += 308;
    }
    return x < 0 ? -f : f;
}

/* Unigram: "vocab" [[piece, score], ...] (ids in order), "unk_id" (null: none),
 * "byte_fallback"; run by the SentencePiece Unigram code (tok_spm.c) as tokenizers runs it. */
static bool load_unigram(const ctx *c, json_t *model, tok_model *m) {
    json_t *vocab = json_object_get(model, "vocab"), *unk = json_object_get(model, "unk_id");
    bool byte_fallback = false;
    m->kind = MODEL_UNIGRAM;
    m->unk = -1;
    if (!json_is_array(vocab)) return fail(c, ACCEL_ERR_FORMAT, "model.vocab", "must be an array of [piece, score]");
    size_t n = json_array_size(vocab);
    if (!n || n > INT32_MAX - 1) return fail(c, ACCEL_ERR_FORMAT, "model.vocab", "has %zu pieces, not 1 to 2^31 - 1", n);
    if (!get_bool(c, model, "byte_fallback", false, &byte_fallback, "model")) return false;
    double *score = malloc(n * sizeof *score);
    size_t *len = malloc(n * sizeof *len);
    if (!score || !len || !(m->token = calloc(n + 1, sizeof *m->token))) {
        free(score);
        free(len);
        return oom(c, "model.vocab");
    }
    m->n_token = (int64_t)n; /* with token[]: tok_free_parts frees n_token of them */
    double pow10[309];
    for (int i = 0; i < 309; i++) {
        char e[16];
        snprintf(e, sizeof e, "1e%d", i);
        pow10[i] = strtod(e, NULL);
    }
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "model.vocab[%zu]", i);
        json_t *e = json_array_get(vocab, i), *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) || !json_is_number(sc))
            ok = fail(c, ACCEL_ERR_FORMAT, where, "must be [piece, score]");
        else if (!(len[i] = json_string_length(p))) /* a NUL ("\u0000") never gets here: the JSON parser refuses it */
            ok = fail(c, ACCEL_ERR_FORMAT, where, "the piece is empty");
        else if (!(m->token[i] = dup_str(json_string_value(p))) || !tok_strmap_put(&m->vocab, m->token[i], len[i], (int64_t)i))
            ok = oom(c, where);
        else /* an integer is converted as Rust's `as f64` converts it */
            score[i] = json_is_integer(sc) ? (double)json_integer_value(sc) : serde_f64(json_real_value(sc), pow10);
    }
    if (ok && unk && !json_is_null(unk)) {
        if (!json_is_integer(unk) || json_integer_value(unk) < 0 || (size_t)json_integer_value(unk) >= n)
            ok = fail(c, ACCEL_ERR_FORMAT, "model.unk_id", "must be null or an id of the vocabulary [0, %zu)", n);
        else
            m->unk = json_integer_value(unk);
    }
    if (ok && !(m->unigram = tok_spm_hf_unigram(m->token, len, score, (int32_t)n, (int32_t)m->unk, byte_fallback)))
        ok = oom(c, "model.vocab");
    free(score);
    free(len);
    return ok;
}

static bool load_model(const ctx *c, json_t *model, tok_model *m) {
    const char *type = type_of(c, model, "model");
    if (!type) return false;
    if (!strcmp(type, "Unigram")) return load_unigram(c, model, m);
    if (!load_vocab(c, model, m)) return false;
    if (!strcmp(type, "BPE")) {
        m->kind = MODEL_BPE;
        if (!refuse_set(c, model, "dropout", "model") || !refuse_set(c, model, "continuing_subword_prefix", "model") ||
            !refuse_set(c, model, "end_of_word_suffix", "model") || !unk_of(c, model, m, "unk_token") ||
            !get_bool(c, model, "fuse_unk", false, &m->fuse_unk, "model") ||
            !get_bool(c, model, "byte_fallback", false, &m->byte_fallback, "model") ||
            !get_bool(c, model, "ignore_merges", false, &m->ignore_merges, "model"))
            return false;
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            m->byte_id[b] = tok_strmap_get(&m->vocab, name, 6);
        }
        json_t *merges = json_object_get(model, "merges");
        if (!json_is_array(merges)) return fail(c, ACCEL_ERR_FORMAT, "model.merges", "must be an array");
        size_t i;
        json_t *v;
        json_array_foreach(merges, i, v) if (!load_merge(c, m, v, i)) return false;
        return true;
    }
    if (!strcmp(type, "WordPiece")) {
        m->kind = MODEL_WORDPIECE;
        const char *prefix = get_str(c, model, "continuing_subword_prefix", "model", false);
        json_t *mx = json_object_get(model, "max_input_chars_per_word");
        m->max_chars = 100;
        if (mx && !json_is_null(mx)) {
            if (!json_is_integer(mx) || json_integer_value(mx) < 0)
                return fail(c, ACCEL_ERR_FORMAT, "model", "\"max_input_chars_per_word\" must be an integer >= 0");
            m->max_chars = json_integer_value(mx);
        }
        if (!unk_of(c, model, m, "unk_token")) return false;
        if (m->unk < 0) return fail(c, ACCEL_ERR_FORMAT, "model", "WordPiece needs an \"unk_token\"");
        return (m->prefix = dup_str(prefix ? prefix : "##")) || oom(c, "model");
    }
    return fail(c, ACCEL_ERR_UNSUPPORTED, "model.type", "model type \"%s\" is not supported (BPE, WordPiece and Unigram are)", type);
}

/* ------------------------------------------------------------ added tokens */

static bool load_added(const ctx *c, json_t *root, accel_tokenizer *t) {
    json_t *arr = json_object_get(root, "added_tokens");
    if (!arr || json_is_null(arr)) return true;
    if (!json_is_array(arr)) return fail(c, ACCEL_ERR_FORMAT, "added_tokens", "must be an array");
    if (!(t->added = calloc(json_array_size(arr) + 1, sizeof *t->added))) return oom(c, "added_tokens");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        tok_added *a = &t->added[t->n_added];
        json_t *id = json_object_get(v, "id");
        const char *content = get_str(c, v, "content", where, true);
        if (!content) return false;
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX - 1)
            return fail(c, ACCEL_ERR_FORMAT, where, "\"id\" must be an integer in [0, 2^31)");
        if (!get_bool(c, v, "special", false, &a->special, where) ||
            !get_bool(c, v, "single_word", false, &a->single_word, where) ||
            !get_bool(c, v, "lstrip", false, &a->lstrip, where) || !get_bool(c, v, "rstrip", false, &a->rstrip, where) ||
            !get_bool(c, v, "normalized", !a->special, &a->normalized, where))
            return false;
        a->len = json_string_length(json_object_get(v, "content"));
        if (!a->len) return fail(c, ACCEL_ERR_FORMAT, where, "\"content\" is empty");
        if (!(a->content = malloc(a->len + 1))) return oom(c, where);
        memcpy(a->content, content, a->len + 1);
        a->id = json_integer_value(id);
        t->n_added++;
        if (!tok_strmap_put(&t->added_map, a->content, a->len, t->n_added - 1)) return oom(c, where);
    }
    return true;
}

/* As the reference's AddedVocabulary: a token the model knows takes the model's
 * id; a normalized one is looked for as the normalizer makes it (lowercased by
 * BERT's, say), and never when it normalizes to nothing. Needs the normalizer. */
static bool prepare_added(const ctx *c, accel_tokenizer *t) {
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        int64_t known = tok_strmap_get(&t->model.vocab, a->content, a->len);
        if (known >= 0) a->id = known;
        a->match = a->content, a->match_len = a->len;
        if (!a->normalized || !t->normalizer) continue;
        tok_buf b = {0};
        if (!tok_normalize(t->normalizer, a->content, a->len, &b)) {
            free(b.p);
            char where[64];
            snprintf(where, sizeof where, "added_tokens[%d]", i);
            return fail(c, accel_last_status() ? accel_last_status() : ACCEL_ERR_OOM, where,
                        "normalizing \"content\" failed: %s", accel_last_error());
        }
        a->match = b.p, a->match_len = b.n;
    }
    return true;
}

/* ------------------------------------------------------------ post-processors */

/* "cls": ["[CLS]", 101] */
static bool token_pair(const ctx *c, json_t *o, const char *key, int64_t *id, const char *where) {
    json_t *p = json_object_get(o, key);
    if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 1)))
        return fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" must be [token, id]", key);
    *id = json_integer_value(json_array_get(p, 1));
    return true;
}

static bool load_template(const ctx *c, json_t *o, tok_post *pp, const char *where) {
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return fail(c, ACCEL_ERR_FORMAT, where, "\"single\" must be an array");
    if (!(pp->items = calloc(json_array_size(single) + 1, sizeof *pp->items))) return oom(c, where);
    size_t i;
    json_t *v;
    json_array_foreach(single, i, v) {
        struct tok_template_item *it = &pp->items[pp->n_items++];
        json_t *sp = json_object_get(v, "SpecialToken"), *seq = json_object_get(v, "Sequence");
        if (seq) {
            const char *id = get_str(c, seq, "id", where, true);
            if (!id) return false;
            if (strcmp(id, "A")) return fail(c, ACCEL_ERR_FORMAT, where, "the single template names sequence \"%s\"", id);
            continue;
        }
        const char *name = sp ? get_str(c, sp, "id", where, true) : NULL;
        if (!name) return fail(c, ACCEL_ERR_FORMAT, where, "single[%zu] is neither a SpecialToken nor a Sequence", i);
        json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        if (!json_is_array(ids))
            return fail(c, ACCEL_ERR_FORMAT, where, "special token \"%s\" has no ids in \"special_tokens\"", name);
        if (!(it->ids = calloc(json_array_size(ids) + 1, sizeof *it->ids))) return oom(c, where);
        size_t j;
        json_t *x;
        json_array_foreach(ids, j, x) {
            if (!json_is_integer(x)) return fail(c, ACCEL_ERR_FORMAT, where, "an id of \"%s\" is not an integer", name);
            it->ids[it->n++] = json_integer_value(x);
        }
    }
    return true;
}

static bool load_post(const ctx *c, json_t *o, tok_post *pp, const char *where);

static bool one_post(const ctx *c, json_t *o, void *dst, const char *where) { return load_post(c, o, dst, where); }

static bool load_post(const ctx *c, json_t *o, tok_post *pp, const char *where) {
    const char *type = type_of(c, o, where);
    if (!type) return false;
    if (!strcmp(type, "TemplateProcessing")) return pp->kind = POST_TEMPLATE, load_template(c, o, pp, where);
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        pp->kind = type[0] == 'B' ? POST_BERT : POST_ROBERTA;
        return token_pair(c, o, "cls", &pp->cls, where) && token_pair(c, o, "sep", &pp->sep, where);
    }
    if (!strcmp(type, "ByteLevel")) return pp->kind = POST_BYTE_LEVEL, true; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        pp->kind = POST_SEQUENCE;
        return load_seq(c, o, "processors", where, sizeof *pp, (void **)&pp->seq, &pp->n_seq, one_post);
    }
    return fail(c, ACCEL_ERR_UNSUPPORTED, where, "post-processor type \"%s\" is not supported", type);
}

/* ------------------------------------------------------------ decoders */

static bool load_decoder(const ctx *c, json_t *o, tok_decoder *d, const char *where);

static bool one_decoder(const ctx *c, json_t *o, void *dst, const char *where) { return load_decoder(c, o, dst, where); }

static bool load_decoder(const ctx *c, json_t *o, tok_decoder *d, const char *where) {
    const char *type = type_of(c, o, where);
    if (!type) return false;
    if (!strcmp(type, "ByteLevel")) return d->kind = DEC_BYTE_LEVEL, true;
    if (!strcmp(type, "ByteFallback")) return d->kind = DEC_BYTE_FALLBACK, true;
    if (!strcmp(type, "Fuse")) return d->kind = DEC_FUSE, true;
    if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        json_t *start = json_object_get(o, "start"), *stop = json_object_get(o, "stop");
        if (!get_char(c, o, "content", where, &d->strip_char)) return false;
        if (!json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 ||
            json_integer_value(stop) < 0)
            return fail(c, ACCEL_ERR_FORMAT, where, "\"start\" and \"stop\" must be integers >= 0");
        d->start = json_integer_value(start), d->stop = json_integer_value(stop);
        return true;
    }
    if (!strcmp(type, "Replace")) {
        d->kind = DEC_REPLACE;
        json_t *s = json_object_get(json_object_get(o, "pattern"), "String");
        const char *content = get_str(c, o, "content", where, true);
        if (!json_is_string(s))
            return fail(c, ACCEL_ERR_UNSUPPORTED, where, "a Replace decoder's pattern must be {\"String\": ...}");
        if (!content || !json_string_length(s)) return content ? fail(c, ACCEL_ERR_FORMAT, where, "empty pattern") : false;
        d->pattern = dup_str(json_string_value(s));
        d->content = dup_str(content);
        return (d->pattern && d->content) || oom(c, where);
    }
    if (!strcmp(type, "WordPiece")) {
        d->kind = DEC_WORDPIECE;
        const char *prefix = get_str(c, o, "prefix", where, false);
        if (!get_bool(c, o, "cleanup", true, &d->cleanup, where)) return false;
        return (d->prefix = dup_str(prefix ? prefix : "##")) || oom(c, where);
    }
    if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        const char *r = get_char(c, o, "replacement", where, NULL);
        const char *scheme = r ? get_str(c, o, "prepend_scheme", where, false) : NULL;
        bool aps = true;
        if (!r || (!scheme && !get_bool(c, o, "add_prefix_space", true, &aps, where))) return false;
        d->prepend = scheme ? strcmp(scheme, "never") != 0 : aps;
        return (d->replacement = dup_str(r)) || oom(c, where);
    }
    if (!strcmp(type, "Sequence")) {
        d->kind = DEC_SEQUENCE;
        return load_seq(c, o, "decoders", where, sizeof *d, (void **)&d->seq, &d->n_seq, one_decoder);
    }
    return fail(c, ACCEL_ERR_UNSUPPORTED, where, "decoder type \"%s\" is not supported", type);
}

/* ------------------------------------------------------------ the file */

/* The ids a post-processor inserts must be tokens: [0, vocab_size). */
static bool check_post_ids(const ctx *c, const tok_post *pp, const char *where, int64_t vocab_size) {
    const char *bad = NULL;
    int64_t id = 0;
    if (pp->kind == POST_BERT || pp->kind == POST_ROBERTA) {
        if (pp->cls < 0 || pp->cls >= vocab_size) bad = "cls", id = pp->cls;
        else if (pp->sep < 0 || pp->sep >= vocab_size) bad = "sep", id = pp->sep;
    }
    for (int k = 0; !bad && k < pp->n_items; k++)
        for (int i = 0; !bad && i < pp->items[k].n; i++)
            if (pp->items[k].ids[i] < 0 || pp->items[k].ids[i] >= vocab_size) bad = "special_tokens", id = pp->items[k].ids[i];
    if (bad)
        return fail(c, ACCEL_ERR_FORMAT, where, "\"%s\" has id %lld, outside the vocabulary [0, %lld)", bad,
                    (long long)id, (long long)vocab_size);
    for (int i = 0; i < pp->n_seq; i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.processors[%d]", where, i);
        if (!check_post_ids(c, &pp->seq[i], sub, vocab_size)) return false;
    }
    return true;
}

/* Loads an optional component: absent or null leaves *out NULL. */
#define LOAD_PART(root, key, out, loader)                                                      \
    do {                                                                                       \
        json_t *o_ = json_object_get(root, key);                                               \
        if (o_ && !json_is_null(o_)) {                                                         \
            if (!((out) = calloc(1, sizeof *(out)))) { oom(&c, key); goto fail; }              \
            if (!loader(&c, o_, (out), key)) goto fail;                                        \
        }                                                                                      \
    } while (0)

/* The tokenizer a parsed tokenizer.json describes (root is consumed); path names it in messages. */
static accel_tokenizer *load_root(const char *path, json_t *root) {
    ctx c = {path};
    if (!root) return NULL;
    accel_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = dup_str(path))) {
        oom(&c, "tokenizer");
        json_decref(root);
        free(t);
        return NULL;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(root) || !model) {
        fail(&c, ACCEL_ERR_FORMAT, "tokenizer", "no \"model\": not a tokenizers tokenizer.json");
        goto fail;
    }
    if (!refuse_set(&c, root, "truncation", "truncation") || !refuse_set(&c, root, "padding", "padding") ||
        !load_model(&c, model, &t->model) || !load_added(&c, root, t))
        goto fail;
    LOAD_PART(root, "normalizer", t->normalizer, load_normalizer);
    LOAD_PART(root, "pre_tokenizer", t->pretokenizer, load_pretokenizer);
    LOAD_PART(root, "post_processor", t->post, load_post);
    LOAD_PART(root, "decoder", t->decoder, load_decoder);

    if (!prepare_added(&c, t)) goto fail;
    /* ids: the model's, then the added tokens' (which may reuse a model id) */
    t->vocab_size = t->model.n_token;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > t->vocab_size) t->vocab_size = t->added[i].id + 1;
    if (!(t->added_token = calloc((size_t)t->vocab_size + 1, sizeof *t->added_token))) {
        oom(&c, "added_tokens");
        goto fail;
    }
    for (int i = 0; i < t->n_added; i++) t->added_token[t->added[i].id] = t->added[i].content;
    if (t->post && !check_post_ids(&c, t->post, "post_processor", t->vocab_size)) goto fail;
    json_decref(root);
    return t;
fail:
    json_decref(root);
    accel_tokenizer_free(t);
    return NULL;
}

accel_tokenizer *tok_load_json(const char *path) { return load_root(path, accel__json_load_file(path)); }

accel_tokenizer *tok_load_json_text(const char *name, const char *text, size_t n) {
    return load_root(name, accel__json_parse(name, text, n));
}

static void free_normalizer(tok_normalizer *nz) {
    for (int i = 0; i < nz->n_seq; i++) free_normalizer(&nz->seq[i]);
    free(nz->seq);
    pcre2_code_free(nz->pattern);
    free(nz->content);
    tok_charsmap_free(&nz->cmap);
}

static void free_pretokenizer(tok_pretokenizer *pt) {
    for (int i = 0; i < pt->n_seq; i++) free_pretokenizer(&pt->seq[i]);
    free(pt->seq);
    pcre2_code_free(pt->pattern);
    free(pt->replacement);
}

static void free_post(tok_post *pp) {
    for (int i = 0; i < pp->n_seq; i++) free_post(&pp->seq[i]);
    free(pp->seq);
    for (int i = 0; i < pp->n_items; i++) free(pp->items[i].ids);
    free(pp->items);
}

static void free_decoder(tok_decoder *d) {
    for (int i = 0; i < d->n_seq; i++) free_decoder(&d->seq[i]);
    free(d->seq);
    free(d->pattern);
    free(d->content);
    free(d->prefix);
    free(d->replacement);
}

void tok_free_parts(accel_tokenizer *t) {
    tok_model *m = &t->model;
    for (int64_t i = 0; i < m->n_token; i++) free(m->token[i]);
    free(m->token);
    tok_strmap_free(&m->vocab);
    tok_pairmap_free(&m->merges);
    free(m->prefix);
    tok_spm_free(m->unigram);
    if (t->normalizer) free_normalizer(t->normalizer);
    if (t->pretokenizer) free_pretokenizer(t->pretokenizer);
    if (t->post) free_post(t->post);
    if (t->decoder) free_decoder(t->decoder);
    free(t->normalizer);
    free(t->pretokenizer);
    free(t->post);
    free(t->decoder);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].match != t->added[i].content) free(t->added[i].match);
        free(t->added[i].content);
    }
    free(t->added);
    tok_strmap_free(&t->added_map);
    free(t->added_token);
    free(t->path);
}
