#!/bin/sh
# save_model out of space at many points (issue 22, item 12): for tmpfs sizes
# from 8 KiB up, in a private mount namespace (needs root; skipped with 77
# otherwise), `checkpoint_kill_points enospc` saves model 0 then model 1 into
# it; every run that runs out of space must leave model 0 whole. Passes when
# every run passed its checks and at least 5 ran out of space mid-save.
dir=$1
prog=$2
mkdir -p "$dir" || exit 1
unshare -m true 2>/dev/null || { echo "skipped: unshare -m needs root"; exit 77; }
out=$(mktemp)
for kb in $(seq 8 4 200); do
  unshare -m sh -c 'mount -t tmpfs -o size=$1k accel_enospc "$2" || exit 77; exec "$3" enospc "$2"' sh "$kb" "$dir" "$prog" >>"$out" 2>&1
  rc=$?
  [ $rc -eq 77 ] && { echo "skipped: cannot mount a tmpfs"; rm -f "$out"; exit 77; }
  [ $rc -ne 0 ] && { cat "$out"; echo "FAILED at ${kb} KiB"; rm -f "$out"; exit 1; }
done
full=$(grep -c "ran out of space, model 0 intact" "$out")
saved=$(grep -c "model 1 saved" "$out")
rm -f "$out"
echo "save_model out of space: $full runs ran out mid-save (model 0 intact), $saved saved"
[ "$full" -ge 5 ] && [ "$saved" -ge 1 ] && echo enospc-ok
