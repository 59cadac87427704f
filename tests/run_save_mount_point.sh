#!/bin/sh
# save_model and save_state into a mount point, or into a directory holding
# one, fail at once naming it, writing nothing beside it (io's weight writers
# write the mount point itself in place, and refuse the other): tmpfs mounts on DIR
# and on DIR.outer/data in a private mount namespace (needs root; skipped with
# 77 otherwise), then `checkpoint_kill_points mount-point DIR DIR.outer`.
dir=$1
prog=$2
rm -rf "$dir.outer"
mkdir -p "$dir" "$dir.outer/data" || exit 1
unshare -m true 2>/dev/null || { echo "skipped: unshare -m needs root"; exit 77; }
unshare -m sh -c 'mount -t tmpfs -o size=1m accel_mount_point "$1" || exit 77
mount -t tmpfs -o size=1m accel_mount_inner "$1.outer/data" || exit 77
exec "$2" mount-point "$1" "$1.outer"' sh "$dir" "$prog"
