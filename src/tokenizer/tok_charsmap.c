/* SentencePiece's precompiled charsmap (tok_internal.h's tok_charsmap): read
 * once, then searched by both runtimes that use one: a tokenizer.model's
 * normalizer (tok_spm.c: the longest rule at each position) and tokenizers'
 * Precompiled normalizer (tok_normalize.c: the shortest rule of a grapheme or
 * character, as its transform takes the first result of the search). */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static uint32_t le32(const uint8_t *u) {
    return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

accel_status tok_charsmap_read(tok_charsmap *c, const uint8_t *p, size_t n) {
    uint32_t trie = n > 4 ? le32(p) : 0;
    if (n <= 4 || trie > n - 4 || trie % 4 || !trie) return ACCEL_ERR_FORMAT;
    c->n = trie / 4;
    c->norm_len = n - 4 - trie;
    if (!(c->unit = malloc(c->n * sizeof *c->unit)) || !(c->norm = malloc(c->norm_len + 1))) {
        tok_charsmap_free(c);
        return ACCEL_ERR_OOM;
    }
    const uint8_t *u = p + 4;
    for (size_t i = 0; i < c->n; i++, u += 4) c->unit[i] = le32(u);
    memcpy(c->norm, u, c->norm_len);
    c->norm[c->norm_len] = 0; /* a last string without its NUL ends at the blob's end */
    return ACCEL_OK;
}

void tok_charsmap_free(tok_charsmap *c) {
    free(c->unit);
    free(c->norm);
    memset(c, 0, sizeof *c);
}

/* darts-clone's commonPrefixSearch. A unit: bits 0-7 label, 8 has_leaf, 9
 * offset shift, 10-31 offset; a leaf unit's bits 0-30 are its value. */
size_t tok_charsmap_prefix(const tok_charsmap *c, const char *s, size_t n, bool shortest, uint32_t *value) {
    const uint32_t *a = c->unit;
    size_t pos = 0, best = 0;
    uint32_t unit = a[0];
    pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = (uint8_t)s[i];
        if (shortest && !ch) break; /* spm_precompiled's search ends at a NUL */
        pos ^= ch;
        if (pos >= c->n) break;
        unit = a[pos];
        if ((unit & ((1u << 31) | 0xFF)) != ch) break;
        pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
        if (pos >= c->n) break;
        if ((unit >> 8) & 1) {
            best = i + 1;
            *value = a[pos] & ((1u << 31) - 1);
            if (shortest) break;
        }
    }
    return best;
}
