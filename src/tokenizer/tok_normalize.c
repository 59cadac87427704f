/* Normalizers: text -> text, as the tokenizers library's (Unicode data from
 * utf8proc). Character classes shared with the pre-tokenizers live here too. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tok_internal.h"

/* Rust's char::is_whitespace: the White_Space property. */
bool tok_is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_categories(uint32_t c, int lo, int hi) {
    int cat = utf8proc_category((utf8proc_int32_t)c);
    return cat >= lo && cat <= hi;
}

/* Sorted, disjoint code point ranges [lo, hi]. */
typedef struct tok_cp_range {
    uint32_t lo, hi;
} tok_cp_range;

static bool in_ranges(uint32_t c, const tok_cp_range *r, size_t n) {
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (c < r[m].lo) b = m;
        else if (c > r[m].hi) a = m + 1;
        else return true;
    }
    return false;
}

/* The reference's older tables, as differences from utf8proc's categories. */
#include "tok_unicode_lag.h"

/* In utf8proc's categories [lo, hi], corrected by the reference's table: yes
 * where `added` holds c, no where `dropped` does. */
static bool in_ref_categories(uint32_t c, int lo, int hi, const tok_cp_range *added, size_t n_added,
                              const tok_cp_range *dropped, size_t n_dropped) {
    if (in_ranges(c, added, n_added)) return true;
    return in_categories(c, lo, hi) && !in_ranges(c, dropped, n_dropped);
}
#define IN_REF(c, lo, hi, name) \
    in_ref_categories(c, lo, hi, name##_ADDED, sizeof name##_ADDED / sizeof *name##_ADDED, name##_DROPPED, \
                      sizeof name##_DROPPED / sizeof *name##_DROPPED)

bool tok_is_letter(uint32_t c) { return in_categories(c, UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LO); }
bool tok_is_numeric(uint32_t c) { return in_categories(c, UTF8PROC_CATEGORY_ND, UTF8PROC_CATEGORY_NO); }
bool tok_is_joining_mark(uint32_t c) { return in_categories(c, UTF8PROC_CATEGORY_MN, UTF8PROC_CATEGORY_MC); }
/* BertPreTokenizer's punctuation (Unicode 8.0's, as the reference's unicode_categories) */
bool tok_is_punctuation(uint32_t c) { return IN_REF(c, UTF8PROC_CATEGORY_PC, UTF8PROC_CATEGORY_PO, PUNCT); }

/* The first code point of s (valid UTF-8: checked at encode's entry). */
static size_t next_cp(const char *s, size_t n, uint32_t *cp) {
    size_t k = tok_utf8_next(s, n, cp);
    return k ? k : (*cp = 0xFFFD, 1);
}

static bool unicode_form(const char *s, size_t n, int options, tok_buf *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, options | UTF8PROC_STABLE);
    if (len < 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "tokenizer: Unicode normalization failed: %s", utf8proc_errmsg(len));
        return false;
    }
    bool ok = tok_buf_put(out, dst, (size_t)len);
    free(dst);
    return ok;
}

/* The reference's lowercasing, Rust's char::to_lowercase one character at a
 * time: full mappings, of which the one-to-many one is U+0130 (-> "i\u0307"),
 * and no context (Σ is σ at the end of a word too, not str::to_lowercase's ς). */
static bool lowercase(const char *s, size_t n, tok_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += next_cp(s + i, n - i, &c);
        bool ok = c == 0x130 ? tok_buf_putc(out, 'i') && tok_buf_putc(out, 0x307)
                             : tok_buf_putc(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
        if (!ok) return false;
    }
    return true;
}

/* Drops the marks: with nfd the nonspacing ones (Mn) after a canonical
 * decomposition (BertNormalizer's strip_accents), without it the combining
 * ones (Mn Mc Me) as the StripAccents normalizer, which keeps a precomposed
 * "\u00e9" whole; both by the reference's tables. */
static bool strip_marks(const char *s, size_t n, bool nfd, tok_buf *out) {
    tok_buf d = {0};
    bool ok = nfd ? unicode_form(s, n, UTF8PROC_DECOMPOSE, &d) : tok_buf_put(&d, s, n);
    for (size_t i = 0; ok && i < d.n;) {
        uint32_t c;
        size_t k = next_cp(d.p + i, d.n - i, &c);
        bool mark = nfd ? IN_REF(c, UTF8PROC_CATEGORY_MN, UTF8PROC_CATEGORY_MN, NONSPACING)
                        : IN_REF(c, UTF8PROC_CATEGORY_MN, UTF8PROC_CATEGORY_ME, COMBINING);
        if (!mark) ok = tok_buf_put(out, d.p + i, k);
        i += k;
    }
    free(d.p);
    return ok;
}

static bool is_chinese_char(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* BertNormalizer's control characters: Cc, Cf, Co but \t \n \r, as the
 * reference's unicode_categories tables (Unicode 8.0) have them: the format
 * characters assigned since are kept, as are unassigned code points (Cn). */
static bool is_bert_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    bool cf_after_8 = c == 0x8E2 || c == 0x890 || c == 0x891 || c == 0x110CD || (c >= 0x13430 && c <= 0x1343F);
    return in_categories(c, UTF8PROC_CATEGORY_CC, UTF8PROC_CATEGORY_CO) && !cf_after_8;
}

/* BertNormalizer's first two steps: control characters, NUL and U+FFFD
 * dropped, whitespace made ' ', CJK ideographs surrounded by spaces. */
static bool bert_clean(const tok_normalizer *nz, const char *s, size_t n, tok_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = next_cp(s + i, n - i, &c);
        i += k;
        bool ok = true;
        if (nz->clean_text) {
            if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
            if (tok_is_white_space(c)) c = ' ';
        }
        if (nz->chinese_chars && is_chinese_char(c))
            ok = tok_buf_putc(out, ' ') && tok_buf_putc(out, c) && tok_buf_putc(out, ' ');
        else ok = tok_buf_putc(out, c);
        if (!ok) return false;
    }
    return true;
}

