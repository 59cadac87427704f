#!/bin/bash
# A two-"machine" job on loopback: two launchers, --machine_rank 0 and 1, 2
# workers each (TWO_MACHINES_PROCESSES: the job's processes, default 4),
# started concurrently like on two hosts. Both must succeed.
# Usage: run_two_machines.sh ACCEL_BIN WORKER [ARGS...]
# The two launchers share ACCEL_JOB_SECRET (each machine of a real job must
# be given the same one; the launcher cannot invent a shared random one).
set -u
ACCEL=$1
shift
. "$(dirname "$0")/free_port.sh"
PORT=$(free_port) || { echo "run_two_machines.sh: no free port on 127.0.0.1" >&2; exit 1; }
export ACCEL_JOB_SECRET=two-machines-$$-$RANDOM
export OMP_NUM_THREADS=1
for m in 0 1; do
  "$ACCEL" launch --num_machines 2 --machine_rank $m --num_processes "${TWO_MACHINES_PROCESSES:-4}" \
    --main_process_ip 127.0.0.1 --main_process_port "$PORT" "$@" &
  pids[$m]=$!
done
rc=0
for m in 0 1; do
  wait "${pids[$m]}" || { echo "machine $m failed (exit $?)" >&2; rc=1; }
done
exit $rc
