# Sourced by the bench scripts: what their reports share.

# median [FORMAT] (default %.1f) of the numbers on stdin
median() { sort -n | awk -v f="${1:-%.1f}" '{a[NR]=$1} END {if (NR % 2) printf f, a[(NR+1)/2]; else printf f, (a[NR/2]+a[NR/2+1])/2}'; }

# machine_lines BUILD_DIR THREADS: the report's machine lines (markdown line
# breaks): the CPU model and cores, the GEMM paths the library chose (a binary
# copied without its plug-ins falls back: visible here), the peer's versions.
machine_lines() {
  echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1) ($(nproc) cores); $2 threads each"
  "$1/bin/accel" env 2>/dev/null | awk '/^- (CPU kernels|GEMM f32|GEMM bf16):/ {
    sub(/^- /, ""); sub(/;.*/, "");              # the path, without its notes
    if (index($0, "(") && !index($0, ")")) $0 = $0 ")"
    print $0 "  " }'
  echo "(OMP_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE). torch $(python3 -c 'import torch; print(torch.__version__)'),"
  echo "transformers $(python3 -c 'import transformers; print(transformers.__version__)')."
}
