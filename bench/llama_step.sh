#!/usr/bin/env bash
# One Llama training step (forward, backward, AdamW), accel vs PyTorch eager,
# same config and thread count, runs interleaved so both see the same machine
# load. Prints and writes the comparison table, with each step's model
# GFLOP/s over the GEMM limit of its dtype that bench_llama_step measures in
# its own process (every provider on every GEMM shape of the step: the best
# GFLOP/s any reaches, and the FLOP-weighted limit with each shape on its
# fastest provider) and the per-shape GEMM table. The CPU model and ISA come
# first; nothing here assumes a CPU kind.
#
#     bash bench/llama_step.sh [ROUNDS] [STEPS]      (defaults 3 rounds x 5 steps)
#
# Env: BUILD_DIR (default build), THREADS (2), OUT (bench/results/llama_step.md:
#      the Zen 3 baseline's file; on any other CPU kind pass
#      OUT=bench/results/<kind>/llama_step.md, e.g. amd-epyc-zen5, whose KIND
#      file names the kind: bench/collect_results.sh renders each such
#      directory as its own section, so no kind overwrites another's figures),
#      EXTRA (extra flags for both, e.g. "--layers 2 --seq 64" for a quick run),
#      QUIET_WAIT (seconds to wait for an idle CPU before each run, default 120),
#      MIXED_PRECISION (no|bf16|fp16, default no: accel's Accelerator mode and
#      torch.autocast on the PyTorch side), PEER_COMPILE (1: a torch.compile run
#      of the peer in every round too; default 1 for MIXED_PRECISION=no),
#      PEER (1: run the PyTorch peer, the default; 0: accel only, e.g. bf16 on
#      a CPU without bf16 units, where torch.autocast's step takes minutes),
#      OMP_WAIT_POLICY (default PASSIVE, for both sides: OpenMP workers that
#      spin after each parallel region compete with OpenBLAS's own threads and,
#      on a shared machine, with everyone else; measured on the 2-vCPU box
#      under load, both accel's and PyTorch's steps took about 2x longer with
#      libgomp's default spinning).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-5}
THREADS=${THREADS:-2}
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-bench/results/llama_step.md}
EXTRA=${EXTRA:-}
MP=${MIXED_PRECISION:-no}
PEER=${PEER:-1}
COMPILE=${PEER_COMPILE:-$([ "$MP" = no ] && echo 1 || echo 0)}
[ "$PEER" = 1 ] || COMPILE=0
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

cmake -S . -B "$BUILD_DIR" >/dev/null
cmake --build "$BUILD_DIR" -j2 --target bench_llama_step >/dev/null
BIN="$BUILD_DIR/bin/bench_llama_step"
export OMP_NUM_THREADS=$THREADS

# Waits (at most QUIET_WAIT seconds, default 120) for a 2 s window in which
# the CPUs are at least 90% idle, so that a run starts on a quiet machine when
# the shared box allows it; prints the idle fraction it started at.
quiet() {
    python3 - "${QUIET_WAIT:-120}" <<'PY'
import sys, time
def snap():
    f = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return f[3] + f[4], sum(f)
deadline, idle = time.time() + float(sys.argv[1]), 0.0
while True:
    i0, t0 = snap(); time.sleep(2); i1, t1 = snap()
    idle = (i1 - i0) / max(1, t1 - t0)
    if idle >= 0.9 or time.time() > deadline:
        break
print(f"{idle:.2f}")
PY
}

LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
    idle=$(quiet)
    echo "== round $r/$ROUNDS: accel (cpu idle before: $idle)" >&2
    echo "idle=$idle" > "$LOG/idle_accel.$r"
    # shellcheck disable=SC2086
    "$BIN" --threads "$THREADS" --steps "$STEPS" --profile --paired --mixed_precision "$MP" $EXTRA | tee "$LOG/accel.$r" >&2
    if [ "$MP" != no ]; then
        # accel's own f32 step beside it: the goal for a CPU without bf16 units is relative to it.
        echo "== round $r/$ROUNDS: accel f32" >&2
        # shellcheck disable=SC2086
        "$BIN" --threads "$THREADS" --steps "$STEPS" --mixed_precision no $EXTRA | tee "$LOG/accel32.$r" >&2
    fi
    if [ "$PEER" = 1 ]; then
        idle=$(quiet)
        echo "== round $r/$ROUNDS: pytorch (cpu idle before: $idle)" >&2
        echo "idle=$idle" > "$LOG/idle_torch.$r"
        # shellcheck disable=SC2086
        python3 bench/llama_step_peer.py --threads "$THREADS" --steps "$STEPS" --mixed_precision "$MP" $EXTRA | tee "$LOG/torch.$r" >&2
    fi
    if [ "$COMPILE" = 1 ]; then
        idle=$(quiet)
        echo "== round $r/$ROUNDS: pytorch torch.compile (cpu idle before: $idle)" >&2
        echo "idle=$idle" > "$LOG/idle_compile.$r"
        # shellcheck disable=SC2086
        python3 bench/llama_step_peer.py --threads "$THREADS" --steps "$STEPS" --warmup 2 --compile \
            --mixed_precision "$MP" $EXTRA | tee "$LOG/compile.$r" >&2
    fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$LOG" "$ROUNDS" "$STEPS" "$THREADS" "$OUT" "$load_before" "$load_after" "$EXTRA" "$MP" "$OMP_WAIT_POLICY" <<'EOF'
import glob, os, re, statistics, sys, datetime
log, rounds, steps, threads, out, lb, la, extra, mp, wait = sys.argv[1:]

def kv(path, key):
    for line in open(path):
        if key in line and "=" in line:
            return dict(re.findall(r"(\w+)=([^\s]+)", line))
    raise SystemExit(f"llama_step.sh: no '{key}' line in {path}")

