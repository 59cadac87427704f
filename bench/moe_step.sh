#!/bin/bash
# Mixture-of-experts training step: accel (bench_moe_step, through an
# Accelerator) vs transformers + torch (bench/moe_step_peer.py) with its
# default experts implementation (grouped_mm) and its eager loop, the same
# model sizes and ids, AdamW, runs interleaved (accel, grouped_mm, eager for
# each family in every round) so all three see the same load.
#
#     bash bench/moe_step.sh [BUILD_DIR] [ROUNDS]        (defaults build, 3)
#
# Model: hidden 512, 4 layers, 8 heads (4 key/value heads), vocabulary 32000,
# 8 experts of 1024 (Mixtral's intermediate_size, Qwen3-MoE's
# moe_intermediate_size, renormalised, Qwen2-MoE's beside a shared expert of
# 1024), 2 per token; batch 4 x 256; f32 (or
# MIXED_PRECISION=bf16: the Accelerator's, torch.autocast). Each side inits
# its own weights (the losses differ: their scale, not their digits, is the
# check). Env: THREADS (2), STEPS (5), MIXED_PRECISION (no), OUT (default
# bench/results/moe_step.md; bench/results/<kind>/moe_step.md on a CPU kind
# with its own section). Writes medians and same-round ratios there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-5}
MP=${MIXED_PRECISION:-no}
FAMILIES="mixtral qwen3_moe qwen2_moe"
SIZES="--batch 4 --seq 256 --hidden 512 --layers 4 --heads 8 --ffn 1024 --vocab 32000 --experts 8 --topk 2"
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
if [ "$B" = build ]; then cmake --build build -j2 --target bench_moe_step accel_cli >/dev/null; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. bench/common.sh  # median, machine_lines
field() { sed -n "s/^impl=.* $1=\([0-9.]*\).*/\1/p"; }

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  for f in $FAMILIES; do
    # shellcheck disable=SC2086
    "$B/bin/bench_moe_step" --family "$f" $SIZES --steps "$STEPS" --threads "$THREADS" --mixed_precision "$MP" \
      > "$T/out" 2>&1 || { cat "$T/out" >&2; exit 1; }
    field step_ms_median < "$T/out" >> "$T/$f.accel"
    field loss < "$T/out" >> "$T/$f.accel_loss"
    for impl in grouped_mm eager; do
      # shellcheck disable=SC2086
      python3 bench/moe_step_peer.py --family "$f" --experts-impl "$impl" $SIZES --steps "$STEPS" \
        --mixed_precision "$MP" > "$T/out" 2>/dev/null || { cat "$T/out" >&2; exit 1; }
      field step_ms_median < "$T/out" >> "$T/$f.$impl"
      field loss < "$T/out" >> "$T/$f.${impl}_loss"
      awk -v a="$(tail -1 "$T/$f.accel")" -v p="$(tail -1 "$T/$f.$impl")" 'BEGIN {printf "%.3f\n", p / a}' \
        >> "$T/$f.r_$impl"
    done
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

out=${OUT:-bench/results/moe_step.md}
{
  echo "# Mixture-of-experts training step: accel vs transformers + torch ($MP mixed precision)"
  echo
  echo "> Measured $(date -u '+%Y-%m-%d %H:%M UTC') on the shared 2-core box: load average before $LOAD0,"
  echo "> after $LOAD1 (1/5/15 min). The same-round ratios are the robust figures."
  echo
  machine_lines "$B" "$THREADS"
  echo
  echo "Model: hidden 512, 4 layers, 8 heads (4 key/value), vocabulary 32000, 8 experts of 1024, 2 per token"
  echo "(Qwen3-MoE renormalised; Qwen2-MoE with a shared expert of 1024); batch 4 x 256, AdamW; a step = forward with the loss, backward, optimizer"
  echo "step, zero_grad (accel through an Accelerator). $ROUNDS interleaved rounds of $STEPS timed steps after"
  echo "one warm-up, each side's median per round; the table: medians over rounds, and the medians of the"
  echo "same-round ratios torch / accel (above 1: accel faster). Each side inits its own weights; the last"
  echo "step's losses are given to show both train the same problem."
  echo "Command: \`MIXED_PRECISION=$MP bash bench/moe_step.sh $B $ROUNDS\`."
  echo
  echo "| family | accel ms | torch grouped_mm ms | torch eager ms | grouped_mm / accel | eager / accel | last loss (accel / grouped_mm / eager) |"
  echo "|---|---|---|---|---|---|---|"
  for f in $FAMILIES; do
    echo "| $f | $(median < "$T/$f.accel") | $(median < "$T/$f.grouped_mm") | $(median < "$T/$f.eager") |" \
         "$(median %.2f < "$T/$f.r_grouped_mm")x | $(median %.2f < "$T/$f.r_eager")x |" \
         "$(tail -1 "$T/$f.accel_loss") / $(tail -1 "$T/$f.grouped_mm_loss") / $(tail -1 "$T/$f.eager_loss") |"
  done
  echo
  echo "Per round (ms: accel / grouped_mm / eager):"
  echo
  for f in $FAMILIES; do
    echo "- $f: $(paste -d/ "$T/$f.accel" "$T/$f.grouped_mm" "$T/$f.eager" | tr '\n' ' ')"
  done
} > "$out"
cat "$out"
