#!/bin/bash
# Loading a 50 MB JSON file (a DeepSpeed config holding a big weight map: what
# accel reads with accel__json_load_file, src/io/io_util.c): accel now (read in
# one go, parsed from memory), accel before (jansson's json_loadfd: one read()
# per byte), and Python's json.load as the peer, on the same file.
#
#     bash bench/json_load.sh [BUILD_DIR] [ROUNDS] [BEFORE_ROUNDS]   (defaults build, 5, 3)
#
# Env: MB (file size, default 50). Writes bench/results/json_load.md. The
# before path takes about a second per MB (minutes in all).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-5}
BEFORE=${3:-3}
MB=${MB:-50}
if [ "$B" = build ]; then cmake --build build -j2 --target bench_json_load >/dev/null; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
F=$T/ds_config.json
python3 bench/json_load_peer.py make "$F" "$MB"
BYTES=$(stat -c %s "$F")
cat "$F" >/dev/null # warm the page cache for every side
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ACCEL=$("$B/bin/bench_json_load" "$F" --rounds "$ROUNDS" --before-rounds "$BEFORE")
PEER=$(python3 bench/json_load_peer.py load "$F" "$ROUNDS")
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
# field NAME KEY: KEY's value on the line of NAME (keys are space-separated key=value pairs)
field() { awk -v n="name=$1" -v k="$2" '$1 == n { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' <<<"$ACCEL
$PEER"; }
mkdir -p bench/results
{
  echo "# Loading a ${MB} MB JSON file: accel before/after vs Python's json.load"
  echo
  echo "File: a DeepSpeed-config-like JSON of $BYTES bytes (bench/json_load_peer.py make: a"
  echo "safetensors-index-like weight map and per-layer tables of floats, indent 2), in the page cache."
  echo "Each figure is the median of its rounds (wall ms; CPU ms of the process beside it)."
  echo
  echo "| loader | rounds | median ms | CPU ms | fastest ms |"
  echo "|---|---|---|---|---|"
  echo "| accel now: accel__json_load_file (one read, json_loadb) | $ROUNDS | $(field accel__json_load_file ms) | $(field accel__json_load_file cpu_ms) | $(field accel__json_load_file min_ms) |"
  echo "| accel before: json_loadfd (one read() per byte) | $BEFORE | $(field json_loadfd_before ms) | $(field json_loadfd_before cpu_ms) | $(field json_loadfd_before min_ms) |"
  echo "| Python $(sed -n 's/.*python=\([0-9.]*\).*/\1/p' <<<"$PEER") json.load | $ROUNDS | $(field python_json_load ms) | $(field python_json_load cpu_ms) | $(field python_json_load min_ms) |"
  echo
  awk -v a="$(field accel__json_load_file cpu_ms)" -v b="$(field json_loadfd_before cpu_ms)" \
      -v p="$(field python_json_load cpu_ms)" -v aw="$(field accel__json_load_file ms)" \
      -v bw="$(field json_loadfd_before ms)" -v pw="$(field python_json_load ms)" 'BEGIN {
    printf "**Reading the file in one go: %.0fx less CPU time than before (%.0fx wall)**; accel takes %.2fx the CPU time of Python'"'"'s json.load (%.2fx wall). The CPU times are the robust figures on a shared machine: wall times wait for a core.\n", b / a, bw / aw, a / p, aw / pw }'
  echo
  echo "Machine load average (1/5/15 min) before: $LOAD_BEFORE; after: $LOAD_AFTER (2 vCPUs, shared)."
  echo
  echo "Generated $(date -u '+%Y-%m-%d %H:%M UTC') by bench/json_load.sh."
} > bench/results/json_load.md
cat bench/results/json_load.md
