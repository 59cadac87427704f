#!/bin/bash
# Greedy decode with the KV cache, f32 and bf16: accel's examples/generate vs
# transformers' generate (bench/bigmodel_peer.py decode), same checkpoint, same
# prompt, same thread count, runs interleaved (accel f32, peer f32, accel bf16,
# peer bf16 in every round) so both sides see the same machine load.
#
#     bash bench/decode.sh [BUILD_DIR] [ROUNDS]        (defaults build, 3)
#
# The checkpoint is examples/save_fake_llama's (hidden 512, intermediate 1024,
# vocab 32000, 8 heads, randn * 0.02, f32 safetensors) with LAYERS layers
# (default 4); bf16 runs load the same f32 file in bf16 (accel: --dtype
# bfloat16; transformers: from_pretrained(dtype=torch.bfloat16)). Each run
# decodes NEW tokens (default 32) after an 8-token prompt, warm on both sides as
# bench/families.sh: accel's generate --warm-up and the peer's
# bench/peer_decode.py each run one untimed generation of 2 new tokens in the
# same process first. First token: accel's prompt_ms (the prompt's forward to
# its logits), the peer's first_token_ms (generate(max_new_tokens=1)), each the
# median of FIRST_REPS (5) in the process, beside the process's CPU time over
# it (prompt_cpu_ms, first_token_cpu_ms: all threads; what the other
# engineers' load cannot add to) and the same-round ratios accel / peer of
# both; tokens/s counts the new tokens after the first over their time (the
# prompt's forward taken out, as both programs measure it). Env: THREADS (2),
# LAYERS, NEW, FIRST_REPS, OMP_WAIT_POLICY (PASSIVE for both sides, as
# bench_bigmodel.sh), QUIET_WAIT (seconds to wait for a 90%-idle CPU before
# each run, default 0). Writes bench/results/decode.md.
# About 2 minutes at the defaults on the 2-vCPU box under load.
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-4}
NEW=${NEW:-32}
FIRST_REPS=${FIRST_REPS:-5}
PROMPT=1,2,3,4,5,6,7,8
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
if [ "$B" = build ]; then cmake --build build -j2 --target generate save_fake_llama accel_cli >/dev/null; fi
BIN=$B/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CKPT=$T/fake-llama
"$BIN/save_fake_llama" "$CKPT" --layers "$LAYERS" >/dev/null
cat "$CKPT/model.safetensors" >/dev/null # warm the page cache for both sides

. bench/common.sh  # median, accel_env_lines

