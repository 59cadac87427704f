/* Internal types of the tokenizer (include/accel/tokenizer.h): the components a
 * tokenizer.json describes, as plain tagged structs built once at load
 * (tok_load.c) and read-only afterwards, plus the small containers they use.
 * Strings are UTF-8 byte ranges (pointer + length), never NUL-terminated unless said. */
#ifndef ACCEL_TOK_INTERNAL_H
#define ACCEL_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "accel/tokenizer.h"

/* ------------------------------------------------------------ containers (tok_util.c) */

/* Makes room for one more element in the array *pv of *cap elements of elem
 * bytes holding n (doubling); false: out of memory, the array unchanged. */
bool tok_grow(void *pv, size_t *cap, size_t n, size_t elem);

/* A growable byte string. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;
bool tok_buf_put(tok_buf *b, const void *s, size_t n);       /* false: out of memory */
bool tok_buf_putc(tok_buf *b, uint32_t cp);                  /* cp as UTF-8 */

/* Pieces of text: each a byte range of one shared buffer. */
typedef struct tok_pieces {
    tok_buf text;
    size_t *off, *len;
    size_t n, cap;
} tok_pieces;
bool tok_pieces_add(tok_pieces *p, const char *s, size_t n);
void tok_pieces_free(tok_pieces *p);

/* Byte ranges [a, b) of a text with a tag (a split's match flag, an added
 * token's id or -1). */
typedef struct tok_spans {
    struct tok_span {
        size_t a, b;
        int64_t tag;
    } *v;
    size_t n, cap;
} tok_spans;
bool tok_spans_add(tok_spans *s, size_t a, size_t b, int64_t tag);

/* A growable array of ids. */
typedef struct tok_ids {
    int64_t *v;
    size_t n, cap;
} tok_ids;
bool tok_ids_push(tok_ids *a, int64_t id);

/* String -> id, open addressing; keys copied. */
typedef struct tok_strmap {
    struct tok_strmap_slot {
        char *key;
        size_t len;
        int64_t val;
    } *slot;
    size_t cap, n;
} tok_strmap;
bool tok_strmap_put(tok_strmap *m, const char *key, size_t len, int64_t val); /* replaces */
int64_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);     /* -1: none */
void tok_strmap_free(tok_strmap *m);

/* (left id, right id) -> (rank, merged id): a BPE merge. */
typedef struct tok_pairmap {
    struct tok_pair_slot {
        int32_t a, b, rank, id; /* a == -1: empty */
    } *slot;
    size_t cap, n;
} tok_pairmap;
bool tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id); /* replaces */
const struct tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);
void tok_pairmap_free(tok_pairmap *m);

/* UTF-8: the code point at s[0..n) and its length (0: invalid). */
size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp);
/* Offset of the first invalid byte, or n when s is valid UTF-8. */
size_t tok_utf8_invalid_at(const char *s, size_t n);
/* s as UTF-8 with every maximal invalid subsequence replaced by U+FFFD, as Rust's
 * String::from_utf8_lossy. */
bool tok_utf8_lossy(tok_buf *out, const char *s, size_t n);

/* Standard base64 with canonical padding (what tokenizers writes for a
 * Precompiled normalizer's charsmap): *out malloc'd (n_out bytes); false when
 * `s` is not such base64 (*out NULL) or out of memory (*out NULL, *oom true). */
bool tok_base64_decode(const char *s, size_t n, uint8_t **out, size_t *n_out, bool *oom);

/* ------------------------------------------------------------ precompiled charsmaps (tok_charsmap.c) */

/* SentencePiece's precompiled_charsmap (normalization rules such as nmt_nfkc),
 * as both a tokenizer.model's normalizer_spec and tokenizers' Precompiled
 * normalizer hold it: a darts-clone double-array trie over the input's bytes
 * whose values are offsets into `norm`, the replacement strings (each ending
 * with a NUL; norm[len] is a NUL too). n == 0: none. */
typedef struct tok_charsmap {
    uint32_t *unit;
    size_t n;
    char *norm;
    size_t norm_len;
} tok_charsmap;

/* Parses the blob: a little-endian uint32 byte size of the trie, its units, then
 * the strings. ACCEL_ERR_FORMAT when the size is 0, not a multiple of 4 or runs
 * past the blob; ACCEL_ERR_OOM. No error message is set: callers name the field. */
