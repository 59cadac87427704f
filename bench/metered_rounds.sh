# shellcheck shell=bash disable=SC2154  # r: the caller's round
# Sourced by bench/ddp.sh and bench/zero.sh: the log directory and run().
#
# LOG: LOG_DIR when set (kept, created), else a temporary directory removed
# at exit. run NAME CMD...: runs CMD through bench/metered_run.py, its output
# in $LOG/NAME.$r and "wall_s own_cpu_s machine_busy_s load1 rc" in
# $LOG/NAME.$r.meta (r: the caller's round, of $ROUNDS). Settings, set before
# sourcing: RUN_IDLE_WAIT (seconds to wait for a >= 90% idle machine before
# each run; 0, the default: none), RUN_STRICT=1 (a failed run ends the
# script; else its rc is only in the .meta and the report says so).
if [ -n "${LOG_DIR:-}" ]; then
    LOG=$LOG_DIR
    mkdir -p "$LOG"
else
    LOG=$(mktemp -d)
    trap 'rm -rf "$LOG"' EXIT
fi

run() {
    local name=$1
    shift
    echo "== round $r/$ROUNDS: $name" >&2
    python3 bench/metered_run.py "$LOG/$name.$r" "${RUN_IDLE_WAIT:-0}" "$@" && return 0
    [ "${RUN_STRICT:-0}" = 1 ] || return 0
    echo "$(basename "$0"): $* failed; log above" >&2
    exit 1
}
