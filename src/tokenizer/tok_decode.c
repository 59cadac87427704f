/* Decoders: a list of token strings -> a list of strings, chained, then
 * concatenated; as the tokenizers library's decode_chain. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

const uint32_t *tok_byte_chars(void);

/* The list of strings a decoder step works on: each malloc'd, with its length
 * (decoded bytes may hold NUL). */
typedef struct strs {
    char **v;
    size_t *len;
    size_t n, cap;
} strs;

static bool strs_push_n(strs *l, const char *s, size_t n) {
    size_t cap = l->cap;
    if (!tok_grow(&l->v, &cap, l->n, sizeof *l->v) || !tok_grow(&l->len, &l->cap, l->n, sizeof *l->len)) return false;
    char *d = malloc(n + 1);
    if (!d) return false;
    memcpy(d, s, n);
    d[n] = 0;
    l->v[l->n] = d;
    l->len[l->n++] = n;
    return true;
}

static bool strs_push_buf(strs *l, tok_buf *b) { return strs_push_n(l, b->p ? b->p : "", b->n); }

static void strs_free(strs *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    free(l->len);
    memset(l, 0, sizeof *l);
}

/* s[0..n) with every occurrence of pat replaced by rep. */
static bool replace_str(tok_buf *out, const char *s, size_t n, const char *pat, const char *rep) {
    size_t np = strlen(pat), nr = strlen(rep);
    const char *end = s + n;
    for (const char *hit; (hit = memmem(s, (size_t)(end - s), pat, np)); s = hit + np)
        if (!tok_buf_put(out, s, (size_t)(hit - s)) || !tok_buf_put(out, rep, nr)) return false;
    return tok_buf_put(out, s, (size_t)(end - s));
}

/* The byte a byte-level character stands for, -1 when it stands for none. */
static int char_byte(uint32_t c) {
    const uint32_t *map = tok_byte_chars();
    if (c < 256 && map[c] == c) return (int)c;
    if (c >= 256 && c < 256 + 68)
        for (int b = 0; b < 256; b++)
            if (map[b] == c) return b;
    return -1;
}

static bool byte_level(strs *in, strs *out) {
    tok_buf bytes = {0}, text = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < in->n; i++) {
        const char *t = in->v[i];
        size_t n = in->len[i], mark = bytes.n;
        bool all = true;
        for (size_t j = 0; ok && all && j < n;) {
            uint32_t c;
            size_t k = tok_utf8_next(t + j, n - j, &c);
            int b = k ? char_byte(c) : -1;
            if (b < 0) all = false;
            else {
                unsigned char u = (unsigned char)b;
                ok = tok_buf_put(&bytes, &u, 1);
            }
            j += k ? k : 1;
        }
        if (ok && !all) { /* a token with a character outside the map goes as its own bytes */
            bytes.n = mark;
            ok = tok_buf_put(&bytes, t, n);
        }
    }
    if (ok) ok = tok_utf8_lossy(&text, bytes.p ? bytes.p : "", bytes.n) && strs_push_buf(out, &text);
    free(bytes.p);
    free(text.p);
    return ok;
}

/* "<0xAB>" -> 0xAB, -1 when t is not a byte token. */
static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int byte_token(const char *t) {
    if (strlen(t) != 6 || strncmp(t, "<0x", 3) || t[5] != '>') return -1;
    int hi = hex_digit(t[3]), lo = hex_digit(t[4]); /* exactly two digits: no sign, no space */
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static bool byte_fallback(strs *in, strs *out) {
    tok_buf run = {0};
    bool ok = true;
    for (size_t i = 0; ok && i <= in->n; i++) {
        int b = i < in->n ? byte_token(in->v[i]) : -1;
        if (b >= 0) {
            unsigned char u = (unsigned char)b;
            ok = tok_buf_put(&run, &u, 1);
            continue;
        }
        if (run.n) { /* a run that is not valid UTF-8 becomes one U+FFFD per byte */
            if (tok_utf8_invalid_at(run.p, run.n) == run.n) ok = strs_push_buf(out, &run);
            else
                for (size_t j = 0; ok && j < run.n; j++) ok = strs_push_n(out, "\xEF\xBF\xBD", 3);
            run.n = 0;
        }
        if (ok && i < in->n) ok = strs_push_n(out, in->v[i], in->len[i]);
    }
    free(run.p);
    return ok;
}

static bool strip(const tok_decoder *d, strs *in, strs *out) {
    bool ok = true;
    for (size_t i = 0; ok && i < in->n; i++) {
        const char *t = in->v[i];
        size_t n = in->len[i], a = 0, b = n;
        uint32_t c;
        for (int64_t k = 0; k < d->start && a < b; k++) {
            size_t len = tok_utf8_next(t + a, b - a, &c);
            if (!len || c != d->strip_char) break;
            a += len;
        }
        for (int64_t k = 0; k < d->stop && b > a; k++) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)t[j] & 0xC0) == 0x80) j--;
            if (!tok_utf8_next(t + j, b - j, &c) || c != d->strip_char) break;
            b = j;
        }
        ok = strs_push_n(out, t + a, b - a);
    }
    return ok;
}

