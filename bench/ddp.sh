#!/usr/bin/env bash
# Data-parallel Llama training step (the engine issue's step: hidden 512, 8 layers,
# 8 heads, ffn 1536, vocab 8192, batch 8 x seq 256 per process, f32, AdamW):
# accel (Accelerator + `accel launch`) vs PyTorch + Accelerate (gloo), on 1 and
# 2 processes, interleaved in one run so both see the same machine load.
#
#     bash bench/ddp.sh [ROUNDS] [STEPS]        (defaults 3 rounds x 4 timed steps, 2 warm-ups)
#
# Per round, in this order:
#   accel_1p      1 process  x 2 threads   OMP_NUM_THREADS=2 bench_ddp_step
#   accel_2p      2 processes x 1 thread   accel launch --num_processes 2 bench_ddp_step
#   accel_2p_ns   2 processes x 1 thread   ... bench_ddp_step --no-sync (no all-reduce)
#   torch_1p      1 process  x 2 threads   llama_step_peer.py --accelerate --threads 2
#   torch_2p      2 processes x 1 thread   torchrun --nproc_per_node 2 llama_step_peer.py --accelerate --threads 1
#   and with ONE_THREAD=1 (default) the per-core baselines
#   accel_1p1t / torch_1p1t   1 process x 1 thread
# Before each run it waits (at most IDLE_WAIT s, default 90) for the machine to
# be >= 90% idle over 2 s, then records the CPU time the other processes on the
# machine used during the run (foreign share of the 2 CPUs).
#
# Env: BUILD_DIR (build), OUT (bench/results/ddp.md), EXTRA (flags for every
# run, e.g. "--layers 2 --seq 64" for a quick check), ONE_THREAD (1), IDLE_WAIT (90),
# LOG_DIR (keep the run logs there instead of a temporary directory),
# REPORT_ONLY=1 (no runs: rebuild the report from the logs in LOG_DIR),
# FIRST_ROUND (1; with LOG_DIR, add rounds FIRST_ROUND..ROUNDS to earlier ones).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-4}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/ddp.md}
EXTRA=${EXTRA:-}
ONE_THREAD=${ONE_THREAD:-1}
IDLE_WAIT=${IDLE_WAIT:-90}

if [ "${REPORT_ONLY:-0}" != 1 ]; then
    cmake -S . -B "$BUILD_DIR" >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target bench_ddp_step accel_cli >/dev/null
fi
BIN="$BUILD_DIR/bin/bench_ddp_step"
ACCEL="$BUILD_DIR/bin/accel"
if [ "${REPORT_ONLY:-0}" != 1 ] && { [ ! -x "$BIN" ] || [ ! -x "$ACCEL" ]; }; then
    echo "ddp.sh: $BIN or $ACCEL missing" >&2
    exit 1
fi
PEER=bench/llama_step_peer.py
# 2 warm-ups: accel's second step still faults in memory (~1,400 page faults, +30-50% CPU).
COMMON="--steps $STEPS --warmup 2 $EXTRA"

# run NAME CMD...: gate on an idle machine, run, log to $LOG/NAME.R (+ .meta); a failure ends the script.
RUN_IDLE_WAIT=$IDLE_WAIT
RUN_STRICT=1
. bench/metered_rounds.sh

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
[ "${REPORT_ONLY:-0}" = 1 ] && ROUNDS_RUN=0 || ROUNDS_RUN=$ROUNDS
for r in $(seq "${FIRST_ROUND:-1}" "$ROUNDS_RUN"); do
    # shellcheck disable=SC2086
    {
        run accel_1p env OMP_NUM_THREADS=2 "$BIN" $COMMON
        run accel_2p env -u OMP_NUM_THREADS "$ACCEL" launch --num_processes 2 --num_cpu_threads_per_process 1 \
            "$BIN" $COMMON
        run accel_2p_ns env -u OMP_NUM_THREADS "$ACCEL" launch --num_processes 2 --num_cpu_threads_per_process 1 \
            "$BIN" $COMMON --no-sync
        run torch_1p env OMP_NUM_THREADS=2 python3 "$PEER" --accelerate --threads 2 $COMMON
        run torch_2p env OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 "$PEER" --accelerate \
            --threads 1 $COMMON
        if [ "$ONE_THREAD" = 1 ]; then
            run accel_1p1t env OMP_NUM_THREADS=1 "$BIN" $COMMON
            run torch_1p1t env OMP_NUM_THREADS=1 python3 "$PEER" --accelerate --threads 1 $COMMON
        fi
    }
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${REPORT_ONLY:-0}" = 1 ]; then load_before="(report rebuilt from logs; see the per-run load column)"; fi

