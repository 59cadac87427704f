#!/usr/bin/env bash
# Pipeline schedules, in two parts.
#
# 1. The sweep (OUT, bench/results/pipeline.md): measured idle fraction
#    beside the theoretical bubble (p - 1) / (m + p - 1) ((p - 1) / (v m + p - 1)
#    for interleaved 1F1B with v chunks per stage), and the micro-batch inputs
#    each stage holds, for GPipe, 1F1B and interleaved 1F1B (v = 2) on p = 2
#    and 4 stages (processes, 1 thread each) with m = 4 and 8 micro-batches.
#    The theory is the reference.
# 2. The peer (PEER_OUT, bench/results/pipeline_torch.md): the same three
#    schedules on p = 2 with m = 4 and 8 beside torch.distributed.pipelining
#    (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B over gloo,
#    bench/pipeline_peer.py), accel and torch alternating run by run over
#    PEER_ROUNDS rounds so both see the same machine load; both train the same
#    weights (accel's first run writes them with --save-pretrained, torch loads
#    them), so their losses are compared step by step. Each run is metered
#    (bench/metered_run.py: load1, the CPU other processes took).
#
#     bash bench/pipeline.sh [STEPS]          (default 5: 1 warm-up + 4 timed)
#
# Env: BUILD_DIR (build), OUT (bench/results/pipeline.md), PEER_OUT
# (bench/results/pipeline_torch.md), EXTRA (flags for every run; default a
# Llama of 8 layers, hidden 128, batch 16 x seq 32), SWEEP=0 (skip part 1),
# PEER=0 (skip part 2), PEER_ROUNDS (3), PEER_STEPS (9: 1 warm-up + 8 timed),
# TORCH_NO_RECOMPUTE=1 (also run torch without recomputation, its default),
# LOG_DIR (keep part 2's logs there), REPORT_ONLY=1 (rebuild part 2's report
# from LOG_DIR). Part 2 with TORCH_NO_RECOMPUTE=1 (54 runs) took 31 minutes
# under load 12-39 (2026-12-03); on a quiet machine most of a run is torch's
# start-up (about 8 s), so about 7 minutes (estimated, not measured).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/pipeline.md}
PEER_OUT=${PEER_OUT:-bench/results/pipeline_torch.md}
EXTRA=${EXTRA:---layers 8 --hidden 128 --batch 16 --seq 32 --vocab 2048}
ACCEL="$BUILD_DIR/bin/accel"
BIN="$BUILD_DIR/bin/bench_pipeline"
if [ "${SWEEP:-1}" != 0 ] && [ "${REPORT_ONLY:-0}" != 1 ]; then
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
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=1 "$ACCEL" launch --num_processes "$p" "$BIN" \
          --schedule "$s" --virtual-stages "$v" --micro-batches "$m" --steps "$STEPS" $EXTRA 2>/dev/null |
          grep -E '^(stage|schedule)'
        echo '```'
      done
    done
  done
} > "$OUT"
echo "wrote $OUT"
fi
[ "${PEER:-1}" != 0 ] || exit 0

ROUNDS=${PEER_ROUNDS:-3}
PSTEPS=${PEER_STEPS:-9}
. bench/metered_rounds.sh  # run NAME CMD...: $LOG/NAME.$r and its .meta
WEIGHTS="$LOG/weights"
if [ "${REPORT_ONLY:-0}" != 1 ]; then
  [ -x "$BIN" ] && [ -x "$ACCEL" ] ||
    { echo "pipeline.sh: build bench_pipeline and accel_cli in $BUILD_DIR" >&2; exit 1; }
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "$load_before" > "$LOG/load_before"
  # shellcheck disable=SC2034  # r: the round run() files the logs under
  for r in $(seq 1 "$ROUNDS"); do
    for m in 4 8; do
      for s in gpipe 1f1b interleaved; do
        v=1
        if [ "$s" = interleaved ]; then v=2; fi
        save=()
        [ -f "$WEIGHTS/model.safetensors" ] || save=(--save-pretrained "$WEIGHTS")
        # shellcheck disable=SC2086
        run "accel_${s}_m$m" env OMP_NUM_THREADS=1 "$ACCEL" launch --num_processes 2 "$BIN" --schedule "$s" \
          --virtual-stages "$v" --micro-batches "$m" --steps "$PSTEPS" "${save[@]}" $EXTRA
        # shellcheck disable=SC2086
        run "torch_${s}_m$m" env OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 bench/pipeline_peer.py \
          --schedule "$s" --virtual-stages "$v" --micro-batches "$m" --steps "$PSTEPS" --load "$WEIGHTS" $EXTRA
        if [ "${TORCH_NO_RECOMPUTE:-0}" = 1 ]; then
          # shellcheck disable=SC2086
          run "torchnr_${s}_m$m" env OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 \
            bench/pipeline_peer.py --schedule "$s" --virtual-stages "$v" --micro-batches "$m" --steps "$PSTEPS" \
            --load "$WEIGHTS" --no-recompute $EXTRA
        fi
      done
    done
  done
fi

python3 - "$LOG" "$PSTEPS" "$PEER_OUT" "$EXTRA" <<'EOF'
import re, statistics, sys
sys.path.insert(0, "bench")
from metered_report import failures, machine, read_runs, rounds_cell, succeeded, write
log, steps, out, extra = sys.argv[1:]
med = statistics.median

