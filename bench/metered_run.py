#!/usr/bin/env python3
"""One benchmark run with the machine's load recorded beside it (bench/ddp.sh, bench/zero.sh).

    metered_run.py OUT IDLE_WAIT CMD...

Waits (at most IDLE_WAIT s; 0: not at all) for a 2 s window in which the CPUs
are >= 90% idle, runs CMD with stdout+stderr in OUT, writes OUT.meta
"wall_s own_cpu_s machine_busy_s load1 rc" (own = CPU of CMD and its children,
busy = CPU of the whole machine during the run: busy - own is what other
processes took), prints OUT's tail on stderr and exits with CMD's status."""
import os, resource, subprocess, sys, time

out, idle_wait, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
HZ = os.sysconf("SC_CLK_TCK")


def busy():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / HZ, sum(v[:8]) / HZ


t0 = time.time()
while time.time() - t0 < idle_wait:
    b0, a0 = busy(); time.sleep(2); b1, a1 = busy()
    if b1 - b0 <= 0.10 * (a1 - a0):
        break
load = open("/proc/loadavg").read().split()[0]
ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
b0, _ = busy(); w0 = time.time()
with open(out, "w") as f:
    rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
w1 = time.time(); b1, _ = busy()
ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
open(out + ".meta", "w").write(f"{w1 - w0:.2f} {own:.2f} {b1 - b0:.2f} {load} {rc}\n")
sys.stderr.write(open(out).read()[-600:])
sys.exit(rc)
