#!/usr/bin/env bash
# tools/gpu_check.sh — the CUDA backend on a real GPU, in two halves.
#
#   tools/gpu_check.sh prepare   (here, on the build machine: no GPU needed)
#       Builds accel with CUDA into build-gpu/ (portable code: ACCEL_NATIVE=OFF,
#       since the GPU machine's CPU may differ), then gathers into
#       build-gpu/bundle/ the programs the check runs and the shared libraries
#       they need that a bare GPU image lacks (OpenBLAS, jansson, libyaml, MPI,
#       OpenMP runtime, ...: everything ldd resolves outside the C library and
#       the NVIDIA driver/toolkit), stripped, compressed (xz -9) into
#       build-gpu/bundle.tar.xz, which must stay under 64 MiB (the device
#       tool's carry limit): prepare fails, naming the sizes, when it does not.
#       Compiles with ccache when it is installed; JOBS (default 2) and XZ_THREADS
#       (default 2) bound its CPU use.
#
#   tools/gpu_check.sh run       (there, from the repository root, one command)
#       With build-gpu/bundle.tar.xz carried over (unpacked on first use): prints `accel env`, runs the GPU
#       tests (ctest label gpu: test_cuda_kernels, test_cuda_staging, test_nccl one rank and one
#       rank per GPU), test_fp8, test_fp8_amax on cuda:0 (one rank, and two
#       ranks sharing the GPU: the amax reduction), a few fp8 training steps of the bench's Llama
#       (mixed_precision='fp8', end to end), the op tests with every tensor on cuda:0, the
#       seed examples with ACCEL_DEFAULT_DEVICE=cuda:0, and times them; then
#       the benchmark: the Llama training step in bf16 (the bench config and a
#       large one: hidden 2048, 16 layers, seq 1024) by accel (bench_gpu_step)
#       and by PyTorch on the same GPU in the same run (bench/gpu_step_peer.py),
#       tokens/s and MFU against each one's bf16 GEMM peak measured in its own
#       process. Writes bench/results/gpu_check-<UTC time>.md and
#       bench/results/gpu.md (the benchmark table). Exits non-zero when a GPU
#       test fails. Keeps to about 8 minutes (each step has its time limit).
#
#   tools/gpu_check.sh dry       (here: no GPU needed)
#       The benchmark half on the cpu with a tiny config, from build/ (or
#       BUILD_DIR): runs bench_gpu_step and the PyTorch peer with --device cpu,
#       and writes the table to ${OUT:-/tmp}/gpu-dry.md, so the script's
#       parsing and table are tested without a GPU.
#
# The GPU machine must have the NVIDIA driver (for CUDA 13 binaries: >= 580)
# and cuBLASLt 13 (libcublasLt.so.13, ~500 MB, too big to carry): the check
# says so and stops when they are missing.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-gpu
BUNDLE=$BUILD/bundle
PROGRAMS="test_cuda_kernels test_cuda_staging test_nccl test_fp8 test_fp8_amax test_ops_pointwise test_ops_reduce test_ops_matmul test_ops_nn
          test_ops_loss test_ops_attention test_ops_shape test_llama_numerics accel train_linear four_lines
          bench_gpu_step"
# The benchmark's two configs: the bench config (bench_util.h's defaults) and
# a large one that fills more of the GPU.
BENCH_SMALL=""
BENCH_LARGE="--hidden 2048 --layers 16 --heads 16 --ffn 5632 --vocab 32000 --seq 1024 --batch 8"
# What the device tool carries at the most (all carried paths together).
CARRY_LIMIT_BYTES=$((64 * 1024 * 1024))