/* Each match of re replaced by rep (an empty match inserts rep there). */
static bool replace_all(const pcre2_code *re, const char *rep, const char *s, size_t n, tok_buf *out) {
    tok_spans r = {0};
    bool ok = tok_regex_ranges(re, s, n, &r);
    for (size_t i = 0; ok && i < r.n; i++)
        ok = r.v[i].tag ? tok_buf_put(out, rep, strlen(rep)) : tok_buf_put(out, s + r.v[i].a, r.v[i].b - r.v[i].a);
    free(r.v);
    return ok;
}

static bool strip_ws(const char *s, size_t n, bool left, bool right, tok_buf *out) {
    size_t a = 0, b = n;
    uint32_t c;
    while (left && a < b) {
        size_t k = next_cp(s + a, b - a, &c);
        if (!tok_is_white_space(c)) break;
        a += k;
    }
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        next_cp(s + j, b - j, &c);
        if (!tok_is_white_space(c)) break;
        b = j;
    }
    return tok_buf_put(out, s + a, b - a);
}

/* tokenizers' Precompiled::transform: the replacement of the shortest rule whose
 * source starts `chunk` (the whole chunk replaced by it), NULL when none. The
 * strings are UTF-8 (checked at load), so a replacement starting on a
 * character boundary is UTF-8 too; one that does not, or lies past the strings,
 * is an error (*bad) where tokenizers would panic. */
static const char *transform(const tok_charsmap *c, const char *chunk, size_t n, bool *bad) {
    uint32_t v;
    if (!tok_charsmap_prefix(c, chunk, n, true, &v)) return NULL;
    if (v > c->norm_len || (v < c->norm_len && ((unsigned char)c->norm[v] & 0xC0) == 0x80)) {
        *bad = true;
        return NULL;
    }
    return c->norm + v; /* up to its NUL (norm[norm_len] is one) */
}

/* tokenizers' Precompiled normalizer: each extended grapheme cluster under 6
 * bytes whose start has a rule is replaced whole by it (so "\r\n" becomes
 * what "\r" maps to); otherwise each character by its rule, or kept. */
static bool precompiled(const tok_charsmap *c, const char *s, size_t n, tok_buf *out) {
    utf8proc_int32_t state = 0;
    bool bad = false, ok = true;
    for (size_t a = 0; ok && a < n;) {
        uint32_t c1, c2;
        size_t b = a + next_cp(s + a, n - a, &c1);
        for (size_t k; b < n; b += k, c1 = c2) {
            k = next_cp(s + b, n - b, &c2);
            if (utf8proc_grapheme_break_stateful((utf8proc_int32_t)c1, (utf8proc_int32_t)c2, &state)) break;
        }
        const char *t = b - a < 6 ? transform(c, s + a, b - a, &bad) : NULL;
        if (t) {
            ok = tok_buf_put(out, t, strlen(t));
        } else {
            for (size_t i = a, k; ok && !bad && i < b; i += k) {
                k = next_cp(s + i, b - i, &c2);
                t = transform(c, s + i, k, &bad);
                ok = t ? tok_buf_put(out, t, strlen(t)) : tok_buf_put(out, s + i, k);
            }
        }
        if (bad) {
            accel_set_error(ACCEL_ERR_FORMAT, "tokenizer: the Precompiled normalizer's charsmap has a rule whose "
                                              "replacement starts inside a character or past its strings");
            return false;
        }
        a = b;
    }
    return ok;
}

bool tok_normalize(const tok_normalizer *nz, const char *s, size_t n, tok_buf *out) {
    switch (nz->kind) {
    case NORM_NFC: return unicode_form(s, n, UTF8PROC_COMPOSE, out);
    case NORM_NFD: return unicode_form(s, n, UTF8PROC_DECOMPOSE, out);
    case NORM_NFKC: return unicode_form(s, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case NORM_NFKD: return unicode_form(s, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case NORM_LOWERCASE: return lowercase(s, n, out);
    case NORM_STRIP: return strip_ws(s, n, nz->left, nz->right, out);
    case NORM_STRIP_ACCENTS: return strip_marks(s, n, false, out);
    case NORM_REPLACE: return replace_all(nz->pattern, nz->content, s, n, out);
    case NORM_PREPEND:
        return !n || (tok_buf_put(out, nz->content, strlen(nz->content)) && tok_buf_put(out, s, n));
    case NORM_BERT: {
        tok_buf a = {0}, b = {0};
        bool ok = bert_clean(nz, s, n, &a);
        const tok_buf *cur = &a;
        if (ok && nz->strip_accents) {
            ok = strip_marks(a.p, a.n, true, &b);
            cur = &b;
        }
        if (ok) ok = nz->lowercase ? lowercase(cur->p, cur->n, out) : tok_buf_put(out, cur->p, cur->n);
        free(a.p);
        free(b.p);
        return ok;
    }
    case NORM_PRECOMPILED: return precompiled(&nz->cmap, s, n, out);
    case NORM_SEQUENCE: {
        tok_buf cur = {0}, next = {0};
        bool ok = tok_buf_put(&cur, s, n);
        for (int i = 0; ok && i < nz->n_seq; i++) {
            next.n = 0;
            ok = tok_normalize(&nz->seq[i], cur.p, cur.n, &next);
            tok_buf t = cur;
            cur = next;
            next = t;
        }
        if (ok) ok = tok_buf_put(out, cur.p, cur.n);
        free(cur.p);
        free(next.p);
        return ok;
    }
    }
    return false;
}