accel_status tok_charsmap_read(tok_charsmap *c, const uint8_t *p, size_t n);
void tok_charsmap_free(tok_charsmap *c);
/* The rules whose source is a prefix of s[0..n): the longest one's length
 * (sentencepiece) or, with shortest, the shortest one's (tokenizers' transform,
 * which also stops at a NUL byte), 0 when none; *value its replacement's offset.
 * Every index is checked against the trie's size: a broken trie ends the match. */
size_t tok_charsmap_prefix(const tok_charsmap *c, const char *s, size_t n, bool shortest, uint32_t *value);

/* ------------------------------------------------------------ components */

typedef enum {
    NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_STRIP, NORM_STRIP_ACCENTS,
    NORM_REPLACE, NORM_PREPEND, NORM_BERT, NORM_PRECOMPILED, NORM_SEQUENCE
} tok_norm_kind;

typedef struct tok_normalizer {
    tok_norm_kind kind;
    bool left, right;                      /* Strip */
    pcre2_code *pattern;                   /* Replace */
    char *content;                         /* Replace's content, Prepend's prepend (NUL-terminated) */
    bool clean_text, chinese_chars, strip_accents, lowercase; /* BertNormalizer */
    tok_charsmap cmap;                     /* Precompiled (its strings checked to be UTF-8) */
    struct tok_normalizer *seq;            /* Sequence */
    int n_seq;
} tok_normalizer;

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } tok_split_behavior;

typedef enum {
    PRE_BYTE_LEVEL, PRE_SPLIT, PRE_METASPACE, PRE_WHITESPACE, PRE_WHITESPACE_SPLIT, PRE_BERT, PRE_DIGITS,
    PRE_SEQUENCE
} tok_pre_kind;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend_scheme;

typedef struct tok_pretokenizer {
    tok_pre_kind kind;
    bool add_prefix_space, use_regex;      /* ByteLevel */
    pcre2_code *pattern;                   /* Split (also Whitespace's and ByteLevel's regex) */
    tok_split_behavior behavior;
    bool invert;
    char *replacement;                     /* Metaspace (NUL-terminated) */
    tok_prepend_scheme prepend_scheme;
    bool split;                            /* Metaspace */
    bool individual_digits;                /* Digits */
    struct tok_pretokenizer *seq;
    int n_seq;
} tok_pretokenizer;

typedef enum { MODEL_BPE, MODEL_WORDPIECE, MODEL_UNIGRAM } tok_model_kind;

struct tok_spm;

typedef struct tok_model {
    tok_model_kind kind;
    tok_strmap vocab;
    char **token;        /* id -> token text (NUL-terminated), NULL where none */
    int64_t n_token;     /* one past the largest model id */
    int64_t unk;         /* -1: none */
    /* BPE */
    tok_pairmap merges;
    bool byte_fallback, fuse_unk, ignore_merges;
    int64_t byte_id[256]; /* <0xXX> ids for byte_fallback, -1 where missing */
    /* WordPiece */
    char *prefix;        /* continuing_subword_prefix (NUL-terminated) */
    int64_t max_chars;
    /* Unigram: the vocabulary as a tok_spm run by tok_spm_unigram_ids (token and vocab above hold it too) */
    struct tok_spm *unigram;
} tok_model;

typedef enum { POST_TEMPLATE, POST_BERT, POST_ROBERTA, POST_BYTE_LEVEL, POST_SEQUENCE } tok_post_kind;

typedef struct tok_post {
    tok_post_kind kind;
    /* TemplateProcessing's single template: n_items items, each either the
     * sequence ($A: ids == NULL) or a special token's ids. */
    struct tok_template_item {
        int64_t *ids;
        int n;
    } *items;
    int n_items;
    int64_t cls, sep;    /* BertProcessing, RobertaProcessing */
    struct tok_post *seq;
    int n_seq;
} tok_post;

typedef enum {
    DEC_BYTE_LEVEL, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_WORDPIECE, DEC_METASPACE,
    DEC_SEQUENCE
} tok_dec_kind;

