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
 *                   Digits Sequence (regular expressions by PCRE2 with Oniguruma's meaning
 *                   of \s \w \b \h \v, as the reference: docs/tokenizer.md)
 *   post-processors TemplateProcessing BertProcessing RobertaProcessing ByteLevel Sequence
 *   decoders        ByteLevel ByteFallback Fuse Strip Replace WordPiece Metaspace Sequence
 * Any other component, and any option of these that is not implemented (BPE dropout,
 * a continuing_subword_prefix on BPE, a regular expression class PCRE2 cannot give
 * Oniguruma's meaning, ...), makes the load fail naming the JSON field:
 * a tokenizer is never silently approximated. Chat templates: accel_chat_template_* below.
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

/* ------------------------------------------------------------ chat templates
 *
 * A model's chat template (transformers' apply_chat_template), run by accel's own
 * interpreter of the Jinja2 subset chat templates use, as transformers runs it
 * (jinja2's sandbox, trim_blocks, lstrip_blocks, loop controls, raise_exception,
 * strftime_now, tojson): the rendered text is transformers' byte for byte. A
 * construct outside the subset is refused naming it and its line and column
 * (docs/tokenizer.md lists the subset); a malformed template is ACCEL_ERR_FORMAT
 * with its line and column; raise_exception(msg) fails the render with
 * ACCEL_ERR_INVALID_ARG and msg in the message. A render is bounded: 10 million
 * steps (a string operation's scan costs a step per 64 bytes), 100 nested macro
 * calls, 500 nested evaluation frames (fits a 2 MiB thread stack), values nested
 * 200 deep, 64 MiB of text, 512 MiB of values; expressions nested past 200
 * levels are refused at load.
 *
 * OWNERSHIP: a template is immutable once loaded; renders may run on several
 * threads at once. Returned text and ids are malloc'd: free() them. */
typedef struct accel_chat_template accel_chat_template;

/* dir: a model folder. The template is chat_template.jinja when the folder has
 * one, else tokenizer_config.json's `chat_template` (a string, or a list of
 * {name, template} of which the one named "tool_use" is taken when tools are
 * given and there is one, else the one named "default"), as transformers 5
 * chooses; the named special tokens (bos_token, eos_token, unk_token, sep_token,
 * pad_token, cls_token, mask_token: strings or AddedToken dicts) come from
 * tokenizer_config.json. NULL + error naming the file and key when there is no
 * template, or on anything malformed; a dir that does not exist is
 * ACCEL_ERR_IO "no such directory", one that is a file ACCEL_ERR_INVALID_ARG
 * "not a directory". */
accel_chat_template *accel_chat_template_load(const char *dir);
/* A template from its source (n bytes of UTF-8), with no special tokens (pass
 * them as variables to accel_chat_template_render_json). */
accel_chat_template *accel_chat_template_new(const char *source, size_t n);
void accel_chat_template_free(accel_chat_template *ct); /* NULL is a no-op */

typedef struct accel_chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* NUL-terminated UTF-8 */
} accel_chat_message;

/* apply_chat_template(messages, add_generation_prompt=..., tokenize=False):
 * *text gets the malloc'd NUL-terminated rendering, *len (may be NULL) its length.
 * At least one message; roles and contents must be UTF-8. */
accel_status accel_chat_template_render(const accel_chat_template *ct, const accel_chat_message *msgs, size_t n_msgs,
                                        bool add_generation_prompt, char **text, size_t *len);
/* The same with every template variable given as one JSON object (n bytes):
 * "messages" (required: a non-empty array of objects, whose content may be a
 * string or a list of parts, with tool_calls, reasoning_content, ...), and any
 * others the template reads ("add_generation_prompt", "tools", "documents",
 * "enable_thinking", "bos_token", ...), which override the loaded special tokens.
 * As transformers, a message's null-valued keys are dropped, reasoning given as
 * reasoning_content, thinking or reasoning is also visible under `thinking` and
 * `reasoning_content`, and tools, documents and add_generation_prompt default to
 * None, None and false. "continue_final_message" (true, or the message key to
 * continue) is apply_chat_template's option of that name, not a variable: the
 * rendering stops inside the final message, as transformers cuts it. */
accel_status accel_chat_template_render_json(const accel_chat_template *ct, const char *json, size_t n, char **text,
                                             size_t *len);
/* apply_chat_template(..., tokenize=True): the rendering encoded by t without
 * adding special tokens (the template writes them), as transformers encodes it
 * (a SentencePiece tokenizer.model reads the control pieces a template writes as
 * text, as sentencepiece does: docs/tokenizer.md). */
accel_status accel_chat_template_encode(const accel_chat_template *ct, const accel_tokenizer *t,
                                        const accel_chat_message *msgs, size_t n_msgs, bool add_generation_prompt,
                                        int64_t **ids, int64_t *n_ids);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TOKENIZER_H */
