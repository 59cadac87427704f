#!/usr/bin/env bash
# tools/gpu_check.sh — the CUDA backend on a real GPU, in two halves.
#
#   tools/gpu_check.sh prepare   (here, on the build machine: no GPU needed)
#       Builds accel with CUDA into build-gpu/ (portable code: ACCEL_NATIVE=OFF,
#       since the GPU machine's CPU may differ), then gathers into
#       build-gpu/bundle/ the programs the check runs, the backend plug-ins
#       (bundle/lib/accel/libaccel-cuda.so, which holds the CUDA backend and
#       NCCL and which the programs load at run time, and libaccel-hostless.so)
#       and the shared libraries they need that a bare GPU image lacks (OpenBLAS,
#       which the programs open at run time, included) (OpenBLAS, jansson, libyaml, MPI,
#       OpenMP runtime, ...: everything ldd resolves outside the C library and
#       the NVIDIA driver/toolkit), stripped, compressed (xz -9) into
#       build-gpu/bundle.tar.xz, which with the working tree must stay under
#       64 MiB (the device tool's carry limit): prepare fails, naming the
#       sizes, when they do not.
#       Compiles with ccache when it is installed; JOBS (default 2) and XZ_THREADS
#       (default 2) bound its CPU use.
#
#   tools/gpu_check.sh run       (there, from the repository root, one command)
#       With build-gpu/bundle.tar.xz carried over (unpacked on first use; the
#       programs find its libraries, and cuBLASLt 13 / NCCL 2 in the CUDA
#       toolkit or in PyTorch's NVIDIA wheels, through LD_LIBRARY_PATH; PyTorch
#       itself runs without the bundle's): prints `accel env`, runs the GPU
#       tests (test_cuda_kernels, test_cuda_staging, test_zero3_device_memory
#       on cuda:0 with one and two ranks, test_nccl one rank and one rank per GPU),
#       test_fp8, test_fp8_amax on cuda:0 (one rank, and two ranks sharing the
#       GPU: the amax reduction), a few fp8 training steps of the bench's Llama
#       (mixed_precision='fp8', end to end), then the op tests with every
#       tensor on cuda:0 and the seed examples with ACCEL_DEFAULT_DEVICE=cuda:0
#       (four_lines, train_linear on one rank and on two sharing the GPU under
#       bf16, three train_llama steps; informative), a per-kernel profile of one
#       large-config step by Nsight Compute (summed by tools/ncu_summary.py into
#       the results), test_cuda_kernels under compute-sanitizer's memcheck (both
#       informative; the profile first, since memcheck may take all the time it
#       is given), and times them; then the benchmark: the Llama training
#       step in bf16 (the bench config and a large one: hidden 2048, 16 layers,
#       seq 1024) by accel (bench_gpu_step) and by PyTorch on the same GPU in
#       the same run (bench/gpu_step_peer.py), tokens/s and MFU against each
#       one's bf16 GEMM peak measured in its own process. Writes
#       bench/results/gpu_check-<UTC time>.md and bench/results/gpu.md (the
#       benchmark table) and, when $OUT is set (the device tool's folder that
#       comes back), copies them there with the logs packed in
#       gpu_check-logs.tar.gz, after every step. Prints the failed steps' log
#       tails, the table and the results last. Every step runs under `timeout`,
#       cut to a budget of GPU_CHECK_BUDGET seconds (450) of which the last
#       GPU_CHECK_BENCH_RESERVE (200) are the benchmark's: a hung step costs
#       its own limit, never the run. Exits 1 when a GPU test fails or times
#       out, 77 when there is no usable GPU (nothing else is run then, unless
#       GPU_CHECK_WITHOUT_GPU=1: how the script is tested on a machine without one).
#       With the device tool: timeout_s 480 (the budget, the last steps' kill
#       grace and the summary); a 15-minute lease then leaves room for a short
#       rerun of single steps, not for a second full run.
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
PROGRAMS="test_cuda_kernels test_cuda_staging test_zero3_device_memory test_nccl test_fp8 test_fp8_amax test_ops_pointwise test_ops_reduce test_ops_matmul test_ops_nn
          test_ops_loss test_ops_attention test_ops_shape test_llama_numerics accel train_linear four_lines
          train_llama bench_gpu_step"
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
    targets="$(echo $PROGRAMS | sed 's/\baccel\b/accel_cli/') accel-cuda accel-hostless"
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j"${JOBS:-2}" --target $targets || exit 1
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib/accel"
    # The plug-ins, where a program in bundle/bin looks for them (../lib/accel).
    for p in cuda hostless; do
        [ -f "$BUILD/lib/accel/libaccel-$p.so" ] || { echo "gpu_check: no $BUILD/lib/accel/libaccel-$p.so" >&2; exit 1; }
        cp "$BUILD/lib/accel/libaccel-$p.so" "$BUNDLE/lib/accel/"
        strip --strip-debug "$BUNDLE/lib/accel/libaccel-$p.so"
    done
    for p in $PROGRAMS; do
        [ -x "$BUILD/bin/$p" ] || { echo "gpu_check: $BUILD/bin/$p was not built" >&2; exit 1; }
        cp "$BUILD/bin/$p" "$BUNDLE/bin/"
        strip --strip-debug "$BUNDLE/bin/$p"
    done
    # Every library the programs load except the C library, the loader and
    # what the GPU machine's driver and toolkit provide.
    # OpenBLAS is opened at run time by its soname (src/backends/cpu/openblas_lazy.c), so
    # ldd of the programs does not name it: carried under its soname, with what it needs.
    local blas
    blas=$(readlink -f "$(sed -n 's/^OPENBLAS_LIB:FILEPATH=//p' "$BUILD/CMakeCache.txt")")
    [ -f "$blas" ] || { echo "gpu_check: OpenBLAS not found from $BUILD/CMakeCache.txt" >&2; exit 1; }
    local soname
    soname=$(objdump -p "$blas" | awk '/SONAME/ {print $2}')
    cp -L "$blas" "$BUNDLE/lib/$soname" && strip --strip-unneeded "$BUNDLE/lib/$soname"
    ldd "$BUNDLE"/bin/* "$BUNDLE"/lib/accel/*.so "$blas" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libnccl*|libnvidia*) ;;
            *) cp -L "$lib" "$BUNDLE/lib/" && strip --strip-unneeded "$BUNDLE/lib/$(basename "$lib")" ;;
        esac
    done
    # Compressed for the trip (OpenBLAS alone is ~35 MiB): carry build-gpu/bundle.tar.xz.
    tar -C "$BUILD" -cf - bundle | xz -T"${XZ_THREADS:-2}" -9 > "$BUILD/bundle.tar.xz" || exit 1
    local bytes tree
    bytes=$(stat -c %s "$BUILD/bundle.tar.xz")
    # The limit holds for everything that travels: the working tree (tracked
    # and untracked-not-ignored files) and the bundle together.
    tree=$(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
           awk '{ s += $1 } END { print s + 0 }')
    echo "gpu_check: $BUILD/bundle.tar.xz: $((bytes / 1024)) KiB ($(du -sm "$BUNDLE" | cut -f1) MiB unpacked," \
         "$(ls "$BUNDLE/lib" | wc -l) libraries) + the working tree $((tree / 1024)) KiB; the carry limit is" \
         "$((CARRY_LIMIT_BYTES / 1024)) KiB"
    if [ $((bytes + tree)) -ge "$CARRY_LIMIT_BYTES" ]; then
        echo "gpu_check: ERROR: the bundle ($bytes bytes) and the working tree ($tree bytes) are over the" \
             "device tool's carry limit of $CARRY_LIMIT_BYTES bytes (64 MiB): they cannot be carried to the GPU machine." >&2
        echo "gpu_check: the largest files in it:" >&2
        du -ab "$BUNDLE" | sort -rn | sed -n '2,9p' >&2
        exit 1
    fi
    echo "gpu_check: carry build-gpu/bundle.tar.xz, then: tools/gpu_check.sh run"
}

# The run half's time budget in seconds (the device tool stops a command at
# 10 minutes and the issue asks for 8): every step's own limit is cut to what
# is left of it, and the tests stop starting while only RESERVE seconds (kept
# for the benchmark) are left. T_START: when the script started.
BUDGET=${GPU_CHECK_BUDGET:-450}
BENCH_RESERVE=${GPU_CHECK_BENCH_RESERVE:-200}
RESERVE=0
T_START=$(date +%s)
# What LD_LIBRARY_PATH was: PyTorch's Python runs with it, not with the
# bundle's libraries (its libstdc++ and libgomp are this machine's).
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

# Seconds left of the budget beyond RESERVE.
seconds_left() { echo $((T_START + BUDGET - $(date +%s) - RESERVE)); }

# A step's limit: $1 cut to what is left (0 when under 5 s are left).
limit_of() {
    local want=$1 room
    room=$(seconds_left)
    [ "$room" -lt "$want" ] && want=$room
    [ "$want" -lt 5 ] && want=0
    echo "$want"
}

# The results (and the benchmark table, the logs packed in one file) into
# $OUT, the folder the device tool brings back (at most 8 files): after every
# step, so that a command stopped at its limit still returns what ran.
publish() {
    [ -n "${OUT:-}" ] || return 0
    cp "$RESULTS" "$OUT/" 2>/dev/null
    [ -f "$ROOT/bench/results/gpu.md" ] && [ "$ROOT/bench/results/gpu.md" -nt "$RESULTS.started" ] &&
        cp "$ROOT/bench/results/gpu.md" "$OUT/"
    tar -C "$(dirname "$LOGDIR")" -czf "$OUT/gpu_check-logs.tar.gz" "$(basename "$LOGDIR")" 2>/dev/null
    return 0
}

# step NAME LIMIT DIR COMMAND...: runs COMMAND in DIR under `timeout` (cut to
# the budget), output to $LOGDIR/NAME.log, and appends its outcome to the
# results file. Returns the command's status (125: not run, out of time).
step() {
    local name=$1 limit dir=$3 t0 t1 rc verdict
    limit=$(limit_of "$2")
    shift 3
    if [ "$limit" -eq 0 ]; then
        printf '| %s | not run (time budget of %s s spent) | 0 |\n' "$name" "$BUDGET" >> "$RESULTS"
        NOT_RUN="$NOT_RUN $name"
        publish
        return 125
    fi
    t0=$(date +%s.%N)
    (cd "$dir" && exec timeout -k 10 "$limit" "$@") > "$LOGDIR/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
        0) verdict=pass ;;
        77) verdict="skipped: $(grep -m1 '^SKIP' "$LOGDIR/$name.log" | tr '|' '/')" ;;
        124|137) verdict="TIMEOUT (${limit} s)" ;;
        *) verdict="FAIL (exit $rc)" ;;
    esac
    case $rc in 0|77) ;; *) FAILED="$FAILED $name" ;; esac
    printf '| %s | %s | %s |\n' "$name" "$verdict" "$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")" >> "$RESULTS"
    publish
    return $rc
}

# A step of the GPU suite proper: a failure or timeout fails the check
# (run's `status`); a skip or a step the budget left out does not.
gpu_step() {
    step "$@"
    case $? in 0|77|125) ;; *) status=1 ;; esac
}

# Directories of the libraries the image must provide (cuBLASLt 13, NCCL 2):
# the CUDA toolkit's, or the NVIDIA wheels beside PyTorch (nvidia/cu13/lib,
# nvidia/nccl/lib of its site-packages).
cuda_lib_dirs() {
    local d sp
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -d "$d" ] && echo "$d"
    done
    for sp in $(timeout 60 python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        for d in "$sp"/nvidia/*/lib; do
            { [ -e "$d/libcublasLt.so.13" ] || [ -e "$d/libnccl.so.2" ]; } && echo "$d"
        done
    done
}

