#!/bin/bash
# The rendezvous' cost: `accel launch --num_processes 2` of /bin/true (the
# launcher alone) and of bench_rendezvous (accel_dist_init + finalize) over
# shm (the default on one machine) and tcp, RUNS times each, in turns so the
# shared machine's load drifts over all alike. Prints the medians: the launch
# wall time of each, and rank 0's init/finalize times; the load beside them.
# Usage: bash bench/rendezvous.sh [BUILD_DIR] [RUNS]
set -u
B=${1:-build}
RUNS=${2:-41}
export OMP_NUM_THREADS=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$RUNS"); do
  for form in true shm tcp; do
    case $form in
      true) s=$(date +%s%N); "$B/bin/accel" launch --num_processes 2 /bin/true; e=$(date +%s%N) ;;
      shm) s=$(date +%s%N); "$B/bin/accel" launch --num_processes 2 "$B/bin/bench_rendezvous" >>"$T/shm.out"; e=$(date +%s%N) ;;
      tcp) s=$(date +%s%N); ACCEL_DIST_BACKEND=tcp "$B/bin/accel" launch --num_processes 2 "$B/bin/bench_rendezvous" \
             >>"$T/tcp.out"; e=$(date +%s%N) ;;
    esac
    echo "$(( (e - s) / 1000 ))" >>"$T/$form.wall"
  done
done
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for form in true shm tcp; do
  line="$form: launch_wall_ms=$(median <"$T/$form.wall" | awk '{printf "%.1f", $1/1000}')"
  if [ -f "$T/$form.out" ]; then
    line="$line init_ms=$(sed -n 's/.*init_ms=\([0-9.]*\).*/\1/p' "$T/$form.out" | median)"
    line="$line finalize_ms=$(sed -n 's/.*finalize_ms=\([0-9.]*\).*/\1/p' "$T/$form.out" | median)"
  fi
  echo "$line (median of $RUNS)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
