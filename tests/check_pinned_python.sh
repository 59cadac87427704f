#!/bin/sh
# check_pinned_python.sh BUILD_DIR: no registered test runs a Python interpreter
# looked up on PATH at test time. A test whose Python was checked at configure
# time must run that interpreter by its absolute path (tests/bigmodel.cmake);
# tests that decide at run time (exit 77, cli_python) run no python command
# line themselves.
hits=$(find "$1" -name CTestTestfile.cmake -exec grep -HE '(^|[^/A-Za-z0-9_.-])python[0-9.]*([[:space:]"]|$)' {} +)
if [ -n "$hits" ]; then
  printf '%s\n' "$hits"
  echo "check_pinned_python.sh: these tests run python from PATH; use the interpreter configure found" >&2
  exit 1
fi
echo "no test runs python from PATH"
