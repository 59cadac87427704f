#!/usr/bin/env bash
# Tensor parallelism beside PyTorch DTensor: bench_tp_step (accel) and
# bench/tp_peer.py (`parallelize_module` with torchtitan's Llama plan:
# ColwiseParallel / RowwiseParallel, SequenceParallel for the sp rows,
# loss_parallel for the cross-entropy; gloo) on the same meshes, model and
# ids: 1 process, tp 2 and tp 2 + sp on 2 processes, tp 4, tp 4 + sp,
# dp_shard 2 x tp 2 and the same + sp on 4 processes, 1 thread each. accel
# and torch alternate run by run over ROUNDS rounds so both see the same
# machine load; each run is metered (bench/metered_run.py: load1, the CPU
# other processes took). Both train the same weights (accel's first run
# writes them with --save-pretrained, torch loads them). Step time, CPU time
# per step, the bytes a rank hands to the tensor-parallel collectives in one
# step (accel: src/ops/tp_stats.h; torch: a dispatch mode over DTensor's
# functional collectives, counted the same way) and rank 0's first-step loss
# (every mesh of both sides must agree).
#
#     bash bench/tp.sh [ROUNDS] [STEPS]       (defaults 3 rounds x 4 timed steps, 1 warm-up)
#
# Env: BUILD_DIR (build), OUT (bench/results/tp_torch.md), EXTRA (model and
# batch flags; default bench/results/tp.md's: 2 layers, hidden 256, 8 heads,
# ffn 768, vocab 4096, batch 4 x seq 128 per data-parallel rank), LOG_DIR
# (keep the logs there), REPORT_ONLY=1 (rebuild the report from LOG_DIR).
# The 42 runs took 25 minutes under load 20-36 (2026-12-03); on a quiet
# machine most of a run is torch's start-up, so about 7 (estimated).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-4}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/tp_torch.md}
EXTRA=${EXTRA:---layers 2 --hidden 256 --heads 8 --ffn 768 --vocab 4096 --batch 4 --seq 128}
ACCEL="$BUILD_DIR/bin/accel"
BIN="$BUILD_DIR/bin/bench_tp_step"
COMMON="--steps $STEPS --warmup 1 $EXTRA"
# name processes tp sp
MESHES="1p 1 1 0
tp2 2 2 0
tp2_sp 2 2 1
tp4 4 4 0
tp4_sp 4 4 1
dp2_tp2 4 2 0
dp2_tp2_sp 4 2 1"
. bench/metered_rounds.sh  # run NAME CMD...: $LOG/NAME.$r and its .meta
if [ "${REPORT_ONLY:-0}" != 1 ]; then
  [ -x "$BIN" ] && [ -x "$ACCEL" ] || { echo "tp.sh: build bench_tp_step and accel_cli in $BUILD_DIR" >&2; exit 1; }
  cut -d' ' -f1-3 /proc/loadavg > "$LOG/load_before"
  # shellcheck disable=SC2034  # r: the round run() files the logs under
  for r in $(seq 1 "$ROUNDS"); do
    while read -r name n tp sp; do
      flags=(--tp "$tp")
      [ "$sp" = 1 ] && flags+=(--sp)
      save=()
      [ -f "$LOG/weights/model.safetensors" ] || save=(--save-pretrained "$LOG/weights")
      # shellcheck disable=SC2086
      run "accel_$name" env OMP_NUM_THREADS=1 "$ACCEL" launch --num_processes "$n" "$BIN" "${flags[@]}" "${save[@]}" \
        $COMMON
      # shellcheck disable=SC2086
      run "torch_$name" env OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node "$n" bench/tp_peer.py \
        "${flags[@]}" --load "$LOG/weights" $COMMON
    done <<< "$MESHES"
  done
fi

python3 - "$LOG" "$STEPS" "$OUT" "$EXTRA" "$MESHES" <<'EOF'
import re, statistics, sys
sys.path.insert(0, "bench")
from metered_report import failures, machine, read_runs, rounds_cell, succeeded, write
log, steps, out, extra, meshes = sys.argv[1:]
med = statistics.median
labels = {"1p": "1 process", "tp2": "tp 2 (2)", "tp2_sp": "tp 2, sequence parallel (2)", "tp4": "tp 4 (4)",
          "tp4_sp": "tp 4, sequence parallel (4)", "dp2_tp2": "dp_shard 2 x tp 2 (4)",
          "dp2_tp2_sp": "dp_shard 2 x tp 2, sequence parallel (4)"}

