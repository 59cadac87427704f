# shellcheck shell=bash disable=SC2154,SC2034
# Sourced by bench/op_trace.sh and bench/idle_trace.sh: perf_timed_steps BIN
# ARGS PERF_RECORD_EVENTS... runs bench_llama_step BIN with --profile and ARGS
# (OMP_WAIT_POLICY=PASSIVE unless set, as bench/llama_step.sh), attaches
# `perf record` with the events given once the last warm-up step has printed
# (the GEMM-limit measurement and the first steps' page faults left out),
# stops it once the timed steps have, and waits for the bench. Leaves the
# bench's output in $out/log, the recording in $out/perf.data and the 1-min
# load average at the first timed step in $timed_load ($out: the caller's
# scratch directory; the two are read by the caller).
perf_timed_steps() {
    local bin=$1 args=$2 pid rec warm
    shift 2
    # shellcheck disable=SC2086
    OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} "$bin" --profile $args > "$out/log" 2>&1 &
    pid=$!
    warm=$(sed -n 's/.* --warmup \([0-9]*\).*/\1/p' <<< " $args ")
    until [ "$(grep -c "(warm-up)" "$out/log" 2>/dev/null)" -ge "${warm:-1}" ]; do
        kill -0 $pid 2>/dev/null || { cat "$out/log"; exit 1; }
        sleep 0.05
    done
    timed_load=$(cut -d' ' -f1 /proc/loadavg)
    perf record -q "$@" -p $pid -o "$out/perf.data" > /dev/null 2>&1 &
    rec=$!
    until grep -q "^split_ms" "$out/log" 2>/dev/null; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    kill -INT $rec
    wait $rec || true
    wait $pid
}
