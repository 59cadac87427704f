#!/usr/bin/env python3
"""Sums bench/op_trace.sh's uprobe events (perf script -F tid,time,event,trace
on stdin) per step: the phases (forward accel_llama_loss, backward, optimizer
step, zero_grad), each kernel's wall time on the thread that called it (a
kernel inside another kernel, as a GEMM's weight conversion inside
accel__cpuk_gemm, counts in its caller), and the copies (accel__cpuk_copy) by
dtypes, shape and the source's stride[1] (a transpose shows it)."""
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
        stack[tid].append((ev, t, pending.pop(tid, None) if ev == "accel__cpuk_copy" else None))
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
