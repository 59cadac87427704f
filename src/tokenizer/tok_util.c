/* The tokenizer's small containers and UTF-8 helpers (tok_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

bool tok_grow(void *pv, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 16;
    void *p = realloc(*(void **)pv, c * elem);
    if (!p) return false;
    *(void **)pv = p;
    *cap = c;
    return true;
}

bool tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0; /* always NUL-terminated, for the callers that hand it out */
    return true;
}

bool tok_buf_putc(tok_buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    return tok_buf_put(b, u, n);
}

bool tok_pieces_add(tok_pieces *p, const char *s, size_t n) {
    size_t cap = p->cap;
    if (!tok_grow(&p->off, &cap, p->n, sizeof *p->off) || !tok_grow(&p->len, &p->cap, p->n, sizeof *p->len))
        return false;
    p->off[p->n] = p->text.n;
    p->len[p->n] = n;
    if (!tok_buf_put(&p->text, s, n)) return false;
    p->n++;
    return true;
}

bool tok_spans_add(tok_spans *s, size_t a, size_t b, int64_t tag) {
    if (!tok_grow(&s->v, &s->cap, s->n, sizeof *s->v)) return false;
    s->v[s->n++] = (struct tok_span){a, b, tag};
    return true;
}

void tok_pieces_free(tok_pieces *p) {
    free(p->text.p);
    free(p->off);
    free(p->len);
    memset(p, 0, sizeof *p);
}

bool tok_ids_push(tok_ids *a, int64_t id) {
    if (!tok_grow(&a->v, &a->cap, a->n, sizeof *a->v)) return false;
    a->v[a->n++] = id;
    return true;
}

/* FNV-1a: keys are short token strings. */
static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static bool strmap_grow(tok_strmap *m) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    struct tok_strmap_slot *slot = calloc(cap, sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slot[i].key) continue;
        size_t j = hash_bytes(m->slot[i].key, m->slot[i].len) & (cap - 1);
        while (slot[j].key) j = (j + 1) & (cap - 1);
        slot[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return true;
}

bool tok_strmap_put(tok_strmap *m, const char *key, size_t len, int64_t val) {
    if (2 * (m->n + 1) > m->cap && !strmap_grow(m)) return false;
    size_t j = hash_bytes(key, len) & (m->cap - 1);
    for (; m->slot[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slot[j].len == len && !memcmp(m->slot[j].key, key, len)) {
            m->slot[j].val = val;
            return true;
        }
    char *k = malloc(len + 1);
    if (!k) return false;
    memcpy(k, key, len);
    k[len] = 0;
    m->slot[j] = (struct tok_strmap_slot){k, len, val};
    m->n++;
    return true;
}

int64_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    for (size_t j = hash_bytes(key, len) & (m->cap - 1); m->slot[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slot[j].len == len && !memcmp(m->slot[j].key, key, len)) return m->slot[j].val;
    return -1;
}

void tok_strmap_free(tok_strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->slot[i].key);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* Both halves of the key reach the low bits (a product alone leaves bits
 * below 32 blind to `a`: every pair with the same `b` collided in maps of up
 * to 4096 slots). */
static size_t pair_hash(int32_t a, int32_t b, size_t cap) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return (size_t)h & (cap - 1);
}

static bool pairmap_grow(tok_pairmap *m) {
    size_t cap = m->cap ? 2 * m->cap : 256;
    struct tok_pair_slot *slot = malloc(cap * sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < cap; i++) slot[i].a = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slot[i].a < 0) continue;
        size_t j = pair_hash(m->slot[i].a, m->slot[i].b, cap);
        while (slot[j].a >= 0) j = (j + 1) & (cap - 1);
        slot[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return true;
}

bool tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if (2 * (m->n + 1) > m->cap && !pairmap_grow(m)) return false;
    size_t j = pair_hash(a, b, m->cap);
    for (; m->slot[j].a >= 0; j = (j + 1) & (m->cap - 1))
        if (m->slot[j].a == a && m->slot[j].b == b) { /* the last rank wins, as the reference's HashMap */
            m->slot[j].rank = rank, m->slot[j].id = id;
            return true;
        }
    m->slot[j] = (struct tok_pair_slot){a, b, rank, id};
    m->n++;
    return true;
}

const struct tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    for (size_t j = pair_hash(a, b, m->cap); m->slot[j].a >= 0; j = (j + 1) & (m->cap - 1))
        if (m->slot[j].a == a && m->slot[j].b == b) return &m->slot[j];
    return NULL;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

size_t tok_utf8_next(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (!n) return 0;
    if (s[0] < 0x80) return *cp = s[0], 1;
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
    if (!len || len > n || s[0] > 0xF4) return 0;
    uint32_t c = s[0] & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    /* overlong forms, surrogates and values past U+10FFFF are invalid */
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

size_t tok_utf8_invalid_at(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_next(s + i, n - i, &cp);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* How many bytes at s form the longest prefix of a valid sequence (the
 * "maximal subpart" that one U+FFFD replaces), at least 1. */
static size_t maximal_subpart(const unsigned char *s, size_t n) {
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 1;
    if (len == 1 || s[0] > 0xF4) return 1;
    for (size_t i = 1; i < len && i < n; i++) {
        unsigned char lo = 0x80, hi = 0xBF;
        if (i == 1) { /* the second byte's narrower ranges (Unicode table 3-7) */
            if (s[0] == 0xE0) lo = 0xA0;
            else if (s[0] == 0xED) hi = 0x9F;
            else if (s[0] == 0xF0) lo = 0x90;
            else if (s[0] == 0xF4) hi = 0x8F;
        }
        if (s[i] < lo || s[i] > hi) return i;
    }
    return len < n ? len : n;
}

bool tok_utf8_lossy(tok_buf *out, const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_next(s + i, n - i, &cp);
        if (k) {
            if (!tok_buf_put(out, s + i, k)) return false;
            i += k;
        } else {
            if (!tok_buf_putc(out, 0xFFFD)) return false;
            i += maximal_subpart((const unsigned char *)s + i, n - i);
        }
    }
    return true;
}

/* The standard alphabet, '=' padding to a multiple of 4, unused bits zero: the
 * base64 crate's STANDARD engine, which tokenizers reads a charsmap with. */
bool tok_base64_decode(const char *s, size_t n, uint8_t **out, size_t *n_out, bool *oom) {
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    *out = NULL, *n_out = 0, *oom = false;
    if (n % 4) return false;
    size_t pad = n && s[n - 1] == '=' ? (n > 1 && s[n - 2] == '=' ? 2 : 1) : 0;
    uint8_t *p = malloc(n / 4 * 3 + 1);
    if (!p) return *oom = true, false;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (size_t j = 0; j < 4; j++) {
            const char *d = s[i + j] ? strchr(alpha, s[i + j]) : NULL;
            bool padding = i + 4 == n && j >= 4 - pad;
            if (!d && !padding) return free(p), false;
            v = v << 6 | (uint32_t)(d ? d - alpha : 0);
        }
        /* the bits padding leaves over must be zero (canonical) */
        if ((pad == 1 && i + 4 == n && (v & 0xFF)) || (pad == 2 && i + 4 == n && (v & 0xFFFF))) return free(p), false;
        p[k++] = (uint8_t)(v >> 16), p[k++] = (uint8_t)(v >> 8), p[k++] = (uint8_t)v;
    }
    *out = p, *n_out = k - pad;
    return true;
}
