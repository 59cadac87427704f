/* Pre-tokenizers: pieces -> smaller pieces, as the tokenizers library's. A split
 * marks each range of a piece as a match or not, then a behaviour decides which
 * ranges are kept and which are glued to their neighbours. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

bool tok_is_white_space(uint32_t c);
bool tok_is_letter(uint32_t c);
bool tok_is_numeric(uint32_t c);
bool tok_is_punctuation(uint32_t c);

/* The matches of re in s[0..n), as the reference's find_matches walks them (Rust
 * onig's find_iter): an empty match is recorded too (behaviours split there),
 * except one right where the previous match ended; after an empty match the
 * search resumes one character on. Matches are appended to r tagged true, the
 * gaps between them tagged false. False: out of memory, or the regex engine
 * failed (match or depth limit, JIT stack): then an error naming it is set,
 * never a silent "no match". */
bool tok_regex_ranges(const pcre2_code *re, const char *s, size_t n, tok_spans *r) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return false;
    size_t at = 0, prev = 0, last_end = 0;
    bool ok = true, have_last = false;
    while (ok && at <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            accel_set_error(rc == PCRE2_ERROR_NOMEMORY ? ACCEL_ERR_OOM : ACCEL_ERR_INVALID_ARG,
                            "tokenizer: a regular expression failed on the text at byte %zu: %s", at,
                            (const char *)msg);
            ok = false;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (end == start) {
            uint32_t c;
            size_t k = start < n ? tok_utf8_next(s + start, n - start, &c) : 1;
            at = start + (k ? k : 1);
            if (have_last && last_end == end) continue;
        } else {
            at = end;
        }
        have_last = true, last_end = end;
        if (start > prev) ok = tok_spans_add(r, prev, start, false);
        if (ok) ok = tok_spans_add(r, start, end, true);
        prev = end;
    }
    if (ok && prev < n) ok = tok_spans_add(r, prev, n, false);
    pcre2_match_data_free(md);
    return ok;
}

/* ------------------------------------------------------------ ranges and behaviours */

/* The ranges of s[0..n) kept by a behaviour, appended to out as pieces. */
static bool apply_behavior(tok_spans *r, tok_split_behavior b, bool invert, const char *s, tok_pieces *out) {
    if (invert)
        for (size_t i = 0; i < r->n; i++) r->v[i].tag = !r->v[i].tag;
    tok_spans keep = {0};
    bool ok = true, prev_match = false;
    if (b == SPLIT_MERGED_NEXT) { /* folded from the right, as the reference does */
        for (size_t k = r->n; ok && k-- > 0;) {
            struct tok_span x = r->v[k];
            if (x.tag && !prev_match && keep.n) keep.v[keep.n - 1].a = x.a;
            else ok = tok_spans_add(&keep, x.a, x.b, false);
            prev_match = x.tag != 0;
        }
        for (size_t i = 0; i < keep.n / 2; i++) {
            struct tok_span t = keep.v[i];
            keep.v[i] = keep.v[keep.n - 1 - i];
            keep.v[keep.n - 1 - i] = t;
        }
    } else {
        for (size_t i = 0; ok && i < r->n; i++) {
            struct tok_span x = r->v[i];
            switch (b) {
            case SPLIT_REMOVED:
                if (!x.tag) ok = tok_spans_add(&keep, x.a, x.b, false);
                break;
            case SPLIT_ISOLATED: ok = tok_spans_add(&keep, x.a, x.b, false); break;
            case SPLIT_MERGED_PREV:
                if (x.tag && !prev_match && keep.n) keep.v[keep.n - 1].b = x.b;
                else ok = tok_spans_add(&keep, x.a, x.b, false);
                break;
            case SPLIT_CONTIGUOUS:
                if ((x.tag != 0) == prev_match && keep.n) keep.v[keep.n - 1].b = x.b;
                else ok = tok_spans_add(&keep, x.a, x.b, false);
                break;
            case SPLIT_MERGED_NEXT: break;
            }
            prev_match = x.tag != 0;
        }
    }
    for (size_t i = 0; ok && i < keep.n; i++)
        if (keep.v[i].b > keep.v[i].a) ok = tok_pieces_add(out, s + keep.v[i].a, keep.v[i].b - keep.v[i].a);
    free(keep.v);
    return ok;
}

/* Ranges of s: runs of characters for which pred holds are matches; with
 * each_char every such character is its own match. */
static bool char_ranges(const char *s, size_t n, bool (*pred)(uint32_t), bool each_char, tok_spans *r) {
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        uint32_t c;
        size_t k = tok_utf8_next(s + i, n - i, &c);
        if (!k) k = 1, c = 0xFFFD;
        bool m = pred(c);
        if (r->n && r->v[r->n - 1].tag == m && !(m && each_char)) r->v[r->n - 1].b = i + k;
        else ok = tok_spans_add(r, i, i + k, m);
        i += k;
    }
    return ok;
}

static bool is_bert_punct(uint32_t c) {
    bool ascii = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    return ascii || tok_is_punctuation(c);
}

/* ------------------------------------------------------------ byte level */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68
 * become U+0100 + their rank among them. */
static uint32_t byte_char_table[256];
static pthread_once_t byte_char_once = PTHREAD_ONCE_INIT;

static void byte_char_init(void) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_char_table[b] = printable ? (uint32_t)b : next++;
    }
}

const uint32_t *tok_byte_chars(void) {
    pthread_once(&byte_char_once, byte_char_init);
    return byte_char_table;
}

