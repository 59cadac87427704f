# Sourced by the bench scripts: what their reports share.

# median [FORMAT] (default %.1f) of the numbers on stdin
median() { sort -n | awk -v f="${1:-%.1f}" '{a[NR]=$1} END {if (NR % 2) printf f, a[(NR+1)/2]; else printf f, (a[NR/2]+a[NR/2+1])/2}'; }

# machine_lines BUILD_DIR THREADS [KEYS]: the report's machine lines (markdown
# line breaks): the CPU model and cores, the paths the library chose (KEYS,
# default its CPU kernels and GEMMs; a binary copied without its plug-ins
# falls back: visible here), the OpenMP wait policy in force, the peer's versions.
machine_lines() {
  echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1) ($(nproc) cores); $2 threads each"
  accel_env_lines "$1/bin" "${3:-CPU kernels|GEMM f32|GEMM bf16}"
  echo "(OMP_NUM_THREADS, OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}). torch $(python3 -c 'import torch; print(torch.__version__)'),"
  echo "transformers $(python3 -c 'import transformers; print(transformers.__version__)')."
}

# accel_env_lines BIN_DIR [KEYS]: the lines of accel env whose key matches the
# extended regex KEYS (default: CPU, ISA, the CPU kernels and GEMM paths),
# without their notes, as markdown lines.
accel_env_lines() {
  "$1/accel" env 2>/dev/null | awk -v k="^- (${2:-CPU|ISA|CPU kernels|GEMM f32|GEMM bf16}):" '$0 ~ k {
    sub(/^- /, ""); sub(/;.*/, "");              # the path, without its notes
    if (index($0, "(") && !index($0, ")")) $0 = $0 ")"
    print $0 "  " }'
}
