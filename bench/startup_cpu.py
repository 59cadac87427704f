#!/usr/bin/env python3
"""Start-up of `accel launch --num_processes 2 /bin/true` and `accel --help`,
one build against another, with the CPU time beside the wall time.

bench/startup.py's wall medians need a quiet machine: on a loaded one (the
shared 2-core project machine, load 20+) a run mostly waits for a core. The
CPU time the command and every process it started and reaped spent (user +
sys from wait4's rusage: the launcher, its watchdog, the workers) hardly
depends on the load, so it shows what a change saves there; the lead reruns
bench/startup.sh on a quiet machine for the wall figures. It also times
mkdtemp + rmdir in /tmp and /dev/shm (where `accel launch` keeps its
workers' error files).
Interleaved (A B A B ...), 3 untimed runs each first; prints a markdown table.

    startup_cpu.py BEFORE_BUILD AFTER_BUILD [RUNS (60)]
"""
import os
import statistics
import sys
import tempfile
import time

CASES = [
    ("`accel launch --num_processes 2 /bin/true`", ["bin/accel", "launch", "--num_processes", "2", "/bin/true"]),
    ("`accel --help`", ["bin/accel", "--help"]),
]


def spawn(argv, env):
    devnull = os.open(os.devnull, os.O_WRONLY)
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1),
                                                             (os.POSIX_SPAWN_DUP2, devnull, 2)])
    _, status, ru = os.wait4(pid, 0)
    t1 = time.perf_counter()
    os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)}: exit status {os.waitstatus_to_exitcode(status)}")
    return (t1 - t0) * 1e3, (ru.ru_utime + ru.ru_stime) * 1e3


def fmt(xs):
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.2f} ms (p25 {q[0]:.2f}, min {min(xs):.2f})"


def main():
    before, after = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    env = dict(os.environ, OMP_NUM_THREADS="1")
    load0 = os.getloadavg()
    print("| command | before: wall | after: wall | before: CPU | after: CPU |")
    print("|---|---|---|---|---|")
    for name, argv in CASES:
        wall = {before: [], after: []}
        cpu = {before: [], after: []}
        for i in range(3 + runs):
            for build in (before, after):
                ms, c = spawn([os.path.join(build, argv[0])] + argv[1:], env)
                if i >= 3:
                    wall[build].append(ms)
                    cpu[build].append(c)
        print(f"| {name} | {fmt(wall[before])} | {fmt(wall[after])} | {fmt(cpu[before])} | {fmt(cpu[after])} |")
    # What the launch's error-file directory costs where it is made: mkdtemp + rmdir.
    dirs = []
    for base in ("/tmp", "/dev/shm"):
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            os.rmdir(tempfile.mkdtemp(prefix="accel-launch-", dir=base))
            ts.append((time.perf_counter() - t0) * 1e3)
        dirs.append(f"{base} {statistics.median(ts):.3f} ms")
    load1 = os.getloadavg()
    print()
    print(f"A directory made and removed (mkdtemp + rmdir, median of {runs}): {', '.join(dirs)}.")
    print()
    print(f"Medians of {runs} runs each (25th percentile and minimum beside them), before and after interleaved, "
          f"3 warm-up runs each not counted; OMP_NUM_THREADS=1. CPU: user + sys of the command and the processes "
          f"it reaped. Load average (1/5/15 min) before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; after: "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}.")


if __name__ == "__main__":
    main()
