/* Models: one pre-tokenized piece -> ids. BPE merges the cheapest adjacent pair
 * first (lowest rank, then leftmost), as the tokenizers library's Word::merge_all,
 * so ids match it exactly; WordPiece takes the longest known prefix greedily;
 * Unigram is the SentencePiece Viterbi of tok_spm.c in tokenizers' mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* ------------------------------------------------------------ BPE */

typedef struct symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool gone;          /* merged into its left neighbour */
} symbol;

typedef struct merge {
    int32_t rank, pos, id;
} merge;

typedef struct word {
    symbol *sym;
    size_t n, cap;
    merge *heap;
    size_t nh, caph;
} word;

static bool word_add(word *w, int64_t id) {
    if (!tok_grow(&w->sym, &w->cap, w->n, sizeof *w->sym)) return false;
    int32_t i = (int32_t)w->n;
    w->sym[w->n++] = (symbol){(int32_t)id, i - 1, -1, false};
    if (i > 0) w->sym[i - 1].next = i;
    return true;
}

/* min-heap on (rank, pos) */
static bool before(merge a, merge b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static bool heap_push(word *w, merge m) {
    if (!tok_grow(&w->heap, &w->caph, w->nh, sizeof *w->heap)) return false;
    size_t i = w->nh++;
    while (i && before(m, w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = m;
    return true;
}

static merge heap_pop(word *w) {
    merge top = w->heap[0], last = w->heap[--w->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->nh) break;
        if (c + 1 < w->nh && before(w->heap[c + 1], w->heap[c])) c++;
        if (!before(w->heap[c], last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->nh) w->heap[i] = last;
    return top;
}

static bool push_pair(word *w, const tok_pairmap *merges, int32_t pos) {
    int32_t next = w->sym[pos].next;
    if (next < 0) return true;
    const struct tok_pair_slot *m = tok_pairmap_get(merges, w->sym[pos].id, w->sym[next].id);
    return !m || heap_push(w, (merge){m->rank, pos, m->id});
}

static bool merge_all(word *w, const tok_pairmap *merges) {
    for (size_t i = 0; i + 1 < w->n; i++)
        if (!push_pair(w, merges, (int32_t)i)) return false;
    while (w->nh) {
        merge top = heap_pop(w);
        symbol *s = &w->sym[top.pos];
        if (s->gone || s->next < 0) continue;
        symbol *right = &w->sym[s->next];
        const struct tok_pair_slot *m = tok_pairmap_get(merges, s->id, right->id);
        if (!m || m->id != top.id) continue; /* an expired entry: the pair has changed since */
        s->id = top.id;
        right->gone = true;
        s->next = right->next;
        if (s->next >= 0) w->sym[s->next].prev = top.pos;
        if (s->prev >= 0 && !push_pair(w, merges, s->prev)) return false;
        if (!push_pair(w, merges, top.pos)) return false;
    }
    return true;
}

static bool bpe_encode(const tok_model *m, const char *s, size_t n, tok_ids *out) {
    if (!n) return true;
    if (m->ignore_merges) {
        int64_t id = tok_strmap_get(&m->vocab, s, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    word w = {0};
    bool ok = true;
    int64_t unk = -1; /* a pending unknown (fused while fuse_unk) */
    for (size_t i = 0; ok && i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next(s + i, n - i, &cp);
        if (!k) k = 1;
        int64_t id = tok_strmap_get(&m->vocab, s + i, k);
        if (id >= 0) {
            if (unk >= 0) ok = word_add(&w, unk), unk = -1;
            if (ok) ok = word_add(&w, id);
        } else {
            bool all = m->byte_fallback;
            for (size_t j = 0; all && j < k; j++) all = m->byte_id[(unsigned char)s[i + j]] >= 0;
            if (all) {
                for (size_t j = 0; ok && j < k; j++) ok = word_add(&w, m->byte_id[(unsigned char)s[i + j]]);
            } else if (m->unk >= 0) {
                if (unk >= 0 && !m->fuse_unk) ok = word_add(&w, unk);
                unk = m->unk;
            }
        }
        i += k;
    }
    if (ok && unk >= 0) ok = word_add(&w, unk);
    if (ok) ok = merge_all(&w, &m->merges);
    for (size_t i = 0; ok && i < w.n; i++)
        if (!w.sym[i].gone) ok = tok_ids_push(out, w.sym[i].id);
    free(w.sym);
    free(w.heap);
    return ok;
}

/* ------------------------------------------------------------ WordPiece */

static bool wordpiece_encode(const tok_model *m, const char *s, size_t n, tok_ids *out) {
    if (!n) return true;
    int64_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    if (chars > m->max_chars) return tok_ids_push(out, m->unk);
    size_t np = strlen(m->prefix);
    char *buf = malloc(np + n);
    if (!buf) return false;
    memcpy(buf, m->prefix, np);
    size_t first = out->n;
    bool ok = true;
    for (size_t start = 0; ok && start < n;) {
        int64_t id = -1;
        size_t end = n;
        for (; end > start; end--) {
            if (end < n && ((unsigned char)s[end] & 0xC0) == 0x80) continue; /* not a character boundary */
            memcpy(buf + np, s + start, end - start);
            id = start ? tok_strmap_get(&m->vocab, buf, np + end - start) : tok_strmap_get(&m->vocab, s, end);
            if (id >= 0) break;
        }
        if (id < 0) { /* one unknown piece makes the whole word unknown */
            out->n = first;
            ok = tok_ids_push(out, m->unk);
            break;
        }
        ok = tok_ids_push(out, id);
        start = end;
    }
    free(buf);
    return ok;
}

bool tok_model_encode(const tok_model *m, const char *s, size_t n, tok_ids *out) {
    switch (m->kind) {
    case MODEL_BPE: return bpe_encode(m, s, n, out);
    case MODEL_WORDPIECE: return wordpiece_encode(m, s, n, out);
    case MODEL_UNIGRAM: return tok_spm_unigram_ids(m->unigram, s, n, out); /* tok_spm.c, as tokenizers runs it */
    }
    return false;
}
