"""Tokenizer fixtures for tests/test_tokenizer.c, made with Hugging Face `tokenizers`.

No model can be downloaded here, so each tokenizer is trained on a generated
multilingual corpus with the exact pipeline of a real family:

  gpt2     byte-level BPE, GPT-2's ByteLevel pre-tokenizer regex, <|endoftext|>
  llama3   byte-level BPE, Llama 3's Split regex + ByteLevel(use_regex=False),
           ignore_merges, <|begin_of_text|> added by a TemplateProcessing
  qwen2    byte-level BPE, NFC normalizer, Qwen2's Split regex
  llama2   SentencePiece-style BPE as transformers converts it: Prepend + Replace
           normalizer, byte_fallback, fuse_unk, <s> template, Strip decoder
  bert     WordPiece, BertNormalizer (lowercase, accents stripped, CJK split),
           BertPreTokenizer, [CLS] $A [SEP]
  mistral  SentencePiece-style BPE split by Metaspace (prepend_scheme first),
           ByteFallback + Metaspace decoders
  misc1    NFKD + StripAccents + Lowercase + Strip, Whitespace + Digits, RobertaProcessing
  misc2    WordPiece behind every Split behaviour, a regex Replace, NFKC, no decoder
  unigram  Unigram trained by UnigramTrainer, byte_fallback (the 256 <0xXX> pieces
           appended), NFKC, Metaspace (prepend_scheme always, split), ByteFallback +
           Metaspace decoders, "$A </s>"
  t5       what transformers' T5Converter writes for a SentencePiece Unigram model
           (trained here by sentencepiece with T5's ids pad 0, eos 1, unk 2 and a
           small precompiled charsmap compiled from CHARSMAP_RULES; rare characters
           unknown, no byte fallback): Precompiled + Strip + Replace, Metaspace,
           Unigram, <extra_id_N> special tokens. Needs sentencepiece, protobuf and
           transformers besides tokenizers.
  unigram_ulp  a hand-written Unigram tokenizer.json whose scores are written with 17
           significant digits, chosen so that the best segmentation of "ab" / "cd"
           differs between the scores read as correctly rounded doubles (strtod)
           and as tokenizers reads them (serde_json: the digits as an integer, then
           times or over a power of ten, two roundings): the fixture pins the
           second reading (tok_load.c, serde_f64).

For each: tests/data/tokenizers/<name>/tokenizer.json and expected.json, a list of
{"text": ..., "ids": [...], "ids_plain": [...], "decoded": ..., "decoded_skip": ...}
over a test corpus (CJK, emoji, combining marks, whitespace runs, digits,
contractions, special tokens inside text) that the training corpus does not hold.
ids: encode(text, add_special_tokens=True); ids_plain: add_special_tokens=False;
decoded: decode(ids, skip_special_tokens=False); decoded_skip: with True.

    python3 tools/gen_tokenizer_fixtures.py tests/data/tokenizers [name ...]
"""
import io
import json
import os
import random
import sys
import tempfile
import types

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for that with as on by at from his her it an were are which this be or "
         "has had not but also first one their its new after who they have two been other when there "
         "all during into school time may years more most only over city some world would where later "
         "up such used many can state about national out known university united then made").split()
FOREIGN = ["東京都", "日本語の文章", "中文分词测试", "한국어 문장", "Ελληνικά", "русский текст", "العربية",
           "हिन्दी", "café", "naïve", "Zürich", "façade", "smörgåsbord", "ÅÄÖ", "ﬁnance"]
EMOJI = ["😀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "❤️", "🚀✨"]


def training_corpus(rng):
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 18)
        ws = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            ws.insert(rng.randrange(len(ws) + 1), rng.choice(FOREIGN))
        if rng.random() < 0.2:
            ws.append(str(rng.randint(0, 99999)))
        if rng.random() < 0.1:
            ws.append(rng.choice(EMOJI))
        s = " ".join(ws)
        if rng.random() < 0.3:
            s = s.capitalize() + rng.choice([".", "!", "?", ",", ";", "'s", "n't"])
        lines.append(s)
    return lines


