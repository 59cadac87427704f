/* The public tokenizer (include/accel/tokenizer.h): the encode pipeline around
 * the added tokens, the post-processor, decode and the lookups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_internal.h"

bool tok_is_white_space(uint32_t c);
bool tok_is_letter(uint32_t c);
bool tok_is_joining_mark(uint32_t c);
bool tok_is_numeric(uint32_t c);

/* A SentencePiece tokenizer.model as an accel_tokenizer. */
static accel_tokenizer *load_spm(const char *path) {
    tok_spm *m = tok_spm_load(path);
    if (!m) return NULL;
    accel_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        tok_spm_free(m);
        accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
        return NULL;
    }
    t->spm = m;
    t->vocab_size = m->n;
    return t;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

accel_tokenizer *accel_tokenizer_load(const char *path) {
    if (!path) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tokenizer_load: NULL path");
        return NULL;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* a snapshot's tokenizer.json, else its SentencePiece tokenizer.model (as transformers prefers) */
        size_t n = strlen(path) + sizeof "/tokenizer.model" + sizeof "/tokenizer.json";
        char *json = malloc(n), *model = malloc(n);
        if (!json || !model) {
            free(json);
            free(model);
            accel_set_error(ACCEL_ERR_OOM, "accel_tokenizer_load: out of memory");
            return NULL;
        }
        snprintf(json, n, "%s/tokenizer.json", path);
        snprintf(model, n, "%s/tokenizer.model", path);
        accel_tokenizer *t;
        if (stat(json, &sb) != 0 && stat(model, &sb) == 0) {
            t = load_spm(model);
        } else {
            t = tok_load_json(json);
            if (!t && accel_last_status() == ACCEL_ERR_IO && stat(json, &sb) != 0)
                accel_set_error(ACCEL_ERR_IO, "%s: neither %s nor %s exists", path, json, model);
        }
        free(json);
        free(model);
        return t;
    }
    return ends_with(path, ".model") ? load_spm(path) : tok_load_json(path);
}

void accel_tokenizer_free(accel_tokenizer *t) {
    if (!t) return;
    tok_spm_free(t->spm);
    tok_free_parts(t);
    free(t);
}

/* ------------------------------------------------------------ added tokens */

/* The reference's \w: letters, marks (Mn, Mc: U+0301 and U+093E join a word), numbers, '_'. */
static bool is_word_char(uint32_t c) { return c == '_' || tok_is_letter(c) || tok_is_numeric(c) || tok_is_joining_mark(c); }

