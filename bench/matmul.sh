#!/usr/bin/env bash
# The Llama step's 12 GEMMs: bench_matmul's table (every provider of accel on
# every shape, the one chosen marked, oneDNN's weight plain vs packed), then
# PyTorch's torch.mm on the same shapes in the same run (bench/matmul_peer.py,
# appended to the same file): a step's ratio to PyTorch read against GEMMs of
# equal speed or not.
#
#     bash bench/matmul.sh [OUT.md]     (default bench/results/matmul.md: the Zen 3
#                                        baseline's file; on another CPU kind
#                                        bench/results/<kind>/matmul.md)
#
# Env: BUILD_DIR (default build), THREADS (2), REPS (7), PEER (1: run the
# PyTorch peer; 0 or no torch: accel's table only), OMP_WAIT_POLICY (PASSIVE
# for both, as bench/llama_step.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/matmul.md}
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
REPS=${REPS:-7}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OMP_NUM_THREADS=$THREADS "$BUILD_DIR/bin/bench_matmul" "$OUT" "$REPS"
if [ "${PEER:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
    { echo; python3 bench/matmul_peer.py --threads "$THREADS" --reps "$REPS"; } | tee -a "$OUT"
else
    echo "matmul.sh: PyTorch peer skipped (PEER=0 or no torch)" >&2
fi