python3 - "$LOG" "$ROUNDS" "$STEPS" "$OUT" "$load_before" "$load_after" "$EXTRA" <<'EOF'
import datetime, glob, os, re, statistics, sys
log, rounds, steps, out, lb, la, extra = sys.argv[1:]
rounds = int(rounds)

def summary(path):
    for line in open(path):
        if line.startswith("impl=accel") or line.startswith("peer=pytorch"):
            return {k: v for k, v in re.findall(r"(\w+)=([^\s]+)", line)}
    raise SystemExit(f"ddp.sh: no summary line in {path}")

def meta(path):
    wall, own, busy, load = open(path + ".meta").read().split()[:4]
    wall, own, busy = float(wall), float(own), float(busy)
    return {"wall": wall, "foreign": max(0.0, busy - own) / (2 * wall), "load": float(load)}

names = ["accel_1p", "accel_2p", "accel_2p_ns", "torch_1p", "torch_2p", "accel_1p1t", "torch_1p1t"]
# A log without .meta is a run that did not finish.
runs = {n: [(summary(p), meta(p)) for p in sorted(glob.glob(f"{log}/{n}.*[0-9]")) if os.path.exists(p + ".meta")]
        for n in names}
runs = {n: v for n, v in runs.items() if v}
# Runs during which other processes took >= 10% of the 2 CPUs are contaminated;
# the tables use the quiet runs of a config when it has any (else all of them).
QUIET = 0.10
quiet = {n: [x for x in v if x[1]["foreign"] < QUIET] or v for n, v in runs.items()}
nq = {n: sum(1 for x in v if x[1]["foreign"] < QUIET) for n, v in runs.items()}
med = lambda n, k: statistics.median(float(s[k]) for s, _ in quiet[n])
tok = {n: med(n, "tokens_per_s") for n in runs}
ms = {n: med(n, "step_ms_median") for n in runs}
state = [l.strip() for l in open(sorted(glob.glob(f"{log}/torch_2p.*[0-9]"))[0]) if l.startswith("accelerate ")]
accel_desc = [l.strip() for l in open(sorted(glob.glob(f"{log}/accel_2p.*[0-9]"))[0])
              if l.startswith("Distributed environment") or l.startswith("rank ") and "OMP" in l]
pairs = list(zip(runs["accel_2p"], runs["accel_2p_ns"]))
pairs = [(a, b) for a, b in pairs if max(a[1]["foreign"], b[1]["foreign"]) < QUIET] or pairs
exposed = [float(a[0]["step_ms_median"]) - float(b[0]["step_ms_median"]) for a, b in pairs]
exposed_cpu = [float(a[0]["cpu_ms_rank0"]) - float(b[0]["cpu_ms_rank0"]) for a, b in pairs]
# Off-CPU time of rank 0 per timed step (wall - process CPU): what it spends
# waiting (for the all-reduce, for the other rank, or preempted by other jobs).
def off_cpu(n):
    v = []
    paths = [p for p in sorted(glob.glob(f"{log}/{n}.*[0-9]")) if os.path.exists(p + ".meta")]
    paths = [p for p in paths if meta(p)["foreign"] < QUIET] or paths
    for p in paths:
        for m in re.finditer(r"rank 0 step \d+: ([\d.]+) ms .* cpu ([\d.]+) ms", open(p).read()):
            v.append(float(m.group(1)) - float(m.group(2)))
    return statistics.median(v)
