#!/usr/bin/env bash
# Fails, listing the files, when a tracked C++ file differs from what clang-format makes of it
# with the repository's .clang-format (clang-format 14, Debian 12's; scripts/setup.sh installs
# it). To fix: git ls-files '*.cc' '*.h' | xargs clang-format -i
#   scripts/check_format.sh [CLANG_FORMAT]
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${1:-clang-format}
command -v "$tool" >/dev/null || {
  echo "check_format: $tool not found; install it (scripts/setup.sh --no-build does)" >&2
  exit 1
}
unformatted=()
while IFS= read -r file; do
  "$tool" --style=file "$file" | cmp -s - "$file" || unformatted+=("$file")
done < <(git ls-files '*.cc' '*.h')
if ((${#unformatted[@]})); then
  printf 'check_format: %d file(s) differ from clang-format:\n' "${#unformatted[@]}" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "check_format: fix with: git ls-files '*.cc' '*.h' | xargs $tool -i" >&2
  exit 1
fi
echo "check_format: all $(git ls-files '*.cc' '*.h' | wc -l) C++ files are formatted"
