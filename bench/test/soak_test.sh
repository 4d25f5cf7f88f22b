#!/usr/bin/env bash
# Test of bench/soak.sh: its verdict (bench/soak_judge.py) on made-up files, flat (exit 0) and
# with memory that grows (exit 1, a GREW row); then a short real soak (12 epochs of 10 steps)
# writes its metrics, memory samples and table, and its exit status is the verdict its table
# shows (which of the two depends on the machine's load); too few steps is refused with exit 2.
set -euo pipefail
soak="$1"
dgc="$2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
judge="$(dirname "$soak")/soak_judge.py"
made_up() {  # made_up DIR KB_PER_EPOCH: 12 epochs of 10 steps, resident memory growing by that
  mkdir -p "$1"
  : >"$1/soak.jsonl"
  : >"$1/rss.tsv"
  for e in $(seq 0 12); do
    ((e > 0)) && echo "{\"train_seconds\": 1.0, \"iterations\": 10, \"test_accuracy\": 0.9, \"compression_ratio\": 500}" >>"$1/soak.jsonl"
    printf '%d\t%d\t%d\t%d\n' "$e" "$e" "$((100000 + e * $2))" 400000 >>"$1/rss.tsv"
  done
}
made_up "$out/flat" 0
status=0
/usr/bin/python3 "$judge" "$out/flat" 12 "0 0 0" "0 0 0" >/dev/null || status=$?
((status == 0)) && ! grep -q GREW "$out/flat/soak.md" || { echo "soak_test: flat memory judged $status" >&2; exit 1; }
made_up "$out/grows" 20000
status=0
/usr/bin/python3 "$judge" "$out/grows" 12 "0 0 0" "0 0 0" >/dev/null || status=$?
((status == 1)) && grep -q "resident memory, epochs 8-12 .*GREW" "$out/grows/soak.md" || {
  echo "soak_test: growing memory judged $status: $(cat "$out/grows/soak.md")" >&2; exit 1; }

status=0
"$soak" --steps 120 --examples 1280 --out "$out" --dgc "$dgc" >"$out/stdout" 2>&1 || status=$?
cat "$out/stdout"
((status == 0 || status == 1)) || { echo "soak_test: bench/soak.sh exited $status" >&2; exit 1; }
if grep -q GREW "$out/soak.md"; then verdict=1; else verdict=0; fi
((status == verdict)) || { echo "soak_test: exit $status but the table's verdict is $verdict" >&2; exit 1; }
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
