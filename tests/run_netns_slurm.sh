#!/bin/bash
# Two SLURM "nodes" in two network namespaces joined by a veth pair
# (10.231.0.1 and 10.231.0.2, addresses that exist only inside them):
#   1. srun without `accel launch`: each node's task forms the world from
#      SLURM_PROCID/SLURM_NTASKS/SLURM_NODEID/SLURM_TASKS_PER_NODE and finds
#      the main address in SLURM_JOB_NODELIST=10.231.0.[1-2];
#   2. `srun accel launch --num_processes 4`: each node's launcher takes
#      num_machines, machine_rank and main_process_ip from SLURM.
# Needs root and iproute2's `ip netns`; exits 77 (skipped) without them.
# Usage: run_netns_slurm.sh ACCEL_BIN WORKER
set -u
ACCEL=$1
WORKER=$2
NS0=accel_slurm0_$$
NS1=accel_slurm1_$$
skip() { echo "skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root"
command -v ip >/dev/null || skip "needs iproute2"
cleanup() { ip netns del "$NS0" 2>/dev/null; ip netns del "$NS1" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$NS0" 2>/dev/null && ip netns add "$NS1" 2>/dev/null || skip "cannot create network namespaces"
ip link add v0_$$ netns "$NS0" type veth peer name v1_$$ netns "$NS1" || skip "cannot create a veth pair"
for i in 0 1; do
  ns=accel_slurm${i}_$$
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add 10.231.0.$((i + 1))/24 dev v${i}_$$
  ip -n "$ns" link set v${i}_$$ up
done
export ACCEL_JOB_SECRET=netns-$$-$RANDOM OMP_NUM_THREADS=1 ACCEL_DIST_TIMEOUT=60
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR ACCEL_DIST_BACKEND
PORT=$((20000 + $$ % 20000))
export SLURM_JOB_NODELIST=10.231.0.[1-2]

run_pair() { # what, then the command for node $NODE (as a string evaluated in each namespace)
  local what=$1 cmd=$2 rc=0
  for node in 0 1; do
    NODE=$node ip netns exec accel_slurm${node}_$$ bash -c "$cmd" &
    pids[$node]=$!
  done
  for node in 0 1; do
    wait "${pids[$node]}" || { echo "$what: node $node failed (exit $?)" >&2; rc=1; }
  done
  return $rc
}

rc=0
run_pair "srun, no launcher" "SLURM_STEP_ID=0 SLURM_PROCID=\$NODE SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODEID=\$NODE \
  SLURM_TASKS_PER_NODE='1(x2)' MASTER_PORT=$PORT ACCEL_TEST_WORLD=2 '$WORKER'" || rc=1
run_pair "srun accel launch" "SLURM_STEP_NUM_NODES=2 SLURM_NODEID=\$NODE ACCEL_TEST_WORLD=4 \
  '$ACCEL' launch --num_processes 4 --main_process_port $((PORT + 1)) '$WORKER'" || rc=1
exit $rc