typedef struct tok_decoder {
    tok_dec_kind kind;
    uint32_t strip_char;  /* Strip */
    int64_t start, stop;
    char *pattern;        /* Replace (a plain string), NUL-terminated */
    char *content;
    char *prefix;         /* WordPiece */
    bool cleanup;
    char *replacement;    /* Metaspace */
    bool prepend;         /* Metaspace: prepend_scheme != never */
    struct tok_decoder *seq;
    int n_seq;
} tok_decoder;

typedef struct tok_added {
    char *content;
    size_t len;
    /* the text encode looks for: content, or for a normalized token the
     * normalizer's output of it (owned then; match_len 0: never matched) */
    char *match;
    size_t match_len;
    int64_t id;
    bool special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* ------------------------------------------------------------ SentencePiece */

/* A SentencePiece tokenizer.model (sentencepiece_model.proto's ModelProto), as
 * the sentencepiece library runs it: tok_spm_load.c reads it, tok_spm.c
 * normalizes, encodes (BPE by piece scores, Unigram by Viterbi) and decodes. */

/* SentencePiece.Type */
enum { SPM_NORMAL = 1, SPM_UNKNOWN = 2, SPM_CONTROL = 3, SPM_USER_DEFINED = 4, SPM_UNUSED = 5, SPM_BYTE = 6 };

/* A byte trie: node 0 is the root, piece[node] the piece ending there (-1
 * none). Built through `child` ((node, byte) -> the child node, in the pair
 * map's `id`), then frozen by tok_spm_trie_freeze into the layout encode walks
 * (a hash per byte cost more than sentencepiece's double array): the
 * children of the root and of every node with more than TOK_SPM_WIDE of them
 * as a table by byte (wide[node]: its block of 256 in table, else -1), every
 * other node's as its slice first[node] .. first[node + 1] of label / next,
 * sorted by label. */
#define TOK_SPM_WIDE 16
typedef struct tok_spm_trie {
    int32_t *piece;
    size_t n, cap;
    tok_pairmap child;  /* building only: freed by tok_spm_trie_freeze */
    int32_t *wide;      /* [n] */
    int32_t *table;     /* [256 per wide node]: the child per byte, -1 none */
    uint32_t *first;    /* [n + 1] */
    uint8_t *label;     /* [n - 1]: the byte into each child */
    int32_t *next;      /* [n - 1]: the child node */
} tok_spm_trie;

typedef struct tok_spm {
    bool unigram;                /* trainer_spec.model_type UNIGRAM; else BPE */
    /* A tokenizers Unigram model (tokenizer.json), not a tokenizer.model: every piece
     * is NORMAL (special and byte pieces are matched in text too), the best path's
     * scores are summed in double rather than float, the unknown score is the
     * minimum over all pieces less 10, and tok_spm_unigram_ids emits the ids. */
    bool hf;
    struct tok_spm_piece {
        char *text;              /* NUL-terminated (a piece holds no NUL) */
        size_t len;
        double score;            /* a float's value for a tokenizer.model */
        uint8_t type;            /* SPM_* */
    } *pc;                       /* id -> piece */
    int32_t n;                   /* ids 0 .. n-1 */
    tok_strmap pieces;           /* NORMAL, USER_DEFINED, UNUSED text -> id */
    tok_strmap reserved;         /* UNKNOWN, CONTROL, BYTE text -> id (looked up first) */
    /* Byte tries (as sentencepiece's double-array tries: finding the pieces
     * that start at a position costs the longest match) of `pieces`, and of
     * the USER_DEFINED ones alone (matched first, by normalizer and BPE). */
    tok_spm_trie trie, user;
    int32_t unk;                 /* the UNKNOWN piece (one, required; hf: unk_id, -1 none) */
    int32_t bos, eos;            /* trainer_spec's bos_piece / eos_piece when CONTROL, else -1 */
    bool byte_fallback;
    int32_t byte_id[256];        /* <0xXX> pieces (all 256 when byte_fallback; hf: -1 where missing) */
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    tok_charsmap cmap;           /* normalizer_spec.precompiled_charsmap, cmap.n == 0: none */
    char *unk_surface;           /* what decode writes for the unknown piece */
    double min_score; /* over NORMAL pieces, from FLT_MAX as sentencepiece (hf: over all) */
} tok_spm;

/* NULL + an error naming `name` and the field or byte offset on anything
 * malformed, truncated or unsupported. tok_spm_load reads the file first. */
tok_spm *tok_spm_parse(const char *name, const uint8_t *p, size_t n);
tok_spm *tok_spm_load(const char *path);
void tok_spm_free(tok_spm *m); /* NULL is a no-op */
/* Appends sentencepiece's ids of s[0..n) (any bytes: each invalid UTF-8 byte
 * becomes U+FFFD, as sentencepiece's normalizer does). False: out of memory. */
bool tok_spm_encode(const tok_spm *m, const char *s, size_t n, tok_ids *out);
/* A tokenizers Unigram model: pieces 0 .. n-1 (text[i] of len[i] bytes, no NUL,
 * UTF-8, checked by the caller; a text given twice maps to its last id, as
 * tokenizers' map), unk -1 for none. NULL: out of memory (no message set). */
tok_spm *tok_spm_hf_unigram(char *const *text, const size_t *len, const double *score, int32_t n, int32_t unk,
                            bool byte_fallback);
/* tokenizers' Unigram::tokenize of one pre-tokenized piece (valid UTF-8): the best
 * path, runs of unknown pieces fused and looked up as one piece, else spelled
 * as <0xXX> pieces with byte_fallback when all are there, else the unknown id.
 * False: out of memory, or (error set) a character no piece covers and no unk_id. */
bool tok_spm_unigram_ids(const tok_spm *m, const char *s, size_t n, tok_ids *out);
/* sentencepiece's DecodeIds (ids checked by the caller); with render_control,
 * CONTROL pieces write their text instead of nothing. */
bool tok_spm_decode(const tok_spm *m, const int64_t *ids, size_t n, bool render_control, tok_buf *out);

struct accel_tokenizer {
    char *path;
    tok_spm *spm;                     /* a tokenizer.model: the fields below are unused */
    tok_model model;
    tok_normalizer *normalizer;       /* NULL: none */
    tok_pretokenizer *pretokenizer;
    tok_post *post;
    tok_decoder *decoder;             /* NULL: tokens joined by spaces */
    tok_added *added;
    int n_added;
    tok_strmap added_map;             /* content -> index in added */
    char **added_token;               /* id -> content for ids of added tokens, else NULL */
    int64_t vocab_size;
};

/* ------------------------------------------------------------ stages */

accel_tokenizer *tok_load_json(const char *path);             /* tok_load.c */
/* The same from a tokenizer.json's text in memory (name for messages): the fuzz target's way in. */
accel_tokenizer *tok_load_json_text(const char *name, const char *text, size_t n);
void tok_free_parts(accel_tokenizer *t);

/* in -> out (appended), or false + error. */
bool tok_normalize(const tok_normalizer *nz, const char *s, size_t n, tok_buf *out);
/* Splits every piece of *p (replaced by the result). first: the text is the
 * start of the input (Metaspace's prepend_scheme "first"). */
bool tok_pretokenize(const tok_pretokenizer *pt, tok_pieces *p, bool first);
/* Appends the model's ids for one pre-tokenized piece. */
bool tok_model_encode(const tok_model *m, const char *s, size_t n, tok_ids *out);
/* tokens -> text through the decoder (NULL: joined by spaces). */
bool tok_decode_tokens(const tok_decoder *d, char **tokens, size_t n, tok_buf *out);

/* The matches of re in s[0..n) (tagged true) and the gaps between them (false),
 * appended to r as the reference's find_matches gives them. False: out of
 * memory, or the regex engine failed (an error naming it is set). */
bool tok_regex_ranges(const pcre2_code *re, const char *s, size_t n, tok_spans *r);
/* How a pattern is read: a tokenizer.json "String" (literal text), a "Regex"
 * (Oniguruma's meaning, as the reference's SysRegex: tok_regex.c rewrites its
 * classes), or a pattern accel writes in PCRE2's own syntax. */
typedef enum { TOK_RE_STRING, TOK_RE_ONIGURUMA, TOK_RE_PCRE2 } tok_regex_syntax;
/* pattern compiled for PCRE2; NULL with an error naming path and field when it
 * does not compile or uses a class PCRE2 cannot give Oniguruma's meaning. */
pcre2_code *tok_regex_compile(const char *pattern, tok_regex_syntax syntax, const char *path, const char *field);

#endif /* ACCEL_TOK_INTERNAL_H */