static bool byte_level(const tok_pretokenizer *pt, const char *s, size_t n, tok_pieces *out) {
    tok_buf pre = {0};
    bool ok = true;
    if (pt->add_prefix_space && n && s[0] != ' ') ok = tok_buf_put(&pre, " ", 1) && tok_buf_put(&pre, s, n);
    else ok = tok_buf_put(&pre, s, n);
    tok_pieces parts = {0};
    tok_spans r = {0};
    if (ok && pt->use_regex) ok = tok_regex_ranges(pt->pattern, pre.p, pre.n, &r) && apply_behavior(&r, SPLIT_ISOLATED, false, pre.p, &parts);
    else if (ok && pre.n) ok = tok_pieces_add(&parts, pre.p, pre.n);
    const uint32_t *map = tok_byte_chars();
    tok_buf mapped = {0};
    for (size_t i = 0; ok && i < parts.n; i++) {
        mapped.n = 0;
        const unsigned char *p = (const unsigned char *)parts.text.p + parts.off[i];
        for (size_t j = 0; ok && j < parts.len[i]; j++) ok = tok_buf_putc(&mapped, map[p[j]]);
        if (ok) ok = tok_pieces_add(out, mapped.p, mapped.n);
    }
    free(mapped.p);
    free(r.v);
    tok_pieces_free(&parts);
    free(pre.p);
    return ok;
}

/* ------------------------------------------------------------ metaspace */

static bool metaspace(const tok_pretokenizer *pt, const char *s, size_t n, bool first, tok_pieces *out) {
    const char *rep = pt->replacement;
    size_t nrep = strlen(rep);
    tok_buf b = {0};
    bool ok = true;
    bool starts = n >= nrep && !memcmp(s, rep, nrep);
    bool starts_after_replace = starts || (n && s[0] == ' ');
    if (!starts_after_replace && (pt->prepend_scheme == PREPEND_ALWAYS || (pt->prepend_scheme == PREPEND_FIRST && first)))
        ok = tok_buf_put(&b, rep, nrep);
    for (size_t i = 0; ok && i < n; i++) ok = s[i] == ' ' ? tok_buf_put(&b, rep, nrep) : tok_buf_put(&b, s + i, 1);
    if (ok && !pt->split) ok = !b.n || tok_pieces_add(out, b.p, b.n);
    else if (ok) {
        tok_spans r = {0};
        size_t prev = 0;
        for (size_t i = 0; ok && i + nrep <= b.n;) {
            if (memcmp(b.p + i, rep, nrep)) {
                i++;
                continue;
            }
            if (i > prev) ok = tok_spans_add(&r, prev, i, false);
            if (ok) ok = tok_spans_add(&r, i, i + nrep, true);
            prev = i += nrep;
        }
        if (ok && prev < b.n) ok = tok_spans_add(&r, prev, b.n, false);
        if (ok) ok = apply_behavior(&r, SPLIT_MERGED_NEXT, false, b.p, out);
        free(r.v);
    }
    free(b.p);
    return ok;
}

/* ------------------------------------------------------------ one pre-tokenizer over one piece */

static bool split_piece(const tok_pretokenizer *pt, const char *s, size_t n, bool first, tok_pieces *out) {
    tok_spans r = {0};
    bool ok;
    switch (pt->kind) {
    case PRE_BYTE_LEVEL: return byte_level(pt, s, n, out);
    case PRE_METASPACE: return metaspace(pt, s, n, first, out);
    case PRE_SPLIT:
        ok = tok_regex_ranges(pt->pattern, s, n, &r) && apply_behavior(&r, pt->behavior, pt->invert, s, out);
        break;
    case PRE_WHITESPACE: /* keeps the matches of \w+|[^\w\s]+ */
        ok = tok_regex_ranges(pt->pattern, s, n, &r) && apply_behavior(&r, SPLIT_REMOVED, true, s, out);
        break;
    case PRE_WHITESPACE_SPLIT:
        ok = char_ranges(s, n, tok_is_white_space, false, &r) && apply_behavior(&r, SPLIT_REMOVED, false, s, out);
        break;
    case PRE_BERT: {
        tok_pieces words = {0};
        ok = char_ranges(s, n, tok_is_white_space, false, &r) && apply_behavior(&r, SPLIT_REMOVED, false, s, &words);
        for (size_t i = 0; ok && i < words.n; i++) {
            r.n = 0;
            const char *w = words.text.p + words.off[i];
            ok = char_ranges(w, words.len[i], is_bert_punct, true, &r) && apply_behavior(&r, SPLIT_ISOLATED, false, w, out);
        }
        tok_pieces_free(&words);
        break;
    }
    case PRE_DIGITS:
        ok = char_ranges(s, n, tok_is_numeric, pt->individual_digits, &r) &&
             apply_behavior(&r, pt->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, false, s, out);
        break;
    case PRE_SEQUENCE: {
        tok_pieces cur = {0};
        ok = tok_pieces_add(&cur, s, n);
        for (int i = 0; ok && i < pt->n_seq; i++) ok = tok_pretokenize(&pt->seq[i], &cur, first);
        for (size_t i = 0; ok && i < cur.n; i++) ok = tok_pieces_add(out, cur.text.p + cur.off[i], cur.len[i]);
        tok_pieces_free(&cur);
        break;
    }
    default: ok = false;
    }
    free(r.v);
    return ok;
}

bool tok_pretokenize(const tok_pretokenizer *pt, tok_pieces *p, bool first) {
    tok_pieces out = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < p->n; i++)
        ok = split_piece(pt, p->text.p + p->off[i], p->len[i], first && i == 0 && p->off[i] == 0, &out);
    tok_pieces_free(p);
    *p = out;
    return ok;
}
