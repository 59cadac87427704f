#!/usr/bin/env bash
# Pipeline schedules: measured idle fraction beside the theoretical bubble
# (p - 1) / (m + p - 1) ((p - 1) / (v m + p - 1) for interleaved 1F1B with v
# chunks per stage), and the micro-batch inputs each stage holds, for GPipe,
# 1F1B and interleaved 1F1B (v = 2) on p = 2 and 4 stages (processes, 1
# thread each) with m = 4 and 8 micro-batches. No peer: the theory is the
# reference.
#
#     bash bench/pipeline.sh [STEPS]          (default 5: 1 warm-up + 4 timed)
#
# Env: BUILD_DIR (build), OUT (bench/results/pipeline.md), EXTRA (flags for
# every run; default a Llama of 8 layers, hidden 128, batch 16 x seq 32).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/pipeline.md}
EXTRA=${EXTRA:---layers 8 --hidden 128 --batch 16 --seq 32 --vocab 2048}
{
  echo "# Pipeline schedules: idle fraction vs the theoretical bubble"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
  echo "Load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (other engineers' builds and tests share the"
  echo "machine: with p = 4 the 4 stages also share its 2 cores, so their busy times include waiting for a core)."
  echo "Model and batch: \`$EXTRA\`, f32, SGD; $STEPS steps, the first a warm-up; medians."
  echo
  for p in 2 4; do
    for m in 4 8; do
      for s in gpipe 1f1b interleaved; do
        v=1
        if [ "$s" = interleaved ]; then v=2; fi
        echo "### p=$p m=$m $s v=$v (load $(cut -d' ' -f1 /proc/loadavg))"
        echo '```'
        OMP_NUM_THREADS=1 "$BUILD_DIR/bin/accel" launch --num_processes "$p" "$BUILD_DIR/bin/bench_pipeline" \
          --schedule "$s" --virtual-stages "$v" --micro-batches "$m" --steps "$STEPS" $EXTRA 2>/dev/null |
          grep -E '^(stage|schedule)'
        echo '```'
      done
    done
  done
} > "$OUT"
echo "wrote $OUT"