cfg = extra.strip() or "hidden 512, 8 layers, 8 heads, ffn 1536, vocab 8192, batch 8 x seq 256 per process"
L = [
    "# Data-parallel Llama training step: accel vs PyTorch + Accelerate (gloo)",
    "",
    f"Config: {cfg}; f32, forward + backward (+ gradient all-reduce) + AdamW + zero_grad. "
    f"{rounds} interleaved rounds; every run is 2 warm-up + {steps} timed steps, its value the median step "
    "(for 2 processes: the slower rank's median for accel, rank 0's for PyTorch, whose DDP steps are lock-step); "
    "each table value is the median over the quiet rounds of that config (other processes used < 10% of "
    "the CPUs during the run; all rounds if none was quiet; quiet runs per config: "
    + ", ".join(f"{n} {nq[n]}/{len(runs[n])}" for n in runs) + "). tokens/s counts the tokens of all processes "
    "(world x batch x seq per step).",
    "",
    "Launch: accel `accel launch --num_processes 2 --num_cpu_threads_per_process 1` (shm backend, "
    "zero-copy bucketed all-reduce overlapping backward, 25 MiB buckets); PyTorch "
    f"{__import__('torch').__version__} + accelerate {__import__('accelerate').__version__} under "
    "`torchrun --standalone --nproc_per_node 2`, `Accelerator(cpu=True)` -> DDP over gloo. What each side "
    "reported it ran:",
    "",
    *[f"    {l}" for l in accel_desc + state],
    "",
    "| config | accel tok/s | accel step ms | PyTorch+Accelerate tok/s | PyTorch step ms | accel / PyTorch |",
    "|---|---|---|---|---|---|",
]
rows = [("1 process x 2 threads", "accel_1p", "torch_1p"),
        ("2 processes x 1 thread", "accel_2p", "torch_2p"),
        ("1 process x 1 thread (per-core baseline)", "accel_1p1t", "torch_1p1t")]
for label, a, t in rows:
    if a in runs and t in runs:
        L.append(f"| {label} | {tok[a]:.0f} | {ms[a]:.0f} | {tok[t]:.0f} | {ms[t]:.0f} | "
                 f"**{tok[a] / tok[t]:.2f}x** |")
L.append(f"| 2 processes, accel --no-sync (no all-reduce) | {tok['accel_2p_ns']:.0f} | "
         f"{ms['accel_2p_ns']:.0f} | | | |")
# CPU time per step does not depend on how much of the machine the other jobs
# took (busy-waiting threads aside), so it is the robust figure on a shared box.
def cpu(n):
    v = [float(s.get("cpu_ms_rank0", s.get("cpu_ms_median", "nan"))) for s, _ in quiet[n]]
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")
L += ["", "CPU time per step of one process (rank 0, all its threads, median; the per-process batch is the "
      "same 8 x 256 in every config, so lower = less work per token; independent of how much of the machine "
      "other jobs took, except that waiting threads that spin also burn CPU):", "",
      "| config | accel CPU ms / step | PyTorch CPU ms / step | PyTorch / accel |", "|---|---|---|---|"]
for label, a, t in rows:
    if a in runs and t in runs:
        L.append(f"| {label} | {cpu(a):.0f} | {cpu(t):.0f} | {cpu(t) / cpu(a):.2f}x |")
L.append(f"| 2 processes, accel --no-sync | {cpu('accel_2p_ns'):.0f} | | |")
L += ["", "Scaling (the machine has 2 cores, so \"1 process\" and \"2 processes\" use different per-process "
      "resources; three ratios, each defined here):", "",
      "| ratio | definition | accel | PyTorch+Accelerate |", "|---|---|---|---|"]
def both(f):
    return " | ".join(f"{f(p):.2f}" for p in ("accel", "torch"))
