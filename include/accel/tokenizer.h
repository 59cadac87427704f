/*
 * accel/tokenizer.h — Hugging Face tokenizers from a model's own tokenizer.json or
 * SentencePiece tokenizer.model.
 *
 * The pipeline is the `tokenizers` library's, stage by stage:
 *     text -> split on added tokens -> normalizer -> pre-tokenizer -> model -> post-processor -> ids
 *     ids  -> tokens (special ones skipped on request) -> decoder -> text
 * with the components the common model families use:
 *   models          BPE (byte-level as GPT-2 / Llama 3 / Qwen2; SentencePiece-style with
 *                   byte_fallback and fuse_unk as Llama 2 / Mistral / Gemma; ignore_merges),
 *                   WordPiece (BERT), Unigram (T5, ALBERT, XLM-RoBERTa: unk_id, byte_fallback)
 *   normalizers     NFC NFD NFKC NFKD Lowercase Strip StripAccents Replace Prepend
 *                   BertNormalizer Precompiled (SentencePiece's charsmap) Sequence
 *   pre-tokenizers  ByteLevel Split Metaspace Whitespace WhitespaceSplit BertPreTokenizer
 *                   Digits Sequence (regular expressions by PCRE2, Unicode properties on)
 *   post-processors TemplateProcessing BertProcessing RobertaProcessing ByteLevel Sequence
 *   decoders        ByteLevel ByteFallback Fuse Strip Replace WordPiece Metaspace Sequence
 * Any other component, and any option of these that is not implemented (BPE dropout,
 * a continuing_subword_prefix on BPE, ...), makes the load fail naming the JSON field:
 * a tokenizer is never silently approximated. Chat templates are not read.
 *
 * A SentencePiece `tokenizer.model` (Llama 2, Mistral, Gemma, T5-style Unigram) is
 * run as the sentencepiece library runs it, ids for ids: BPE by piece scores or
 * Unigram by Viterbi, user-defined pieces, byte_fallback, the precompiled charsmap
 * (normalization rules such as the default nmt_nfkc), add_dummy_prefix,
 * remove_extra_whitespaces, escape_whitespaces. Its special tokens are its CONTROL
 * pieces; add_special_tokens puts BOS first (LlamaTokenizer's and GemmaTokenizer's
 * add_bos_token); control pieces in the text are text, as in sentencepiece. A
 * WORD or CHAR model, treat_whitespace_as_suffix or a denormalizer's charsmap is
 * refused naming the field.
 *
 * OWNERSHIP: a tokenizer is immutable once loaded; encode/decode may run on several
 * threads at once. Returned id arrays and strings are malloc'd: free() them.
 */
#ifndef ACCEL_TOKENIZER_H
#define ACCEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel_tokenizer accel_tokenizer;

/* path: a tokenizer.json, a SentencePiece model (a name ending in ".model"), or a
 * directory holding tokenizer.json or else tokenizer.model (transformers' order).
 * NULL + error naming the file and the field (or byte offset) on anything
 * malformed or unsupported. */
accel_tokenizer *accel_tokenizer_load(const char *path);
void accel_tokenizer_free(accel_tokenizer *t); /* NULL is a no-op */

/* text: n bytes of UTF-8 (invalid UTF-8 is ACCEL_ERR_INVALID_ARG naming the byte
 * offset; a SentencePiece model takes it as sentencepiece does, each invalid byte
 * U+FFFD). add_special_tokens applies the post-processor's template (BOS, [CLS] ...
 * [SEP]), as tokenizers' encode(text, add_special_tokens=...). *ids gets a malloc'd
 * array (NULL when empty) and *n_ids its length. */
accel_status accel_tokenizer_encode(const accel_tokenizer *t, const char *text, size_t n,
                                    bool add_special_tokens, int64_t **ids, int64_t *n_ids);
/* tokenizers' decode(ids, skip_special_tokens): *text gets a malloc'd NUL-terminated
 * string (invalid byte sequences become U+FFFD as the reference does), *len its
 * length (may be NULL). SentencePiece: sentencepiece's DecodeIds; with
 * skip_special_tokens false the control pieces are written as their text. An id outside the vocabulary is ACCEL_ERR_INVALID_ARG naming it. */
accel_status accel_tokenizer_decode(const accel_tokenizer *t, const int64_t *ids, int64_t n,
                                    bool skip_special_tokens, char **text, size_t *len);

/* The number of ids (model vocabulary and added tokens): one past the largest id. */
int64_t accel_tokenizer_vocab_size(const accel_tokenizer *t);
/* -1 when token is not in the vocabulary or the added tokens. */
int64_t accel_tokenizer_token_to_id(const accel_tokenizer *t, const char *token);
/* The token's text (owned by t), NULL when id has none. */
const char *accel_tokenizer_id_to_token(const accel_tokenizer *t, int64_t id);
/* Whether id is an added token marked special (skipped by decode on request). */
bool accel_tokenizer_is_special(const accel_tokenizer *t, int64_t id);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TOKENIZER_H */
