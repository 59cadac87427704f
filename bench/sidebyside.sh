#!/bin/bash
# accel beside llm.c and ggml on their own GPT-2 benchmarks, same weights, one run:
#
#     LLMC_TRAIN_GPT2=/path/to/llm.c/train_gpt2 GGML_GPT2=/path/to/ggml/build/bin/gpt-2-backend \
#         bash bench/sidebyside.sh [BUILD_DIR] [ROUNDS]          (defaults build, 2)
#
# Neither peer is part of accel, nor built here: build them yourself by their own instructions
# (llm.c's train_gpt2, its CPU program with OpenMP; ggml's gpt-2-backend example, the one its CI
# runs, on the CPU backend) and pass the binaries' paths. A peer whose variable is unset or not an
# executable is skipped, and its results file says so. LLMC_COMMIT / GGML_COMMIT name the
# commits built (else `git rev-parse HEAD` in the binary's checkout, else "unknown").
#
# bench_gpt2_peers export writes accel's random-init GPT-2 124M (seed 0) in each program's
# own format: llm.c's gpt2_124M.bin and token file, ggml's model file (f32 and f16), a
# save_pretrained directory for accel (bench/bench_gpt2_peers.c says what each holds).
#
# llm.c (llmc.md): train_gpt2 as it ships (B 4, T 64, AdamW lr 1e-4, betas 0.9 / 0.999,
# eps 1e-8, no weight decay, f32), run in the export directory, whose token file holds one
# batch, so every step trains on the same batch; stopped after STEPS step lines (its val
# loss forwards before step 0 are not timed: its own timer covers the step only). accel:
# bench_gpt2_peers train, the same step on the same batch through an Accelerator, f32 and
# (an extra row, another precision) bf16 mixed precision. ms/step: median of steps
# WARM..STEPS-1 of each run (the first steps allocate and fill caches on both sides), then
# the median over rounds; ratio: the median of the same-round llm.c / accel. Losses: every
# step of round 1, f32 against llm.c, must agree within LOSS_TOL (absolute), else the run fails (exit 1, files written).
#
# ggml (ggml_gpt2.md): gpt-2-backend with the prompt of P (128) ids (prompt.txt in the
# bench's vocabulary reads back as exactly those ids), one batch for the whole prompt
# (-b P), greedy (--top_k 1: its sampler keeps the argmax only), --ignore-eos, -t THREADS;
# prompt eval = its predict time with -n 1 (the prompt's one eval); decode ms/token =
# (predict time with -n NEW+1 - that) / NEW. accel: examples/generate --ids (the same ids)
# --new-tokens 1, no warm-up, as ggml's first eval is cold too: prompt_ms; then --new-tokens
# NEW+1 --warm-up --first-reps 3: the warm prompt_ms and decode tokens/s. f32 weights on both, then ggml's f16 file beside accel's --dtype bfloat16 (other
# precisions, labelled). Same tokens: ggml's printed text mapped back to ids against
# accel's generated_ids, the first differing position given.
#
# Env: THREADS (2; OMP_NUM_THREADS for all, -t for ggml), STEPS (6), WARM (2), P (128),
# NEW (32), LOSS_TOL (1e-4), OUT_DIR (bench/results; on another CPU kind
# bench/results/<kind>), OMP_WAIT_POLICY (PASSIVE). About 4 minutes at the defaults on the
# 2-vCPU box, most of it llm.c's steps.
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-2}
THREADS=${THREADS:-2}
STEPS=${STEPS:-6}
WARM=${WARM:-2}
P=${P:-128}
NEW=${NEW:-32}
LOSS_TOL=${LOSS_TOL:-1e-4}
OUT_DIR=${OUT_DIR:-bench/results}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
[ "$STEPS" -gt "$WARM" ] || { echo "sidebyside.sh: STEPS must exceed WARM" >&2; exit 2; }
if [ "$B" = build ]; then cmake --build build -j2 --target bench_gpt2_peers generate accel_cli >/dev/null; fi
BIN=$B/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. bench/common.sh # median, accel_env_lines

# peer VAR: the binary VAR names when it is an executable, else empty (and why, on stderr)
peer() {
  local v=${!1:-}
  if [ -n "$v" ] && [ -x "$v" ]; then echo "$v"; return; fi
  echo "sidebyside.sh: $1 ${v:+($v) is not an executable}${v:-is not set}: skipping that peer" >&2
}
LLMC=$(peer LLMC_TRAIN_GPT2)
GGML=$(peer GGML_GPT2)
# commit NAME BINARY: NAME_COMMIT, else the binary's checkout's HEAD, else unknown
commit() {
  local v=${1}_COMMIT
  [ -n "${!v:-}" ] && { echo "${!v}"; return; }
  git -C "$(dirname "$2")" rev-parse HEAD 2>/dev/null || echo unknown
}

