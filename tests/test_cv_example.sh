#!/bin/sh
# examples/cv_example.c end to end (docs/guide/cv.md): the small ResNet
# trained for one epoch on the generated four-pattern images under
# `accel launch --num_processes 2` (batch 32 each) and on one process (batch
# 64: the same global batch and steps), each reaching at least 70% accuracy
# on the gathered eval split (chance is 25%; 85.5% on both here), with one
# line from the main process; bf16 autocast the same; bad arguments named.
# usage: test_cv_example.sh ACCEL CV_EXAMPLE
set -eu
accel=$1 example=$2

learned() { # the "epoch 0: A (...)" line, once, with A >= 70
    echo "$1" | grep "^epoch 0: " | awk '{ ok = $3 >= 70; n++ } END { exit !(n == 1 && ok) }'
}
for run in "2 no 32" "1 no 64" "2 bf16 32"; do
    set -- $run
    out=$("$accel" launch --quiet --main_process_port 0 --num_processes "$1" --mixed_precision "$2" "$example" 1 3e-3 "$3")
    echo "$1 process(es), $2:"; echo "$out"
    learned "$out" || { echo "FAIL: $1 process(es), mixed precision $2: did not learn the task"; exit 1; }
done
if err=$("$example" 0 2>&1); then echo "FAIL: EPOCHS=0 was taken"; exit 1; fi
echo "$err" | grep -q 'EPOCHS and BATCH >= 1' || { echo "FAIL: unclear error: $err"; exit 1; }
echo cv-example-ok
