#!/bin/bash
# A two-"machine" job on loopback whose rank 2 (on machine 1) is given
# ACCEL_MIXED_PRECISION=fp32: its accel_accelerator_new refuses it before the
# rendezvous. Both launchers must fail, machine 0's workers at once naming
# rank 2 and its message (they waited out the rendezvous timeout, 300 s, or
# named rank 3, which machine 1's launcher stopped, as gone). ctest's timeout
# is below ACCEL_DIST_TIMEOUT, so a wait for the timeout fails the test.
# Usage: run_two_machines_failed_early.sh ACCEL_BIN WORKER [ARGS...]
set -u
ACCEL=$1
shift
. "$(dirname "$0")/free_port.sh"
PORT=$(free_port) || { echo "run_two_machines_failed_early.sh: no free port on 127.0.0.1" >&2; exit 1; }
export OMP_NUM_THREADS=1 ACCEL_JOB_SECRET=two-machines-$$-$RANDOM
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
for m in 0 1; do
  cmd=("$@")
  if [ "$m" = 1 ]; then
    cmd=(bash -c 'if [ "$RANK" = 2 ]; then export ACCEL_MIXED_PRECISION=fp32; fi; exec "$@"' _ "$@")
  fi
  "$ACCEL" launch --num_machines 2 --machine_rank $m --num_processes 4 \
    --main_process_ip 127.0.0.1 --main_process_port "$PORT" "${cmd[@]}" >"$LOG/$m" 2>&1 &
  pids[$m]=$!
done
rc=0
for m in 0 1; do
  if wait "${pids[$m]}"; then echo "machine $m succeeded though rank 2 was refused" >&2; rc=1; fi
done
want="rendezvous failed: rank 2 failed before the rendezvous: accel_accelerator_new: ACCEL_MIXED_PRECISION: Unknown mixed_precision mode: fp32"
grep -qF "$want" "$LOG/0" || { echo "machine 0 did not name rank 2's refusal:" >&2; cat "$LOG/0" >&2; rc=1; }
exit $rc
