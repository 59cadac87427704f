#!/bin/sh
# A 64 KiB tmpfs in a private mount namespace (needs root; skipped with 77
# otherwise): the nvme offload's optimizer state does not fit on it, and
# prepare says so (tests/test_accelerator_offload.c, "enospc DIR").
dir=$1
prog=$2
mkdir -p "$dir" || exit 1
unshare -m true 2>/dev/null || { echo "skipped: unshare -m needs root"; exit 77; }
exec unshare -m sh -c 'mount -t tmpfs -o size=64k accel_offload "$1" || exit 77; exec "$2" enospc "$1"' sh "$dir" "$prog"