prepare() {
    local launcher=()
    command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DACCEL_NATIVE=OFF -DACCEL_CUDA=ON "${launcher[@]}" || exit 1
    local targets
    targets=$(echo $PROGRAMS | sed 's/\baccel\b/accel_cli/')
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j"${JOBS:-2}" --target $targets || exit 1
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
    for p in $PROGRAMS; do
        [ -x "$BUILD/bin/$p" ] || { echo "gpu_check: $BUILD/bin/$p was not built" >&2; exit 1; }
        cp "$BUILD/bin/$p" "$BUNDLE/bin/"
        strip --strip-debug "$BUNDLE/bin/$p"
    done
    # Every library the programs load except the C library, the loader and
    # what the GPU machine's driver and toolkit provide.
    ldd "$BUNDLE"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libnccl*|libnvidia*) ;;
            *) cp -L "$lib" "$BUNDLE/lib/" && strip --strip-unneeded "$BUNDLE/lib/$(basename "$lib")" ;;
        esac
    done
    # Compressed for the trip (OpenBLAS alone is ~35 MiB): carry build-gpu/bundle.tar.xz.
    tar -C "$BUILD" -cf - bundle | xz -T"${XZ_THREADS:-2}" -9 > "$BUILD/bundle.tar.xz" || exit 1
    local bytes
    bytes=$(stat -c %s "$BUILD/bundle.tar.xz")
    echo "gpu_check: $BUILD/bundle.tar.xz: $((bytes / 1024)) KiB ($(du -sm "$BUNDLE" | cut -f1) MiB unpacked," \
         "$(ls "$BUNDLE/lib" | wc -l) libraries; the carry limit is $((CARRY_LIMIT_BYTES / 1024)) KiB)"
    if [ "$bytes" -ge "$CARRY_LIMIT_BYTES" ]; then
        echo "gpu_check: ERROR: the bundle is $bytes bytes, over the device tool's carry limit of" \
             "$CARRY_LIMIT_BYTES bytes (64 MiB): it cannot be carried to the GPU machine." >&2
        echo "gpu_check: the largest files in it:" >&2
        du -ab "$BUNDLE" | sort -rn | sed -n '2,9p' >&2
        exit 1
    fi
    echo "gpu_check: carry build-gpu/bundle.tar.xz, then: tools/gpu_check.sh run"
}

# Runs "$@" with a time limit, appending its outcome to the results file.
step() {
    local name=$1 limit=$2
    shift 2
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout "$limit" "$@" > "$LOGDIR/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    local verdict=pass
    [ $rc -eq 77 ] && verdict=skipped
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && verdict="FAIL (exit $rc)"
    [ $rc -eq 124 ] && verdict="TIMEOUT (${limit} s)"
    printf '| %s | %s | %s |\n' "$name" "$verdict" "$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")" >> "$RESULTS"
    return $rc
}