# The end of the run: the logs of the failed steps (tails), the benchmark
# table, then the results, printed last so that the device tool's output
# tail (its last 12,000 characters) holds them if the files do not come back.
finish() {
    local name
    publish
    for name in $FAILED; do
        echo "---- $name: the end of $LOGDIR/$name.log"
        tail -15 "$LOGDIR/$name.log" | cut -c1-240
    done
    [ -f "$ROOT/bench/results/gpu.md" ] && [ "$ROOT/bench/results/gpu.md" -nt "$RESULTS.started" ] &&
        cat "$ROOT/bench/results/gpu.md"
    echo
    cat "$RESULTS"
    rm -f "$RESULTS.started"
}

run() {
    # unpacked whole or not at all: an unpack cut by its timeout is redone, not taken as done
    if [ -f "$BUILD/bundle.tar.xz" ] && [ ! -f "$BUNDLE/.unpacked" ]; then
        rm -rf "$BUNDLE"
        timeout 120 sh -c 'xz -dc "$1" | tar -C "$2" -xf -' sh "$BUILD/bundle.tar.xz" "$BUILD" &&
            touch "$BUNDLE/.unpacked"
    fi
    [ -d "$BUNDLE/bin" ] || { echo "gpu_check: no $BUNDLE (run 'tools/gpu_check.sh prepare' first)" >&2; exit 1; }
    local libs
    libs=$(cuda_lib_dirs | paste -sd: -)
    export LD_LIBRARY_PATH="$BUNDLE/lib${libs:+:$libs}${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} PYTHONUNBUFFERED=1
    local stamp
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$ROOT/bench/results"
    RESULTS=$ROOT/bench/results/gpu_check-$stamp.md
    touch "$RESULTS.started"
    # The logs stay out of $OUT (a file each would pass the tool's 8): publish packs them.
    LOGDIR=$BUILD/gpu_check-logs
    rm -rf "$LOGDIR"
    mkdir -p "$LOGDIR"
    FAILED="" NOT_RUN=""
    {
        echo "# GPU check $stamp"
        echo
        echo '```'
        timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
        timeout 30 "$BUNDLE/bin/accel" env 2>&1 | grep -E '^- (CUDA|NCCL|cuBLAS|GPU)'
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        # the programs need no CUDA library; the plug-in they load needs these
        timeout 20 ldd "$BUNDLE/lib/accel/libaccel-cuda.so" 2>&1 | grep -E 'cublasLt|nccl|not found' | tr -s ' \t' ' '
        echo '```'
        echo
        echo "Time budget: $BUDGET s ($BENCH_RESERVE s kept for the benchmark)."
        echo
        echo '| step | result | seconds |'
        echo '|---|---|---|'
    } > "$RESULTS"
    publish
    if timeout 20 ldd "$BUNDLE"/bin/* "$BUNDLE"/lib/accel/*.so 2>&1 | grep -q 'not found'; then
        { echo; echo "Missing libraries, nothing run:"
          timeout 20 ldd "$BUNDLE"/bin/* "$BUNDLE"/lib/accel/*.so 2>&1 | grep 'not found' | sort -u; } >> "$RESULTS"
        finish
        exit 1
    fi
    local status=0 T=$ROOT/tests B=$BUNDLE/bin
    RESERVE=$BENCH_RESERVE
    step cuda_kernels 240 "$T" "$B/test_cuda_kernels"
    case $? in
        0) ;;
        77) # no usable GPU: the cuda:0 runs below would fall back to the cpu and prove nothing
            # (GPU_CHECK_WITHOUT_GPU=1 runs them anyway: the script's own test on a machine without one)
            if [ -z "${GPU_CHECK_WITHOUT_GPU:-}" ]; then
                { echo; echo "No usable GPU: nothing else run."; } >> "$RESULTS"
                finish
                exit 77
            fi ;;
        *) status=1 ;;
    esac
    # The GPU tests proper first (a failure fails the check), then the op
    # tests and examples on cuda:0 (informative: they fail where a layer is
    # not on the device layer yet).
    gpu_step cuda_staging 60 "$T" "$B/test_cuda_staging"
    # ZeRO-3's device memory through the virtual memory's pool (vm.c): one rank, then two sharing the GPU (shm group)
    gpu_step zero3_memory_cuda 30 "$T" "$B/test_zero3_device_memory" cuda
    gpu_step zero3_memory_2ranks_cuda 60 "$T" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/accel" launch --main_process_port 0 \
        --num_processes 2 --use_fsdp "$B/test_zero3_device_memory" cuda
    gpu_step nccl_1rank 60 "$T" "$B/test_nccl"
    gpu_step nccl_multi 90 "$T" "$B/test_nccl" multi
    gpu_step fp8 30 "$T" "$B/test_fp8"
    # fp8's amax reduction with device metas: one rank, then two ranks on the one GPU (shm group)
    gpu_step fp8_amax_cuda 30 "$T" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/test_fp8_amax"
    gpu_step fp8_amax_2ranks_cuda 60 "$T" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/accel" launch --main_process_port 0 \
        --num_processes 2 "$B/test_fp8_amax"
    # mixed_precision='fp8' end to end: the bench's Llama trains a few steps with fp8 Linears
    gpu_step fp8_llama_steps 60 "$ROOT" "$B/bench_gpu_step" --mixed_precision fp8 --steps 3 --warmup 1 --peak-size 1024
    local t e
    for t in ops_pointwise ops_reduce ops_matmul ops_nn ops_loss ops_attention ops_shape llama_numerics; do
        step "${t}_cuda" 60 "$T" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/test_$t"
    done
    for e in four_lines train_linear; do
        step "example_${e}_cuda" 60 "$ROOT" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/$e"
    done
    # the seed's scenarios as ctest runs them on the cpu: two ranks sharing the GPU under bf16,
    # and a few Llama steps (progress bar, TensorBoard logs, the save: into build-gpu/example_run)
    mkdir -p "$BUILD/example_run"
    step example_train_linear_bf16_2_cuda 60 "$ROOT" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/accel" launch \
        --main_process_port 0 --num_processes 2 --mixed_precision bf16 "$B/train_linear"
    step example_train_llama_cuda 90 "$BUILD/example_run" env ACCEL_DEFAULT_DEVICE=cuda:0 "$B/accel" launch \
        --main_process_port 0 --num_processes 1 --mixed_precision bf16 "$B/train_llama" "$ROOT/docs/CONVENTIONS.md" 3
    # where the large config's GPU time goes, kernel by kernel (Nsight Compute: the warm-up step and
    # one timed), then the kernels under compute-sanitizer's memcheck (out-of-bounds and misaligned
    # accesses; the out-of-memory test's refused allocations are API errors, not reported). The
    # profile first: memcheck may use all it is given, and the profile's table exists only when ncu
    # finishes; memcheck cut short by the budget still lists the errors it found until then.
    # shellcheck disable=SC2086
    if step profile_large 150 "$ROOT" ncu --clock-control none --metrics gpu__time_duration.sum \
        --print-summary per-kernel --launch-count 5000 "$B/bench_gpu_step" $BENCH_LARGE --steps 1 --warmup 1 \
        --mixed_precision bf16 --peak-size 1024; then
        { echo; echo "## Where the large config's GPU time goes (ncu, warm-up + one step)"; echo
          timeout 30 env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" python3 "$ROOT/tools/ncu_summary.py" \
              "$LOGDIR/profile_large.log" 2>&1; } >> "$RESULTS.kernels"
    fi
    step memcheck_cuda_kernels 150 "$T" compute-sanitizer --tool memcheck --report-api-errors no \
        --error-exitcode 1 --print-limit 30 "$B/test_cuda_kernels"
    RESERVE=0
    bench "$B/bench_gpu_step" cuda "--steps 10 --warmup 2" "--steps 4 --warmup 1" "$ROOT/bench/results/gpu.md" \
        > "$LOGDIR/bench_table.log" 2>&1
    {
        echo
        echo "Failed:${FAILED:- none}. Not run (time budget):${NOT_RUN:- none}."
        echo "$(( $(date +%s) - T_START )) s of the $BUDGET s budget used. Logs: gpu_check-logs.tar.gz (in \$OUT)."
        echo
        [ -f "$RESULTS.kernels" ] && cat "$RESULTS.kernels" && rm -f "$RESULTS.kernels"
        echo
        echo "## cuda_kernels log (tail)"
        echo '```'
        tail -40 "$LOGDIR/cuda_kernels.log"
        echo '```'
    } >> "$RESULTS"
    finish
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

# Runs "$@" under `timeout $1` (cut to the budget), output to log $2; a
# timeout, or a run the budget left no time for, is the log's last line.
timed_log() {
    local limit log=$2 rc
    limit=$(limit_of "$1")
    shift 2
    if [ "$limit" -eq 0 ]; then
        echo "not run: the time budget of $BUDGET s is spent" > "$log"
        return
    fi
    timeout -k 10 "$limit" "$@" > "$log" 2>&1
    rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || echo "timed out after $limit s" >> "$log"
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
        timed_log "$limit" "$LOGDIR/bench_torch_$name.log" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" \
            python3 "$ROOT/bench/gpu_step_peer.py" --device "$device" \
            $cfg $steps --mixed_precision bf16 --peak-size "$peak"
        bench_row accel "$label" "$LOGDIR/bench_accel_$name.log" impl=accel >> "$out"
        bench_row "pytorch $(field peer=pytorch torch "$LOGDIR/bench_torch_$name.log")" "$label" \
            "$LOGDIR/bench_torch_$name.log" peer=pytorch >> "$out"
        [ -n "$extra" ] && break
    done
    echo >> "$out"
    echo "Logs: bench_*.log in $(basename "$LOGDIR")/ (the run packs them into gpu_check-logs.tar.gz)." >> "$out"
    cat "$out"
}

# The benchmark half on the cpu with a tiny config (no GPU): the script's logic.
dry() {
    local build=${BUILD_DIR:-$ROOT/build}
    BUDGET=${GPU_CHECK_BUDGET:-3600} # importing torch alone can take minutes on a loaded cpu
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
