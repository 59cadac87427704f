#!/bin/bash
# First-token latency and greedy decode tokens/s per architecture family:
# accel's examples/generate vs transformers' generate (bench/families_peer.py),
# the same checkpoint, prompt and thread count, runs interleaved (accel then
# transformers for each family in every round) so both sides see the same load.
#
#     bash bench/families.sh [BUILD_DIR] [ROUNDS]        (defaults build, 3)
#
# The checkpoints: bench/families_peer.py make (one per family: hidden 512,
# intermediate 1024, 4 layers, 8 heads, vocabulary 32000, transformers' random
# init, f32), written to a temporary folder, loaded in DTYPE (float32, or
# bfloat16: both sides cast the f32 file at load). Prompt 1..8, NEW new tokens
# (default 32). First token, warm on both sides: accel's is generate --warm-up's
# prompt_ms (the prompt's forward after one untimed generation of 2 new tokens),
# transformers' generate(max_new_tokens=1) after a warm-up generate of 2; each
# the median of FIRST_REPS (5) in the process, beside the process's CPU time
# over it (all threads: what the other engineers' load cannot add to) and the
# same-round ratios accel / transformers of both.
# tokens/s: new tokens after the first over their time, on both sides.
# Env: THREADS (2), NEW, DTYPE, FIRST_REPS, FAMILIES (a space-separated subset), OUT (default bench/results/families.md,
# families_bf16.md for bfloat16; bench/results/<kind>/... on another CPU kind).
# Writes medians there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
THREADS=${THREADS:-2}
NEW=${NEW:-32}
DTYPE=${DTYPE:-float32}
FIRST_REPS=${FIRST_REPS:-5}
PROMPT=1,2,3,4,5,6,7,8
FAMILIES=${FAMILIES:-"llama mistral qwen2 qwen3 gemma gemma2 gemma3_text granite phi3 olmo2 gpt2 mixtral qwen3_moe qwen2_moe"}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
if [ "$B" = build ]; then cmake --build build -j2 --target generate >/dev/null; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 bench/families_peer.py make "$T/models" > "$T/params" 2>/dev/null

. bench/common.sh  # median, machine_lines

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  for f in $FAMILIES; do
    cat "$T/models/$f/model.safetensors" > /dev/null # the page cache warm for both
    "$B/bin/generate" "$T/models/$f" --ids "$PROMPT" --new-tokens "$NEW" --dtype "$DTYPE" --warm-up \
      --first-reps "$FIRST_REPS" > "$T/out" 2>&1 || { cat "$T/out" >&2; exit 1; }
    sed -n 's/.*prompt_ms=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$f.a_first"
    sed -n 's/.*prompt_cpu_ms=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$f.a_fcpu"
    sed -n 's/.*decode_tokens_per_s=\([0-9.]*\).*/\1/p' "$T/out" >> "$T/$f.a_tps"
    sed -n 's/^generated_ids=\[\(.*\)\]/\1/p' "$T/out" | tr -d ' ' > "$T/$f.a_ids"
    python3 bench/families_peer.py decode "$T/models/$f" --ids "$PROMPT" --new-tokens "$NEW" --dtype "$DTYPE" \
      --first-reps "$FIRST_REPS" > "$T/out" 2>/dev/null || { cat "$T/out" >&2; exit 1; }
    sed -n 's/^first_token_ms=\([0-9.]*\)/\1/p' "$T/out" >> "$T/$f.p_first"
    sed -n 's/^first_token_cpu_ms=\([0-9.]*\)/\1/p' "$T/out" >> "$T/$f.p_fcpu"
    for x in first fcpu; do # this round's accel / transformers
      awk -v a="$(tail -1 "$T/$f.a_$x")" -v p="$(tail -1 "$T/$f.p_$x")" 'BEGIN {printf "%.3f\n", a / p}' >> "$T/$f.r_$x"
    done
    sed -n 's/^decode_tokens_per_s=\([0-9.]*\)/\1/p' "$T/out" >> "$T/$f.p_tps"
    sed -n 's/^generated_ids=\[\(.*\)\]/\1/p' "$T/out" | tr -d ' ' > "$T/$f.p_ids"
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

default_out=bench/results/families.md
[ "$DTYPE" = float32 ] || default_out=bench/results/families_bf16.md
out=${OUT:-$default_out}
{
  echo "# First token and greedy decode per family: accel vs transformers ($DTYPE)"
  echo
  echo "> Measured $(date -u '+%Y-%m-%d %H:%M UTC') on the shared 2-core box while other engineers were"
  echo "> building and testing: load average before $LOAD0, after $LOAD1 (1/5/15 min). Wall-clock"
  echo "> figures swing with the load; the same-round ratios are the robust figures."
  echo
  machine_lines "$B" "$THREADS"
  echo
  echo "Checkpoints: \`bench/families_peer.py make\` (hidden 512, intermediate 1024, 4 layers, 8 heads,"
  echo "vocabulary 32000, f32, transformers' random init), loaded in $DTYPE on both sides; prompt 1..8, $NEW new"
  echo "tokens, greedy, KV cache; $ROUNDS interleaved rounds, medians. First token warm on both sides: each side's"
  echo "prompt forward after one untimed generate of 2 new tokens in the same process, the median of $FIRST_REPS there,"
  echo "wall and the process's CPU time (all threads); ratios: medians of the same-round accel / transformers."
  echo "Command: \`DTYPE=$DTYPE bash bench/families.sh $B $ROUNDS\`."
  echo
  echo "| family | parameters | accel first token ms | transformers first token ms | first token accel / transformers (wall; CPU) | first token CPU ms (accel / transformers) | accel tokens/s | transformers tokens/s | accel / transformers tokens/s | same tokens |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for f in $FAMILIES; do
    af=$(median %.2f < "$T/$f.a_first"); pf=$(median %.2f < "$T/$f.p_first")
    rf="$(median %.2f < "$T/$f.r_first"); $(median %.2f < "$T/$f.r_fcpu")"
    cf="$(median %.2f < "$T/$f.a_fcpu") / $(median %.2f < "$T/$f.p_fcpu")"
    at=$(median < "$T/$f.a_tps"); pt=$(median < "$T/$f.p_tps")
    same=$(cmp -s "$T/$f.a_ids" "$T/$f.p_ids" && echo yes || echo no)
    echo "| $f | $(awk -v f="$f" '$1 == f {print $2}' "$T/params") | $af | $pf | $rf | $cf | $at | $pt | $(awk -v a="$at" -v p="$pt" 'BEGIN{printf "%.2fx", a/p}') | $same |"
  done
  echo
  echo "Per run (accel tokens/s / transformers tokens/s, in order):"
  echo
  for f in $FAMILIES; do echo "- $f: $(tr '\n' ' ' < "$T/$f.a_tps")/ $(tr '\n' ' ' < "$T/$f.p_tps")"; done
} > "$out"
cat "$out"
