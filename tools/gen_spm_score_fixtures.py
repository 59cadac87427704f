"""Fixtures of sentencepiece's Unigram path arithmetic for tests/test_sentencepiece.c:
tests/data/sentencepiece/unigram_bf/scores.json, the ids sentencepiece (0.2.3, the
version of the other fixtures) gives on the existing unigram_bf model (nothing is
trained here) for texts where how it adds path scores decides the segmentation:

  tie_after_long_prefix  189 bytes with "<mask>" (a user-defined piece, whose bonus is
                         GetUserDefinedScore: 0.1 a byte past the first) and invalid
                         UTF-8, ending in "11777": "11" "7" "77" and "11" "77" "7"
                         score the same but for the float sums' rounding (found by
                         tools/sweep_tokenizers.py)
  past_reset             a generated 32 KB text whose best path's score passes
                         -100000, where EncodeOptimized moves the scores back to 0
                         (kScoreResetThreshold), chosen (seed 1) as one whose ids
                         differ without that move (many of 20,000 characters do
                         not); 21,105 ids, kept as their count and an FNV-1a 64
                         hash of their 4-byte little-endian values

    python3 tools/gen_spm_score_fixtures.py
"""
import json
import os
import random
import struct

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "data", "sentencepiece", "unigram_bf")
TIE = ("316865686872686568656872726872686572686568686568657268686568726865726872687268657268656872686565726868656865"
       "686865656865726872686568657272686568726865686568726865657268726872687268723c6d61736b3ea5a7776868687768686868"
       "77686877686868687768687768636877696368686877686877636869637769687763687768776968776368776368696377696377696868"
       "696877636877687769687768776968e9efbce199d33131373737")


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for b in b"".join(struct.pack("<I", i) for i in ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def long_text(sp, seed, nchars):
    """Pieces of the model, digit runs and CJK ideographs (unknown: byte fallback), with spaces and punctuation."""
    words = [sp.id_to_piece(i).replace("\u2581", "") for i in range(sp.get_piece_size())
             if not (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i))]
    words = sorted(w for w in words if w and not w.startswith("<"))
    r = random.Random(seed)
    out, n = [], 0
    while n < nchars:
        k = r.random()
        if k < 0.6:
            w = r.choice(words)
        elif k < 0.8:
            w = "".join(r.choice("0123456789") for _ in range(r.randint(1, 6)))
        else:
            w = chr(r.randint(0x4E00, 0x9FFF)) * r.randint(1, 3)
        w += r.choice([" ", " ", "", ",", ". "])
        out.append(w)
        n += len(w)
    return "".join(out)


def main():
    sp = spm.SentencePieceProcessor(model_file=os.path.join(DIR, "tokenizer.model"))
    tie = bytes.fromhex(TIE)
    text = long_text(sp, 1, 25000)
    ids = sp.encode(text)
    cases = [{"name": "tie_after_long_prefix", "hex": TIE, "ids": sp.encode(tie)},
             {"name": "past_reset", "text": text, "n_ids": len(ids), "fnv1a64": f"{fnv1a64(ids):016x}"}]
    with open(os.path.join(DIR, "scores.json"), "w") as f:
        json.dump({"sentencepiece_version": spm.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"tie: {cases[0]['ids'][-3:]}, past_reset: {len(text.encode())} bytes, {len(ids)} ids")


if __name__ == "__main__":
    main()