run() {
    [ -d "$BUNDLE/bin" ] || [ ! -f "$BUILD/bundle.tar.xz" ] || xz -dc "$BUILD/bundle.tar.xz" | tar -C "$BUILD" -xf -
    [ -d "$BUNDLE/bin" ] || { echo "gpu_check: no $BUNDLE (run 'tools/gpu_check.sh prepare' first)" >&2; exit 1; }
    export LD_LIBRARY_PATH="$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
    local stamp
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$ROOT/bench/results"
    RESULTS=$ROOT/bench/results/gpu_check-$stamp.md
    LOGDIR=${OUT:-$BUILD}/gpu_check-logs
    mkdir -p "$LOGDIR"
    {
        echo "# GPU check $stamp"
        echo
        echo '```'
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
        "$BUNDLE/bin/accel" env 2>&1 | grep -E '^- (CUDA|NCCL|cuBLAS|GPU)'
        echo '```'
        echo
        echo '| step | result | seconds |'
        echo '|---|---|---|'
    } > "$RESULTS"
    if ldd "$BUNDLE/bin/test_cuda_kernels" | grep -q 'not found'; then
        echo "missing libraries: $(ldd "$BUNDLE/bin/test_cuda_kernels" | grep 'not found' | tr -s ' \t' ' ')" >> "$RESULTS"
        cat "$RESULTS"
        exit 1
    fi
    local status=0
    (cd "$ROOT/tests" && step cuda_kernels 240 "$BUNDLE/bin/test_cuda_kernels")
    case $? in
        0) ;;
        77) # no usable GPU: the cuda:0 runs below would fall back to the cpu and prove nothing
            { echo; grep SKIP "$LOGDIR/cuda_kernels.log"; } >> "$RESULTS"
            cat "$RESULTS"
            exit 1 ;;
        *) status=1 ;;
    esac
    for t in ops_pointwise ops_reduce ops_matmul ops_nn ops_loss ops_attention ops_shape llama_numerics; do
        (cd "$ROOT/tests" && ACCEL_DEFAULT_DEVICE=cuda:0 step "${t}_cuda" 60 "$BUNDLE/bin/test_$t")
    done
    for e in four_lines train_linear; do
        (cd "$ROOT" && ACCEL_DEFAULT_DEVICE=cuda:0 step "example_${e}_cuda" 60 "$BUNDLE/bin/$e")
    done
    (cd "$ROOT/tests" && step cuda_staging 60 "$BUNDLE/bin/test_cuda_staging") || status=1
    (cd "$ROOT/tests" && step nccl_1rank 60 "$BUNDLE/bin/test_nccl") || [ $? -eq 77 ] || status=1
    (cd "$ROOT/tests" && step nccl_multi 90 "$BUNDLE/bin/test_nccl" multi) || [ $? -eq 77 ] || status=1
    (cd "$ROOT/tests" && step fp8 30 "$BUNDLE/bin/test_fp8") || status=1
    # fp8's amax reduction with device metas: one rank, then two ranks on the one GPU (shm group)
    (cd "$ROOT/tests" && ACCEL_DEFAULT_DEVICE=cuda:0 step fp8_amax_cuda 30 "$BUNDLE/bin/test_fp8_amax") || status=1
    (cd "$ROOT/tests" && ACCEL_DEFAULT_DEVICE=cuda:0 step fp8_amax_2ranks_cuda 60 "$BUNDLE/bin/accel" launch \
        --main_process_port 0 --num_processes 2 "$BUNDLE/bin/test_fp8_amax") || status=1
    # mixed_precision='fp8' end to end: the bench's Llama trains a few steps with fp8 Linears
    step fp8_llama_steps 60 "$BUNDLE/bin/bench_gpu_step" --mixed_precision fp8 --steps 3 --warmup 1 --peak-size 1024 ||
        status=1
    bench "$BUNDLE/bin/bench_gpu_step" cuda "--steps 10 --warmup 2" "--steps 4 --warmup 1" \
        "$ROOT/bench/results/gpu.md"
    {
        echo
        echo "Logs: $LOGDIR. The op tests and examples on cuda:0 fail where a layer is not on the device layer"
        echo "yet (docs/architecture.md) or a kernel is missing (their logs name it)."
        echo
        echo "## cuda_kernels log (tail)"
        echo '```'
        tail -40 "$LOGDIR/cuda_kernels.log"
        echo '```'
    } >> "$RESULTS"
    [ -n "${OUT:-}" ] && cp "$RESULTS" "$ROOT/bench/results/gpu.md" "$OUT/"
    cat "$RESULTS"
    exit $status
}

