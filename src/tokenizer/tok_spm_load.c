/* SentencePiece tokenizer.model -> tok_spm (tok_internal.h).
 *
 * The file is a protobuf ModelProto (sentencepiece_model.proto). A small
 * wire-format reader takes the fields the runtime uses and skips the others:
 *   ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec,
 *                   3 normalizer_spec, 5 denormalizer_spec
 *   SentencePiece   1 piece, 2 score (float), 3 type
 *   TrainerSpec     3 model_type, 24 treat_whitespace_as_suffix, 35 byte_fallback,
 *                   44 unk_surface, 46 bos_piece, 47 eos_piece
 *   NormalizerSpec  2 precompiled_charsmap, 3 add_dummy_prefix,
 *                   4 remove_extra_whitespaces, 5 escape_whitespaces
 * Every read is bounds-checked against the enclosing message; a truncated
 * varint or length, a wrong wire type for a known field, or a group is an
 * error naming the byte offset. Then the checks sentencepiece's
 * ModelInterface makes (one unknown piece, no duplicate, all 256 byte pieces
 * with byte_fallback), and refusals of what tok_spm.c does not implement:
 * a denormalizer's precompiled_charsmap, WORD / CHAR models,
 * treat_whitespace_as_suffix. Nothing is silently ignored that would
 * change ids or text. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/io_internal.h"
#include "tok_internal.h"

/* Far above any real tokenizer.model (Gemma's is 4 MB): a hostile size is refused before
 * reading, and the trie of the pieces (tens of bytes a byte of piece text) stays bounded. */
#define SPM_MAX_FILE (64u << 20)

typedef struct pb {
    const uint8_t *p, *end;
    const uint8_t *base; /* the file's first byte, for offsets in messages */
    const char *name;
} pb;

static bool pfail(const pb *r, accel_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool pfail(const pb *r, accel_status st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    accel_set_error(st, "%s: %s", r->name, msg);
    return false;
}

static size_t off(const pb *r) { return (size_t)(r->p - r->base); }

static bool varint(pb *r, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a varint runs past the end of its message", off(r));
        uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return true;
    }
    return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a varint longer than 10 bytes", off(r));
}