L.append("| equal-machine speed-up S | tok/s(2 proc x 1 thr) / tok/s(1 proc x 2 thr): both use the whole "
         "2-core machine; > 1 means data parallelism beats threading | "
         + both(lambda p: tok[f"{p}_2p"] / tok[f"{p}_1p"]) + " |")
L.append("| issue's efficiency S/2 | tok/s(2 proc) / (2 x tok/s(1 proc x 2 thr)); its ceiling here is about "
         "0.56 (2 x 1-thread sgemm 140 GFLOP/s vs 2-thread 124, measured on Zen 3), not 1 | "
         + both(lambda p: tok[f"{p}_2p"] / (2 * tok[f"{p}_1p"])) + " |")
if "accel_1p1t" in runs and "torch_1p1t" in runs:
    L.append("| per-core scaling efficiency E | tok/s(2 proc x 1 thr) / (2 x tok/s(1 proc x 1 thr)): "
             "each process has one core in both; 1.0 = perfect | "
             + both(lambda p: tok[f"{p}_2p"] / (2 * tok[f"{p}_1p1t"])) + " |")
ex = statistics.median(exposed)
L += ["", f"**Exposed communication (accel)**: step(sync) - step(no-sync), 2 processes, median over the rounds "
      f"where both runs were quiet (all rounds if none) of the per-round difference: **{ex:.0f} ms** = {100 * ex / ms['accel_2p']:.1f}% of the "
      f"{ms['accel_2p']:.0f} ms step (per round: {', '.join(f'{e:.0f}' for e in exposed)} ms; gradients "
      f"are {float(open(sorted(glob.glob(f'{log}/accel_2p.*[0-9]'))[0]).read().split('model params=')[1].split()[0]) * 4 / 1e6:.0f} MB "
      "f32; the shm zero-copy all-reduce floor for 80 MB is ~10 ms, measured on Zen 3). A difference within the "
      "round-to-round noise means the all-reduce is hidden behind backward. The CPU the all-reduce costs "
      "rank 0 (CPU ms/step sync - no-sync, per round): "
      f"{', '.join(f'{e:.0f}' for e in exposed_cpu)} ms (median {statistics.median(exposed_cpu):.0f}). "
      "Load-robust bound: rank 0's off-CPU time per timed step (wall - CPU, median over the timed steps of "
      f"the quiet runs) is {off_cpu('accel_2p'):.0f} ms with sync and {off_cpu('accel_2p_ns'):.0f} ms without: "
      "the all-reduce wait that backward does not hide is at most the difference.", "",
      "Per run (step ms median; foreign = CPU share of the 2 cores used by other processes on the shared "
      "machine during the run; load = 1-min load average at its start):", "",
      "| round | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
for i in range(rounds):
    cells = []
    for n in runs:
        if i < len(runs[n]):
            s, m = runs[n][i]
            cells.append(f"{float(s['step_ms_median']):.0f} (foreign {100 * m['foreign']:.0f}%, load {m['load']:.1f})")
        else:
            cells.append("")
    L.append(f"| {i + 1} | " + " | ".join(cells) + " |")
acc_split = [(n, runs[n][0][0]) for n in ("accel_1p", "accel_2p", "accel_2p_ns", "accel_1p1t") if n in runs]
L += ["", "accel step split (round 1, ms, slowest rank): " + "; ".join(
    f"{n}: fwd {s['fwd_ms']} bwd {s['bwd_ms']} opt {s['opt_ms']}, rank-0 CPU {s['cpu_ms_rank0']}" for n, s in acc_split),
      "", f"Machine load average (1/5/15 min) before: {lb}; after: {la}. The machine is a shared 2-vCPU VM: "
      "other engineers' builds and benchmarks ran during this measurement (see the foreign column); each "
      "run first waited (bounded) for a >= 90% idle machine. Runs of both implementations are interleaved "
      "in every round, so the ratios are more robust than the absolute tokens/s.", "",
      f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by bench/ddp.sh.", ""]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write("\n".join(L))
print("\n".join(L))
EOF
