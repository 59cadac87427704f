#!/bin/bash
# A two-"machine" job on loopback whose machines were given different
# ACCEL_JOB_SECRETs: both launchers must fail, machine 1 because the store
# refused it, machine 0 at once naming the refused address and "wrong job
# secret" (it waited out the whole rendezvous timeout with only "rank 2 of 4
# did not arrive"). ctest's timeout is below ACCEL_DIST_TIMEOUT, so a wait
# for the timeout fails the test.
# --stall R: machine 1's rank R never reaches the store (it sleeps instead of
# running the worker), as when it starts late and its launcher kills it once
# its other rank was refused: machine 0 must still fail at once, naming the
# other rank's refusal (it used to watch only the lowest missing rank, R, and
# wait out the timeout).
# Usage: run_two_machines_wrong_secret.sh ACCEL_BIN [--stall R] WORKER [ARGS...]
set -u
ACCEL=$1
shift
STALL=
if [ "${1:-}" = --stall ]; then STALL=$2; shift 2; fi
. "$(dirname "$0")/free_port.sh"
PORT=$(free_port) || { echo "run_two_machines_wrong_secret.sh: no free port on 127.0.0.1" >&2; exit 1; }
export OMP_NUM_THREADS=1
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
for m in 0 1; do
  cmd=("$@")
  if [ "$m" = 1 ] && [ -n "$STALL" ]; then
    cmd=(bash -c 'if [ "$RANK" = "$0" ]; then exec sleep 600; fi; exec "$@"' "$STALL" "$@")
  fi
  ACCEL_JOB_SECRET=machine-$m-$$-$RANDOM "$ACCEL" launch --num_machines 2 --machine_rank $m --num_processes 4 \
    --main_process_ip 127.0.0.1 --main_process_port "$PORT" "${cmd[@]}" >"$LOG/$m" 2>&1 &
  pids[$m]=$!
done
rc=0
for m in 0 1; do
  if wait "${pids[$m]}"; then echo "machine $m succeeded with another machine's secret" >&2; rc=1; fi
done
grep -q "ACCEL_JOB_SECRET does not match" "$LOG/1" || { echo "machine 1 did not name the secret:" >&2; cat "$LOG/1" >&2; rc=1; }
grep -q "refused a process at 127.0.0.1:[0-9]* claiming rank [23]: wrong job secret" "$LOG/0" ||
  { echo "machine 0 did not report the refused attempt:" >&2; cat "$LOG/0" >&2; rc=1; }
exit $rc
