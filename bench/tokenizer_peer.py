"""Peer of bench/tokenizer.sh: Hugging Face `tokenizers` (or, for a
SentencePiece tokenizer.model, the `sentencepiece` library) on the same corpus.

    python3 bench/tokenizer_peer.py TOKENIZER_JSON|TOKENIZER_MODEL CORPUS MODE

MODE "loop": encode(line) per line on one thread (add_special_tokens=True;
sentencepiece: add_bos=True, as accel's add_special_tokens); "batch":
encode_batch(lines) / sentencepiece's encode(lines), the library's own threads.
Prints "MB/s ids" where ids is the total count (both sides must agree).
"""
import sys
import time

from tokenizers import Tokenizer

path, corpus, mode = sys.argv[1:4]
with open(corpus, encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
mb = sum(len(l.encode("utf-8")) for l in lines) / 1e6
if path.endswith(".model"):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=path)
    t0 = time.perf_counter()
    if mode == "loop":
        n = sum(len(sp.encode(l, add_bos=True)) for l in lines)
    else:
        n = sum(len(e) for e in sp.encode(lines, add_bos=True, num_threads=-1))
else:
    tok = Tokenizer.from_file(path)
    t0 = time.perf_counter()
    if mode == "loop":
        n = sum(len(tok.encode(l).ids) for l in lines)
    else:
        n = sum(len(e.ids) for e in tok.encode_batch(lines))
s = time.perf_counter() - t0
print(f"{mb / s:.2f} {n}")