files = lambda pat: sorted(glob.glob(f"{log}/{pat}.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
acc = [kv(p, "impl=accel") for p in files("accel")]
tor = [kv(p, "peer=pytorch") for p in files("torch")]
com = [kv(p, "peer=pytorch") for p in files("compile")]
a32 = [kv(p, "impl=accel") for p in files("accel32")]
split = [kv(p, "split_ms_median") for p in files("accel")]
idle_a = [kv(p, "idle=")["idle"] for p in files("idle_accel")]
idle_t = [kv(p, "idle=")["idle"] for p in files("idle_torch")]
model = kv(files("accel")[0], "gflop_per_step")
gflop = float(model["gflop_per_step"])
# The GEMM limits: the best over the rounds (GEMM calls disturbed by other
# processes only come out lower).
limit = max(float(a["gemm_limit_gflops"]) for a in acc)
weighted = max(float(a["gemm_weighted_gflops"]) for a in acc)
lims = [kv(p, "gemm_limit ") for p in files("accel")]
lim = max(lims, key=lambda l: float(l["limit_gflops"]))
# The per-shape table: each (shape, provider)'s best over the rounds.
shapes, provs = {}, []
for p in files("accel"):
    for line in open(p):
        if line.startswith("gemm_shape "):
            d = dict(re.findall(r"(\w+)=([^\s]+)", line))
            key = (d["layer"], d["piece"], d["MxNxK"], d["per_step"])
            for k, v in d.items():
                if k in ("layer", "piece", "dtype", "MxNxK", "per_step"):
                    continue
                provs += [k] if k not in provs else []
                g = float(v.split("(")[0])
                cell = shapes.setdefault(key, {})
                if g > cell.get(k, (0.0, ""))[0]:
                    cell[k] = (g, v[v.index("("):].replace("_", " ") if "(" in v else "")
# The weighted limit timed again after each timed step (--paired): each
# step's ratio to the limit of its own moment, the VM's speed moving between.
paired = [[dict(re.findall(r"(\w+)=([^\s]+)", l)) for l in open(p) if l.startswith("paired step=")]
          for p in files("accel")]
a_ms = [float(a["step_ms_median"]) for a in acc]
t_ms = [float(t["step_ms_median"]) for t in tor]
ratio = [t / a for a, t in zip(a_ms, t_ms)]
B_T = float(acc[0]["tokens_per_s"]) * a_ms[0] / 1e3  # tokens per step
med = lambda v: statistics.median(v) if v else float("nan")  # no peer rounds under PEER=0
med_a, med_t, med_r = med(a_ms), med(t_ms), med(ratio)
# CPU time per step (all threads): less disturbed by other processes than wall time.
a_cpu = [float(a["cpu_ms_median"]) for a in acc]
t_cpu = [float(t["cpu_ms_median"]) for t in tor]
c_ms = [float(c["step_ms_median"]) for c in com]
c_cpu = [float(c["cpu_ms_median"]) for c in com]
cpu_ratio = med([t / a for a, t in zip(a_cpu, t_cpu)])
q = min(range(len(acc)), key=lambda i: a_ms[i] + (t_ms[i] if tor else 0))  # the quietest round
tv = __import__("torch").__version__
peer = "eager" if mp == "no" else f"torch.autocast {mp}"
row = lambda name, ms: (f"| {name} | {ms:.0f} | {B_T / (ms / 1e3):.0f} | {gflop / (ms / 1e3):.1f} | "
                        f"{gflop / (ms / 1e3) / limit:.2f} | {gflop / (ms / 1e3) / weighted:.2f} |")
cfg = extra.strip() or "hidden 512, 8 layers, 8 heads, ffn 1536, vocab 8192, batch 8 x seq 256"
cpu = [l.strip() for l in open(files("accel")[0]) if l.startswith(("CPU:", "ISA:", "CPU kernels:"))]
mode = "f32" if mp == "no" else f"mixed_precision {mp} (PyTorch: torch.autocast cpu {mp})"
lines = [
    f"# Llama training step: accel vs PyTorch {peer} ({mode})" if tor else f"# Llama training step: accel ({mode})",
    "",
    "; ".join(cpu),
    "",
    f"Config: {cfg}; forward + backward + AdamW (lr 1e-4, wd 0.01) + zero_grad, "
    f"{threads} threads each (OMP_NUM_THREADS={threads}, torch.set_num_threads({threads})). "
    f"{rounds} interleaved rounds (accel, then PyTorch, each started after waiting up to "
    "QUIET_WAIT s for a 90%-idle CPU) of 1 warm-up + "
    f"{steps} timed steps; a run's value is its median step. "
    f"Model FLOPs per step: {gflop:.1f} GFLOP (6 x {int(model['matmul_params']):,} matmul params "
    "(all but the embedding and the norms) x tokens + 12 L B T^2 C attention). "
    f"The GEMM limit is measured in the accel process, in the step's GEMM dtype ({lim['dtype']}"
    + ("" if lim["dtype"] == "float32" else ": bf16/f16 operands, f32 accumulation") + "): each of the step's "
    f"{len(shapes)} GEMM shapes (forward / dX / dW of attention q/k/v/o, mlp up/gate, mlp down, lm_head) on "
    f"every provider built in ({', '.join(provs)}; accel__gemm_on, {threads} accel threads; oneDNN's forward "
    "and dX also with the weight kept in oneDNN's layout, as the step's linear layers run, the better "
    "taken" + ("; dnnl_rows, oneDNN on row blocks, one single-threaded matmul per thread, on dW alone, where "
               "it is a candidate of the measured choice" if "dnnl_rows" in provs else "") + "), best of 3 calls "
    "after a warm-up, best over the rounds. **GEMM limit** = the best GFLOP/s any provider reaches on any of "
    f"those shapes: {limit:.1f} GFLOP/s ({lim['limit_provider']} on {lim['limit_shape']}); **weighted limit** "
    "= the step's GEMM FLOPs over the time they take with each shape on its fastest provider: "
    f"{weighted:.1f} GFLOP/s. The ratios divide the model GFLOP/s (attention included) by them.",
    "",
    "| run | step (ms) | tokens/s | model GFLOP/s | step / GEMM limit | step / weighted GEMM limit |",
    "|---|---|---|---|---|---|",
    row("accel, median of rounds", med_a),
] + ([row(f"PyTorch {tv} {peer}, median of rounds", med_t)] if tor else []) + [
    row(f"accel, quietest round ({q + 1})", a_ms[q]),
] + ([row(f"PyTorch, quietest round ({q + 1})", t_ms[q])] if tor else []) + (
    [row(f"PyTorch {tv} torch.compile, median of rounds", statistics.median(c_ms))] if com else []) + [
    "",
    "The PyTorch peer was not run (PEER=0)." if not tor else
    f"**accel is {med_r:.2f}x PyTorch {peer}'s throughput** (median of the per-round ratios "
    f"PyTorch step / accel step: {', '.join(f'{r:.2f}' for r in ratio)}); "
    f"in CPU time per step {cpu_ratio:.2f}x (median of PyTorch CPU ms / accel CPU ms per round)"
    + (f"; against torch.compile {statistics.median([c / a for a, c in zip(a_ms, c_ms)]):.2f}x "
       f"(CPU time {statistics.median([c / a for a, c in zip(a_cpu, c_cpu)]):.2f}x)" if com else "") + ".",
    "",
] + ([f"**Paired with the limit of its moment**: after each timed step accel timed the weighted limit again "
      "(each shape on the provider found fastest above, best of 3 calls), and divided that step's model GFLOP/s by "
      f"it: median **step / weighted limit {statistics.median([float(d['step_over_weighted']) for r in paired for d in r]):.2f}** "
      f"over the {sum(map(len, paired))} timed steps (per round: "
      + ", ".join(f"{statistics.median([float(d['step_over_weighted']) for d in r]):.2f}" for r in paired if r)
      + f"); the limit itself measured {min(float(d['weighted_gflops']) for r in paired for d in r):.1f}-"
      f"{max(float(d['weighted_gflops']) for r in paired for d in r):.1f} GFLOP/s between the steps.", ""]
     if any(paired) else []) + ([f"**accel {mp} step / accel f32 step: {statistics.median([float(a['step_ms_median']) / float(b['step_ms_median']) for a, b in zip(acc, a32)]):.2f}x** "
      f"(median of the per-round ratios; in CPU time per step "
      f"{statistics.median([float(a['cpu_ms_median']) / float(b['cpu_ms_median']) for a, b in zip(acc, a32)]):.2f}x; "
      f"accel f32 per round, step / CPU ms: "
      + ", ".join(f"{float(b['step_ms_median']):.0f} / {float(b['cpu_ms_median']):.0f}" for b in a32) + ").", ""]
     if a32 else []) + [
    "Per round:",
    "",
    "| round | CPU idle before (accel / torch) | accel step ms | accel fwd / bwd / opt ms | "
    "accel CPU ms per step | PyTorch eager step ms / CPU ms | torch.compile step ms / CPU ms | "
    "ratio (eager / accel) | GEMM limit / weighted GFLOP/s |",
    "|---|---|---|---|---|---|---|---|---|",
]
for i, (a, s_) in enumerate(zip(acc, split)):
    cc = f"{c_ms[i]:.0f} / {c_cpu[i]:.0f}" if i < len(com) else "-"
    eager = (f"{t_ms[i]:.0f} / {t_cpu[i]:.0f} | {cc} | {ratio[i]:.2f}" if i < len(tor) else f"- | {cc} | -")
    lines.append(f"| {i + 1} | {idle_a[i]} / {idle_t[i] if i < len(tor) else '-'} | {a_ms[i]:.0f} | "
                 f"{s_['fwd']} / {s_['bwd']} / {s_['opt']} | {a_cpu[i]:.0f} | {eager} | "
                 f"{float(a['gemm_limit_gflops']):.1f} / {float(a['gemm_weighted_gflops']):.1f} |")
lines += [
    "",
    f"GEMM providers per shape ({lim['dtype']}, GFLOP/s, best call over the rounds; **bold** the fastest, "
    "the one the weighted limit takes; \"packed\": oneDNN's figure is the one with the weight's form in its "
    "layout; \"as f32\": oneDNN has no matmul of the dtype on this CPU and multiplies f32 panels):",
    "",
    "| layer | piece | M x N x K | per step | " + " | ".join(provs) + " |",
    "|---|---|---|---|" + "---|" * len(provs),
]
for (layer, piece, mnk, count), cell in shapes.items():
    top = max(cell, key=lambda k: cell[k][0])
    cells = [(f"**{cell[k][0]:.1f}**" if k == top else f"{cell[k][0]:.1f}") + (" " + cell[k][1] if cell[k][1] else "")
             if k in cell else "-" for k in provs]
    lines.append(f"| {layer} | {piece} | {mnk.replace('x', ' x ')} | {count} | " + " | ".join(cells) + " |")
lines += [
    "",
    f"Machine load average (1/5/15 min) before: {lb}; after: {la}. The machine is shared "
    "(2 vCPUs): when other processes run, both implementations get a fraction of the cores, "
    "wall-clock times swing by 2-4x between runs, and the paired per-round ratio is the robust "
    "figure. accel's CPU ms per step (both threads, waits included) does not depend on the "
    "load as much: on an idle machine a step takes about half of it. "
    f"OMP_WAIT_POLICY={wait} for both sides; torch.compile runs take 2 warm-up steps (compilation).",
    "",
    f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by bench/llama_step.sh.",
    "",
]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
EOF
