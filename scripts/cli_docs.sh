#!/usr/bin/env bash
# Writes docs/cli.md from the dgc program's own help: `dgc --help`, then `dgc <subcommand> --help`
# for every subcommand it lists (and theirs, such as `dgc bench exchange`), each in a fenced
# block under a heading. The help is printed as the program `dgc`, whatever its path.
#
#   scripts/cli_docs.sh [--check] [DGC]
#
# DGC is the program (default: build/bin/dgc, a build with libtorch, the communication layer and
# the benchmarks: the whole program). --check writes nothing: it exits 1, with the difference,
# when docs/cli.md is not what this script would write now (the `docs.cli` test runs it so).
set -euo pipefail

check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
dgc=${1:-}
if [ -n "$dgc" ] && [[ $dgc != /* ]]; then
  dgc=$PWD/$dgc  # as given, from where the script was started
fi
cd "$(dirname "$0")/.."
dgc=${dgc:-$PWD/build/bin/dgc}
out=docs/cli.md
if [ ! -x "$dgc" ]; then
  echo "cli_docs: no dgc program at '$dgc': build it (cmake --build build) or name it:" \
       "scripts/cli_docs.sh [--check] path/to/dgc" >&2
  exit 2
fi

# The help of `dgc ARGS...`, run as `dgc` so that "Usage:" lines name no path.
help_of() {
  (exec -a dgc "$dgc" "$@" --help)
}

# The subcommands a help text lists: the first word of each entry under "Subcommands:".
subcommands_in() {
  awk '/^Subcommands:/ { in_list = 1; next }
       in_list && /^[^ ]/ { in_list = 0 }
       in_list && /^  [^ ]/ { print $1 }'
}

# One section per command, the subcommands of a command after it.
section() {
  local help
  help=$(help_of "$@")
  printf '\n## `dgc%s`\n\n```\n%s\n```\n' "$(printf ' %s' "$@")" "$help"
  local sub
  for sub in $(printf '%s\n' "$help" | subcommands_in); do
    section "$@" "$sub"
  done
}

generate() {
  cat <<'EOF'
# The `dgc` command line

Generated from the program's own help by `scripts/cli_docs.sh` (`dgc --help`, then
`dgc <subcommand> --help` for every subcommand): do not edit it by hand. After changing a flag,
rebuild and run `scripts/cli_docs.sh` (it reads `build/bin/dgc`, or the program given as its
argument); the `docs.cli` test (`ctest -L docs`) fails while this page differs from the
program's help. What the flags mean in practice, with examples: [training.md](training.md)
(`dgc train`), [results.md](results.md) (the benchmarks), [comm.md](comm.md#launching)
(launching several processes).
EOF
  printf '\n## `dgc`\n\n```\n%s\n```\n' "$(help_of)"
  local sub
  for sub in $(help_of | subcommands_in); do
    section "$sub"
  done
}

if ((check)); then
  expected=$(mktemp)
  trap 'rm -f "$expected"' EXIT
  generate >"$expected"
  if ! diff -u "$out" "$expected" >&2; then
    echo "cli_docs: $out differs from the help of $dgc (above: - the file, + the program):" \
         "run scripts/cli_docs.sh $dgc and commit $out" >&2
    exit 1
  fi
  echo "cli_docs: $out matches the help of $dgc"
else
  generate >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "cli_docs: wrote $out"
fi
