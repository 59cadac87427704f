"""SentencePiece tokenizer.model fixtures for tests/test_sentencepiece.c, made with
the `sentencepiece` library (pip install sentencepiece), the reference for these files.

No model can be downloaded here, so each model is trained by sentencepiece's own
trainer on the generated multilingual corpus of tools/gen_tokenizer_fixtures.py,
with the options of a real family:

  llama2      BPE, identity normalization, byte_fallback, add_dummy_prefix,
              whitespace kept as is (remove_extra_whitespaces false), digits
              split: Llama 2's / Mistral's tokenizer.model
  gemma       BPE, byte_fallback, no dummy prefix, whitespace kept, Gemma's ids
              (pad 0, eos 1, bos 2, unk 3) and user-defined pieces
              (<start_of_turn>, <end_of_turn>, runs of newlines and spaces)
  unigram     Unigram (Viterbi), identity normalization, the default whitespace
              handling (dummy prefix, extra whitespace removed), no byte
              fallback, character_coverage 0.98 (rare characters are unknown)
  unigram_bf  Unigram with byte_fallback, user-defined and control pieces,
              whitespace kept
  nfkc        Unigram with sentencepiece's default normalization, nmt_nfkc:
              a precompiled_charsmap (NFKC and whitespace rules, as T5's and
              ALBERT's models have)

and two that accel refuses at load (tests/test_sentencepiece.c checks the
message names the type), trained on a tiny corpus, tokenizer.model only:

  char        model_type CHAR
  word        model_type WORD

For each of the others: tests/data/sentencepiece/<name>/tokenizer.model and expected.json:
  {"bos": id, "cases": [...], "decode_cases": [...]}
  cases: {"text": str} or {"hex": bytes of invalid UTF-8}, with
    "ids": sp.encode(text)  (sentencepiece replaces each invalid byte by U+FFFD),
    "decoded": sp.decode(ids), "round_trips": decoded == text
  decode_cases: {"ids": random ids (control, unknown, byte pieces making invalid
    UTF-8 included), "decoded": sp.decode(ids)}
accel's encode(text, add_special_tokens=True) is [bos] + ids (LlamaTokenizer's and
GemmaTokenizer's add_bos_token); decode(ids, skip_special_tokens=True) is sp.decode.

    python3 tools/gen_sentencepiece_fixtures.py tests/data/sentencepiece [name ...]
"""
import io
import json
import os
import random
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tokenizer_fixtures import test_corpus, training_corpus  # noqa: E402

COMMON = dict(minloglevel=2, num_threads=1, seed_sentencepiece_size=20000, shuffle_input_sentence=False,
              hard_vocab_limit=False, character_coverage=1.0)

MODELS = {
    "llama2": dict(model_type="bpe", vocab_size=1000, normalization_rule_name="identity", byte_fallback=True,
                   add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
                   allow_whitespace_only_pieces=True),
    "gemma": dict(model_type="bpe", vocab_size=1000, normalization_rule_name="identity", byte_fallback=True,
                  add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True,
                  allow_whitespace_only_pieces=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                  pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                  user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "\n\n", "\n\n\n", "  ", "   "]),
    "unigram": dict(model_type="unigram", vocab_size=800, normalization_rule_name="identity",
                    character_coverage=0.98),
    "unigram_bf": dict(model_type="unigram", vocab_size=800, normalization_rule_name="identity", byte_fallback=True,
                       remove_extra_whitespaces=False, user_defined_symbols=["<mask>", "@@"],
                       control_symbols=["<ctrl>"]),
    "nfkc": dict(model_type="unigram", vocab_size=400),
}

REFUSED = {"char": dict(model_type="char", vocab_size=20), "word": dict(model_type="word", vocab_size=12)}
TINY_CORPUS = ["hello world", "the cat sat on the mat", "a b c d e f g"] * 3

# text the test corpus lacks: a control piece, user-defined pieces, runs of blanks
EXTRA_TEXTS = ["<s>Hello</s>", "<start_of_turn>user\nhi<end_of_turn>\n\n\nok", "a<mask>b @@ c", "<ctrl> x",
               "    four spaces", "\u3000ideographic\u3000space", "tab\t\tx", "\n\n\n\n", "▁already▁escaped",
               "<0x41>", "\u2047 unk surface"]
INVALID = [b"ab\xff", b"\xc3", b"x\xe2\x82y", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"caf\xc3\xa9 \xfe\xfe"]


def train(name, rng):
    m = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_corpus(rng)), model_writer=m,
                                   **{**COMMON, **MODELS[name]})
    return m.getvalue()


def main(out, names):
    for name in names:
        if name in REFUSED:
            m = io.BytesIO()
            spm.SentencePieceTrainer.train(sentence_iterator=iter(TINY_CORPUS), model_writer=m, minloglevel=2,
                                           num_threads=1, hard_vocab_limit=False, normalization_rule_name="identity",
                                           **REFUSED[name])
            proto = m.getvalue()
        else:
            proto = train(name, random.Random(1234))
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.model"), "wb") as f:
            f.write(proto)
        if name in REFUSED:
            print(name, len(proto), "bytes")
            continue
        sp = spm.SentencePieceProcessor(model_proto=proto)
        cases = []
        for text in test_corpus([]) + EXTRA_TEXTS + INVALID:
            ids = sp.encode(text)
            dec = sp.decode(ids)
            case = {"hex": text.hex()} if isinstance(text, bytes) else {"text": text}
            case.update(ids=ids, decoded=dec, round_trips=dec == text)
            cases.append(case)
        rng = random.Random(7)
        n = sp.get_piece_size()
        dcases = []
        for _ in range(200):
            ids = [rng.randrange(n) if rng.random() < 0.6 else rng.randrange(min(n, 270)) for _ in range(rng.randint(0, 12))]
            dcases.append({"ids": ids, "decoded": sp.decode(ids)})
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"sentencepiece_version": spm.__version__, "bos": sp.bos_id(), "vocab_size": n,
                       "cases": cases, "decode_cases": dcases}, f, ensure_ascii=False, indent=0)
        print(name, n, "pieces,", len(proto), "bytes,", len(cases), "cases,",
              sum(c["round_trips"] for c in cases), "round trips")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/sentencepiece", sys.argv[2:] or [*MODELS, *REFUSED])
