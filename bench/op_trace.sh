#!/usr/bin/env bash
# Where the wall time of a Llama training step goes, kernel by kernel: uprobes
# on every CPU kernel of the table (accel__cpuk_*, entry and return) and on the
# step's phases, recorded by perf over the timed steps of bench_llama_step
# (attached once its warm-up steps have printed), then summed by
# bench/op_trace.py: each kernel's wall time on the calling thread (the kernels
# called from another kernel are counted in their caller), its calls, and the
# copies (accel__cpuk_copy) split by dtypes, shape and strides, and the GEMMs
# (accel__cpuk_gemm) by shape: their GFLOP/s inside the step beside the best
# the bench measured for that shape before the model was made (its
# "gemm_shape" lines, called alone on warm operands). What the kernels
# leave of a phase is the autograd's and the ops' own time, or threads idle.
#
#     sudo bash bench/op_trace.sh [BUILD_DIR] [bench_llama_step args...]
#
# BUILD_DIR defaults to build; the args to --threads 2 --mixed_precision bf16
# --steps 3 --warmup 2. Needs root (uprobes) and perf built with them; the
# binary needs its debug info (RelWithDebInfo) for the copy's arguments. The
# probes are removed at the end. OMP_WAIT_POLICY=PASSIVE as bench/llama_step.sh.
# A uprobe costs ~1-3 us a hit (~2,000 hits a step): noise next to a step.
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
args=${*:---threads 2 --mixed_precision bf16 --steps 3 --warmup 2}
bin=$(readlink -f "$build/bin/bench_llama_step")
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'perf probe -q -d "probe_bench_llama_step:*" 2>/dev/null || true; rm -rf "$out"' EXIT
perf probe -q -d "probe_bench_llama_step:*" 2>/dev/null || true
for f in $(nm "$bin" | awk '$2 == "T" && $3 ~ /^accel__cpuk_/ {print $3}') accel_llama_loss \
    accel_accelerator_backward accel_optimizer_step accel_optimizer_zero_grad; do
    case $f in
    accel__cpuk_copy) perf probe -q -x "$bin" -a \
        "accel__cpuk_copy odt=a->out->dtype:u32 idt=a->in->dtype:u32 nd=a->out->ndim:s32 s0=a->out->shape[0]:s64 s1=a->out->shape[1]:s64" ;
        perf probe -q -x "$bin" -a "copyshape=accel__cpuk_copy s2=a->out->shape[2]:s64 s3=a->out->shape[3]:s64 contig=a->in->stride[1]:s64" ;;
    accel__cpuk_gemm) perf probe -q -x "$bin" -a \
        "accel__cpuk_gemm M=k->M:s64 N=k->N:s64 K=k->K:s64 ta=k->trans_a:u8 tb=k->trans_b:u8 dt=k->a->dtype:u32" ;;
    *) perf probe -q -x "$bin" -a "$f" ;;
    esac
    perf probe -q -x "$bin" -a "$f%return"
done
# shellcheck source=bench/perf_steps.sh
. "$here/perf_steps.sh"
perf_timed_steps "$bin" "$args" -e 'probe_bench_llama_step:*'
grep -E "^(CPU|ISA|step|split_ms)" "$out/log" || true
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
perf script -i "$out/perf.data" -F tid,time,event,trace 2> /dev/null | python3 "$here/op_trace.py" "$out/log"