D=$T/gpt2
"$BIN/bench_gpt2_peers" export "$D" --prompt "$P" >/dev/null
cat "$D"/*.bin "$D/hf/model.safetensors" >/dev/null # warm the page cache for every side
load() { cut -d' ' -f1 /proc/loadavg >> "$T/loads"; }
header() { # TITLE
  echo "# $1"
  echo
  echo "> Measured $(date -u '+%Y-%m-%d %H:%M UTC') on the shared box: load average before $LOAD0, after $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "> (1/5/15 min; 1-min load at each run's start $(sort -n "$T/loads" | head -1)-$(sort -n "$T/loads" | tail -1)). Wall-clock figures"
  echo "> swing with the load; the same-round ratios are the robust figures."
  echo
  echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1) ($(nproc) cores); $THREADS threads each (OMP_NUM_THREADS, OMP_WAIT_POLICY=$OMP_WAIT_POLICY)  "
  accel_env_lines "$BIN" "ISA|CPU kernels|GEMM f32|GEMM bf16"
  echo
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f\n", a / b}'; }
mkdir -p "$OUT_DIR"

# ---- llm.c: train_gpt2 against bench_gpt2_peers train
# steps_ms FILE: the median ms of steps WARM.. of one run's "step N: train loss L (took X ms)" lines
steps_ms() { awk -v w="$WARM" '/^step [0-9]+: train loss/ && $2 + 0 >= w {print $7}' "$1" | median '%.1f\n'; }
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$T/loads"
if [ -n "$LLMC" ]; then
  for r in $(seq "$ROUNDS"); do
    echo "== llm.c round $r/$ROUNDS" >&2
    load
    # its own program, in the export directory (it opens gpt2_124M.bin and dev/data/... there);
    # line-buffered so that the steps can be counted, stopped after STEPS of them
    (cd "$D" && exec stdbuf -oL "$LLMC") > "$T/llmc.$r" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ "$(grep -c '^step ' "$T/llmc.$r")" -lt "$STEPS" ]; do sleep 0.2; done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ "$(grep -c '^step ' "$T/llmc.$r")" -ge "$STEPS" ] || { cat "$T/llmc.$r" >&2; exit 1; }
    steps_ms "$T/llmc.$r" >> "$T/llmc.ms"
    for mp in no bf16; do
      echo "== accel $mp round $r/$ROUNDS" >&2
      load
      "$BIN/bench_gpt2_peers" train "$D" --steps "$STEPS" --threads "$THREADS" --mixed_precision "$mp" > "$T/accel_$mp.$r"
      steps_ms "$T/accel_$mp.$r" >> "$T/accel_$mp.ms"
      ratio "$(tail -1 "$T/llmc.ms")" "$(tail -1 "$T/accel_$mp.ms")" >> "$T/r_$mp"
    done
  done
  # the losses of round 1, step by step: llm.c, accel f32, accel bf16
  loss() { awk '/^step [0-9]+: train loss/ {print $5}' "$1"; }
  paste <(loss "$T/llmc.1") <(loss "$T/accel_no.1") <(loss "$T/accel_bf16.1") | head -"$STEPS" > "$T/losses"
  maxdiff=$(awk '{d = $1 - $2; d = d < 0 ? -d : d; m = d > m ? d : m} END {printf "%.2g", m}' "$T/losses")
  agree=$(awk -v m="$maxdiff" -v t="$LOSS_TOL" 'BEGIN {print (m <= t) ? "yes" : "NO"}')
fi
{
  header "GPT-2 124M training step: accel vs llm.c's train_gpt2 (CPU)"
  if [ -z "$LLMC" ]; then
    echo "Not run: LLMC_TRAIN_GPT2 was not given (the path of llm.c's train_gpt2 built by the user)."
  else
    echo "llm.c $(commit LLMC "$LLMC") (\`train_gpt2\`, its Makefile's CPU build with OpenMP), as it ships: GPT-2 124M"
    echo "(accel's random init, seed 0, written in llm.c's gpt2_124M.bin format), B 4, T 64, AdamW lr 1e-4, betas"
    echo "0.9 / 0.999, eps 1e-8, weight decay 0, f32; one batch (the token file holds B*T+1 tokens), the same every"
    echo "step. accel: \`bench_gpt2_peers train\`, the same weights, batch, loss (mean cross-entropy of the"
    echo "logits against llm.c's targets) and optimizer through an Accelerator. ms/step: the median of steps"
    echo "$WARM..$((STEPS - 1)) of each run (each side's own timer: forward, backward, update), then over $ROUNDS"
    echo "interleaved rounds (llm.c, accel f32, accel bf16); ratio: median of the same-round llm.c / accel."
    echo "Command: \`LLMC_TRAIN_GPT2=... OUT_DIR=$OUT_DIR bash bench/sidebyside.sh $B $ROUNDS\`."
    echo
    echo "| program | precision | ms/step | llm.c / accel (same round) | per round |"
    echo "|---|---|---|---|---|"
    echo "| llm.c train_gpt2 | f32 | $(median %.1f < "$T/llmc.ms") | - | $(paste -sd' ' "$T/llmc.ms") |"
    echo "| accel | f32 | $(median %.1f < "$T/accel_no.ms") | $(median %.2f < "$T/r_no")x | $(paste -sd' ' "$T/accel_no.ms") |"
    echo "| accel | bf16 mixed precision (another precision) | $(median %.1f < "$T/accel_bf16.ms") | $(median %.2f < "$T/r_bf16")x | $(paste -sd' ' "$T/accel_bf16.ms") |"
    echo
    echo "Losses of round 1 (accel f32 agrees with llm.c within $LOSS_TOL: $agree, largest difference $maxdiff;"
    echo "bf16 rounds its operands, so it follows the f32 curve only roughly):"
    echo
    echo "| step | llm.c | accel f32 | accel bf16 |"
    echo "|---|---|---|---|"
    awk '{printf "| %d | %s | %s | %s |\n", NR - 1, $1, $2, $3}' "$T/losses"
  fi
} > "$OUT_DIR/llmc.md"
cat "$OUT_DIR/llmc.md"

# ---- ggml: gpt-2-backend against examples/generate
# ggml_pred FILE: its "predict time = X ms" ; ggml_ids FILE: its printed text as ids
ggml_pred() { sed -n 's/.*predict time = *\([0-9.]*\) ms.*/\1/p' "$1"; }
ggml_ids() {
  awk '/first 8 tokens/ {on = 1; next} /load time/ {on = 0} on' "$1" | grep -o ' Q[a-z]\{4\}' |
    awk '{n = 0; for (i = 2; i <= 5; i++) n = n * 26 + index("abcdefghijklmnopqrstuvwxyz", substr($1, i, 1)) - 1
          printf "%s%d", (NR > 1 ? "," : ""), n} END {print ""}'
}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$T/loads"
if [ -n "$GGML" ]; then
  PROMPT=$(cat "$D/prompt.txt")
  gg() { "$GGML" -m "$D/ggml-model-$1.bin" -p "$PROMPT" -n "$2" -b "$P" -t "$THREADS" --top_k 1 --ignore-eos -s 1; }
  for r in $(seq "$ROUNDS"); do
    for w in f32:float32 f16:bfloat16; do
      g=${w%%:*} dt=${w#*:}
      echo "== ggml $g / accel $dt round $r/$ROUNDS" >&2
      load
      gg "$g" 1 > "$T/g1" 2>&1
      gg "$g" $((NEW + 1)) > "$T/gn.$g" 2>&1
      p1=$(ggml_pred "$T/g1") pn=$(ggml_pred "$T/gn.$g")
      echo "$p1" >> "$T/ggml_$g.prompt"
      awk -v a="$pn" -v b="$p1" -v n="$NEW" 'BEGIN {printf "%.2f\n", (a - b) / n}' >> "$T/ggml_$g.tok"
      sed -n 's/.*load time = *\([0-9.]*\) ms.*/\1/p' "$T/gn.$g" >> "$T/ggml_$g.load"
      load
      # cold: the prompt's forward first in the process, as ggml's; then warm, whose decode
      # tokens/s is right (generate takes the median prompt time out of the generation's)
      "$BIN/generate" "$D/hf" --ids "$(cat "$D/prompt_ids")" --new-tokens 1 --dtype "$dt" > "$T/a.$dt"
      sed -n 's/.*prompt_ms=\([0-9.]*\).*/\1/p' "$T/a.$dt" >> "$T/accel_$dt.prompt"
      "$BIN/generate" "$D/hf" --ids "$(cat "$D/prompt_ids")" --new-tokens $((NEW + 1)) --dtype "$dt" --warm-up \
        --first-reps 3 > "$T/a.$dt"
      sed -n 's/.*prompt_ms=\([0-9.]*\).*/\1/p' "$T/a.$dt" >> "$T/accel_$dt.warm"
      sed -n 's/.*decode_tokens_per_s=\([0-9.]*\).*/\1/p' "$T/a.$dt" | awk '{printf "%.2f\n", 1000 / $1}' >> "$T/accel_$dt.tok"
      sed -n 's/.*load_ms=\([0-9.]*\).*/\1/p' "$T/a.$dt" >> "$T/accel_$dt.load"
      ratio "$(tail -1 "$T/ggml_$g.prompt")" "$(tail -1 "$T/accel_$dt.prompt")" >> "$T/rp_$g"
      ratio "$(tail -1 "$T/ggml_$g.tok")" "$(tail -1 "$T/accel_$dt.tok")" >> "$T/rt_$g"
      ggml_ids "$T/gn.$g" | tr ',' '\n' > "$T/ids_ggml_$g"
      sed -n 's/^generated_ids=\[\(.*\)\]/\1/p' "$T/a.$dt" | tr -d ' ' | tr ',' '\n' > "$T/ids_accel_$g"
    done
  done
  # same WHICH: yes, or the first position (0-based, prompt included) where the ids differ
  same() {
    cmp -s "$T/ids_ggml_$1" "$T/ids_accel_$1" && { echo "yes ($((P + NEW + 1)) ids)"; return; }
    local at
    at=$(paste -d' ' "$T/ids_ggml_$1" "$T/ids_accel_$1" | awk '$1 != $2 {print NR - 1; exit}')
    echo "no: from position ${at:-?} (new token $(( ${at:-P} - P )))"
  }
fi
{
  header "GPT-2 124M inference: accel vs ggml's gpt-2 example (CPU)"
  if [ -z "$GGML" ]; then
    echo "Not run: GGML_GPT2 was not given (the path of ggml's gpt-2-backend built by the user)."
  else
    echo "ggml $(commit GGML "$GGML") (\`gpt-2-backend\`, CPU backend). GPT-2 124M (accel's random init, seed 0,"
    echo "written in ggml's format: f32, and f16 as its converters write it: wte and the projections in f16);"
    echo "a prompt of $P ids, one batch (-b $P), $NEW new tokens after the first, greedy (--top_k 1),"
    echo "--ignore-eos, -t $THREADS. Prompt eval: the prompt's forward, cold on both sides (ggml: its predict"
    echo "time with -n 1, its first eval; accel: examples/generate --new-tokens 1, no warm-up), and accel's warm"
    echo "(--warm-up, the median of --first-reps 3; ggml has no such mode). Decode: ms per new token after the"
    echo "first (ggml: (predict time with -n $((NEW + 1)) - predict time with -n 1) / $NEW; accel: 1000 / decode"
    echo "tokens/s of the warm run). $ROUNDS interleaved rounds, medians; ratios: median of the same-round"
    echo "ggml / accel (above 1: accel faster). Command: \`GGML_GPT2=... OUT_DIR=$OUT_DIR bash bench/sidebyside.sh $B $ROUNDS\`."
    echo
    echo "| weights (ggml / accel) | ggml prompt ms | accel prompt ms (cold; warm) | prompt ggml / accel (cold) | ggml decode ms/token | accel decode ms/token | decode ggml / accel | load ms (ggml / accel) | same tokens |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for w in f32:float32 f16:bfloat16; do
      g=${w%%:*} dt=${w#*:}
      label=$([ "$g" = f32 ] && echo "f32 / f32" || echo "f16 / bf16 (other precisions)")
      echo "| $label | $(median %.1f < "$T/ggml_$g.prompt") | $(median %.1f < "$T/accel_$dt.prompt"); $(median %.1f < "$T/accel_$dt.warm") | $(median %.2f < "$T/rp_$g")x |" \
           "$(median %.2f < "$T/ggml_$g.tok") | $(median %.2f < "$T/accel_$dt.tok") | $(median %.2f < "$T/rt_$g")x |" \
           "$(median %.0f < "$T/ggml_$g.load") / $(median %.0f < "$T/accel_$dt.load") | $(same "$g") |"
    done
  fi
} > "$OUT_DIR/ggml_gpt2.md"
cat "$OUT_DIR/ggml_gpt2.md"
# the same weights on both sides or the timings compare nothing: a loss apart fails the run
[ "${agree:-yes}" = yes ] || { echo "sidebyside.sh: accel f32's losses differ from llm.c's by $maxdiff > $LOSS_TOL" >&2; exit 1; }
