#!/bin/bash
# CPU time per decoded token per family, accel alone: what bench/families.sh's
# wall-clock tokens/s cannot show on a loaded box (there one run swings by 3x
# with the other engineers' load). Each family's generate runs on one thread
# with NEW and with 4 new tokens; the difference of the two processes' user +
# system CPU seconds over NEW - 4 is one decode step's CPU cost (loading and the
# prompt cancel). The checkpoints are bench/families_peer.py make's.
#
#     bash bench/families_cpu.sh [BUILD_DIR] [ROUNDS]      (defaults build, 3)
#
# Prints one markdown row per family: the median CPU ms per token and the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
NEW=${NEW:-260}
FAMILIES=${FAMILIES:-"llama mistral qwen2 qwen3 gemma gemma2 granite phi3 olmo2 gpt2"}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
if [ "$B" = build ]; then cmake --build build -j2 --target generate >/dev/null; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 bench/families_peer.py make "$T/models" > /dev/null 2>&1
cpu() { /usr/bin/time -f "%U %S" "$B/bin/generate" "$T/models/$1" --ids 1,2,3,4,5,6,7,8 --new-tokens "$2" 2>&1 >/dev/null |
          tail -1 | awk '{print $1 + $2}'; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| family | CPU ms per decoded token (median) | runs |"
echo "|---|---|---|"
for f in $FAMILIES; do
  runs=""
  for _ in $(seq "$ROUNDS"); do
    short=$(cpu "$f" 4); long=$(cpu "$f" "$NEW")
    runs="$runs $(awk -v a="$short" -v b="$long" -v n="$NEW" 'BEGIN {printf "%.2f", (b - a) / (n - 4) * 1000}')"
  done
  med=$(echo "$runs" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "| $f | $med |$runs |"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
