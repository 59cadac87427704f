#!/usr/bin/env bash
# Rebuilds bench/RESULTS.md from the per-topic result files that each bench
# script writes into bench/results/ (llama_step.sh, bench_matmul, ddp.sh, launchers.sh, zero.sh,
# device_layer.sh, dist_bench.sh, hier_bench.sh, rendezvous.sh, bench_bigmodel.sh, decode.sh,
# families.sh, moe_step.sh, conv.sh, bench_callsite, bench_checkpoint_io, json_load.sh, tokenizer.sh,
# startup.sh, sidebyside.sh (llmc.md, ggml_gpt2.md: llm.c and ggml), batch_decode.sh, pipeline.sh (pipeline.md and its torch peer's pipeline_torch.md), tp.sh (tp_torch.md, beside
# bench_tp_step's tp.md); startup_launch.md came from startup_cpu.py, now startup.py's CPU column); one section per CPU kind from
# bench/results/<kind>/ (its KIND file names the kind).
#     bash bench/collect_results.sh
set -euo pipefail
cd "$(dirname "$0")"
TOPICS="llama_step llama_step_bf16 llama_step_profile matmul matmul_packed linear_raw ddp launchers zero device_layer dist hier rendezvous bigmodel decode batch_decode families families_bf16 families_moe moe_step moe_step_bf16 conv callsite checkpoint_checksums json_load tokenizer startup startup_launch llmc ggml_gpt2"
# Prints the sections of the files in directory $1: the known topics in their
# order, then any other file, each heading one level down.
sections() {
  local dir=$1 f seen=" "
  for f in $TOPICS; do
    [ -f "$dir/$f.md" ] || continue
    seen="$seen$f "
    echo
    sed -e 's/^### /#### /' -e 's/^## /### /' -e 's/^# /## /' "$dir/$f.md"
  done
  for f in "$dir"/*.md; do
    [ -f "$f" ] || continue
    case "$seen" in *" $(basename "$f" .md) "*) continue ;; esac
    echo
    sed -e 's/^### /#### /' -e 's/^## /### /' -e 's/^# /## /' "$f"
  done
}
{
  echo "# Benchmark results"
  echo
  echo "Every number here was produced by a script in bench/ on a project machine (2 vCPUs, shared;"
  echo "each table gives the limits it is measured against). The machines change CPU kind"
  echo "from day to day: the sections up to the first CPU-kind heading were measured on AMD EPYC Zen 3 (AVX2,"
  echo "no bf16 units) unless a section names another CPU; each other kind has its own section below, from"
  echo "bench/results/<kind>/ (a bench script writes there when given OUT=bench/results/<kind>/<topic>.md),"
  echo "never overwritten by another kind's figures. Each section names the script that regenerates it, the"
  echo "machine load during the run, and the peer run beside accel in the same script. Single runs jitter by 2x"
  echo "under load; ratios from interleaved runs are the robust figures. Regenerate a section with its"
  echo "script, then run \`bash bench/collect_results.sh\`."
  sections results
  for d in results/*/; do
    [ -f "$d/KIND" ] || continue
    echo
    echo "## CPU kind: $(head -1 "$d/KIND")"
    sections "${d%/}" | sed -e 's/^\(#\{2,5\}\) /#\1 /'
  done
} > RESULTS.md
echo "wrote bench/RESULTS.md"
