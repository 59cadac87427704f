#!/bin/sh
# examples/nlp_example.c end to end (docs/guide/nlp.md): the tiny BERT of
# tests/data/hf_bert_nlp trained on the generated paraphrase task on 1 process
# (batch 16) and under `accel launch --num_processes 2` (batch 8 each: the same
# global batch and steps), each reaching at least 70% accuracy and F1 on the
# gathered eval split after 3 epochs (chance is 50%; the part of the task that
# sentence B alone tells gives 77%, the rest 100%: seed 42 learns both here,
# other seeds may learn less, docs/guide/nlp.md); the tiny RoBERTa of
# tests/data/hf_roberta_nlp (no token types, pad_token_id 1) on 1 process, the
# same; a config whose vocabulary is smaller than the tokenizer's, and a
# missing model directory, are named once.
# usage: test_nlp_example.sh ACCEL NLP_EXAMPLE DATA_DIR
set -eu
accel=$1 example=$2 data=$3
tok=$data/tokenizers/bert/tokenizer.json

learned() { # the last "epoch N: {'accuracy': A, 'f1': F}" line has A and F >= 0.7
    echo "$1" | grep "^epoch 2: {'accuracy': " | tr -d "{},'" | awk '{ ok = $4 >= 0.7 && $6 >= 0.7; n++ } END { exit !(n == 1 && ok) }'
}
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 1 "$example" "$tok" "$data/hf_bert_nlp" 3 3e-3 16)
echo "1 process:"; echo "$out"
learned "$out" || { echo "FAIL: 1 process did not learn the task"; exit 1; }
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 2 "$example" "$tok" "$data/hf_bert_nlp" 3 3e-3 8)
echo "2 processes:"; echo "$out"
test "$(echo "$out" | grep -c '^epoch ')" = 3 || { echo "FAIL: not one line per epoch from the main process"; exit 1; }
learned "$out" || { echo "FAIL: 2 processes did not learn the task"; exit 1; }
# a RoBERTa of one token type (tests/data/hf_roberta_nlp, type_vocab_size 1, pad_token_id 1) on 1 process
out=$("$accel" launch --quiet --main_process_port 0 --num_processes 1 "$example" "$tok" "$data/hf_roberta_nlp" 3 3e-3 16)
echo "RoBERTa, 1 process:"; echo "$out"
learned "$out" || { echo "FAIL: the RoBERTa did not learn the task"; exit 1; }
if err=$("$example" "$tok" "$data/hf_bert_cls" 2>&1); then echo "FAIL: a 64-word model took a 1200-id tokenizer"; exit 1; fi
test "$(echo "$err" | grep -c 'vocab_size 64 is smaller than the tokenizer')" = 1 || { echo "FAIL: not said once: $err"; exit 1; }
if err=$("$example" "$tok" "$data/no_such_model" 2>&1); then echo "FAIL: a missing model directory was taken"; exit 1; fi
test "$(echo "$err" | grep -c 'no_such_model')" = 1 || { echo "FAIL: not said once: $err"; exit 1; }
echo nlp-example-ok