def parse(text):
    line = re.search(r"^impl=.*$", text, re.M)
    if not line:
        return None
    kv = dict(re.findall(r"(\w+)=([\w.]+)", line.group(0)))
    return {"ms": float(kv["step_ms_median"]), "cpu": float(kv["cpu_ms_median"]), "bytes": int(kv["tp_bytes_per_step"]),
            "rss": float(kv["peak_rss_mb"]), "loss0": kv["loss0"], "comms": line.group(0).partition("comms: ")[2]}

runs = read_runs(log, parse)
rounds = max((len(v) for v in runs.values()), default=0)
L = ["# Tensor parallelism beside PyTorch DTensor (CPU, gloo)", "",
     f"`bash bench/tp.sh`, {machine(log)}; with 4 processes the ranks also share the 2 cores. Model and batch: "
     f"`{extra}` per data-parallel rank (the Llama of bench/results/tp.md), f32, AdamW lr 1e-4; 1 thread per "
     "process. accel: `bench_tp_step` through the Accelerator (`opts.parallelism` tp_size, dp_shard_size, "
     "sequence_parallelism; DDP over dp). torch: `bench/tp_peer.py`, transformers' LlamaForCausalLM under "
     "`parallelize_module` with torchtitan's plan (q/k/v, gate/up ColwiseParallel; o, down RowwiseParallel; the "
     "embedding RowwiseParallel; lm_head ColwiseParallel with its logits kept sharded for `loss_parallel`; with sp: "
     "SequenceParallel norms, PrepareModuleInput from Shard(1), row-parallel outputs to Shard(1)); over dp the "
     "gradients averaged in one all-reduce as DDP does. Both train the same weights (accel's first run writes "
     "its initial model with `--save-pretrained`, a transformers checkpoint, which torch loads) on the same ids "
     f"(bench_llama_ids' LCG per dp rank). {rounds} rounds, accel and torch alternating run by run, each 1 "
     f"warm-up + {steps} "
     "timed steps: step ms = the slowest rank's median step (forward, loss, backward, dp all-reduce, AdamW, "
     "zero_grad), median over the rounds; CPU ms = rank 0's process CPU per step, median.", "",
     "| mesh (processes) | accel step ms | torch step ms | accel / torch step | accel CPU ms | torch CPU ms | "
     "accel / torch CPU | accel tp bytes / step | torch tp bytes / step | accel / torch bytes | torch collectives "
     "/ step | peak RSS rank 0 MB, accel / torch |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
detail, notes, losses = [], [], {"accel": set(), "torch": set()}
for line in meshes.splitlines():
    name = line.split()[0]
    for impl in losses:
        notes += failures(runs, f"{impl}_{name}", f"{impl} {labels[name]}")
        losses[impl] |= {x["loss0"] for x in succeeded(runs, f"{impl}_{name}")}
    a, t = succeeded(runs, f"accel_{name}"), succeeded(runs, f"torch_{name}")
    if not a or not t:
        continue
    am, tm, ac, tc = (med(x[k] for x in v) for v, k in ((a, "ms"), (t, "ms"), (a, "cpu"), (t, "cpu")))
    ab, tb = a[0]["bytes"], t[0]["bytes"]
    L.append(f"| {labels[name]} | {am:.1f} | {tm:.1f} | {am / tm:.2f} | {ac:.1f} | {tc:.1f} | {ac / tc:.2f} | "
             f"{ab:,} | {tb:,} | {f'{ab / tb:.2f}' if tb else '-'} | {t[0]['comms'].replace('=', ' ') or '-'} | "
             f"{max(x['rss'] for x in a):.0f} / {max(x['rss'] for x in t):.0f} |")
    detail.append(f"| {labels[name]} | {rounds_cell(a)} | {rounds_cell(t)} |")
L += ["", "Per round: step ms (load1 at the run's start, other processes' share of the 2 CPUs during it):", "",
      "| mesh | accel | torch |", "|---|---|---|"] + detail
L += ["", "First-step loss of rank 0 (the same initial weights and ids on every mesh, so every mesh of either "
      f"side should print one process's): accel {', '.join(sorted(losses['accel']))}; torch "
      f"{', '.join(sorted(losses['torch']))}. "
      "The bytes count each all-reduce's buffer and each all-gather's and reduce-scatter's input (torch: the "
      "functional collectives DTensor issues, seen by a dispatch mode in one extra step after the timed ones; "
      "the dp gradient all-reduce is not counted on either side). They do not depend on the load."]
write(out, L, notes)
EOF
echo "wrote $OUT"
