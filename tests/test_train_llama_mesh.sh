#!/bin/sh
# examples/train_llama.c unchanged under a mesh that launch flags alone lay out
# (docs/parallelism.md "accel launch"): its final loss must be one process's.
# With tp or cp over both ranks there is one data-parallel rank, so each step
# trains on the whole batch, as one process does; had the flags laid out no
# mesh (a section without its --use_* flag is ignored, as Accelerate's
# launcher ignores it), the 2 ranks would run DDP on half batches each and
# end 0.03 away. The mesh's sums round differently: 2e-3 allowed.
# usage: test_train_llama_mesh.sh ACCEL TRAIN_LLAMA TEXT WORKDIR FLAG...
set -eu
accel=$1 train=$2 text=$3 work=$4
shift 4
rm -rf "$work" && mkdir -p "$work/one" "$work/mesh"
loss() { sed -n 's/^final_loss=\([0-9.]*\) saved llama_out\/$/\1/p'; }
one=$(cd "$work/one" && "$train" "$text" 3 2> /dev/null | loss)
mesh=$(cd "$work/mesh" && "$accel" launch --quiet --main_process_port 0 --num_processes 2 "$@" "$train" "$text" 3 \
       2> /dev/null | loss)
echo "one process: $one; 2 processes with $*: $mesh"
test -n "$one" && test -n "$mesh" || { echo "FAIL: no final_loss line"; exit 1; }
awk -v a="$one" -v b="$mesh" 'BEGIN { d = a - b; exit !(d < 2e-3 && d > -2e-3) }' ||
    { echo "FAIL: the mesh's loss is not one process's (were the flags ignored?)"; exit 1; }
echo train-llama-mesh-ok
