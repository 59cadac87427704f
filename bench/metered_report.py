"""The report side of the metered bench scripts (bench/pipeline.sh's peer part,
bench/tp.sh): each run's output NAME.R beside its NAME.R.meta (bench/metered_run.py:
"wall_s own_cpu_s machine_busy_s load1 rc"), read back into figures per run name
and round, and the lines every such report shares."""
import glob
import subprocess


def read_runs(log, parse):
    """{run name: [figures of round 1, 2, ...]}: parse(text) (a dict, or None
    when the output lacks its summary) plus the run's load1 ("load") and the
    share of the 2 CPUs other processes took during it ("foreign"); a run
    that failed or printed no summary is {"failed": "exit rc: `last line`"}."""
    runs = {}
    paths = [p for p in glob.glob(f"{log}/*.[0-9]*") if not p.endswith(".meta")]
    for path in sorted(paths, key=lambda p: (p.rsplit(".", 1)[0], int(p.rsplit(".", 1)[1]))):
        text = open(path).read()
        wall, own, busy, load, rc = open(path + ".meta").read().split()
        x = parse(text) if int(rc) == 0 else None
        if x is None:
            tail = text.strip().splitlines()
            x = {"failed": f"exit {rc}: `{tail[-1] if tail else 'no output'}`"}
        else:
            x.update(load=float(load), foreign=max(0.0, float(busy) - float(own)) / (2 * float(wall)))
        runs.setdefault(path.rsplit("/", 1)[1].rsplit(".", 1)[0], []).append(x)
    return runs


def succeeded(runs, name):
    return [x for x in runs.get(name, []) if "failed" not in x]


def failures(runs, name, label):
    """Report lines "- label: exit rc: `...`" of name's failed rounds."""
    return [f"- {label}: {x['failed']}" for x in runs.get(name, []) if "failed" in x]


def machine(log):
    """'<CPU model>, 2 cores shared ...: load average <before the runs>' (the
    script wrote $LOG/load_before before its first run)."""
    try:
        before = open(f"{log}/load_before").read().strip()
    except OSError:
        before = "?"
    cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True,
                         text=True).stdout.strip()
    return (f"{cpu}, 2 cores shared with other engineers' builds and tests: load average {before} before the "
            "runs, each run's load1 and the share of the 2 CPUs other processes took during it below")


def rounds_cell(v):
    """One run's rounds: "ms (load1, foreign %), ..."."""
    return ", ".join(f"{x['ms']:.0f} ({x['load']:.1f}, {100 * x['foreign']:.0f}%)" for x in v)


def write(out, lines, notes):
    """The report: lines, then the failed runs' notes, to out and stdout."""
    if notes:
        lines = lines + ["", "Runs that failed:", ""] + notes
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
