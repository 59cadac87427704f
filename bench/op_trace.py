#!/usr/bin/env python3
"""Sums bench/op_trace.sh's uprobe events (perf script -F tid,time,event,trace
on stdin) per step: the phases (forward accel_llama_loss, backward, optimizer
step, zero_grad), each kernel's wall time on the thread that called it (a
kernel inside another kernel, as a GEMM's weight conversion inside
accel__cpuk_gemm, counts in its caller), and the copies (accel__cpuk_copy) by
dtypes, shape and the source's stride[1] (a transpose shows it), and the
GEMMs (accel__cpuk_gemm) by shape, with their GFLOP/s inside the step beside
the best the bench measured for the shape alone (the "gemm_shape" lines of
the bench's log, argv[1])."""
import collections
import re
import sys

PHASES = ("accel_llama_loss", "accel_accelerator_backward", "accel_optimizer_step", "accel_optimizer_zero_grad")
DTYPES = {0: "f32", 1: "bf16", 2: "f16", 3: "f64", 4: "i64"}
EV = re.compile(r"\s*(\d+)\s+([\d.]+):\s+probe_bench_llama_step:(\S+?):\s*\(([^)]*)\)\s*(.*)")

stack = collections.defaultdict(list)  # tid -> [(name, t0, info)]
kernel = collections.Counter()
calls = collections.Counter()
phase = collections.Counter()
copies = collections.defaultdict(lambda: [0.0, 0])
gemms = collections.defaultdict(lambda: [0.0, 0])  # (M, N, K, ta, tb, dtype) -> [seconds, calls]
pending = {}  # tid -> the copy's arguments, from its two probes
first = last = None
for line in sys.stdin:
    m = EV.match(line)
    if not m:
        continue
    tid, t, ev, args = int(m.group(1)), float(m.group(2)), m.group(3), m.group(5)
    first = t if first is None else first
    last = t
    kv = dict(a.split("=", 1) for a in args.split())
    if ev == "copyshape":
        pending.setdefault(tid, {}).update(kv)
        continue
    if ev == "accel__cpuk_copy":
        pending.setdefault(tid, {}).update(kv)
    if not ev.endswith("__return"):
        info = pending.pop(tid, None) if ev == "accel__cpuk_copy" else kv if ev == "accel__cpuk_gemm" else None
        stack[tid].append((ev, t, info))
        continue
    name = ev[: -len("__return")]
    st = stack[tid]
    while st and st[-1][0] != name:  # an entry whose return was not recorded (the trace's edges)
        st.pop()
    if not st:
        continue
    _, t0, info = st.pop()
    inside = [s[0] for s in st]
    if name in PHASES:
        phase[name] += t - t0
        calls[(name, "phase")] += 1
        continue
    if any(s.startswith("accel__cpuk_") for s in inside):
        continue  # counted in the calling kernel
    where = next((p for p in reversed(inside) if p in PHASES), "other")
    kernel[(name, where)] += t - t0
    calls[(name, where)] += 1
    if name == "accel__cpuk_copy" and info:
        nd = int(info.get("nd", 0))
        shape = [info.get(k, "0") for k in ("s0", "s1", "s2", "s3")][:nd]
        key = (where, DTYPES.get(int(info["idt"]), info["idt"]), DTYPES.get(int(info["odt"]), info["odt"]),
               "x".join(shape), info.get("contig", ""))
        copies[key][0] += t - t0
        copies[key][1] += 1
    if name == "accel__cpuk_gemm" and info:
        key = tuple(int(info[k]) for k in ("M", "N", "K", "ta", "tb", "dt"))
        gemms[key][0] += t - t0
        gemms[key][1] += 1

span = (last - first) if first is not None else 0.0
print(f"traced span {span * 1e3:.1f} ms")
print("\nphases (ms summed over the traced steps, calls):")
for p in PHASES:
    print(f"  {phase[p] * 1e3:9.1f} {calls[(p, 'phase')]:6d}  {p}")
print("\nkernels called from a phase (ms, calls, share of the traced span):")
for (name, where), v in sorted(kernel.items(), key=lambda x: -x[1]):
    print(f"  {v * 1e3:9.1f} {calls[(name, where)]:6d} {100 * v / span:5.1f}%  {name} [{where}]")
print("\ncopies (ms, calls): phase, from -> to dtype, shape, source stride[1]:")
for k, v in sorted(copies.items(), key=lambda x: -x[1][0])[:25]:
    print(f"  {v[0] * 1e3:9.1f} {v[1]:6d}  {k[0]}: {k[1]} -> {k[2]} [{k[3]}] stride1={k[4]}")

# The bench's own GEMM table: the best GFLOP/s any provider reached on each
# shape called alone (piece: fwd NT, dx NN, dw TN).
alone = {}
for line in open(sys.argv[1]) if len(sys.argv) > 1 else []:
    if line.startswith("gemm_shape "):
        d = dict(re.findall(r"(\w+)=([^\s]+)", line))
        M, N, K = (int(v) for v in d["MxNxK"].split("x"))
        ta, tb = {"fwd": (0, 1), "dx": (0, 0), "dw": (1, 0)}[d["piece"]]
        best = max(float(v.split("(")[0]) for k, v in d.items()
                   if k not in ("layer", "piece", "dtype", "MxNxK", "per_step"))
        alone[(M, N, K, ta, tb)] = best
total = sum(v[0] for v in gemms.values())
flop = sum(2.0 * k[0] * k[1] * k[2] * v[1] for k, v in gemms.items())
print("\nGEMMs called from the phases (ms, calls, GFLOP/s in the step, best alone in this process, ratio):")
for k, v in sorted(gemms.items(), key=lambda x: -x[1][0]):
    gf = 2.0 * k[0] * k[1] * k[2] * v[1] / v[0] / 1e9
    best = alone.get(k[:5])
    tail = f" {best:7.1f} {gf / best:5.2f}" if best else "       -     -"
    print(f"  {v[0] * 1e3:9.1f} {v[1]:6d} {gf:7.1f}{tail}  {k[0]}x{k[1]}x{k[2]} "
          f"{'T' if k[3] else 'N'}{'T' if k[4] else 'N'} {DTYPES.get(k[5], k[5])}")
if total:
    at_best = sum(2.0 * k[0] * k[1] * k[2] * v[1] / (alone[k[:5]] * 1e9) for k, v in gemms.items() if k[:5] in alone)
    known = sum(v[0] for k, v in gemms.items() if k[:5] in alone)
    print(f"  all: {total * 1e3:.1f} ms at {flop / total / 1e9:.1f} GFLOP/s" +
          (f"; the shapes the bench timed alone took {known * 1e3:.1f} ms in the step against {at_best * 1e3:.1f} ms "
           f"at their best alone ({at_best / known:.2f})" if known else ""))
