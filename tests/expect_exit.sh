#!/bin/sh
# expect_exit.sh RC TEXT CMD [ARGS...]: runs CMD, passes when it exits with RC
# and its output (stdout + stderr) holds TEXT. Error-path tests run through it
# with ASAN_OPTIONS=detect_leaks=1:exitcode=23: under the ASan build a leak (or
# any other sanitizer report) changes the exit status, so it fails the test
# instead of hiding behind the expected error status.
want_rc=$1
want_text=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want_rc" ]; then
  echo "expect_exit.sh: exit status $rc, expected $want_rc" >&2
  exit 1
fi
case $out in
  *"$want_text"*) ;;
  *) echo "expect_exit.sh: the output lacks: $want_text" >&2; exit 1 ;;
esac
