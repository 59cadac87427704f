#!/bin/sh
# The CUDA calls whose answers need handling go through the backend's call
# table (src/backends/cuda/cuda_calls.h): a poll of an event or a stream
# answers cudaErrorNotReady, which some runtimes leave pending for the next
# kernel's launch check; accel__cuda_event_poll takes it off, and
# tests/test_cuda_failures.c tests that through the table's fakes. A direct
# cudaEventQuery/cudaStreamQuery anywhere else bypasses both: it fails here.
# Usage: check_cuda_calls.sh SOURCE_DIR
set -eu
src="$1/src"
# code only: lines of block comments dropped, then the comments at a line's end
out=$(grep -rnwE 'cudaEventQuery|cudaStreamQuery' "$src" |
      grep -vE '^[^:]*:[0-9]+:[[:space:]]*(/\*|\*|//)' |
      sed -e 's|/\*.*||' -e 's|//.*||' | grep -wE 'cudaEventQuery|cudaStreamQuery' |
      grep -vE '^[^:]*/backends/cuda/cuda_calls\.c:' || true)
bad=0
if [ -n "$out" ]; then
    echo "cudaEventQuery/cudaStreamQuery called outside src/backends/cuda/cuda_calls.c (poll through accel__cuda_event_poll, which clears cudaErrorNotReady):"
    echo "$out"
    bad=1
fi
# The NCCL backend's copies go through its staging (src/dist/nccl_stage.h),
# whose copies the same test checks never have a pageable side (a copy that
# has one waits for the collective inside cudaMemcpyAsync: forever when a
# peer is dead).
out=$(grep -rnE 'cudaMemcpy[A-Za-z0-9_]*' "$src/dist" | grep -vE '^[^:]*:[0-9]+:[[:space:]]*(/\*|\*|//)' |
      sed -e 's|/\*.*||' -e 's|//.*||' | grep -E 'cudaMemcpy[A-Za-z0-9_]*[[:space:]]*\(' || true)
if [ -n "$out" ]; then
    echo "src/dist calls cudaMemcpy* itself (copy through accel__nccl_put/get/copy, src/dist/nccl_stage.h):"
    echo "$out"
    bad=1
fi
[ "$bad" = 0 ] && echo "event and stream polls go through the call table (only src/backends/cuda/cuda_calls.c names" \
    "cudaEventQuery/cudaStreamQuery), src/dist's copies through the NCCL staging"
exit "$bad"
