#!/bin/sh
# save_model and save_state into a mount point fail at once naming it, writing
# nothing beside it: a tmpfs mounted on DIR in a private mount namespace
# (needs root; skipped with 77 otherwise), then `checkpoint_kill_points
# mount-point DIR`.
dir=$1
prog=$2
mkdir -p "$dir" || exit 1
unshare -m true 2>/dev/null || { echo "skipped: unshare -m needs root"; exit 77; }
unshare -m sh -c 'mount -t tmpfs -o size=1m accel_mount_point "$1" || exit 77; exec "$2" mount-point "$1"' sh "$dir" "$prog"
