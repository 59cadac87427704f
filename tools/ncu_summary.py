#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel summary into a table: where a run's GPU time goes.

    ncu --metrics gpu__time_duration.sum --print-summary per-kernel PROGRAM ... > ncu.log
    python3 tools/ncu_summary.py ncu.log [--top N]

ncu prints one entry per (kernel, grid, block) with its invocations and the
min/max/average of each metric; this adds invocations x average per kernel
name (the template arguments and the launch shapes folded together) and prints
a markdown table, largest first, with each kernel's share of the total.
tools/gpu_check.sh runs it on the GPU machine after profiling one step.
"""
import argparse
import collections
import re
import sys

UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
ENTRY = re.compile(r"^\s+(?:void )?(\S.*?)\s+\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), .*Invocations (\d+)\s*$")


def summarize(lines):
    """{kernel name: [milliseconds, invocations]} from ncu's per-kernel summary."""
    total = collections.defaultdict(lambda: [0.0, 0])
    for i, line in enumerate(lines):
        m = ENTRY.match(line)
        if not m:
            continue
        name = re.sub(r"\(.*", "", m.group(1))[:70]
        calls = int(m.group(8))
        for follow in lines[i + 1:i + 8]:
            if "gpu__time_duration.sum" in follow:
                fields = follow.split()
                unit, average = fields[1], float(fields[-1])
                if unit not in UNITS:
                    sys.exit(f"ncu_summary: unknown time unit {unit!r} in: {follow.strip()}")
                total[name][0] += calls * average * UNITS[unit]
                total[name][1] += calls
                break
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        total = summarize(f.read().splitlines())
    if not total:
        sys.exit(f"ncu_summary: no per-kernel entries with gpu__time_duration.sum in {a.log}")
    whole = sum(ms for ms, _ in total.values())
    print(f"GPU time of the profiled run: {whole:.1f} ms in {sum(n for _, n in total.values())} kernel launches")
    print()
    print("| kernel | ms | launches | share |")
    print("|---|---|---|---|")
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])
    for name, (ms, calls) in ranked[:a.top]:
        print(f"| {name} | {ms:.2f} | {calls} | {ms / whole:.1%} |")
    rest = ranked[a.top:]
    if rest:
        ms = sum(v[0] for _, v in rest)
        print(f"| {len(rest)} others | {ms:.2f} | {sum(v[1] for _, v in rest)} | {ms / whole:.1%} |")


if __name__ == "__main__":
    main()
