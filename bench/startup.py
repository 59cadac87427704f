#!/usr/bin/env python3
"""Start-up cost of accel's commands, before vs after (bench/startup.sh).

For each command, runs the BEFORE and the AFTER build's binary in turn
(A B A B ..., so a drift of the machine's load hits both alike), RUNS times
each after 3 untimed runs, and takes per run:
- the wall time (spawn to reap, perf_counter): needs a quiet machine; on a
  loaded one (the shared 2-core project machine, load 20+) a run mostly waits
  for a core;
- the CPU time the command and every process it started and reaped spent
  (user + sys from wait4's rusage: the launcher, its watchdog, the workers),
  which hardly depends on the load, so it shows what a change saves there;
- the peak RSS, from separate runs under /usr/bin/time (%M): a process
  started straight from Python would carry Python's own high-water mark
  across its exec (Linux keeps it), /usr/bin/time's is ~2 MB.
Also times mkdtemp + rmdir in /tmp and /dev/shm (where `accel launch` keeps
its workers' error files). Prints a markdown table of medians (min-max
beside them).

    startup.py BEFORE_BUILD AFTER_BUILD [RUNS (21)]
"""
import os
import statistics
import sys
import tempfile
import time

CASES = [
    ("`accel launch --num_processes 2 /bin/true`", ["bin/accel", "launch", "--num_processes", "2", "/bin/true"]),
    ("`accel --help`", ["bin/accel", "--help"]),
    ("`accel env`", ["bin/accel", "env"]),
    ("`train_linear` (1 process)", ["bin/train_linear"]),
]


def spawn(argv, env):
    """Wall ms and CPU ms (user + sys of it and what it reaped)."""
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


def run_once(argv, env):
    """Wall ms and CPU ms of a direct run, peak RSS MB of a run under /usr/bin/time."""
    ms, cpu = spawn(argv, env)
    out = "/tmp/accel_startup_rss.txt"
    spawn(["/usr/bin/time", "-f", "%M", "-o", out] + argv, env)
    with open(out) as f:
        return ms, cpu, int(f.read().split()[-1]) / 1024.0


def fmt(xs, unit):
    return f"{statistics.median(xs):.1f} {unit} ({min(xs):.1f}-{max(xs):.1f})"


def dir_cost(runs):
    """What the launch's error-file directory costs where it is made."""
    out = []
    for base in ("/tmp", "/dev/shm"):
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            os.rmdir(tempfile.mkdtemp(prefix="accel-launch-", dir=base))
            ts.append((time.perf_counter() - t0) * 1e3)
        out.append(f"{base} {statistics.median(ts):.3f} ms")
    return ", ".join(out)


def main():
    before, after = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 21
    env = dict(os.environ, OMP_NUM_THREADS="1")
    load0 = os.getloadavg()
    print("| command | before: wall | after: wall | before: CPU | after: CPU | before: peak RSS | after: peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for name, argv in CASES:
        res = [([], [], []), ([], [], [])]  # before, after (the same build may be both)
        for i in range(3 + runs):
            for b, build in enumerate((before, after)):
                got = run_once([os.path.join(build, argv[0])] + argv[1:], env)
                if i >= 3:
                    for k in range(3):
                        res[b][k].append(got[k])
        print(f"| {name} | {fmt(res[0][0], 'ms')} | {fmt(res[1][0], 'ms')} | "
              f"{fmt(res[0][1], 'ms')} | {fmt(res[1][1], 'ms')} | "
              f"{fmt(res[0][2], 'MB')} | {fmt(res[1][2], 'MB')} |")
    load1 = os.getloadavg()
    print()
    print(f"A directory made and removed (mkdtemp + rmdir, median of {runs}): {dir_cost(runs)}.")
    print()
    print(f"Medians of {runs} runs each (min-max in parentheses), before and after interleaved, 3 warm-up "
          f"runs each not counted; OMP_NUM_THREADS=1. CPU: user + sys of the command and the processes it "
          f"reaped (the column to read on a loaded machine). Load average (1/5/15 min) before: "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}.")


if __name__ == "__main__":
    main()
