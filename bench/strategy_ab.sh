#!/usr/bin/env bash
# The strategy interface's cost: bench_ddp_step on 2 processes x 1 thread
# under DDP, ZeRO-2 and ZeRO-3 (FSDP FULL_SHARD) from two builds, interleaved
# (base, new, base, new, ... for each strategy in every round) so both see
# the same machine load. Prints each build's median step_ms_median per
# strategy and new/base.
#
#     bash bench/strategy_ab.sh BASE_BUILD NEW_BUILD [ROUNDS] [EXTRA...]
#
# EXTRA goes to every bench_ddp_step (default: a reduced Llama, --layers 2
# --hidden 256 --heads 4 --ffn 768 --vocab 4096 --batch 4 --seq 64, 6 timed
# steps after 2 warm-ups).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BASE_BUILD NEW_BUILD [ROUNDS] [EXTRA...]" >&2; exit 2; }
base=$1 new=$2 rounds=${3:-5}
shift $(( $# > 2 ? 3 : 2 ))
extra=${*:---layers 2 --hidden 256 --heads 4 --ffn 768 --vocab 4096 --batch 4 --seq 64 --steps 6 --warmup 2}
log=$(mktemp -d)
step_ms() { # build strategy-flags...
    local b=$1; shift
    # shellcheck disable=SC2086
    env -u OMP_NUM_THREADS "$b/bin/accel" launch --num_processes 2 --num_cpu_threads_per_process 1 \
        --main_process_port 0 "$@" "$b/bin/bench_ddp_step" $extra 2>&1 |
        sed -n 's/.*step_ms_median=\([0-9.]*\).*/\1/p' | head -1
}
declare -A flags=([ddp]="" [zero2]="--use_deepspeed --zero_stage 2" [zero3]="--use_fsdp --fsdp_sharding_strategy FULL_SHARD")
for r in $(seq 1 "$rounds"); do
    for s in ddp zero2 zero3; do
        for which in base new; do
            # shellcheck disable=SC2086
            v=$(step_ms "${!which}" ${flags[$s]})
            echo "$v" >> "$log/$s.$which"
        done
    done
done
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "strategy  base_ms  new_ms  new/base   (medians of $rounds interleaved rounds; load: $(cut -d' ' -f1-3 /proc/loadavg))"
for s in ddp zero2 zero3; do
    b=$(median "$log/$s.base") n=$(median "$log/$s.new")
    printf '%-8s  %7s  %6s  %s\n' "$s" "$b" "$n" "$(awk -v b="$b" -v n="$n" 'BEGIN {printf "%.3f", n / b}')"
done
rm -rf "$log"
