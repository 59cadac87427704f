/* SentencePiece encode and decode (tok_internal.h's tok_spm), step for step as
 * the sentencepiece library (normalizer.cc, bpe_model.cc, unigram_model.cc's
 * EncodeOptimized, sentencepiece_processor.cc) so the ids are its ids:
 *   text -> normalize (user-defined pieces kept whole; the precompiled charsmap's
 *           rules, longest first; every other invalid UTF-8 byte U+FFFD; the
 *           dummy prefix, extra whitespace removal and ' ' -> U+2581 as
 *           normalizer_spec says) -> BPE or Unigram -> ids (unknown runs
 *           merged into one unknown id, or spelled as <0xXX> bytes with
 *           byte_fallback)
 *   ids  -> pieces (control ones invisible, the unknown one unk_surface, byte
 *           pieces gathered and read as UTF-8 with U+FFFD per bad byte) -> text
 *           (U+2581 -> ' ', the first piece's leading one dropped) */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const char SPACE[] = "\xE2\x96\x81"; /* U+2581 LOWER ONE EIGHTH BLOCK */
static const char REPLACEMENT[] = "\xEF\xBF\xBD";

/* The node under `node` for byte c; -1 when none. */
static inline int32_t trie_child(const tok_spm_trie *t, int32_t node, uint8_t c) {
    if (t->wide[node] >= 0) return t->table[(size_t)t->wide[node] * 256 + c];
    /* at most TOK_SPM_WIDE sorted labels: a scan */
    uint32_t lo = t->first[node], hi = t->first[node + 1];
    for (; lo < hi && t->label[lo] <= c; lo++)
        if (t->label[lo] == c) return t->next[lo];
    return -1;
}

/* The length of the longest user-defined piece at s[0..n), 0 when none
 * (sentencepiece's PrefixMatcher over the USER_DEFINED pieces). */
static size_t user_prefix(const tok_spm *m, const char *s, size_t n) {
    size_t best = 0;
    int32_t cur = 0;
    for (size_t k = 0; k < n && (cur = trie_child(&m->user, cur, (uint8_t)s[k])) >= 0; k++)
        if (m->user.piece[cur] >= 0) best = k + 1;
    return best;
}

/* One UTF-8 character's byte length from its first byte, as sentencepiece's
 * OneCharLen (the text is valid UTF-8 by then), clipped to n. */
static size_t one_char_len(const char *s, size_t n) {
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = len[(uint8_t)s[0] >> 4];
    return k < n ? k : n;
}

/* Normalizer::NormalizePrefix: a user-defined piece as it is, else the longest
 * charsmap rule's replacement, else a character as it is, or U+FFFD for one
 * invalid byte. *text / *tn: the normalized prefix; returns the bytes of s it
 * consumed. */
static size_t norm_prefix(const tok_spm *m, const char *s, size_t n, const char **text, size_t *tn) {
    size_t k = user_prefix(m, s, n);
    uint32_t cp, v = 0;
    if (!k && m->cmap.n && (k = tok_charsmap_prefix(&m->cmap, s, n, false, &v))) {
        *text = v < m->cmap.norm_len ? m->cmap.norm + v : "";
        *tn = strlen(*text); /* cmap.norm ends with a NUL */
        return k;
    }
    if (!k && !(k = tok_utf8_next(s, n, &cp))) {
        *text = REPLACEMENT, *tn = 3;
        return 1;
    }
    *text = s, *tn = k;
    return k;
}

static bool put_escaped(const tok_spm *m, tok_buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(m->escape_whitespaces && s[i] == ' ' ? tok_buf_put(out, SPACE, 3) : tok_buf_put(out, s + i, 1))) return false;
    return true;
}

