#!/usr/bin/env bash
# Rebuilds bench/RESULTS.md from the per-topic result files that each bench
# script writes into bench/results/ (llama_step.sh, bench_matmul, ddp.sh, launchers.sh, zero.sh,
# device_layer.sh, dist_bench.sh, hier_bench.sh, rendezvous.sh, bench_bigmodel.sh, decode.sh,
# bench_callsite, bench_checkpoint_io, json_load.sh, tokenizer.sh,
# startup.sh, startup_cpu.py -> startup_launch.md).
#     bash bench/collect_results.sh
set -euo pipefail
cd "$(dirname "$0")"
{
  echo "# Benchmark results"
  echo
  echo "Every number here was produced by a script in bench/ on the project machine (2 vCPUs, AMD EPYC"
  echo "Zen 3, shared; ../shared/reference/limits.md has its measured limits). Each section names the"
  echo "script that regenerates it, the machine load during the run, and the peer run beside accel in"
  echo "the same script. The machine is shared with other jobs: single runs jitter by 2x under load;"
  echo "ratios from interleaved runs are the robust figures. Regenerate a section with its script, then"
  echo "run \`bash bench/collect_results.sh\`."
  echo
  for f in llama_step llama_step_bf16 llama_step_profile matmul matmul_packed ddp launchers zero device_layer dist hier rendezvous bigmodel decode callsite checkpoint_checksums json_load tokenizer startup startup_launch; do
    [ -f "results/$f.md" ] || continue
    echo
    sed -e 's/^### /#### /' -e 's/^## /### /' -e 's/^# /## /' "results/$f.md"
  done
} > RESULTS.md
echo "wrote bench/RESULTS.md"
