#!/usr/bin/env bash
# Ranks sharing a machine under a launcher that sets no OMP_NUM_THREADS (issue
# #22 item 1): bench_ddp_step on 2 processes of one machine, interleaved rounds.
#
#     bash bench/launchers.sh [ROUNDS]        (default 3)
#
# Per round:
#   accel_launch  accel launch --num_processes 2 (it exports OMP_NUM_THREADS =
#                 cores / 2 and OMP_WAIT_POLICY=PASSIVE)
#   mpirun        mpirun --bind-to none -np 2: nothing set, the library sizes
#                 its threads to the rank's share (src/dist/node_threads.c)
#   mpirun_full   the same with OMP_NUM_THREADS=<online cores> exported: every
#                 rank runs a pool as wide as the machine, which is what plain
#                 mpirun and srun ran before (OpenMP's default width is the
#                 affinity mask, all cores under --bind-to none)
# The mpirun runs get MASTER_ADDR/MASTER_PORT, so they rendezvous as accel
# launch's workers do and use the same shm backend: the runs differ in their
# threads only, not in their all-reduce. Model: the issue's (hidden 256, 4
# layers, 4 heads, ffn 768, vocab 4096, batch 4 x seq 128, f32, AdamW).
# Each run's value is bench_ddp_step's step_ms_median (the slower rank's
# median step); the report gives the median over rounds and the load.
#
# Env: BUILD_DIR (build), OUT (bench/results/launchers.md), STEPS (6),
# IDLE_WAIT (0: the shared machine is never idle; the load is reported).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/launchers.md}
STEPS=${STEPS:-6}
# SRUN=1: also under a one-node SLURM (srun on PATH, a partition up): plain
# `srun -N1 -n2` (its port from SLURM_JOB_ID, threads sized by the library),
# the same with OMP_NUM_THREADS=<cores> (as before), and `srun -N1 -n1 accel launch`.
SRUN=${SRUN:-0}
cmake --build "$BUILD_DIR" -j2 --target bench_ddp_step accel_cli >/dev/null
BIN="$BUILD_DIR/bin/bench_ddp_step"
ACCEL="$BUILD_DIR/bin/accel"
CORES=$(nproc --all)
ARGS=(--hidden 256 --layers 4 --heads 4 --ffn 768 --vocab 4096 --batch 4 --seq 128 --steps "$STEPS" --warmup 1)
MPIRUN=(mpirun --allow-run-as-root --bind-to none -np 2 -x MASTER_ADDR=127.0.0.1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

RUN_IDLE_WAIT=${IDLE_WAIT:-0}
RUN_STRICT=1
. bench/metered_rounds.sh

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
    run accel_launch env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY "$ACCEL" launch --num_processes 2 "$BIN" "${ARGS[@]}"
    run mpirun env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY "${MPIRUN[@]}" -x MASTER_PORT="$(free_port)" \
        "$BIN" "${ARGS[@]}"
    run mpirun_full env -u OMP_WAIT_POLICY "${MPIRUN[@]}" -x MASTER_PORT="$(free_port)" -x OMP_NUM_THREADS="$CORES" \
        "$BIN" "${ARGS[@]}"
    if [ "$SRUN" = 1 ]; then
        run srun_launch env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY srun -N1 -n1 "$ACCEL" launch --num_processes 2 \
            "$BIN" "${ARGS[@]}"
        run srun env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY srun -N1 -n2 "$BIN" "${ARGS[@]}"
        run srun_full env -u OMP_WAIT_POLICY OMP_NUM_THREADS="$CORES" srun -N1 -n2 "$BIN" "${ARGS[@]}"
    fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$LOG" "$ROUNDS" "$OUT" "$load_before" "$load_after" "$CORES" <<'EOF'
import datetime, glob, re, statistics, sys
log, rounds, out, lb, la, cores = sys.argv[1:]

def run(path):
    text = open(path).read()
    s = dict(re.findall(r"(\w+)=([^\s]+)", next(l for l in text.splitlines() if l.startswith("impl=accel"))))
    threads = sorted(set(re.findall(r"omp_max_threads=(\d+)", text)))
    wall, own, busy, load = open(path + ".meta").read().split()[:4]
    return float(s["step_ms_median"]), float(load), max(0.0, float(busy) - float(own)) / (int(cores) * float(wall)), threads

names = {"accel_launch": "`accel launch --num_processes 2`",
         "mpirun": "`mpirun --bind-to none -np 2` (library sizes threads)",
         "mpirun_full": f"`mpirun --bind-to none -np 2 -x OMP_NUM_THREADS={cores}` (as before the fix)",
         "srun_launch": "`srun -N1 -n1 accel launch --num_processes 2`",
         "srun": "`srun -N1 -n2` (library sizes threads)",
         "srun_full": f"`OMP_NUM_THREADS={cores} srun -N1 -n2` (as before the fix)"}
rows = {n: [run(p) for p in sorted(glob.glob(f"{log}/{n}.*[0-9]"))] for n in names}
rows = {n: v for n, v in rows.items() if v}
names = {n: l for n, l in names.items() if n in rows}
base = statistics.median(v[0] for v in rows["accel_launch"])
L = [f"| launcher | OpenMP threads per rank | step ms (median of {rounds}) | rounds (ms) | vs accel launch | load1 at start | others' CPU share |",
     "|---|---|---|---|---|---|---|"]
for n, label in names.items():
    v = rows[n]
    med = statistics.median(x[0] for x in v)
    L.append(f"| {label} | {','.join(v[0][3])} | {med:.0f} | {' / '.join(f'{x[0]:.0f}' for x in v)} | "
             f"{med / base:.2f}x | {' / '.join(f'{x[1]:.1f}' for x in v)} | "
             f"{' / '.join(f'{100 * x[2]:.0f}%' for x in v)} |")
head = [
    "# Ranks sharing a machine: plain mpirun and srun vs accel launch",
    "",
    f"Generated by `bash bench/launchers.sh {rounds}` on {datetime.date.today()}. `bench_ddp_step --hidden 256 "
    "--layers 4 --heads 4 --ffn 768 --vocab 4096 --batch 4 --seq 128` (f32, AdamW), 2 processes on one machine, "
    "shm backend for every launcher (the mpirun runs get MASTER_ADDR/MASTER_PORT, so only the threads differ). "
    "Rounds interleaved; each run's value is the slower rank's median step. Plain mpirun and srun export no "
    "OMP_NUM_THREADS: each rank used to run an OpenMP pool as wide as the machine (the last row reproduces "
    "that by exporting OMP_NUM_THREADS=<cores>); now accel_dist_init sizes the kernels' threads to the rank's "
    "share (docs/dist.md, \"Threads of ranks that share a machine\")."
    + (" srun: a one-node SLURM 22.05 (Debian's slurm-wlm, proctrack/linuxproc, task/none: no binding) on "
       "the same machine; srun's ranks are slurmd's children, not srun's, so their CPU counts as others' "
       "(100%) in those rows." if "srun" in rows else " srun: not measured (no SLURM)."),
    "",
]
text = "\n".join(head + L) + f"\n\nMachine: {cores} CPUs; loadavg before {lb}, after {la}.\n"
open(out, "w").write(text)
print(text)
EOF