def test_corpus(specials):
    texts = [
        "Hello world", "Hello  world", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n",
        "multiple\n\n\nnewlines", "I'm sure they'll say it's John's CAN'T", "numbers 1234567 and 3.14159",
        "東京都に住んでいます。", "中文分词测试，标点符号！", "한국어 문장입니다", "emoji 😀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️",
        "combining e\u0301 a\u0308 n\u0303", "precomposed é ä ñ", "Zürich café naïve façade ﬁnance",
        "mixed العربية and हिन्दी and русский", "symbols @#$%^&*()_+-=[]{}|;:,.<>?/~`", "", " ", "\n",
        "a", "unknownwordxyzzy qqqqq", "CamelCaseWordsHere", "url https://example.com/path?q=1&r=2",
        "ΑΒΓ αβγ", "x" * 300, "the the the the the", "don't", "   \t  \n  ",
    ]
    for sp in specials:
        texts.append(f"before{sp}after")
        texts.append(f"{sp} start and end {sp}")
    # A generated sweep: random mixtures of the pieces real text is made of.
    rng = random.Random(99)
    pool = (WORDS + FOREIGN + EMOJI + specials +
            [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u200b", "\u2028",
             "'s", "'LL", "n't", ".", ",", "!?", "...", "--", "\"", "(", ")", "$5", "3.14", "2024", "0x1F", "1,000,000",
             "e\u0301", "a\u0308", "\u0645\u064e", "\u0915\u093f", "\u1100\u1161", "Ｆｕｌｌ", "①②", "ǅ", "İ", "ß", "Σ",
             "ΟΔΟΣ", "\U0001F600", "\U0001D400", "\u00ad", "\ufeff", "\x00", "\x7f", "\x1b[0m", "\ufffd", "##", "▁", "Ġ",
             "<0x41>", "<unk>", "[UNK]"])
    for _ in range(400):
        parts = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        sep = rng.choice(["", " ", " ", "  ", "\n"])
        texts.append(sep.join(parts))
    return texts


def byte_level_bpe(pre, normalizer=None, ignore_merges=False, special="<|endoftext|>"):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=[special],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    return tok, trainer


# Normalization rules for the t5 fixture's precompiled charsmap (source code points TAB
# target code points, sentencepiece's normalization_rule_tsv): sentencepiece's nmt_nfkc
# compiles to 240 KB, these to 2 KB, with the cases that matter: full-width forms, a
# ligature, spaces, deletions, two-character sources (longest and shortest prefix
# differ: "e" alone has no rule) and "\r" with "\r\n" (tokenizers replaces a whole
# grapheme by its shortest rule: "\r\n" becomes " ", where sentencepiece's longest gives "\n").
CHARSMAP_RULES = [(f"{c:X}", f"{c - 0xFEE0:X}") for c in range(0xFF01, 0xFF5F)] + [
    ("FB01", "66 69"), ("A0", "20"), ("3000", "20"), ("9", "20"), ("D", "20"), ("200B", ""), ("FEFF", ""),
    ("AD", ""), ("D A", "A"), ("65 301", "E9"), ("61 308", "E4"), ("2460", "31"), ("2461", "32"), ("1C5", "44 17E"), ("2028", "A")]


def t5_converted(rng):
    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import T5Converter
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.tsv")
        with open(rules, "w", encoding="utf-8") as f:
            f.writelines(f"{a}\t{b}\n" for a, b in CHARSMAP_RULES)
        m = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(training_corpus(rng)), model_writer=m, minloglevel=2, num_threads=1,
            seed_sentencepiece_size=20000, shuffle_input_sentence=False, hard_vocab_limit=False, model_type="unigram",
            vocab_size=500, character_coverage=0.98, normalization_rule_tsv=rules, pad_id=0, eos_id=1, unk_id=2,
            bos_id=-1)
        model = os.path.join(tmp, "spiece.model")
        with open(model, "wb") as f:
            f.write(m.getvalue())
        sp = spm.SentencePieceProcessor(model_file=model)
        # what T5Tokenizer hands the converter (T5's sentencepiece model, 3 extra ids)
        slow = types.SimpleNamespace(vocab_file=model, _extra_ids=3, legacy=False, add_prefix_space=True,
                                     convert_tokens_to_ids=sp.piece_to_id)
        tok = T5Converter(slow).converted()
    tok.add_special_tokens([f"<extra_id_{i}>" for i in range(3)])
    return tok


