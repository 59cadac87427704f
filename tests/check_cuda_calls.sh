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
if [ -n "$out" ]; then
    echo "cudaEventQuery/cudaStreamQuery called outside src/backends/cuda/cuda_calls.c (poll through accel__cuda_event_poll, which clears cudaErrorNotReady):"
    echo "$out"
    exit 1
fi
echo "event and stream polls go through the call table: only src/backends/cuda/cuda_calls.c names cudaEventQuery/cudaStreamQuery"