/* The last / first code point of s[0..n), 0 when empty. */
static uint32_t last_cp(const char *s, size_t n) {
    if (!n) return 0;
    size_t j = n - 1;
    while (j && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    uint32_t c = 0;
    tok_utf8_next(s + j, n - j, &c);
    return c;
}

static uint32_t first_cp(const char *s, size_t n) {
    uint32_t c = 0;
    if (n) tok_utf8_next(s, n, &c);
    return c;
}

/* Splits s[0..n) on the added tokens whose `normalized` is `normalized`:
 * leftmost-longest matches, a single_word token only between non-word
 * characters, lstrip/rstrip taking the whitespace beside it. */
static bool split_added(const accel_tokenizer *t, bool normalized, const char *s, size_t n, tok_spans *out) {
    size_t done = 0;
    for (size_t pos = 0; pos < n;) {
        const tok_added *best = NULL;
        for (int i = 0; i < t->n_added; i++) {
            const tok_added *a = &t->added[i];
            if (a->normalized != normalized || !a->match_len || a->match_len > n - pos ||
                (best && a->match_len <= best->match_len))
                continue;
            if (!memcmp(s + pos, a->match, a->match_len)) best = a;
        }
        if (!best) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + best->match_len;
        pos = stop; /* matches do not overlap, kept or not */
        if (best->single_word && ((start && is_word_char(last_cp(s, start))) ||
                                  (stop < n && is_word_char(first_cp(s + stop, n - stop)))))
            continue;
        if (best->lstrip)
            while (start > done && tok_is_white_space(last_cp(s, start))) {
                size_t j = start - 1;
                while (j > done && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                start = j;
            }
        if (best->rstrip)
            while (stop < n && tok_is_white_space(first_cp(s + stop, n - stop))) {
                uint32_t c;
                stop += tok_utf8_next(s + stop, n - stop, &c);
            }
        if (start > done && !tok_spans_add(out, done, start, -1)) return false;
        if (!tok_spans_add(out, start, stop, best->id)) return false;
        done = pos = stop;
    }
    return done >= n || tok_spans_add(out, done, n, -1);
}

/* ------------------------------------------------------------ encode */

/* One text segment (not an added token) through normalizer, normalized added
 * tokens, pre-tokenizer and model. */
static bool encode_text(const accel_tokenizer *t, const char *s, size_t n, bool first, tok_ids *ids) {
    tok_buf norm = {0};
    tok_spans segs = {0};
    tok_pieces pieces = {0};
    bool ok = t->normalizer ? tok_normalize(t->normalizer, s, n, &norm) : tok_buf_put(&norm, s, n);
    if (ok) ok = split_added(t, true, norm.p, norm.n, &segs);
    for (size_t i = 0; ok && i < segs.n; i++) {
        struct tok_span g = segs.v[i];
        if (g.tag >= 0) {
            ok = tok_ids_push(ids, g.tag);
            continue;
        }
        pieces.n = pieces.text.n = 0;
        ok = tok_pieces_add(&pieces, norm.p + g.a, g.b - g.a);
        if (ok && t->pretokenizer) ok = tok_pretokenize(t->pretokenizer, &pieces, first && g.a == 0);
        for (size_t k = 0; ok && k < pieces.n; k++)
            ok = tok_model_encode(&t->model, pieces.text.p + pieces.off[k], pieces.len[k], ids);
    }
    tok_pieces_free(&pieces);
    free(segs.v);
    free(norm.p);
    return ok;
}

static bool post_process(const tok_post *pp, tok_ids *ids) {
    tok_ids out = {0};
    bool ok = true;
    switch (pp->kind) {
    case POST_BYTE_LEVEL: return true; /* it adjusts offsets only */
    case POST_SEQUENCE:
        for (int i = 0; ok && i < pp->n_seq; i++) ok = post_process(&pp->seq[i], ids);
        return ok;
    case POST_BERT:
    case POST_ROBERTA:
        ok = tok_ids_push(&out, pp->cls);
        for (size_t i = 0; ok && i < ids->n; i++) ok = tok_ids_push(&out, ids->v[i]);
        ok = ok && tok_ids_push(&out, pp->sep);
        break;
    case POST_TEMPLATE:
        for (int k = 0; ok && k < pp->n_items; k++) {
            const struct tok_template_item *it = &pp->items[k];
            if (!it->ids)
                for (size_t i = 0; ok && i < ids->n; i++) ok = tok_ids_push(&out, ids->v[i]);
            for (int i = 0; ok && i < it->n; i++) ok = tok_ids_push(&out, it->ids[i]);
        }
        break;
    }
    if (ok) {
        free(ids->v);
        *ids = out;
    } else {
        free(out.v);
    }
    return ok;
}

/* SentencePiece: its ids, after BOS with special tokens (LlamaTokenizer's and
 * GemmaTokenizer's add_bos_token); invalid UTF-8 is sentencepiece's business. */
static accel_status encode_spm(const tok_spm *m, const char *text, size_t n, bool add_special_tokens, int64_t **ids,
                               int64_t *n_ids) {
    tok_ids out = {0};
    bool ok = !(add_special_tokens && m->bos >= 0) || tok_ids_push(&out, m->bos);
    if (!ok || !tok_spm_encode(m, text, n, &out)) {
        free(out.v);
        return accel_set_error(ACCEL_ERR_OOM, "accel_tokenizer_encode: out of memory");
    }
    *ids = out.v;
    *n_ids = (int64_t)out.n;
    return ACCEL_OK;
}

accel_status accel_tokenizer_encode(const accel_tokenizer *t, const char *text, size_t n, bool add_special_tokens,
                                    int64_t **ids, int64_t *n_ids) {
    if (!t || (!text && n) || !ids || !n_ids)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tokenizer_encode: NULL %s",
                               !t ? "tokenizer" : !ids || !n_ids ? "output" : "text");
    *ids = NULL;
    *n_ids = 0;
    if (t->spm) return encode_spm(t->spm, text, n, add_special_tokens, ids, n_ids);
    size_t bad = tok_utf8_invalid_at(text, n);
    if (bad < n)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tokenizer_encode: the text is not UTF-8: byte %zu (0x%02X)",
                               bad, (unsigned char)text[bad]);
    tok_ids out = {0};
    tok_spans segs = {0};
    bool ok = split_added(t, false, text, n, &segs);
    for (size_t i = 0; ok && i < segs.n; i++) {
        struct tok_span g = segs.v[i];
        ok = g.tag >= 0 ? tok_ids_push(&out, g.tag) : encode_text(t, text + g.a, g.b - g.a, g.a == 0, &out);
    }
    if (ok && add_special_tokens && t->post) ok = post_process(t->post, &out);
    free(segs.v);
    if (!ok) {
        free(out.v);
        return accel_propagate_error(ACCEL_ERR_OOM, "accel_tokenizer_encode: out of memory");
    }
    *ids = out.v;
    *n_ids = (int64_t)out.n;
    return ACCEL_OK;
}

