"""Peer of bench/tokenizer.sh: Hugging Face `tokenizers` on the same corpus.

    python3 bench/tokenizer_peer.py TOKENIZER_JSON CORPUS MODE

MODE "loop": encode(line) per line on one thread (add_special_tokens=True);
"batch": encode_batch(lines), the library's own threads (RAYON_NUM_THREADS).
Prints "MB/s ids" where ids is the total count (both sides must agree).
"""
import sys
import time

from tokenizers import Tokenizer

path, corpus, mode = sys.argv[1:4]
tok = Tokenizer.from_file(path)
with open(corpus, encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
mb = sum(len(l.encode("utf-8")) for l in lines) / 1e6
t0 = time.perf_counter()
if mode == "loop":
    n = sum(len(tok.encode(l).ids) for l in lines)
else:
    n = sum(len(e.ids) for e in tok.encode_batch(lines))
s = time.perf_counter() - t0
print(f"{mb / s:.2f} {n}")