/* Normalizer::Normalize. */
static bool normalize(const tok_spm *m, const char *s, size_t n, tok_buf *out) {
    const char *t;
    size_t tn, pos = 0;
    if (m->remove_extra_whitespaces)
        while (pos < n) {
            size_t k = norm_prefix(m, s + pos, n - pos, &t, &tn);
            if (tn != 1 || *t != ' ') break;
            pos += k;
        }
    if (pos == n) return true;
    if (m->add_dummy_prefix && !put_escaped(m, out, " ", 1)) return false;
    bool prev_space = m->remove_extra_whitespaces;
    while (pos < n) {
        pos += norm_prefix(m, s + pos, n - pos, &t, &tn);
        while (prev_space && tn && *t == ' ') t++, tn--;
        if (tn) {
            if (!put_escaped(m, out, t, tn)) return false;
            prev_space = t[tn - 1] == ' ';
        }
        if (!m->remove_extra_whitespaces) prev_space = false;
    }
    if (m->remove_extra_whitespaces) {
        const char *sp = m->escape_whitespaces ? SPACE : " ";
        size_t sn = strlen(sp);
        while (out->n >= sn && !memcmp(out->p + out->n - sn, sp, sn)) out->n -= sn;
    }
    return true;
}

/* ------------------------------------------------------------ model output -> ids */

/* The ids of the model's pieces, as SentencePieceProcessor's
 * PopulateSentencePieceText: an unknown piece spelled in bytes with
 * byte_fallback, else a run of unknown pieces one unknown id. */
typedef struct emit {
    tok_ids *out;
    bool prev_unk;
} emit;

static bool emit_piece(const tok_spm *m, emit *e, const char *w, size_t n, int32_t id) {
    bool unk = m->pc[id].type == SPM_UNKNOWN, ok = true;
    if (m->pc[id].type == SPM_CONTROL) ok = tok_ids_push(e->out, id);
    else if (unk && m->byte_fallback)
        for (size_t i = 0; ok && i < n; i++) ok = tok_ids_push(e->out, m->byte_id[(uint8_t)w[i]]);
    else if (!(unk && e->prev_unk)) ok = tok_ids_push(e->out, id);
    e->prev_unk = unk;
    return ok;
}

/* ModelInterface::PieceToId: reserved pieces first, then the others, else unknown. */
static int32_t piece_to_id(const tok_spm *m, const char *s, size_t n) {
    int64_t id = tok_strmap_get(&m->reserved, s, n);
    if (id < 0) id = tok_strmap_get(&m->pieces, s, n);
    return id < 0 ? m->unk : (int32_t)id;
}

/* ------------------------------------------------------------ BPE (bpe_model.cc) */

typedef struct sym {
    size_t a, n;            /* bytes of the normalized text; n == 0: merged away */
    ptrdiff_t prev, next;   /* -1: none */
    int32_t node;           /* the trie node of the text; -1: no piece starts so */
    bool freeze;    /* a user-defined piece: never merged */
} sym;

typedef struct pair {
    ptrdiff_t left, right;
    double score; /* a float's value */
    size_t size;
    int32_t node; /* the merged text's trie node */
} pair;

/* The agenda's order: the higher score first, then the leftmost. */
static bool before(const pair *x, const pair *y) { return x->score > y->score || (x->score == y->score && x->left < y->left); }

typedef struct heap {
    pair *v;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, pair p) {
    if (!tok_grow(&h->v, &h->cap, h->n, sizeof *h->v)) return false;
    size_t i = h->n++;
    for (; i && before(&p, &h->v[(i - 1) / 2]); i = (i - 1) / 2) h->v[i] = h->v[(i - 1) / 2];
    h->v[i] = p;
    return true;
}