/* ------------------------------------------------------------ decode and lookups */

const char *accel_tokenizer_id_to_token(const accel_tokenizer *t, int64_t id) {
    if (!t || id < 0 || id >= t->vocab_size) return NULL;
    if (t->spm) return t->spm->pc[id].text;
    if (t->added_token[id]) return t->added_token[id];
    return id < t->model.n_token ? t->model.token[id] : NULL;
}

bool accel_tokenizer_is_special(const accel_tokenizer *t, int64_t id) {
    const char *tok = accel_tokenizer_id_to_token(t, id);
    if (tok && t->spm) return t->spm->pc[id].type == SPM_CONTROL;
    if (!tok || !t->added_token[id]) return false;
    int64_t k = tok_strmap_get(&t->added_map, tok, strlen(tok));
    return k >= 0 && t->added[k].special;
}

accel_status accel_tokenizer_decode(const accel_tokenizer *t, const int64_t *ids, int64_t n, bool skip_special_tokens,
                                    char **text, size_t *len) {
    if (!t || (!ids && n) || n < 0 || !text)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tokenizer_decode: %s",
                               !t ? "NULL tokenizer" : !text ? "NULL output" : "NULL or negative ids");
    *text = NULL;
    char **tokens = malloc(((size_t)n + 1) * sizeof *tokens);
    if (!tokens) return accel_set_error(ACCEL_ERR_OOM, "accel_tokenizer_decode: out of memory");
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *tok = accel_tokenizer_id_to_token(t, ids[i]);
        if (!tok) {
            free(tokens);
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_tokenizer_decode: ids[%lld] = %lld is not in the vocabulary (size %lld)",
                                   (long long)i, (long long)ids[i], (long long)t->vocab_size);
        }
        if (!(skip_special_tokens && accel_tokenizer_is_special(t, ids[i]))) tokens[k++] = (char *)tok;
    }
    tok_buf out = {0};
    /* SentencePiece decodes ids (byte pieces need their neighbours); its special tokens are CONTROL pieces */
    bool ok = t->spm ? tok_spm_decode(t->spm, ids, (size_t)n, !skip_special_tokens, &out) && tok_buf_put(&out, "", 0)
                     : tok_decode_tokens(t->decoder, tokens, k, &out);
    free(tokens);
    if (!ok) {
        free(out.p);
        return accel_propagate_error(ACCEL_ERR_OOM, "accel_tokenizer_decode: out of memory");
    }
    *text = out.p;
    if (len) *len = out.n;
    return ACCEL_OK;
}

int64_t accel_tokenizer_vocab_size(const accel_tokenizer *t) { return t ? t->vocab_size : 0; }

int64_t accel_tokenizer_token_to_id(const accel_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    if (t->spm) {
        int64_t id = tok_strmap_get(&t->spm->reserved, token, strlen(token));
        return id >= 0 ? id : tok_strmap_get(&t->spm->pieces, token, strlen(token));
    }
    int64_t k = tok_strmap_get(&t->added_map, token, strlen(token));
    if (k >= 0) return t->added[k].id;
    return tok_strmap_get(&t->model.vocab, token, strlen(token));
}
