#!/bin/sh
# examples/cv_example.c end to end (docs/guide/cv.md): the small ResNet
# trained for one epoch on the generated four-pattern images under
# `accel launch --num_processes 2` (batch 32 each) and on one process (batch
# 64: the same global batch and steps), each reaching at least 70% accuracy
# on the gathered eval split (chance is 25%; 85.5% on both here), with one
# line from the main process; bf16 autocast the same; --sync_bn (the
# BatchNorms converted to SyncBatchNorm before prepare) on 2 processes the
# same, its loss not the plain run's (the statistics are the global
# batch's); bad arguments named.
# usage: test_cv_example.sh ACCEL CV_EXAMPLE
set -eu
accel=$1 example=$2

learned() { # the "epoch 0: A (...)" line, once, with A >= 70
    echo "$1" | grep "^epoch 0: " | awk '{ ok = $3 >= 70; n++ } END { exit !(n == 1 && ok) }'
}
for run in "2 no 32" "1 no 64" "2 bf16 32" "2 no 32 --sync_bn"; do
    set -- $run
    out=$("$accel" launch --quiet --main_process_port 0 --num_processes "$1" --mixed_precision "$2" "$example" \
          ${4:-} 1 3e-3 "$3")
    echo "$1 process(es), $2 ${4:-}:"; echo "$out"
    learned "$out" || { echo "FAIL: $1 process(es), mixed precision $2 ${4:-}: did not learn the task"; exit 1; }
    if [ "$run" = "2 no 32" ]; then plain=$out; fi
    if [ -n "${4:-}" ] && [ "$out" = "$plain" ]; then echo "FAIL: $4 trained as without it"; exit 1; fi
done
if err=$("$example" 0 2>&1); then echo "FAIL: EPOCHS=0 was taken"; exit 1; fi
echo "$err" | grep -q 'EPOCHS and BATCH >= 1' || { echo "FAIL: unclear error: $err"; exit 1; }
echo cv-example-ok