static pair heap_pop(heap *h) {
    pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

typedef struct bpe {
    const tok_spm *m;
    const char *s;
    sym *sy;
    heap agenda;
    tok_strmap split; /* an UNUSED piece made by a merge -> its left part's length */
} bpe;

/* The trie node of s[0..n) walked on from `node`; -1 when it leaves the trie. */
static int32_t walk(const tok_spm_trie *t, int32_t node, const char *s, size_t n) {
    for (size_t i = 0; i < n && node >= 0; i++) node = trie_child(t, node, (uint8_t)s[i]);
    return node;
}

/* MaybeAddNewSymbolPair: is the two symbols' text a piece? (The trie walked
 * on from the left one's node over the right one's bytes: the pieces map's
 * answer for the price of the right symbol's bytes.) */
static bool maybe_pair(bpe *b, ptrdiff_t l, ptrdiff_t r) {
    if (l < 0 || r < 0 || b->sy[l].freeze || b->sy[r].freeze) return true;
    const char *p = b->s + b->sy[l].a;
    size_t n = b->sy[l].n + b->sy[r].n;
    int32_t node = walk(&b->m->trie, b->sy[l].node, b->s + b->sy[r].a, b->sy[r].n);
    int32_t id = node >= 0 ? b->m->trie.piece[node] : -1;
    if (id < 0) return true;
    if (b->m->pc[id].type == SPM_UNUSED && !tok_strmap_put(&b->split, p, n, (int64_t)b->sy[l].n)) return false;
    return heap_push(&b->agenda, (pair){l, r, b->m->pc[id].score, n, node});
}

/* The resegment of bpe_model.cc: an UNUSED piece is replaced by the two it was made of. */
static bool resegment(bpe *b, emit *e, const char *w, size_t n) {
    int32_t id = piece_to_id(b->m, w, n);
    int64_t left = b->m->pc[id].type == SPM_UNUSED ? tok_strmap_get(&b->split, w, n) : -1;
    if (left < 0) return emit_piece(b->m, e, w, n, id);
    return resegment(b, e, w, (size_t)left) && resegment(b, e, w + left, n - (size_t)left);
}

static bool bpe_encode(const tok_spm *m, const char *s, size_t n, tok_ids *out) {
    bpe b = {.m = m, .s = s, .sy = malloc((n + 1) * sizeof *b.sy)};
    bool ok = b.sy != NULL;
    ptrdiff_t ns = 0;
    for (size_t a = 0; ok && a < n; ns++) {
        size_t k = user_prefix(m, s + a, n - a);
        b.sy[ns] = (sym){a, k ? k : one_char_len(s + a, n - a), ns - 1, -1, -1, k > 0};
        b.sy[ns].node = walk(&m->trie, 0, s + a, b.sy[ns].n);
        if (ns) b.sy[ns - 1].next = ns;
        a += b.sy[ns].n;
    }
    for (ptrdiff_t i = 1; ok && i < ns; i++) ok = maybe_pair(&b, i - 1, i);
    while (ok && b.agenda.n) {
        pair top = heap_pop(&b.agenda);
        sym *l = &b.sy[top.left], *r = &b.sy[top.right];
        if (!l->n || !r->n || l->n + r->n != top.size) continue; /* stale */
        l->n += r->n;
        l->node = top.node;
        l->next = r->next;
        if (r->next >= 0) b.sy[r->next].prev = top.left;
        r->n = 0;
        ok = maybe_pair(&b, l->prev, top.left) && maybe_pair(&b, top.left, b.sy[top.left].next);
    }
    emit e = {out, false};
    for (ptrdiff_t i = 0; ok && ns && i >= 0; i = b.sy[i].next) ok = resegment(&b, &e, s + b.sy[i].a, b.sy[i].n);
    free(b.sy);
    free(b.agenda.v);
    tok_strmap_free(&b.split);
    return ok;
}

/* ------------------------------------------------------------ Unigram (EncodeOptimized) */

typedef struct node {
    int32_t id;    /* the piece ending here on the best path */
    double score;  /* the best path's score up to here */
    int64_t start; /* where that piece starts; -1: no path yet */
} node;

/* sentencepiece 0.2.3's EncodeOptimized moves the path scores from a start
 * whose score is past this back to 0 (kScoreResetThreshold), so that long
 * texts keep float precision: where ties fall depends on it. */
#define SPM_SCORE_RESET 100000.0f

/* The best path's nodes best[0..n] over s[0..n): EncodeOptimized of
 * sentencepiece 0.2.3's unigram_model.cc, or with m->hf tokenizers'
 * Unigram::encode_optimized, the same walk with double sums and no reset.
 * NULL: out of memory, or (hf, error set) an unknown character and no
 * unk_id. */
static node *viterbi(const tok_spm *m, const char *s, size_t n) {
    node *best = malloc((n + 1) * sizeof *best);
    if (!best) return NULL;
    for (size_t i = 0; i <= n; i++) best[i] = (node){-1, 0.0, -1};
    /* kUnkPenalty; a tokenizer.model's sums are sentencepiece's float sums (a float
     * sum rounded from double is the float sum: double has over twice float's
     * precision), which decide ties such as "0" "00" against "00" "0" */
    const double unk_score = m->hf ? m->min_score - 10.0 : (double)(float)(m->min_score - 10.0);
    size_t frontier = 0; /* the furthest end a piece has reached */
    for (size_t a = 0; a < n;) {
        double here = best[a].score;
        if (!m->hf && (here < -SPM_SCORE_RESET || here > SPM_SCORE_RESET)) {
            for (size_t i = a; i <= frontier; i++)
                if (i == a || best[i].start >= 0) best[i].score = (float)(best[i].score - here);
            here = 0.0;
        }
        size_t mblen = one_char_len(s + a, n - a);
        bool single = false;
        /* every piece starting at a, by the trie (its end is a character boundary of the valid text) */
        int32_t cur = 0;
        for (size_t e = a; e < n && (cur = trie_child(&m->trie, cur, (uint8_t)s[e])) >= 0;) {
            int32_t id = m->trie.piece[cur];
            e++;
            if (id < 0 || m->pc[id].type == SPM_UNUSED) continue;
            /* a user-defined piece's bonus, to be chosen: GetUserDefinedScore, 0.1 a byte past the first */
            double score = m->pc[id].type == SPM_USER_DEFINED ? (float)(0.1 * (double)(e - a - 1)) : m->pc[id].score;
            double cand = m->hf ? score + here : (double)(float)(score + here);
            if (e > frontier) frontier = e;
            if (best[e].start < 0 || cand > best[e].score) best[e] = (node){id, cand, (int64_t)a};
            if (e - a == mblen) single = true;
        }
        if (!single) {
            double cand = m->hf ? unk_score + here : (double)(float)(unk_score + here);
            if (a + mblen > frontier) frontier = a + mblen;
            node *t = &best[a + mblen];
            if (t->start < 0 || cand > t->score) {
                if (m->unk < 0) { /* tokenizers' MissingUnkId */
                    free(best);
                    accel_set_error(ACCEL_ERR_INVALID_ARG,
                                    "tokenizer: the Unigram model has no unk_id and no piece for \"%.*s\"", (int)mblen, s + a);
                    return NULL;
                }
                *t = (node){m->unk, cand, (int64_t)a};
            }
        }
        a += mblen;
    }
    return best;
}

/* The ends of the best path's pieces, in order: *k of them, malloc'd (NULL: out of memory). */
static size_t *path_ends(const node *best, size_t n, size_t *k) {
    *k = 0;
    for (size_t e = n; e > 0; e = (size_t)best[e].start) (*k)++;
    size_t *ends = malloc((*k + 1) * sizeof *ends), i = *k;
    for (size_t e = n; ends && e > 0; e = (size_t)best[e].start) ends[--i] = e;
    return ends;
}

static bool unigram_encode(const tok_spm *m, const char *s, size_t n, tok_ids *out) {
    node *best = viterbi(m, s, n);
    size_t k, *ends = best ? path_ends(best, n, &k) : NULL;
    bool ok = ends != NULL;
    emit em = {out, false};
    for (size_t i = 0; ok && i < k; i++) {
        size_t e = ends[i], a = (size_t)best[e].start;
        ok = emit_piece(m, &em, s + a, e - a, best[e].id);
    }
    free(ends);
    free(best);
    return ok;
}

/* One piece of tokenizers' Unigram::tokenize: its id when the text is a piece,
 * else its bytes as <0xXX> pieces with byte_fallback when all are pieces, else
 * the unknown id. */
static bool hf_emit(const tok_spm *m, const char *w, size_t n, tok_ids *out) {
    int64_t id = tok_strmap_get(&m->pieces, w, n);
    if (id >= 0) return tok_ids_push(out, id);
    bool all = m->byte_fallback;
    for (size_t i = 0; all && i < n; i++) all = m->byte_id[(uint8_t)w[i]] >= 0;
    for (size_t i = 0; all && i < n; i++)
        if (!tok_ids_push(out, m->byte_id[(uint8_t)w[i]])) return false;
    if (all) return true;
    if (m->unk < 0) /* not reached: the best path has an unknown piece only with an unk_id */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "tokenizer: the Unigram model has no unk_id"), false;
    return tok_ids_push(out, m->unk);
}

