#!/usr/bin/env python3
"""Sums bench/idle_trace.sh's events (perf script -F tid,time,event,ip,sym,trace
on stdin; argv[1] the timed steps the recording spans): the main thread's
serial stretches between OpenMP regions (GOMP_parallel entry and return),
the worker's sleep inside and outside the regions, its wake-ups, and the
leaf symbols of the main thread's samples while outside every region."""
import collections
import re
import sys

EV = re.compile(r"\s*(\d+)\s+([\d.]+):\s+(\S+):(?:\s+|$)(.*)")
steps = max(1, int(sys.argv[1])) if len(sys.argv) > 1 else 1
rows = []
for line in sys.stdin:
    m = EV.match(line)
    if m:
        rows.append((float(m.group(2)), int(m.group(1)), m.group(3), m.group(4).strip()))
rows.sort()
if not rows:
    sys.exit("idle_trace: no events recorded")
tids = collections.Counter(r[1] for r in rows)
main = min(tids)  # the process's first thread runs the step
# the threads that ran in the recording (a cpu-clock sample): a thread of
# the process that never runs (an idle helper) would count as asleep
# throughout
workers = {r[1] for r in rows if r[2].startswith("cpu-clock")} - {main}

in_region = False
entered = returned = None
regions = 0
region_s = 0.0
gaps = []  # serial stretches of the main thread, seconds
asleep = {}  # worker -> (since, inside a region at that moment)
sleep_in = sleep_out = 0.0
wakeups = 0
serial_syms = collections.Counter()
main_samples = serial_samples = 0


def close_sleep(w, t):
    """Ends (or splits at a region boundary) worker w's sleep at t."""
    global sleep_in, sleep_out
    since, inside = asleep[w]
    if inside:
        sleep_in += t - since
    else:
        sleep_out += t - since


for t, tid, ev, rest in rows:
    if ev == "probe_libgomp:GOMP_parallel" and tid == main:
        if returned is not None:
            gaps.append(t - returned)
        for w in asleep:
            close_sleep(w, t)
            asleep[w] = (t, True)
        in_region, entered = True, t
    elif ev == "probe_libgomp:GOMP_parallel__return" and tid == main and in_region:
        regions += 1
        region_s += t - entered
        for w in asleep:
            close_sleep(w, t)
            asleep[w] = (t, False)
        in_region, returned = False, t
    elif ev == "sched:sched_switch":
        prev = int(re.search(r"prev_pid=(\d+)", rest).group(1))
        state = re.search(r"prev_state=(\S+)", rest).group(1)
        if prev in workers and state.startswith("S") and prev not in asleep:
            asleep[prev] = (t, in_region)
    elif ev == "sched:sched_waking":
        woken = int(re.search(r"\bpid=(\d+)", rest).group(1))
        if woken in asleep:
            close_sleep(woken, t)
            del asleep[woken]
            wakeups += 1
    elif ev.startswith("cpu-clock") and tid == main:
        main_samples += 1
        if not in_region and returned is not None:
            serial_samples += 1
            serial_syms[rest.split(None, 1)[1] if len(rest.split()) > 1 else "?"] += 1  # "ip symbol"

span = rows[-1][0] - rows[0][0]
print(f"\n{steps} timed steps over {span * 1e3:.0f} ms recorded; per step:")
print(f"  OpenMP regions: {regions / steps:.0f}, {region_s / steps * 1e3:.1f} ms of the main thread inside them")
gap_s = sum(gaps)
print(f"  serial stretches (main thread between regions): {len(gaps) / steps:.0f}, "
      f"{gap_s / steps * 1e3:.1f} ms")
edges = (0, 20e-6, 100e-6, 1e-3, 10e-3, float("inf"))
for lo, hi in zip(edges, edges[1:]):
    sel = [g for g in gaps if lo <= g < hi]
    label = f"{lo * 1e6:.0f} us - {hi * 1e6:.0f} us" if hi != float("inf") else f">= {lo * 1e6:.0f} us"
    print(f"    {label:>18}: {len(sel) / steps:7.1f} a step, {sum(sel) / steps * 1e3:7.1f} ms")
print(f"  worker asleep inside regions: {sleep_in / steps * 1e3:.1f} ms, outside: {sleep_out / steps * 1e3:.1f} ms, "
      f"woken {wakeups / steps:.0f} times")
if main_samples:
    print(f"  main thread's samples outside every region: {serial_samples} of {main_samples} "
          f"({100.0 * serial_samples / main_samples:.1f}%); by leaf symbol:")
    for sym, n in serial_syms.most_common(15):
        print(f"    {100.0 * n / max(1, serial_samples):5.1f}%  {sym}")
