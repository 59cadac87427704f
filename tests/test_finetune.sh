#!/bin/sh
# The fine-tune guide's example end to end (docs/guide/finetune.md): a tiny
# Hugging Face directory (save_model's), a corpus of ids, 2-process DDP,
# FSDP FULL_SHARD bf16 and tensor-parallel (tp 2) fine-tunes whose loss falls,
# the saved directory loads for generation, and a corpus holding an id outside
# the vocabulary is named.
# usage: test_finetune.sh ACCEL FINETUNE SAVE_MODEL GENERATE WORKDIR
set -eu
accel=$1 finetune=$2 save_model=$3 generate=$4 work=$5
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$accel" launch --quiet --main_process_port 0 --num_processes 1 "$save_model" base > /dev/null 2>&1
awk 'BEGIN { for (i = 0; i < 2000; i++) printf "%d%s", (i * 7 + 3) % 64, (i % 20 == 19) ? "\n" : " " }' > ids.txt

falls() { # "first_loss=A final_loss=B saved DIR" with B < A / 1.5
    echo "$1" | awk '{ split($1, a, "="); split($2, b, "="); exit !(b[2] < a[2] / 1.5) }'
}
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 2 "$finetune" base/safetensors ids.txt ddp 20 1e-2)
echo "ddp: $out"
falls "$out" || { echo "FAIL: the DDP loss did not fall"; exit 1; }
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD \
      --mixed_precision bf16 "$finetune" base/safetensors ids.txt fsdp 20 1e-2)
echo "fsdp: $out"
falls "$out" || { echo "FAIL: the FSDP loss did not fall"; exit 1; }
# tensor parallelism over both ranks: the loaded checkpoint sliced at prepare
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 2 --use_parallelism_config \
      --parallelism_config_tp_size 2 "$finetune" base/safetensors ids.txt tp 20 1e-2)
echo "tp: $out"
falls "$out" || { echo "FAIL: the tensor-parallel loss did not fall"; exit 1; }
test -f ddp/config.json && test -f ddp/model.safetensors && test -f fsdp/config.json && test -f tp/config.json
# The fine-tuned model learned the corpus' rule (each id is the last + 7, mod 64).
"$generate" ddp --ids 3,10,17 --new-tokens 4 | grep -q 'generated_ids=\[3, 10, 17, 24, 31, 38, 45\]' \
    || { echo "FAIL: the fine-tuned model does not continue the pattern"; exit 1; }
echo "3 9 70 1" > bad.txt
if err=$("$finetune" base/safetensors bad.txt never 2>&1); then echo "FAIL: an id past the vocabulary was taken"; exit 1; fi
echo "$err" | grep -q 'bad.txt: token 3 is "70", not an id in \[0, 64)' || { echo "FAIL: unclear error: $err"; exit 1; }
test "$(echo "$err" | grep -c '^finetune:')" = 1 || { echo "FAIL: not said once: $err"; exit 1; }
if err=$("$finetune" base/safetensors no_such_ids.txt never 2>&1); then echo "FAIL: a missing corpus was taken"; exit 1; fi
test "$err" = "finetune: cannot open no_such_ids.txt: No such file or directory" || { echo "FAIL: unclear error: $err"; exit 1; }
test ! -e never
echo finetune-ok
