#!/usr/bin/env bash
# Start-up cost of accel's commands (issue 24): `accel launch --num_processes 2
# /bin/true`, `accel --help`, `accel env` and a 1-process train_linear: wall
# time, CPU time and peak RSS, one build against another (e.g. the commit before the
# backend plug-ins, built with CUDA, against this one), interleaved.
#     bash bench/startup.sh BEFORE_BUILD_DIR [AFTER_BUILD_DIR (build)] [RUNS (21)]
# Writes bench/results/startup.md (then: bash bench/collect_results.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "${2:-build}" && pwd) RUNS=${3:-21}
{
  echo "## Start-up: what a command costs before it does its work"
  echo
  echo "Before: \`$BEFORE\` ($(grep -o 'ACCEL_CUDA:BOOL=[A-Z]*' "$BEFORE/CMakeCache.txt" || true)); after: \`$AFTER\`"
  echo "($(grep -o 'ACCEL_CUDA:BOOL=[A-Z]*' "$AFTER/CMakeCache.txt" || true)). Machine: $(nproc) CPUs, no GPU."
  echo
  python3 bench/startup.py "$BEFORE" "$AFTER" "$RUNS"
  echo
  echo "Generated $(date -u '+%Y-%m-%d %H:%M') UTC by bench/startup.sh."
} > bench/results/startup.md
cat bench/results/startup.md
