#!/bin/bash
# Big-model inference benchmark on the seed's 20-layer checkpoint
# (examples/save_fake_llama: vocab 32000, hidden 512, 20 layers, f32, ~340 MB):
#   - time from process start to the first logits and peak RSS, accel's
#     examples/dispatch vs Accelerate + transformers (bench/bigmodel_peer.py:
#     init_empty_weights + load_checkpoint_and_dispatch + one forward), with
#     the seed's map on cpu,cpu and cpu,disk;
#   - greedy decode, accel's examples/generate vs transformers' generate, warm on
#     both sides as bench/families.sh: generate --warm-up and bench/peer_decode.py
#     each run one untimed generation of 2 new tokens in the process first; first
#     token (accel prompt_ms, the peer's generate(max_new_tokens=1)) and tokens/s.
# (Start to first logits is cold on both sides: a process start is the question.)
# Medians of RUNS runs (warm page cache: the checkpoint is read once first).
# Writes bench/results/bigmodel.md. Usage: bash bench/bench_bigmodel.sh [BUILD_DIR] [RUNS]
# OMP_WAIT_POLICY defaults to PASSIVE for both sides (torch's libgomp honours it
# too): with the default spin-wait, idle OpenMP workers spinning beside
# OpenBLAS's own threads make every run several times slower whenever the
# 2-core box is shared. Set OMP_WAIT_POLICY=ACTIVE to measure the default.
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
B=${1:-build}
RUNS=${2:-5}
if [ "$B" = build ]; then cmake --build build -j2 --target dispatch generate save_fake_llama >/dev/null; fi
BIN=$B/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CKPT=$T/fake-llama-dispatch
"$BIN/save_fake_llama" "$CKPT" >/dev/null
cat "$CKPT/model.safetensors" >/dev/null # warm the page cache for both sides
NEW=32

. bench/common.sh  # median, machine_lines

# run_many NAME CMD... : RUNS runs; collects wall ms (start to exit), peak RSS MB,
# and the program's own process_to_logits_ms / decode_tokens_per_s lines.
run_many() {
  local name=$1; shift
  local i
  for i in $(seq "$RUNS"); do
    /usr/bin/time -f 'TIME %e %M' "$@" > "$T/out" 2> "$T/err" || { cat "$T/err" >&2; exit 1; }
    awk '/^TIME/ {printf "%.1f %.1f\n", $2 * 1000, $3 / 1024}' "$T/err" >> "$T/$name.time"
    sed -n 's/.*process_to_logits_ms=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$name.ttl"
    sed -n 's/.*decode_tokens_per_s=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$name.tps"
    sed -n 's/.*\(prompt_ms\|first_token_ms\)=\([0-9.]*\).*/\2/p' "$T/out" >> "$T/$name.first"
  done
}
col() { awk -v c="$2" '{print $c}' "$T/$1.time" | median; }
med() { median < "$T/$1.$2"; }

run_many accel_cpu "$BIN/dispatch" "$CKPT" --devices cpu,cpu
run_many accel_disk "$BIN/dispatch" "$CKPT" --devices cpu,disk
run_many accel_decode "$BIN/generate" "$CKPT" --ids 1,2,3 --new-tokens $NEW --warm-up
PRUNS=$RUNS; [ "$PRUNS" -gt 3 ] && PRUNS=3 # the peer is slow; 3 runs are enough for a median
RUNS=$PRUNS
run_many peer_cpu python3 bench/bigmodel_peer.py first-logits "$CKPT" --devices cpu,cpu
run_many peer_disk python3 bench/bigmodel_peer.py first-logits "$CKPT" --devices cpu,disk
run_many peer_decode python3 bench/bigmodel_peer.py decode "$CKPT" --ids 1,2,3 --new-tokens $NEW

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", a / b}'; }
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
OUT=bench/results/bigmodel.md
mkdir -p bench/results
{
  echo "# Big-model inference: accel vs Accelerate + transformers"
  echo
  echo "Seed checkpoint: 20 layers, hidden 512, intermediate 1024, vocab 32000, 8 heads, f32"
  echo "($(du -m "$CKPT/model.safetensors" | cut -f1) MB, written by examples/save_fake_llama), warm page cache."
  echo "Map: embed + layers 0-9 on A, layers 10-19 + norm + lm_head on B; one forward on [[1, 2, 3]]."
  echo "Medians: accel $2 runs... see command. $(nproc) cores, load average $LOAD, $(date -u +%Y-%m-%d)."
  echo "Command: \`bash bench/bench_bigmodel.sh $B\` (OMP_WAIT_POLICY=$OMP_WAIT_POLICY for both sides); peer: bench/bigmodel_peer.py"
  echo "(torch $(python3 -c 'import torch; print(torch.__version__)'), transformers $(python3 -c 'import transformers; print(transformers.__version__)'), accelerate $(python3 -c 'import accelerate; print(accelerate.__version__)'))."
  echo
  echo "| run | process start -> first logits (ms) | process wall (ms) | peak RSS (MB) |"
  echo "|---|---|---|---|"
  echo "| accel dispatch, cpu,cpu | $(med accel_cpu ttl) | $(col accel_cpu 1) | $(col accel_cpu 2) |"
  echo "| Accelerate + transformers, cpu,cpu | $(med peer_cpu ttl) | $(col peer_cpu 1) | $(col peer_cpu 2) |"
  echo "| accel dispatch, cpu,disk | $(med accel_disk ttl) | $(col accel_disk 1) | $(col accel_disk 2) |"
  echo "| Accelerate + transformers, cpu,disk | $(med peer_disk ttl) | $(col peer_disk 1) | $(col peer_disk 2) |"
  echo
  echo "Speed-up to first logits: cpu,cpu $(ratio "$(med peer_cpu ttl)" "$(med accel_cpu ttl)")x," \
       "cpu,disk $(ratio "$(med peer_disk ttl)" "$(med accel_disk ttl)")x (goal: 10x)."
  echo
  echo "Greedy decode, prompt 1,2,3, warm on both sides (one untimed generation of 2 new tokens in the"
  echo "process first: generate --warm-up, bench/peer_decode.py); first token: the prompt's forward."
  echo
  echo "| greedy decode, $NEW new tokens, all on cpu | first token ms | tokens/s | peak RSS (MB) |"
  echo "|---|---|---|---|"
  echo "| accel examples/generate --warm-up | $(med accel_decode first) | $(med accel_decode tps) | $(col accel_decode 2) |"
  echo "| transformers generate | $(med peer_decode first) | $(med peer_decode tps) | $(col peer_decode 2) |"
} > "$OUT"
sed -i "s/^Medians: accel .* see command\./Medians: accel ${2:-5} runs, peer $PRUNS runs./" "$OUT"
cat "$OUT"