# run NAME CMD...: one run through bench/metered_run.py (own CPU time, load);
# appends decode tokens/s, load ms, own CPU s and the generated ids.
run() {
  local name=$1; shift
  python3 bench/metered_run.py "$T/out" "${QUIET_WAIT:-0}" "$@" 2>/dev/null || { cat "$T/out" >&2; exit 1; }
  sed -n 's/.*decode_tokens_per_s=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$name.tps"
  sed -n 's/.*\(prompt_ms\|first_token_ms\)=\([0-9.]*\).*/\2/p' "$T/out" >> "$T/$name.first"
  sed -n 's/.*\(prompt_cpu_ms\|first_token_cpu_ms\)=\([0-9.]*\).*/\2/p' "$T/out" >> "$T/$name.fcpu"
  sed -n 's/.*load_ms=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$name.load"
  awk '{print $2}' "$T/out.meta" >> "$T/$name.cpu"
  awk '{print $4}' "$T/out.meta" >> "$T/loads"
  sed -n 's/^generated_ids=\[\(.*\)\]/\1/p' "$T/out" | tr -d ' ' > "$T/$name.ids"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  for dt in float32 bfloat16; do
    run "accel_$dt" "$BIN/generate" "$CKPT" --ids "$PROMPT" --new-tokens "$NEW" --dtype "$dt" --warm-up \
      --first-reps "$FIRST_REPS"
    run "peer_$dt" python3 bench/bigmodel_peer.py decode "$CKPT" --ids "$PROMPT" --new-tokens "$NEW" --dtype "$dt" \
      --first-reps "$FIRST_REPS"
    for x in first fcpu; do # this round's accel / peer
      awk -v a="$(tail -1 "$T/accel_$dt.$x")" -v p="$(tail -1 "$T/peer_$dt.$x")" 'BEGIN {printf "%.3f\n", a / p}' >> "$T/r_$dt.$x"
    done
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

med() { median %.2f < "$T/$1.$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
same() { cmp -s "$T/accel_$1.ids" "$T/peer_$1.ids" && echo yes || echo no; }
OUT=bench/results/decode.md
mkdir -p bench/results
{
  echo "# Greedy decode tokens/s: accel vs transformers, f32 and bf16"
  echo
  echo "> Measured $(date -u '+%Y-%m-%d %H:%M UTC') on the shared box: load average before $LOAD0, after $LOAD1"
  echo "> (1/5/15 min; per-run 1-min load $(sort -n "$T/loads" | head -1)-$(sort -n "$T/loads" | tail -1)). Wall-clock"
  echo "> tokens/s swing with the load; the same-round ratio is the robust figure.${NOTE:+ $NOTE}"
  echo
  accel_env_lines "$BIN"
  echo
  echo "Checkpoint: examples/save_fake_llama --layers $LAYERS (hidden 512, intermediate 1024, vocab 32000,"
  echo "8 heads, f32 safetensors, $(du -m "$CKPT/model.safetensors" | cut -f1) MB; bf16 runs load it in bf16). Prompt $PROMPT,"
  echo "$NEW new tokens, greedy, KV cache; $THREADS threads each (OMP_NUM_THREADS, torch's default from it),"
  echo "OMP_WAIT_POLICY=$OMP_WAIT_POLICY. $ROUNDS interleaved rounds; medians. Warm on both sides: each"
  echo "process runs one untimed generation of 2 new tokens first (accel: generate --warm-up; transformers:"
  echo "bench/peer_decode.py's warm-up generate); first token: the prompt's forward (accel prompt_ms,"
  echo "transformers generate(max_new_tokens=1)), the median of $FIRST_REPS in each process, wall and the process's"
  echo "CPU time (all threads); the ratios are the medians of the same-round ratios accel / transformers."
  echo "Command: \`bash bench/decode.sh $B $ROUNDS\`; peer: \`bench/bigmodel_peer.py decode\` (torch $(python3 -c 'import torch; print(torch.__version__)'),"
  echo "transformers $(python3 -c 'import transformers; print(transformers.__version__)'))."
  echo
  echo "| dtype | accel first token ms | transformers first token ms | first token accel / transformers (wall; CPU) | first token CPU ms (accel / transformers) | accel tokens/s | transformers tokens/s | accel / transformers tokens/s | accel load ms | transformers load ms | process CPU s (accel / transformers) | same tokens |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for dt in float32 bfloat16; do
    echo "| $dt | $(med "accel_$dt" first) | $(med "peer_$dt" first) | $(median %.2f < "$T/r_$dt.first"); $(median %.2f < "$T/r_$dt.fcpu") |" \
         "$(med "accel_$dt" fcpu) / $(med "peer_$dt" fcpu) | $(med "accel_$dt" tps) | $(med "peer_$dt" tps) | $(ratio "$(med "accel_$dt" tps)" "$(med "peer_$dt" tps)")x |" \
         "$(med "accel_$dt" load) | $(med "peer_$dt" load) | $(med "accel_$dt" cpu) / $(med "peer_$dt" cpu) | $(same "$dt") |"
  done
  echo
  echo "Per run (tokens/s; first token ms, wall / CPU; in order):"
  echo
  for n in accel_float32 peer_float32 accel_bfloat16 peer_bfloat16; do
    echo "- $n: $(tr '\n' ' ' < "$T/$n.tps"); $(paste -d/ "$T/$n.first" "$T/$n.fcpu" | tr '\n' ' ')"
  done
} > "$OUT"
cat "$OUT"