bool tok_spm_unigram_ids(const tok_spm *m, const char *s, size_t n, tok_ids *out) {
    if (!n) return true;
    node *best = viterbi(m, s, n);
    size_t k, *ends = best ? path_ends(best, n, &k) : NULL;
    bool ok = ends != NULL;
    /* tokenizers' fuse_unk (always on for Unigram): adjacent pieces of the unknown id,
     * the unknown piece's own text matched included, are one string */
    for (size_t i = 0; ok && i < k;) {
        size_t a = (size_t)best[ends[i]].start, e = ends[i++];
        if (m->unk >= 0 && best[e].id == m->unk)
            while (i < k && best[ends[i]].id == m->unk) e = ends[i++];
        ok = hf_emit(m, s + a, e - a, out);
    }
    free(ends);
    free(best);
    return ok;
}

bool tok_spm_encode(const tok_spm *m, const char *s, size_t n, tok_ids *out) {
    tok_buf norm = {0};
    bool ok = normalize(m, s, n, &norm);
    if (ok && norm.n) ok = m->unigram ? unigram_encode(m, norm.p, norm.n, out) : bpe_encode(m, norm.p, norm.n, out);
    free(norm.p);
    return ok;
}

/* ------------------------------------------------------------ decode */

/* Byte pieces ids[0..n) as UTF-8: each character whole, each invalid byte U+FFFD. */
static bool put_bytes(const tok_spm *m, const int64_t *ids, size_t n, tok_buf *out) {
    if (!n) return true;
    uint8_t *b = malloc(n);
    if (!b) return false;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)strtol(m->pc[ids[i]].text + 3, NULL, 16); /* "<0xXX>" */
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next((const char *)b + i, n - i, &cp);
        ok = k ? tok_buf_put(out, b + i, k) : tok_buf_put(out, REPLACEMENT, 3);
        i += k ? k : 1;
    }
    free(b);
    return ok;
}