def parse(text):
    summary = re.search(r"^(?:impl=torch )?schedule=.*$", text, re.M)
    losses = re.search(r"^losses=([\d.,e+-]+)$", text, re.M)
    if not summary or not losses:
        return None
    kv = dict(re.findall(r"(\w+)=([\w.]+)", summary.group(0)))
    stages = [dict(re.findall(r"(\w+)=([\w.\[,)]+)", s)) for s in re.findall(r"^stage=.*$", text, re.M)]
    return {"ms": float(kv["step_ms"]), "cpu": float(kv["cpu_ms"]), "theory": float(kv["bubble_theory"]),
            "idle_cpu": [float(s["idle_cpu"]) for s in stages], "layers": [s["layers"] for s in stages],
            "losses": [float(x) for x in losses.group(1).split(",")]}

runs = read_runs(log, parse)
rounds = max((len(v) for v in runs.values()), default=0)
nr = any(k.startswith("torchnr_") for k in runs)
L = ["# Pipeline schedules beside torch.distributed.pipelining (p = 2, CPU, gloo)", "",
     f"`bash bench/pipeline.sh` (its second part; `SWEEP=0` runs only this part), {machine(log)}. "
     f"Model and batch: `{extra}` (Llama, 8 heads, ffn 3 x hidden, untied), f32, SGD lr 0.01; 2 processes x 1 "
     f"thread, one stage each; interleaved 1F1B with v = 2 chunks per stage. {rounds} rounds, accel and torch "
     f"alternating run by run; each run {steps} steps, the first a warm-up. step ms: the median over a run's timed "
     "steps of the slowest stage's wall time of the schedule's forward + backward (accel: "
     "`accel_accelerator_pipeline_step`'s report; torch: `schedule.step`; the SGD step is outside both), then the "
     "median over the rounds; CPU ms: the two stages' process CPU time over the same interval, summed (getrusage; "
     "both sides 1 thread). Both recompute each stage's forward in its backward (accel always does, Megatron's "
     "full recomputation; torch through `torch.utils.checkpoint` around each stage)"
     + (", and torch also runs without recomputation (its default), the `no recompute` rows." if nr else "."), "",
     "Both train the same weights: accel's first run writes its initial model with `--save-pretrained` "
     "(`accel_save_pretrained`, a transformers checkpoint) and every torch run loads it, with the same ids per step, "
     "so the losses of every step (the warm-up's included) are compared.", "",
     "| m | schedule | bubble theory | accel step ms | torch step ms | accel / torch step | accel CPU ms | "
     "torch CPU ms | accel / torch CPU | idle_cpu stage 0, 1: accel / torch | max \\|loss diff\\| over the steps |",
     "|---|---|---|---|---|---|---|---|---|---|---|"]
detail, notes, splits = [], [], {}
for m in (4, 8):
    for s in ("gpipe", "1f1b", "interleaved"):
        a = succeeded(runs, f"accel_{s}_m{m}")
        notes += failures(runs, f"accel_{s}_m{m}", f"accel {s} m={m}")
        for peer, label in (("torch", ""), ("torchnr", " (torch: no recompute)")):
            t = succeeded(runs, f"{peer}_{s}_m{m}")
            notes += failures(runs, f"{peer}_{s}_m{m}", f"torch{label} {s} m={m}")
            if not a or not t:
                continue
            am, tm, ac, tc = (med(x[k] for x in v) for v, k in ((a, "ms"), (t, "ms"), (a, "cpu"), (t, "cpu")))
            ai = [med(x["idle_cpu"][k] for x in a) for k in (0, 1)]
            ti = [med(x["idle_cpu"][k] for x in t) for k in (0, 1)]
            diff = max(abs(p - q) for x in a for y in t for p, q in zip(x["losses"], y["losses"]))
            splits[s] = (" ".join(a[0]["layers"]), " ".join(t[0]["layers"]))
            L.append(f"| {m} | {s}{label} | {a[0]['theory']:.3f} | {am:.1f} | {tm:.1f} | {am / tm:.2f} | {ac:.1f} | "
                     f"{tc:.1f} | {ac / tc:.2f} | {ai[0]:.2f}, {ai[1]:.2f} / {ti[0]:.2f}, {ti[1]:.2f} | {diff:.1e} |")
            detail.append(f"| {m} | {s}{label} | {rounds_cell(a)} | {rounds_cell(t)} |")
L += ["", "Per round: step ms (load1 at the run's start, other processes' share of the 2 CPUs during it):", "",
      "| m | schedule | accel | torch |", "|---|---|---|---|"] + detail
L += ["", "Stages' layers (interleaved: each stage's first chunk): " + "; ".join(
    f"{s} accel {a}, torch {t}" + ("" if a == t else " (DIFFERENT: not like for like)") for s, (a, t) in splits.items())
    + "."]
L += ["", "idle_cpu = 1 - CPU / wall of a stage per step: the time the stage's process did not run, waiting for "
      "its neighbour or, under load, for a core; on a loaded machine it is not the schedule's bubble (the sweep "
      "in pipeline.md, on a quiet machine, compares accel's busy time with the theory). The loss columns compare "
      "accel's and torch's loss of every step of every run, as printed (6 decimals: a 0 means equal to 1e-6)."]
write(out, L, notes)
EOF
echo "wrote $PEER_OUT"