def build(name, rng):
    corpus = training_corpus(rng)
    if name == "gpt2":
        tok, tr = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))
        tok.train_from_iterator(corpus, tr)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return tok, ["<|endoftext|>"]
    if name == "llama3":
        pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PAT), "isolated", invert=False),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok, tr = byte_level_bpe(pre, ignore_merges=True, special="<|begin_of_text|>")
        tok.train_from_iterator(corpus, tr)
        tok.add_special_tokens(["<|end_of_text|>", "<|eot_id|>"])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        return tok, ["<|begin_of_text|>", "<|eot_id|>"]
    if name == "qwen2":
        pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PAT), "isolated", invert=False),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok, tr = byte_level_bpe(pre, normalizer=normalizers.NFC())
        tok.train_from_iterator(corpus, tr)
        tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
        return tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    if name == "llama2":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        tr = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                 limit_alphabet=120)
        tok.train_from_iterator(corpus, tr)
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", bos)])
        return tok, ["<s>", "</s>"]
    if name == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None, lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        tr = trainers.WordPieceTrainer(vocab_size=1200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                       show_progress=False)
        tok.train_from_iterator(corpus, tr)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        return tok, ["[CLS]", "[SEP]", "[MASK]"]
    if name == "mistral":  # SentencePiece-style BPE split by Metaspace (prepend_scheme "first")
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
        specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                                            limit_alphabet=120))
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        return tok, ["<s>", "</s>"]
    if name == "misc1":  # compatibility forms, accents and case folded; words, then single digits
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                               normalizers.Strip()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=700, special_tokens=["[UNK]", "[SEP]"],
                                                            show_progress=False))
        tok.post_processor = processors.RobertaProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                          ("[SEP]", tok.token_to_id("[SEP]")))
        return tok, ["[SEP]"]
    if name == "misc2":  # every Split behaviour, a regex Replace, NFKC, runs of digits, no decoder
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=12))
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[,.;]"), "merged_with_previous"),
            pre_tokenizers.Split(" ", "merged_with_next"),
            pre_tokenizers.Split(Regex(r"\p{N}"), "contiguous"),
            pre_tokenizers.Split(Regex(r"[!?]"), "removed"),
            pre_tokenizers.Split(Regex(r"\p{L}+"), "isolated", invert=True),
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=False)])
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=900, special_tokens=["[UNK]", "[CLS]"],
                                                                 show_progress=False))
        tok.post_processor = processors.BertProcessing(("[CLS]", tok.token_to_id("[CLS]")),
                                                       ("[CLS]", tok.token_to_id("[CLS]")))
        return tok, ["[CLS]"]
    if name == "unigram":  # trained Unigram, then byte_fallback with the 256 byte pieces appended
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"],
                                                                unk_token="<unk>", show_progress=False))
        vocab = json.loads(tok.to_str())["model"]["vocab"]
        vocab += [[f"<0x{b:02X}>", 0.0] for b in range(256)]
        tok.model = models.Unigram([tuple(v) for v in vocab], unk_id=2, byte_fallback=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        return tok, ["</s>", "<pad>"]
    if name == "t5":
        return t5_converted(rng), ["</s>", "<extra_id_0>"]
    raise ValueError(name)


def serde_f64(text):
    """A JSON decimal as serde_json reads it without its float_roundtrip feature: the
    digits as an integer converted to a double, then multiplied or divided by the
    correctly rounded power of ten (the reading tokenizers gets)."""
    neg = text.startswith("-")
    mant, _, exp = text.lstrip("-").lower().partition("e")
    whole, _, frac = mant.partition(".")
    e = int(exp or 0) - len(frac)
    f = float(int(whole + frac))
    f = f * float(f"1e{e}") if e >= 0 else f / float(f"1e{-e}")
    return -f if neg else f


def unigram_ulp_json(rng):
    """tokenizer.json text of a Unigram model over <unk>, a, b, ab, c, d, cd whose best
    segmentations depend on how the scores' 17-digit decimals are read: "a" "b" each
    read one ULP lower by serde_json than by strtod and "ab" between the two sums (serde:
    "ab" wins; strtod: "a" "b"); "c" "d" one ULP higher and "cd" between (serde: "c" "d")."""
    import math

    def shortest17(shift):  # a 17-digit shortest decimal in [-8, -4) that serde reads `shift` ULPs off
        while True:
            x = -rng.uniform(4, 7.99)
            t = repr(x)
            if len(t.lstrip("-").replace(".", "").lstrip("0")) == 17 and serde_f64(t) - x == shift * math.ulp(x):
                return t

    def triple(shift):
        while True:
            a, b = shortest17(shift), shortest17(shift)
            exact, serde = float(a) + float(b), serde_f64(a) + serde_f64(b)
            lo, hi = sorted((exact, serde))
            mid = math.nextafter(lo, hi)
            if mid < hi and serde_f64(repr(mid)) == mid:
                return a, b, repr(mid)

    a, b, ab = triple(-1)
    c, d, cd = triple(+1)
    vocab = ", ".join(f'["{p}", {v}]' for p, v in
                      [("<unk>", "0.0"), ("a", a), ("b", b), ("ab", ab), ("c", c), ("d", d), ("cd", cd)])
    return ('{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, '
            '"pre_tokenizer": null, "post_processor": null, "decoder": null, '
            '"model": {"type": "Unigram", "unk_id": 0, "vocab": [' + vocab + '], "byte_fallback": false}}\n')


ULP_TEXTS = ["ab", "cd", "abcd", "cdab", "abab", "acbd", "ba", "dc"]

# written without indentation, to keep the fixtures small
COMPACT = {"unigram", "t5"}
# texts for the Unigram fixtures: typed byte pieces and unknown pieces, runs of unknown
# characters, graphemes whose first character has a charsmap rule ("Ａ" + U+0308 is
# replaced whole by tokenizers), a two-character rule with and without its second part
EXTRA_TEXTS = {name: ["<0x41><0xC3><0xA9>", "<unk><unk> x<unk>", "ΑΒΓΔ ЖЖЖ ΑΒΓ", "\uff21\u0308b \uff21b",
                      "e\u0301e\u0301 e\u0302 ee\u0301", "a\r\n\r\nb\r", "\u00a0\u3000\t x\u200b\ufeffy",
                      "\U0001F600\U0001F600 q\U0001F600"] for name in COMPACT}
NAMES = ["gpt2", "llama3", "qwen2", "llama2", "bert", "mistral", "misc1", "misc2", "unigram", "t5", "unigram_ulp"]


def main(out, names):
    for name in names:
        rng = random.Random(1234)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        if name == "unigram_ulp":  # written by hand: tokenizers' save would rewrite the scores' digits
            with open(path, "w", encoding="utf-8") as f:
                f.write(unigram_ulp_json(rng))
        else:
            tok, specials = build(name, rng)
            tok.save(path, pretty=name not in COMPACT)
        if name in ("llama2", "mistral"):
            # Llama 2's <0xXX> byte tokens are in the model's vocabulary, not added tokens
            # (the trainer can only reserve them as specials): drop them from added_tokens.
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
            j["added_tokens"] = [t for t in j["added_tokens"] if not t["content"].startswith("<0x")]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, indent=2)
        tok = Tokenizer.from_file(path)  # what a user's file gives
        cases = []
        for text in ULP_TEXTS if name == "unigram_ulp" else test_corpus(specials) + EXTRA_TEXTS.get(name, []):
            ids = tok.encode(text, add_special_tokens=True).ids
            plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "ids_plain": plain,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": __import__("tokenizers").__version__, "cases": cases}, f,
                      ensure_ascii=False, **({"separators": (",", ":")} if name in COMPACT else {"indent": 0}))
        print(name, tok.get_vocab_size(), "tokens,", len(cases), "cases")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizers", sys.argv[2:] or NAMES)