/* The next field's number and wire type; false at the end (*done) or on an error. */
static bool next_field(pb *r, uint32_t *field, uint32_t *wire, bool *done) {
    *done = r->p >= r->end;
    if (*done) return false;
    uint64_t key;
    if (!varint(r, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wire = (uint32_t)(key & 7);
    if (!*field || key >> 32) return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: field number 0 or too large", off(r));
    return true;
}

/* A length-delimited field's bytes as a reader of their own. */
static bool sub(pb *r, pb *s) {
    uint64_t n;
    if (!varint(r, &n)) return false;
    if (n > (uint64_t)(r->end - r->p))
        return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a field of %llu bytes runs past the end of its message", off(r),
                     (unsigned long long)n);
    *s = (pb){r->p, r->p + n, r->base, r->name};
    r->p += n;
    return true;
}

static bool skip(pb *r, uint32_t wire) {
    uint64_t v;
    pb s;
    size_t n = wire == 1 ? 8 : 4;
    switch (wire) {
    case 0: return varint(r, &v);
    case 2: return sub(r, &s);
    case 1:
    case 5:
        if ((size_t)(r->end - r->p) < n)
            return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a fixed-size field runs past the end of its message", off(r));
        r->p += n;
        return true;
    default:
        return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: wire type %u (groups or invalid) is not read", off(r), wire);
    }
}

static bool want_wire(pb *r, const char *field, uint32_t wire, uint32_t want) {
    if (wire == want) return true;
    return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: %s has wire type %u, not %u", off(r), field, wire, want);
}

static bool read_bool(pb *r, const char *field, uint32_t wire, bool *out) {
    uint64_t v;
    if (!want_wire(r, field, wire, 0) || !varint(r, &v)) return false;
    *out = v != 0;
    return true;
}

/* A string field, copied NUL-terminated; one holding a NUL byte is refused. */
static bool read_str(pb *r, const char *field, uint32_t wire, char **out, size_t *len) {
    pb s;
    if (!want_wire(r, field, wire, 2) || !sub(r, &s)) return false;
    size_t n = (size_t)(s.end - s.p);
    if (memchr(s.p, 0, n)) return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: %s holds a NUL byte", off(r), field);
    char *c = malloc(n + 1);
    if (!c) return pfail(r, ACCEL_ERR_OOM, "out of memory");
    memcpy(c, s.p, n);
    c[n] = 0;
    free(*out);
    *out = c;
    if (len) *len = n;
    return true;
}

/* ------------------------------------------------------------ messages */

typedef struct spec {
    uint64_t model_type; /* 1 UNIGRAM (default), 2 BPE, 3 WORD, 4 CHAR */
    bool suffix, byte_fallback;
    char *unk_surface, *bos_piece, *eos_piece;
    pb charsmap;          /* normalizer_spec's precompiled_charsmap (empty: none) */
    bool denorm_charsmap; /* denormalizer_spec has one */
} spec;

static bool read_trainer(pb *r, spec *sp) {
    uint32_t f, w;
    bool done;
    while (next_field(r, &f, &w, &done)) {
        bool ok;
        switch (f) {
        case 3: ok = want_wire(r, "trainer_spec.model_type", w, 0) && varint(r, &sp->model_type); break;
        case 24: ok = read_bool(r, "trainer_spec.treat_whitespace_as_suffix", w, &sp->suffix); break;
        case 35: ok = read_bool(r, "trainer_spec.byte_fallback", w, &sp->byte_fallback); break;
        case 44: ok = read_str(r, "trainer_spec.unk_surface", w, &sp->unk_surface, NULL); break;
        case 46: ok = read_str(r, "trainer_spec.bos_piece", w, &sp->bos_piece, NULL); break;
        case 47: ok = read_str(r, "trainer_spec.eos_piece", w, &sp->eos_piece, NULL); break;
        default: ok = skip(r, w);
        }
        if (!ok) return false;
    }
    return done;
}

/* normalizer_spec (tm set) or denormalizer_spec (tm NULL: only whether it has a charsmap matters). */
static bool read_normalizer(pb *r, tok_spm *tm, pb *charsmap) {
    uint32_t f, w;
    bool done;
    while (next_field(r, &f, &w, &done)) {
        bool ok;
        pb s;
        if (f == 2) {
            ok = want_wire(r, "precompiled_charsmap", w, 2) && sub(r, &s);
            if (ok) *charsmap = s; /* the last occurrence wins, as protobuf merges */
        } else if (tm && f == 3) {
            ok = read_bool(r, "normalizer_spec.add_dummy_prefix", w, &tm->add_dummy_prefix);
        } else if (tm && f == 4) {
            ok = read_bool(r, "normalizer_spec.remove_extra_whitespaces", w, &tm->remove_extra_whitespaces);
        } else if (tm && f == 5) {
            ok = read_bool(r, "normalizer_spec.escape_whitespaces", w, &tm->escape_whitespaces);
        } else {
            ok = skip(r, w);
        }
        if (!ok) return false;
    }
    return done;
}

static bool read_piece(pb *r, struct tok_spm_piece *pc) {
    uint32_t f, w;
    bool done;
    uint64_t t = SPM_NORMAL;
    while (next_field(r, &f, &w, &done)) {
        bool ok;
        if (f == 1) {
            ok = read_str(r, "pieces.piece", w, &pc->text, &pc->len);
        } else if (f == 2) {
            ok = want_wire(r, "pieces.score", w, 5);
            if (ok && r->end - r->p < 4) ok = pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a score runs past its piece", off(r));
            if (ok) {
                uint32_t bits = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
                float f;
                memcpy(&f, &bits, sizeof f);
                pc->score = f;
                r->p += 4;
                /* as sentencepiece: a NaN or infinite score is refused */
                if (!isfinite(pc->score))
                    ok = pfail(r, ACCEL_ERR_FORMAT, "byte %zu: a piece's score is NaN or infinite", off(r) - 4);
            }
        } else if (f == 3) {
            ok = want_wire(r, "pieces.type", w, 0) && varint(r, &t);
        } else {
            ok = skip(r, w);
        }
        if (!ok) return false;
    }
    if (!done) return false;
    if (t < SPM_NORMAL || t > SPM_BYTE) return pfail(r, ACCEL_ERR_FORMAT, "byte %zu: piece type %llu is not a SentencePiece.Type", off(r), (unsigned long long)t);
    pc->type = (uint8_t)t;
    return true;
}

static bool read_model(pb *r, tok_spm *m, spec *sp) {
    uint32_t f, w;
    bool done;
    size_t cap = 0;
    while (next_field(r, &f, &w, &done)) {
        pb s, dn = {0};
        bool ok = true;
        if (f >= 1 && f <= 5 && f != 4) ok = want_wire(r, "a ModelProto field", w, 2) && sub(r, &s);
        if (!ok) return false;
        switch (f) {
        case 1:
            if (m->n == INT32_MAX) return pfail(r, ACCEL_ERR_FORMAT, "more than %d pieces", INT32_MAX);
            if (!tok_grow(&m->pc, &cap, (size_t)m->n, sizeof *m->pc)) return pfail(r, ACCEL_ERR_OOM, "out of memory");
            m->pc[m->n] = (struct tok_spm_piece){.type = SPM_NORMAL};
            if (!read_piece(&s, &m->pc[m->n++])) return false;
            break;
        case 2: ok = read_trainer(&s, sp); break;
        case 3: ok = read_normalizer(&s, m, &sp->charsmap); break;
        case 5:
            ok = read_normalizer(&s, NULL, &dn);
            sp->denorm_charsmap = dn.end > dn.p;
            break;
        default: ok = skip(r, w);
        }
        if (!ok) return false;
    }
    return done;
}

/* precompiled_charsmap (sentencepiece's Normalizer::DecodePrecompiledCharsMap, tok_charsmap.c). */
static bool read_charsmap(pb *r, tok_spm *m) {
    size_t n = (size_t)(r->end - r->p);
    accel_status st = tok_charsmap_read(&m->cmap, r->p, n);
    uint32_t trie = n > 4 ? (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24 : 0;
    if (st == ACCEL_ERR_OOM) return pfail(r, ACCEL_ERR_OOM, "out of memory");
    if (st != ACCEL_OK)
        return pfail(r, ACCEL_ERR_FORMAT,
                     "normalizer_spec.precompiled_charsmap is broken: %zu bytes, a trie of %u bytes (a non-zero multiple "
                     "of 4 that fits)", n, trie);
    return true;
}

/* "<0xXX>" with two upper-case hex digits, as sentencepiece's PieceToByte; -1 otherwise. */
static int piece_byte(const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    return hi && lo && s[3] && s[4] ? (int)((hi - hex) * 16 + (lo - hex)) : -1;
}

static bool trie_node(tok_spm_trie *t) {
    if (t->n >= INT32_MAX || !tok_grow(&t->piece, &t->cap, t->n, sizeof *t->piece)) return false;
    t->piece[t->n++] = -1;
    return true;
}

static bool trie_insert(tok_spm_trie *t, const char *s, size_t n, int32_t id) {
    if (!t->n && !trie_node(t)) return false; /* the root */
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        const struct tok_pair_slot *e = tok_pairmap_get(&t->child, cur, (uint8_t)s[i]);
        int32_t next = e ? e->id : -1;
        if (next < 0) {
            next = (int32_t)t->n;
            if (!trie_node(t) || !tok_pairmap_put(&t->child, cur, (uint8_t)s[i], 0, next)) return false;
        }
        cur = next;
    }
    t->piece[cur] = id;
    return true;
}

/* The pair map's edges as the frozen layout of tok_internal.h; the map is freed. */
static bool trie_freeze(tok_spm_trie *t) {
    if (!t->n && !trie_node(t)) return false; /* the root: encode looks there first */
    t->first = calloc(t->n + 1, sizeof *t->first);
    t->label = malloc(t->n * sizeof *t->label);
    t->next = malloc(t->n * sizeof *t->next);
    if (!t->first || !t->label || !t->next) return false;
    const tok_pairmap *pm = &t->child;
    /* counts, then starts (first[node + 1] the end of node's slice), then the
     * edges in the map's order, then each slice sorted by label (insertion: most are short, none over 256) */
    for (size_t j = 0; j < pm->cap; j++)
        if (pm->slot[j].a >= 0) t->first[pm->slot[j].a + 1]++;
    for (size_t v = 0; v < t->n; v++) t->first[v + 1] += t->first[v];
    uint32_t *fill = malloc(t->n * sizeof *fill);
    if (!fill) return false;
    memcpy(fill, t->first, t->n * sizeof *fill);
    for (size_t j = 0; j < pm->cap; j++) {
        const struct tok_pair_slot *e = &pm->slot[j];
        if (e->a < 0) continue;
        t->label[fill[e->a]] = (uint8_t)e->b;
        t->next[fill[e->a]++] = e->id;
    }
    free(fill);
    /* the wide nodes' tables (the root always: every walk starts there) */
    size_t nwide = 0;
    if (!(t->wide = malloc(t->n * sizeof *t->wide))) return false;
    for (size_t v = 0; v < t->n; v++)
        t->wide[v] = !v || t->first[v + 1] - t->first[v] > TOK_SPM_WIDE ? (int32_t)nwide++ : -1;
    if (!(t->table = malloc(nwide * 256 * sizeof *t->table))) return false;
    for (size_t i = 0; i < nwide * 256; i++) t->table[i] = -1;
    for (size_t v = 0; v < t->n; v++)
        for (uint32_t i = t->first[v]; t->wide[v] >= 0 && i < t->first[v + 1]; i++)
            t->table[(size_t)t->wide[v] * 256 + t->label[i]] = t->next[i];
    for (size_t v = 0; v < t->n; v++)
        for (uint32_t i = t->first[v] + 1; i < t->first[v + 1]; i++) {
            uint8_t l = t->label[i];
            int32_t x = t->next[i];
            uint32_t k = i;
            for (; k > t->first[v] && t->label[k - 1] > l; k--) t->label[k] = t->label[k - 1], t->next[k] = t->next[k - 1];
            t->label[k] = l, t->next[k] = x;
        }
    tok_pairmap_free(&t->child);
    return true;
}

static void trie_free(tok_spm_trie *t) {
    free(t->piece);
    free(t->first);
    free(t->wide);
    free(t->table);
    free(t->label);
    free(t->next);
    tok_pairmap_free(&t->child);
}

/* The maps and checks of sentencepiece's ModelInterface::InitializePieces, and the refusals. */
static bool build(pb *r, tok_spm *m, spec *sp) {
    if (sp->model_type != 1 && sp->model_type != 2)
        return pfail(r, ACCEL_ERR_UNSUPPORTED, "trainer_spec.model_type %llu (%s) is not supported: UNIGRAM (1) and BPE (2) are",
                     (unsigned long long)sp->model_type,
                     sp->model_type == 3 ? "WORD" : sp->model_type == 4 ? "CHAR" : "not a ModelType");
    if (sp->denorm_charsmap)
        return pfail(r, ACCEL_ERR_UNSUPPORTED,
                     "denormalizer_spec.precompiled_charsmap is set (decode-time normalization rules), which accel's "
                     "SentencePiece reader does not implement");
    if (sp->charsmap.end > sp->charsmap.p && !read_charsmap(&sp->charsmap, m)) return false;
    if (sp->suffix)
        return pfail(r, ACCEL_ERR_UNSUPPORTED,
                     "trainer_spec.treat_whitespace_as_suffix is set, which accel's SentencePiece reader does not implement");
    if (!m->n) return pfail(r, ACCEL_ERR_FORMAT, "no pieces");
    m->unigram = sp->model_type == 1;
    m->byte_fallback = sp->byte_fallback;
    m->unk = m->bos = m->eos = -1;
    m->min_score = FLT_MAX;
    for (int b = 0; b < 256; b++) m->byte_id[b] = -1;
    for (int32_t i = 0; i < m->n; i++) {
        struct tok_spm_piece *pc = &m->pc[i];
        if (!pc->len) return pfail(r, ACCEL_ERR_FORMAT, "piece %d is empty", i);
        if (tok_utf8_invalid_at(pc->text, pc->len) != pc->len)
            return pfail(r, ACCEL_ERR_FORMAT, "piece %d is not UTF-8", i);
        bool normal = pc->type == SPM_NORMAL || pc->type == SPM_USER_DEFINED || pc->type == SPM_UNUSED;
        tok_strmap *map = normal ? &m->pieces : &m->reserved;
        if (tok_strmap_get(map, pc->text, pc->len) >= 0)
            return pfail(r, ACCEL_ERR_FORMAT, "piece %d \"%.80s\" is already defined", i, pc->text);
        if (!tok_strmap_put(map, pc->text, pc->len, i) || (normal && !trie_insert(&m->trie, pc->text, pc->len, i)) ||
            (pc->type == SPM_USER_DEFINED && !trie_insert(&m->user, pc->text, pc->len, i)))
            return pfail(r, ACCEL_ERR_OOM, "out of memory");
        if (pc->type == SPM_NORMAL && pc->score < m->min_score) m->min_score = pc->score;
        if (pc->type == SPM_UNKNOWN) {
            if (m->unk >= 0) return pfail(r, ACCEL_ERR_FORMAT, "piece %d: a second unknown piece (the first is %d)", i, m->unk);
            m->unk = i;
        }
        if (pc->type == SPM_BYTE) {
            int b = piece_byte(pc->text, pc->len);
            if (!sp->byte_fallback)
                return pfail(r, ACCEL_ERR_FORMAT, "byte piece %d \"%.80s\" although trainer_spec.byte_fallback is false", i, pc->text);
            if (b < 0) return pfail(r, ACCEL_ERR_FORMAT, "byte piece %d \"%.80s\" is not <0xXX>", i, pc->text);
            m->byte_id[b] = i;
        }
    }
    if (!trie_freeze(&m->trie) || !trie_freeze(&m->user)) return pfail(r, ACCEL_ERR_OOM, "out of memory");
    if (m->unk < 0) return pfail(r, ACCEL_ERR_FORMAT, "no piece of type UNKNOWN");
    for (int b = 0; sp->byte_fallback && b < 256; b++)
        if (m->byte_id[b] < 0) return pfail(r, ACCEL_ERR_FORMAT, "byte_fallback is set but piece <0x%02X> is missing", b);
    /* bos_id() / eos_id(): the trainer's piece names, when they are CONTROL pieces */
    int64_t id = tok_strmap_get(&m->reserved, sp->bos_piece ? sp->bos_piece : "<s>", strlen(sp->bos_piece ? sp->bos_piece : "<s>"));
    if (id >= 0 && m->pc[id].type == SPM_CONTROL) m->bos = (int32_t)id;
    id = tok_strmap_get(&m->reserved, sp->eos_piece ? sp->eos_piece : "</s>", strlen(sp->eos_piece ? sp->eos_piece : "</s>"));
    if (id >= 0 && m->pc[id].type == SPM_CONTROL) m->eos = (int32_t)id;
    m->unk_surface = sp->unk_surface;
    sp->unk_surface = NULL;
    if (!m->unk_surface && !(m->unk_surface = strdup(" \xE2\x81\x87 "))) return pfail(r, ACCEL_ERR_OOM, "out of memory");
    return true;
}

tok_spm *tok_spm_parse(const char *name, const uint8_t *p, size_t n) {
    pb r = {p, p + n, p, name};
    tok_spm *m = calloc(1, sizeof *m);
    spec sp = {.model_type = 1};
    if (!m) {
        pfail(&r, ACCEL_ERR_OOM, "out of memory");
        return NULL;
    }
    /* NormalizerSpec's defaults */
    m->add_dummy_prefix = m->remove_extra_whitespaces = m->escape_whitespaces = true;
    bool ok = read_model(&r, m, &sp) && build(&r, m, &sp);
    free(sp.unk_surface);
    free(sp.bos_piece);
    free(sp.eos_piece);
    if (!ok) {
        tok_spm_free(m);
        return NULL;
    }
    return m;
}

/* tokenizers' Unigram::from: every piece in the map and the trie (a text given
 * twice: its last id, as tokenizers' HashMap), min_score over all of them. */
tok_spm *tok_spm_hf_unigram(char *const *text, const size_t *len, const double *score, int32_t n, int32_t unk,
                            bool byte_fallback) {
    tok_spm *m = calloc(1, sizeof *m);
    if (!m || !(m->pc = calloc((size_t)n + 1, sizeof *m->pc))) goto oom;
    m->unigram = m->hf = true;
    m->unk = unk, m->bos = m->eos = -1;
    m->byte_fallback = byte_fallback;
    m->min_score = INFINITY;
    for (int32_t i = 0; i < n; i++) {
        struct tok_spm_piece *pc = &m->pc[i];
        if (!(pc->text = malloc(len[i] + 1))) goto oom;
        m->n = i + 1; /* freed from here on */
        memcpy(pc->text, text[i], len[i] + 1);
        pc->len = len[i], pc->score = score[i], pc->type = SPM_NORMAL;
        if (score[i] < m->min_score) m->min_score = score[i];
        if (!tok_strmap_put(&m->pieces, pc->text, pc->len, i) || !trie_insert(&m->trie, pc->text, pc->len, i)) goto oom;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int64_t id = tok_strmap_get(&m->pieces, name, 6);
        m->byte_id[b] = (int32_t)id;
    }
    if (!trie_freeze(&m->trie) || !trie_freeze(&m->user)) goto oom;
    return m;
oom:
    tok_spm_free(m);
    return NULL;
}

tok_spm *tok_spm_load(const char *path) {
    struct stat sb;
    int fd = accel__open_regular(path, "a tokenizer.model", &sb);
    if (fd < 0) return NULL;
    uint8_t *buf = NULL;
    tok_spm *m = NULL;
    size_t n = 0;
    if ((uint64_t)sb.st_size > SPM_MAX_FILE) {
        accel_set_error(ACCEL_ERR_FORMAT, "%s: %lld bytes, more than a tokenizer.model may have (%u MiB)", path,
                        (long long)sb.st_size, SPM_MAX_FILE >> 20);
    } else if (!(buf = malloc((size_t)sb.st_size + 1))) {
        accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
    } else {
        /* a file that shrank since fstat is read to its end */
        bool failed = false;
        while (n < (size_t)sb.st_size && !failed) {
            ssize_t k = read(fd, buf + n, (size_t)sb.st_size - n);
            if (k > 0) n += (size_t)k;
            else if (k == 0) break;
            else failed = errno != EINTR;
        }
        if (failed) accel_set_error(ACCEL_ERR_IO, "%s: cannot be read: %s", path, strerror(errno));
        else m = tok_spm_parse(path, buf, n);
    }
    free(buf);
    close(fd);
    return m;
}

void tok_spm_free(tok_spm *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++) free(m->pc[i].text);
    free(m->pc);
    tok_strmap_free(&m->pieces);
    tok_strmap_free(&m->reserved);
    tok_charsmap_free(&m->cmap);
    trie_free(&m->trie);
    trie_free(&m->user);
    free(m->unk_surface);
    free(m);
}