bool tok_spm_decode(const tok_spm *m, const int64_t *ids, size_t n, bool render_control, tok_buf *out) {
    /* the leading U+2581 of the first piece is the dummy prefix (or, with extra
     * whitespace removed, of every piece until text appears) */
    bool strip = m->add_dummy_prefix || m->remove_extra_whitespaces, bos_ws = true, bos_ws_seen = false;
    size_t byte_start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && m->pc[ids[i]].type == SPM_BYTE) continue;
        /* ids NULL with n 0 (no arithmetic on it) */
        if (!put_bytes(m, n ? ids + byte_start : ids, i - byte_start, out)) return false;
        byte_start = i + 1;
        if (i == n) break;
        const struct tok_spm_piece *pc = &m->pc[ids[i]];
        if (bos_ws_seen || out->n) bos_ws = false;
        bos_ws_seen = false;
        if (pc->type == SPM_CONTROL) {
            if (render_control && !tok_buf_put(out, pc->text, pc->len)) return false;
            continue;
        }
        if (pc->type == SPM_UNKNOWN) {
            if (!tok_buf_put(out, m->unk_surface, strlen(m->unk_surface))) return false;
            continue;
        }
        const char *p = pc->text;
        size_t k = pc->len;
        if (bos_ws && strip && k >= 3 && !memcmp(p, SPACE, 3)) {
            p += 3, k -= 3;
            bos_ws_seen = !m->remove_extra_whitespaces;
        }
        for (size_t j = 0; j < k;) {
            bool sp = j + 3 <= k && !memcmp(p + j, SPACE, 3);
            if (!(sp ? tok_buf_put(out, " ", 1) : tok_buf_put(out, p + j, 1))) return false;
            j += sp ? 3 : 1;
        }
    }
    return true;
}
