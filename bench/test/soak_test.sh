#!/usr/bin/env bash
# Smoke test of bench/soak.sh: a short soak (12 epochs of 10 steps) writes its metrics, memory
# samples and table; the verdict (exit 0 or 1) depends on the machine's load, so both are accepted,
# anything else is a failure. Too few steps is refused with exit 2.
set -euo pipefail
soak="$1"
dgc="$2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
"$soak" --steps 120 --examples 1280 --out "$out" --dgc "$dgc" >"$out/stdout" 2>&1 || status=$?
cat "$out/stdout"
((status == 0 || status == 1)) || { echo "soak_test: bench/soak.sh exited $status" >&2; exit 1; }
[ "$(grep -c '^{' "$out/soak.jsonl")" = 12 ] || { echo "soak_test: expected 12 metrics lines" >&2; exit 1; }
[ "$(wc -l <"$out/rss.tsv")" -ge 3 ] || { echo "soak_test: too few memory samples" >&2; exit 1; }
for row in "steps (DGC" "resident memory, epochs 8-12" "peak resident memory" "time per step, epochs 8-12"; do
  grep -qF "| $row" "$out/soak.md" || { echo "soak_test: no row '$row' in soak.md" >&2; exit 1; }
done
grep -qF "| 120 |" "$out/soak.md" || { echo "soak_test: the table does not count 120 steps" >&2; exit 1; }
status=0
"$soak" --steps 110 --examples 1280 --out "$out/short" --dgc "$dgc" 2>"$out/err" || status=$?
((status == 2)) && grep -q "at least 12" "$out/err" || {
  echo "soak_test: too short a soak must be refused with exit 2, got $status: $(cat "$out/err")" >&2
  exit 1
}
echo "soak_test: ok"
