#!/usr/bin/env bash
# Every benchmark, each beside its peer, then bench/RESULTS.md (make bench).
# Needs Python with torch, transformers and accelerate for the peers
# (pip install torch transformers accelerate), and OpenMPI for the MPI peer.
# Takes about 30 minutes on the 2-core machine; run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j2 >/dev/null
BUILD_DIR=build bash bench/llama_step.sh
bash bench/matmul.sh bench/results/matmul.md
bash bench/ddp.sh
bash bench/zero.sh
bash bench/device_layer.sh
bash bench/dist_bench.sh build
bash bench/bench_bigmodel.sh build
bash bench/collect_results.sh
