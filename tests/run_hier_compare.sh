#!/bin/bash
# A two-"machine" job (2 x 2 ranks on loopback, run_two_machines.sh) run
# twice: hierarchically (shm inside each machine, the default) and on the
# flat tcp ring (ACCEL_DIST_HIERARCHICAL=0). Both must pass, and every rank's
# digest of its results (test_dist_collectives: test_hierarchy) must be the
# same bits in both.
# Usage: run_hier_compare.sh ACCEL_BIN WORKER
set -u
HERE=$(dirname "$0")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
rc=0
for h in 1 0; do
  ACCEL_DIST_HIERARCHICAL=$h bash "$HERE/run_two_machines.sh" "$@" > "$OUT/$h.txt" || { echo "hierarchical=$h failed" >&2; rc=1; }
  grep '^digest rank' "$OUT/$h.txt" | sort > "$OUT/$h.digest"
  echo "hierarchical=$h:"; cat "$OUT/$h.digest"
done
[ "$(wc -l < "$OUT/1.digest")" -eq 4 ] || { echo "expected 4 digests" >&2; rc=1; }
cmp -s "$OUT/1.digest" "$OUT/0.digest" || { echo "hierarchical and flat results differ" >&2; rc=1; }
exit $rc