/* The WordPiece decoder's clean-up of spaces before punctuation and in contractions. */
static bool wordpiece_cleanup(tok_buf *b) {
    static const char *const rules[][2] = {{" .", "."},   {" ?", "?"},   {" !", "!"},       {" ,", ","},
                                           {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" do not", " don't"},
                                           {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t r = 0; r < sizeof rules / sizeof *rules; r++) {
        tok_buf t = {0};
        if (!replace_str(&t, b->p ? b->p : "", b->n, rules[r][0], rules[r][1])) return free(t.p), false;
        free(b->p);
        *b = t;
    }
    return true;
}

static bool decode_step(const tok_decoder *d, strs *in, strs *out) {
    bool ok = true;
    tok_buf b = {0};
    switch (d->kind) {
    case DEC_BYTE_LEVEL: return byte_level(in, out);
    case DEC_BYTE_FALLBACK: return byte_fallback(in, out);
    case DEC_STRIP: return strip(d, in, out);
    case DEC_FUSE:
        for (size_t i = 0; ok && i < in->n; i++) ok = tok_buf_put(&b, in->v[i], in->len[i]);
        ok = ok && strs_push_buf(out, &b);
        break;
    case DEC_REPLACE:
        for (size_t i = 0; ok && i < in->n; i++) {
            b.n = 0;
            ok = replace_str(&b, in->v[i], in->len[i], d->pattern, d->content) && strs_push_buf(out, &b);
        }
        break;
    case DEC_WORDPIECE:
        for (size_t i = 0; ok && i < in->n; i++) {
            b.n = 0;
            const char *t = in->v[i];
            size_t np = strlen(d->prefix), n = in->len[i];
            if (i && n >= np && !memcmp(t, d->prefix, np)) ok = tok_buf_put(&b, t + np, n - np);
            else ok = (!i || tok_buf_put(&b, " ", 1)) && tok_buf_put(&b, t, n);
            if (ok && d->cleanup) ok = wordpiece_cleanup(&b);
            ok = ok && strs_push_buf(out, &b);
        }
        break;
    case DEC_METASPACE: {
        size_t nr = strlen(d->replacement);
        for (size_t i = 0; ok && i < in->n; i++) {
            b.n = 0;
            const char *t = in->v[i], *end = t + in->len[i];
            for (const char *hit; ok && (hit = memmem(t, (size_t)(end - t), d->replacement, nr)); t = hit + nr)
                ok = tok_buf_put(&b, t, (size_t)(hit - t)) && ((i == 0 && d->prepend) || tok_buf_put(&b, " ", 1));
            ok = ok && tok_buf_put(&b, t, (size_t)(end - t)) && strs_push_buf(out, &b);
        }
        break;
    }
    case DEC_SEQUENCE: {
        strs cur = {0};
        for (size_t i = 0; ok && i < in->n; i++) ok = strs_push_n(&cur, in->v[i], in->len[i]);
        for (int k = 0; ok && k < d->n_seq; k++) {
            strs next = {0};
            ok = decode_step(&d->seq[k], &cur, &next);
            strs_free(&cur);
            cur = next;
        }
        for (size_t i = 0; ok && i < cur.n; i++) ok = strs_push_n(out, cur.v[i], cur.len[i]);
        strs_free(&cur);
        break;
    }
    }
    free(b.p);
    return ok;
}

bool tok_decode_tokens(const tok_decoder *d, char **tokens, size_t n, tok_buf *out) {
    strs in = {0}, res = {0};
    bool ok = true;
    if (!d) { /* no decoder: the tokens joined by spaces */
        for (size_t i = 0; ok && i < n; i++) ok = (!i || tok_buf_put(out, " ", 1)) && tok_buf_put(out, tokens[i], strlen(tokens[i]));
        return ok && tok_buf_put(out, "", 0);
    }
    for (size_t i = 0; ok && i < n; i++) ok = strs_push_n(&in, tokens[i], strlen(tokens[i]));
    ok = ok && decode_step(d, &in, &res);
    for (size_t i = 0; ok && i < res.n; i++) ok = tok_buf_put(out, res.v[i], res.len[i]);
    strs_free(&in);
    strs_free(&res);
    return ok && tok_buf_put(out, "", 0);
}
