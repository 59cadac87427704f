#!/usr/bin/env bash
# CPU cost of the device layer: the Llama training step (1 process x 2 threads)
# and the DDP step (accel launch, 2 processes x 1 thread) of a base commit
# (before the device layer: 72339d7) against this checkout, each build as a
# user gets it by default, interleaved base/this in every round so both see the
# same machine load. Writes bench/results/device_layer.md.
#
#     bash bench/device_layer.sh [ROUNDS]       (default 5; ~2.5 min a round)
#
# Env: BASE (commit, default 72339d7), BUILD_DIR (build: this checkout's),
#      OUT (bench/results/device_layer.md), LOG_DIR (keep the logs there),
#      REPORT_ONLY=1 (no runs: rebuild the report from the logs in LOG_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
BASE=${BASE:-72339d7}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/device_layer.md}
LOG=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${REPORT_ONLY:-0}" != 1 ]; then
    BASE_TREE=$(mktemp -d)
    trap 'git worktree remove --force "$BASE_TREE" >/dev/null 2>&1 || true' EXIT
    git worktree add -q --detach "$BASE_TREE" "$BASE"
    cmake -S "$BASE_TREE" -B "$BASE_TREE/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$BASE_TREE/build" -j2 --target bench_llama_step bench_ddp_step accel_cli >/dev/null
    cmake -S . -B "$BUILD_DIR" >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target bench_llama_step bench_ddp_step accel_cli >/dev/null
    for r in $(seq 1 "$ROUNDS"); do
        for v in base this; do
            if [ "$v" = base ]; then D=$BASE_TREE/build/bin; else D=$BUILD_DIR/bin; fi
            echo "== round $r/$ROUNDS: $v (load $(cut -d' ' -f1 /proc/loadavg))" >&2
            OMP_NUM_THREADS=2 "$D/bench_llama_step" --threads 2 --steps 4 --warmup 2 > "$LOG/llama.$v.$r" 2>&1
            env -u OMP_NUM_THREADS "$D/accel" launch --num_processes 2 --num_cpu_threads_per_process 1 \
                "$D/bench_ddp_step" --steps 4 --warmup 2 > "$LOG/ddp.$v.$r" 2>&1
        done
    done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${REPORT_ONLY:-0}" = 1 ]; then load_before="(report rebuilt from logs)"; load_after=$load_before; fi
python3 - "$LOG" "$ROUNDS" "$BASE" "$OUT" "$load_before" "$load_after" <<'PY'
import datetime, re, statistics as st, sys
log, rounds, base, out, lb, la = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def val(path, key):
    m = re.search(key + r"=([0-9.]+)", open(path).read())
    return float(m.group(1)) if m else None
cpu = open(f"{log}/llama.this.1").read().split("step 0")[0].strip().replace("\n", "; ")
L = ["# The device layer's CPU cost: before/after", "",
     f"Base: {base} (before the device layer; its default build is `-march=native`); this: the checkout "
     "(portable build, kernels chosen at run time). Same machine, interleaved base/this in each of "
     f"{rounds} rounds. {cpu}.", "",
     "Llama step: `bench_llama_step --threads 2 --steps 4 --warmup 2` (hidden 512, 8 layers, vocab 8192, "
     "batch 8 x 256, AdamW, 1 process x 2 threads). DDP step: `accel launch --num_processes 2 "
     "--num_cpu_threads_per_process 1 bench_ddp_step --steps 4 --warmup 2` (same model, 2 processes x 1 "
     "thread, shm all-reduce). Each run's value is its median timed step; the ratio is this/base per "
     "round (> 1 = slower), its median the figure to quote.", "",
     "| benchmark | figure | base (median) | this (median) | this/base per round | median ratio |",
     "|---|---|---|---|---|---|"]
for bench, keys in (("llama", ("step_ms_median", "cpu_ms_median")), ("ddp", ("step_ms_median", "cpu_ms_rank0"))):
    for k in keys:
        pairs = []
        for r in range(1, rounds + 1):
            a, b = val(f"{log}/{bench}.base.{r}", k), val(f"{log}/{bench}.this.{r}", k)
            if a and b:
                pairs.append((a, b))
        if not pairs:
            continue
        ratios = [b / a for a, b in pairs]
        L.append(f"| {bench} | {k} | {st.median(a for a, _ in pairs):.0f} | {st.median(b for _, b in pairs):.0f} | "
                 + " ".join(f"{x:.3f}" for x in ratios) + f" | **{st.median(ratios):.3f}** |")
L += ["", f"Machine load average (1/5/15 min) before: {lb}; after: {la} (a shared 2-vCPU machine: other "
      "jobs ran during some rounds; the paired ratios are the robust figures).", "",
      f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by bench/device_layer.sh.", ""]
open(out, "w").write("\n".join(L))
print("\n".join(L))
PY
