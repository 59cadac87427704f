#!/bin/sh
# examples/tokenize (ctest example_tokenize; run from tests/): a corpus's
# lines to ids, with and without the special tokens, as the llama2 fixture's
# expected.json has them; its usage, an unknown option, a missing model.
t=$1
d=data/tokenizers/llama2
fail() { echo "FAIL: $*"; exit 1; }
out=$(printf 'Hello world\nHello  world\n' | "$t" "$d" 2>/dev/null) || fail "tokenize exited $?"
[ "$out" = "$(printf '1 596 290 296 296 388 800\n1 596 290 296 296 388 346 800')" ] || fail "ids: $out"
out=$(printf 'Hello world\n' | "$t" "$d" - --no-special 2>/dev/null) || fail "--no-special exited $?"
[ "$out" = "596 290 296 296 388 800" ] || fail "--no-special ids: $out"
err=$(printf 'Hello world\n' | "$t" "$d" 2>&1 >/dev/null)
case "$err" in "tokenize: 1 lines, 7 ids, "*" MB/s") ;; *) fail "summary: $err" ;; esac
"$t" --help | grep -q '^usage: tokenize MODEL_DIR' || fail "--help"
err=$("$t" "$d" --bogus 2>&1 </dev/null); rc=$?
[ $rc -eq 2 ] && echo "$err" | grep -q 'unknown option --bogus' || fail "--bogus: exit $rc: $err"
err=$("$t" /nonexistent 2>&1 </dev/null); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q '^tokenize: ' || fail "missing model: exit $rc: $err"
echo ok
