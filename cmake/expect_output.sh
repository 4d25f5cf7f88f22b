#!/usr/bin/env bash
# expect_output.sh PATTERN COMMAND [ARGS...]: runs the command, shows its output, and fails
# unless it exits 0 and its standard output matches the extended regular expression PATTERN.
# (dgc_add_output_test in cmake/DgcTesting.cmake.)
set -uo pipefail
pattern=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out"
status=$?
cat "$out"
if ((status != 0)); then
  echo "expect_output: '$*' exited $status" >&2
  exit 1
fi
if ! grep -Eq -- "$pattern" "$out"; then
  echo "expect_output: the output of '$*' does not match: $pattern" >&2
  exit 1
fi
