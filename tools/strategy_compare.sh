#!/bin/sh
# tools/strategy_compare.sh: behaviour preserved between two builds of accel.
# Builds tools/strategy_trace.c against each build's shared library, runs it
# under DDP, ZeRO-1, ZeRO-2, ZeRO-3 (sharded and full state dict) and hybrid
# ZeRO-3, with and without bf16, on 1, 2 and 4 processes (or the counts in
# STRATEGY_COMPARE_NPROCS, e.g. "1 2 3 4"), and compares every
# rank's 20 losses (hex floats: bit for bit) and every file save_state and
# save_model wrote (cmp: byte for byte).
#
#   tools/strategy_compare.sh BASE_BUILD_DIR NEW_BUILD_DIR [WORKDIR]
#
# Each build dir is a CMake build of accel (lib/libaccel.so). The ranks are
# started here with the launcher's environment (RANK, WORLD_SIZE, LOCAL_*, ...).
# Every run shares one GEMM choice cache (ACCEL_GEMM_CACHE, docs/cpu.md), so
# the choices save_state records are the same measurement in both builds.
# Exit 0 when everything is identical.
set -u
[ $# -ge 2 ] || { echo "usage: $0 BASE_BUILD_DIR NEW_BUILD_DIR [WORKDIR]" >&2; exit 2; }
base=$1 new=$2 work=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work" && rm -f "$work/failed"
export ACCEL_GEMM_CACHE="$work/gemm_cache"
for b in base new; do
    eval dir=\$$b
    cc -std=c11 -O1 -I"$here/include" "$here/tools/strategy_trace.c" -o "$work/trace_$b" \
        -L"$dir/lib" -laccel -lm -Wl,-rpath,"$(cd "$dir/lib" && pwd)" || exit 2
done
# Starts n ranks of PROGRAM as `accel launch` would, lw of them a machine
# (LOCAL_WORLD_SIZE), on a free loopback port; waits for all.
run_group() { # n lw program args...
    n=$1 lw=$2; shift 2
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pids= r=0
    while [ $r -lt "$n" ]; do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % lw)) LOCAL_WORLD_SIZE=$lw MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            ACCEL_JOB_SECRET=strategy-compare timeout 300 "$@" &
        pids="$pids $!" r=$((r + 1))
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    return $rc
}
# name  env
cases='ddp ACCEL_ZERO_STAGE=0
ddp_bf16 ACCEL_ZERO_STAGE=0 ACCEL_MIXED_PRECISION=bf16
zero1 ACCEL_ZERO_STAGE=1
zero2 ACCEL_ZERO_STAGE=2
zero2_bf16 ACCEL_ZERO_STAGE=2 ACCEL_MIXED_PRECISION=bf16
zero3 ACCEL_ZERO_STAGE=3
zero3_full ACCEL_ZERO_STAGE=3 ACCEL_FSDP_STATE_DICT_TYPE=FULL_STATE_DICT
zero3_bf16 ACCEL_ZERO_STAGE=3 ACCEL_MIXED_PRECISION=bf16
hsdp ACCEL_FSDP_SHARDING_STRATEGY=HYBRID_SHARD'
echo "$cases" | while read -r name envs; do
    for n in ${STRATEGY_COMPARE_NPROCS:-1 2 4}; do
        for b in base new; do
            eval dir=\$$b
            out="$work/$b/$name-$n"
            rm -rf "$out" && mkdir -p "$out"
            # hybrid: two processes a machine on 4 (two machines), one on 2 and 3
            lw=$n
            [ "$name" = hsdp ] && lw=$(( n > 2 && n % 2 == 0 ? 2 : 1 ))
            ( export $envs; run_group "$n" "$lw" "$work/trace_$b" "$out" ) \
                > "$out.log" 2>&1 || { echo "FAIL $name n=$n: $b run failed (see $out.log)"; echo x >> "$work/failed"; }
            grep '^loss ' "$out.log" | sort > "$out.losses"
        done
        b="$work/base/$name-$n" w="$work/new/$name-$n"
        if ! cmp -s "$b.losses" "$w.losses" || [ ! -s "$b.losses" ]; then
            echo "FAIL $name n=$n: losses differ"; echo x >> "$work/failed"
        fi
        files=$(cd "$b" && find . -type f | sort)
        [ "$files" = "$(cd "$w" && find . -type f | sort)" ] || { echo "FAIL $name n=$n: file lists differ"; echo x >> "$work/failed"; }
        for f in $files; do
            cmp -s "$b/$f" "$w/$f" || { echo "FAIL $name n=$n: $f differs"; echo x >> "$work/failed"; }
        done
        echo "done $name n=$n ($(wc -l < "$w.losses") losses, $(echo "$files" | wc -w) files)"
    done
done
if [ -s "$work/failed" ]; then echo "DIFFERENCES: $(wc -l < "$work/failed")"; exit 1; fi
echo "IDENTICAL (losses and checkpoint files; work dir $work)"
