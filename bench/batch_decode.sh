#!/bin/bash
# Batched greedy decode (left-padded prompts of 8, 7, 6, 5, ... tokens):
# accel's examples/generate with one --ids a row and --batch (accel_generate_batch,
# batch 1 too) vs transformers' generate on the same padded batch
# (bench/batch_decode_peer.py), batch 1, 4 and 8, runs interleaved in each
# round so both see the same load. tokens/s counts every row's new tokens
# after the first over their time (the prompt's forward taken out).
#
#     bash bench/batch_decode.sh [BUILD_DIR] [ROUNDS]     (defaults build, 2)
#
# Checkpoint: examples/save_fake_llama --layers LAYERS (default 2; hidden 512,
# vocab 32000), f32. Env: THREADS (2), LAYERS, NEW (16). Then what the mask
# costs a training step's forward + backward (bench_padded_step: batch 4 x 256,
# the same LAYERS, left-padded vs unpadded vs a mask with a hole). Writes
# OUT (default bench/results/batch_decode.md; bench/results/<kind>/batch_decode.md on a
# CPU kind of its own, as the other scripts). About 2 minutes.
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-2}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-2}
NEW=${NEW:-16}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
if [ "$B" = build ]; then cmake --build build -j2 --target generate save_fake_llama accel_cli bench_padded_step >/dev/null; fi
BIN=$B/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CKPT=$T/fake-llama
"$BIN/save_fake_llama" "$CKPT" --layers "$LAYERS" >/dev/null
. bench/common.sh # median, machine_lines

# the --ids of a batch of n: prompts of 8, 7, 6, 5, 8, ... tokens
prompts() {
  for b in $(seq 0 $(($1 - 1))); do
    printf -- "--ids %s " "$(seq -s, $((b + 1)) $((b + 8 - b % 4)))"
  done
}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  for n in 1 4 8; do
    # shellcheck disable=SC2046
    "$BIN/generate" "$CKPT" $(prompts $n) --batch --new-tokens "$NEW" --warm-up > "$T/a$n" 2>&1
    # shellcheck disable=SC2046
    python3 bench/batch_decode_peer.py "$CKPT" $(prompts $n) --new-tokens "$NEW" > "$T/p$n" 2>/dev/null
    for s in a p; do
      sed -n 's/.*decode_tokens_per_s=\([0-9.]*\).*/\1/p' "$T/$s$n" >> "$T/$s$n.tps"
      sed -n 's/.*decode_tokens_per_cpu_s=\([0-9.]*\).*/\1/p' "$T/$s$n" >> "$T/$s$n.cps"
    done
    # this round's accel / transformers, wall and CPU
    for x in tps cps; do
      awk -v a="$(tail -1 "$T/a$n.$x")" -v p="$(tail -1 "$T/p$n.$x")" 'BEGIN {printf "%.4f\n", a / p}' >> "$T/r$n.$x"
    done
    # the same tokens, row by row
    same=yes
    for b in $(seq 0 $((n - 1))); do
      want=$(sed -n "s/^generated_ids\[$b\]=//p" "$T/p$n")
      got=$(sed -n "s/^generated_ids\[$b\]=//p" "$T/a$n")
      [ "$want" = "$got" ] || same=no
    done
    echo "$same" >> "$T/same$n"
  done
done
# the mask's cost to a training step (its own interleaved rounds)
"$BIN/bench_padded_step" --steps $((ROUNDS + 1)) --warmup 1 --batch 4 --seq 256 --layers "$LAYERS" --vocab 8192 > "$T/step"
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
OUT=${OUT:-bench/results/batch_decode.md}
{
  echo "# Batched greedy decode tokens/s: accel vs transformers' generate on a left-padded batch"
  echo
  echo "> Measured $(date -u '+%Y-%m-%d %H:%M UTC'); load average before $LOAD0, after $LOAD1 (1/5/15 min)."
  echo "> On a shared 2-vCPU box tokens/s swing with the load; the same-round ratios are the figure."
  echo
  machine_lines "$B" "$THREADS"
  echo
  echo "Checkpoint: examples/save_fake_llama --layers $LAYERS (hidden 512, vocab 32000, f32). Prompts of 8, 7, 6, 5"
  echo "tokens (repeating), left-padded; $NEW new tokens, greedy, KV cache; $ROUNDS interleaved rounds, medians;"
  echo "ratios: the median of the same-round accel / transformers."
  echo "accel: examples/generate --batch with one --ids a row (accel_generate_batch), --warm-up; transformers:"
  echo "bench/batch_decode_peer.py (a warm-up generate first). tokens/s: every row's new tokens after the first"
  echo "over the generation's time less the first token's; per CPU s: over the process's CPU time (all threads),"
  echo "which another process's load cannot add to. Command: \`bash bench/batch_decode.sh $B $ROUNDS\`."
  echo
  echo "| batch | accel tokens/s | transformers tokens/s | accel / transformers | accel tokens per CPU s | transformers tokens per CPU s | accel / transformers (CPU) | same tokens |"
  echo "|---|---|---|---|---|---|---|---|"
  for n in 1 4 8; do
    a=$(median %.1f < "$T/a$n.tps"); p=$(median %.1f < "$T/p$n.tps")
    ac=$(median %.1f < "$T/a$n.cps"); pc=$(median %.1f < "$T/p$n.cps")
    echo "| $n | $a | $p | $(median %.2f < "$T/r$n.tps")x | $ac | $pc | $(median %.2f < "$T/r$n.cps")x | $(sort -u "$T/same$n" | tr '\n' ' ')|"
  done
  echo
  echo "Per run (tokens/s, accel / transformers, in round order; then per CPU s):"
  echo
  for n in 1 4 8; do
    echo "- batch $n: $(paste -d/ "$T/a$n.tps" "$T/p$n.tps" | tr '\n' ' '); $(paste -d/ "$T/a$n.cps" "$T/p$n.cps" | tr '\n' ' ')"
  done
  echo
  echo "## A training step's forward + backward with the mask (bench_padded_step)"
  echo
  echo "accel_llama_loss_ex + backward, no optimizer: $(sed -n 's/^shape //p' "$T/step") (hidden 512, f32);"
  echo "plain: no mask; padded: row b's first b T / 8 positions masked (left padding: the fused attention's"
  echo "key range); holed: as many zeros a row with one kept key before them (explicit scores); packed: no"
  echo "mask, four sequences a row with no_cache (the fused attention's key start per query). Medians of"
  echo "interleaved rounds; the ratios are medians of same-round ratios to plain."
  echo
  echo "| kind | fwd + bwd ms | CPU ms |"
  echo "|---|---|---|"
  sed -n 's/^kind=\([a-z]*\) fwd_bwd_ms_median=\([0-9.]*\) cpu_ms_median=\([0-9.]*\)/| \1 | \2 | \3 |/p' "$T/step"
  echo
  echo "$(sed -n 's/^padded_over_plain=\([0-9.]*\) holed_over_plain=\([0-9.]*\) packed_over_plain=\([0-9.]*\)/padded \/ plain \1x, holed \/ plain \2x, packed \/ plain \3x./p' "$T/step")"
} > "$OUT"
cat "$OUT"
