#!/usr/bin/env bash
# Where the second core idles in a Llama training step: uprobes on libgomp's
# GOMP_parallel (entry and return: every OpenMP region of accel's kernels and
# of oneDNN's, which share the one pool), the scheduler's switch and waking
# events of the process (sched_waking fires in the waker's context, so the
# recording of the process sees its threads wake each other), and a
# cpu-clock sample of its threads, recorded by
# perf over the timed steps of bench_llama_step (attached once its warm-up
# steps have printed), then summed by bench/idle_trace.py:
#
#   - the serial stretches: the main thread's time between one region's
#     return and the next one's entry (autograd, allocation, single-threaded
#     kernels), their count and sizes, and what the main thread's samples in
#     them were running (leaf symbols; oneDNN's JIT code shows as [unknown]);
#   - the worker asleep (futex wait, OMP_WAIT_POLICY=PASSIVE) inside regions
#     (waiting at a region's end for the main thread: imbalance, late wake-up)
#     and outside them (the serial stretches seen from the idle core), and
#     how often it was woken.
#
#     sudo bash bench/idle_trace.sh [BUILD_DIR] [bench_llama_step args...]
#
# BUILD_DIR defaults to build; the args to --threads 2 --steps 3 --warmup 2
# (f32; add --mixed_precision bf16). Needs root (uprobes, sched tracepoints).
# The probes are removed at the end. Only meaningful on a quiet machine: a
# preempted main thread makes its worker wait at the region's end and reads
# as imbalance (the load average is printed beside the figures).
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
args=${*:---threads 2 --steps 3 --warmup 2}
bin=$(readlink -f "$build/bin/bench_llama_step")
gomp=$(ldd "$bin" | awk '/libgomp/ {print $3}')
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'perf probe -q -d "probe_libgomp:*" 2>/dev/null || true; rm -rf "$out"' EXIT
perf probe -q -d "probe_libgomp:*" 2>/dev/null || true
perf probe -q -x "$gomp" -a GOMP_parallel
perf probe -q -x "$gomp" -a GOMP_parallel%return
# shellcheck source=bench/perf_steps.sh
. "$here/perf_steps.sh"
# the sampling rate on cpu-clock alone: a global -F would sample the
# tracepoints too, dropping most of the switches and wake-ups
perf_timed_steps "$bin" "$args" -e 'probe_libgomp:*' -e sched:sched_switch -e sched:sched_waking \
    -e 'cpu-clock/freq=1999/'
grep -E "^(CPU|ISA|step|split_ms)" "$out/log" || true
echo "load average (1 min) at the first timed step: $timed_load, at the end: $(cut -d' ' -f1 /proc/loadavg)"
steps=$(grep -c "^step [0-9]*:" "$out/log")
perf script -i "$out/perf.data" -F tid,time,event,ip,sym,trace 2> /dev/null | python3 "$here/idle_trace.py" "$steps"
