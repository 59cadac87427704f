#!/bin/bash
# Tokenization throughput: accel's examples/tokenize vs Hugging Face `tokenizers`
# (bench/tokenizer_peer.py: encode per line on one thread, and encode_batch on
# its own threads) on the same corpus with the same tokenizer.json, rounds
# interleaved so both sides see the same load. Tokenizers: the fixtures of
# tools/gen_tokenizer_fixtures.py (gpt2, llama3, llama2, bert pipelines), and
# SentencePiece tokenizer.model files of tools/gen_sentencepiece_fixtures.py
# (spm-llama2 BPE, spm-unigram) against the `sentencepiece` library. The
# corpus: LINES lines (default 20000) of 5-40 words drawn from those fixtures'
# training vocabulary plus CJK, accents and emoji, made by this script.
#
#     bash bench/tokenizer.sh [BUILD_DIR] [ROUNDS]      (defaults build, 3)
#
# Needs `pip install tokenizers sentencepiece`. Writes bench/results/tokenizer.md (medians),
# or OUT (bench/results/<kind>/tokenizer.md on another CPU kind).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
LINES=${LINES:-20000}
if [ "$B" = build ]; then cmake --build build -j2 --target tokenize >/dev/null; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 - "$T/corpus.txt" "$LINES" <<'PY'
import random, sys
sys.path.insert(0, "tools")
from gen_tokenizer_fixtures import WORDS, FOREIGN, EMOJI
rng = random.Random(7)
pool = WORDS * 8 + FOREIGN + EMOJI + ["1984", "3.5", "n't", "'s", ",", "."]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for _ in range(int(sys.argv[2])):
        f.write(" ".join(rng.choice(pool) for _ in range(rng.randint(5, 40))) + "\n")
PY
. bench/common.sh  # median, machine_lines
out=${OUT:-bench/results/tokenizer.md}
{
  echo "# Tokenization throughput: accel vs Hugging Face tokenizers"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores,"
  echo "tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)'), sentencepiece $(python3 -c 'import sentencepiece; print(sentencepiece.__version__)') (the peer of the spm- rows), $LINES lines ($(du -k "$T/corpus.txt" | cut -f1) KiB), $ROUNDS rounds, load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "MB/s of UTF-8 text, medians; accel runs on one thread. The box is shared: other engineers' builds"
  echo "and tests run beside the measurement (the load figures), so compare the same-run ratios."
  echo
  echo "| tokenizer | accel (1 thread) | peer encode loop (1 thread) | peer batch (its threads) | accel / loop | ids equal |"
  echo "|---|---|---|---|---|---|"
} > "$out"
for fam in gpt2 llama3 llama2 bert spm-llama2 spm-unigram; do
  case $fam in
    spm-*) tj=tests/data/sentencepiece/${fam#spm-}/tokenizer.model ;;
    *) tj=tests/data/tokenizers/$fam/tokenizer.json ;;
  esac
  : > "$T/a"; : > "$T/l"; : > "$T/b"
  for _ in $(seq "$ROUNDS"); do
    "$B/bin/tokenize" "$tj" "$T/corpus.txt" 2> "$T/err" > "$T/ids"
    sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p' "$T/err" >> "$T/a"
    ours=$(wc -w < "$T/ids")
    read -r mbs n < <(python3 bench/tokenizer_peer.py "$tj" "$T/corpus.txt" loop); echo "$mbs" >> "$T/l"
    read -r mbs _ < <(python3 bench/tokenizer_peer.py "$tj" "$T/corpus.txt" batch); echo "$mbs" >> "$T/b"
  done
  a=$(median %.2f < "$T/a"); l=$(median %.2f < "$T/l"); b=$(median %.2f < "$T/b")
  eq=$([ "$ours" = "$n" ] && echo yes || echo "NO ($ours vs $n)")
  echo "| $fam | $a | $l | $b | $(awk -v a="$a" -v l="$l" 'BEGIN{printf "%.2fx", a/l}') | $eq |" >> "$out"
done
echo >> "$out"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out"
cat "$out"