# key=value of the summary line that starts with $1 in log $2.
field() { grep "^$1" "$3" | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# One benchmark row: impl, config, then the summary line's numbers (or the failure).
bench_row() {
    local who=$1 cfg=$2 log=$3 prefix=$4
    if grep -q "^$prefix" "$log"; then
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$who" "$cfg" "$(field "$prefix" tokens_per_s "$log")" \
            "$(field "$prefix" step_ms_median "$log")" "$(field "$prefix" achieved_tflops "$log")" \
            "$(field "$prefix" gemm_peak_tflops "$log")" "$(field "$prefix" mfu "$log")"
    else
        printf '| %s | %s | failed: %s | | | | |\n' "$who" "$cfg" "$(tail -1 "$log" | tr '|' '/')"
    fi
}

# Runs "$@" under `timeout $1`, output to log $2; a timeout is the log's last line.
timed_log() {
    local limit=$1 log=$2
    shift 2
    timeout "$limit" "$@" > "$log" 2>&1
    [ $? -ne 124 ] || echo "timed out after $limit s" >> "$log"
}

# bench BIN DEVICE SMALL_STEPS LARGE_STEPS OUTFILE [EXTRA for both configs]:
# accel and PyTorch, alternating, on each config; the table goes to OUTFILE.
# BENCH_LIMIT: seconds per run (90 on the GPU; the dry run on a loaded cpu
# needs more: importing torch alone can take minutes there).
bench() {
    local bin=$1 device=$2 small_steps=$3 large_steps=$4 out=$5 extra=${6:-} peak=${PEAK_SIZE:-8192}
    local limit=${BENCH_LIMIT:-90}
    {
        echo "# Llama training step, bf16, accel vs PyTorch on $device ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo "tools/gpu_check.sh; MFU against each process's own bf16 GEMM peak (${peak}^3: the backend table's gemm (cuBLASLt on cuda)"
        echo "for accel, torch.matmul for PyTorch); FLOPs as bench_llama_step counts them."
        echo
        echo '| impl | config | tokens/s | step ms (median) | achieved TFLOP/s | GEMM peak TFLOP/s | MFU |'
        echo '|---|---|---|---|---|---|---|'
    } > "$out"
    local name cfg steps
    for name in small large; do
        if [ $name = small ]; then cfg=$BENCH_SMALL steps=$small_steps; else cfg=$BENCH_LARGE steps=$large_steps; fi
        [ -n "$extra" ] && cfg=$extra
        local label=${cfg:-bench config (hidden 512, 8 layers, seq 256, batch 8)}
        # shellcheck disable=SC2086
        timed_log "$limit" "$LOGDIR/bench_accel_$name.log" "$bin" $cfg $steps --mixed_precision bf16 --peak-size "$peak"
        # shellcheck disable=SC2086
        timed_log "$limit" "$LOGDIR/bench_torch_$name.log" python3 "$ROOT/bench/gpu_step_peer.py" --device "$device" \
            $cfg $steps --mixed_precision bf16 --peak-size "$peak"
        bench_row accel "$label" "$LOGDIR/bench_accel_$name.log" impl=accel >> "$out"
        bench_row "pytorch $(field peer=pytorch torch "$LOGDIR/bench_torch_$name.log")" "$label" \
            "$LOGDIR/bench_torch_$name.log" peer=pytorch >> "$out"
        [ -n "$extra" ] && break
    done
    echo >> "$out"
    echo "Logs: $LOGDIR/bench_*.log" >> "$out"
    cat "$out"
}

# The benchmark half on the cpu with a tiny config (no GPU): the script's logic.
dry() {
    local build=${BUILD_DIR:-$ROOT/build}
    cmake --build "$build" -j2 --target bench_gpu_step > /dev/null || exit 1
    LOGDIR=${OUT:-/tmp}/gpu_check-dry-logs
    mkdir -p "$LOGDIR"
    PEAK_SIZE=128 BENCH_LIMIT=${BENCH_LIMIT:-600} bench "$build/bin/bench_gpu_step" cpu "--steps 2 --warmup 1" "" "${OUT:-/tmp}/gpu-dry.md" \
        "--hidden 64 --layers 1 --heads 2 --ffn 128 --vocab 256 --seq 16 --batch 2"
    ! grep -q failed "${OUT:-/tmp}/gpu-dry.md"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    dry) dry ;;
    *) echo "usage: tools/gpu_check.sh prepare|run|dry" >&2; exit 2 ;;
esac
