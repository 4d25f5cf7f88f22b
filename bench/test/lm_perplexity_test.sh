#!/usr/bin/env bash
# bench/lm_perplexity.sh on a tiny run (300 training verses, 2 epochs): dense, DGC, DGC with
# --masking and DGC per tensor; the tables, the masking and selection of each DGC run, and
# --skip-existing keeping finished runs (one of them without its log) without training them again.
#   lm_perplexity_test.sh path/to/lm_perplexity.sh path/to/dgc
set -euo pipefail
script="$1"
dgc="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

args=(--out "$work/out" --epochs 2 --train-examples 300 --dgc "$dgc" --masking --per-tensor --
      --test-examples 60 --cache-dir "$work/cache")
"$script" "${args[@]}" >"$work/first" 2>&1 || fail "the benchmark failed: $(cat "$work/first")"
table="$work/out/lm_perplexity.md"
[ -s "$table" ] || fail "no table: $(cat "$work/first")"
[ "$(grep -c '^| [12] |' "$table")" -eq 6 ] || fail "expected 2 rows in each of 3 tables: $(cat "$table")"
grep -q "^Final test perplexity: dense [0-9.]*, DGC [0-9.]*" "$table" || fail "no final line: $(cat "$table")"
grep -q "x after warm-up" "$table" || fail "no ratio after warm-up: $(cat "$table")"
grep -q "^With --masking: DGC [0-9.]* against dense" "$table" || fail "no masking line: $(cat "$table")"
grep -q "^With --selection-scope tensor: DGC [0-9.]* against dense" "$table" ||
  fail "no per-tensor line: $(cat "$table")"
for name in dense dgc dgc_masking dgc_tensor; do
  [ "$(grep -c '"epoch"' "$work/out/$name.jsonl")" -eq 2 ] || fail "$name.jsonl lacks epochs"
done
grep -q "momentum factor masking off" "$work/out/dgc.log" || fail "DGC run masks: $(head -5 "$work/out/dgc.log")"
grep -q "momentum factor masking on" "$work/out/dgc_masking.log" ||
  fail "--masking run does not mask: $(head -5 "$work/out/dgc_masking.log")"
grep -q "selection global" "$work/out/dgc.log" || fail "DGC run selects per tensor: $(head -5 "$work/out/dgc.log")"
grep -q "dense path grouped" "$work/out/dgc_tensor.log" ||
  fail "--per-tensor run selects globally: $(head -5 "$work/out/dgc_tensor.log")"

# Again with --skip-existing: nothing trains, the same curves, a missing log is no error.
sums="$(md5sum "$work/out/"*.jsonl)"
rm "$work/out/dense.log"
"$script" --skip-existing "${args[@]}" >"$work/second" 2>&1 ||
  fail "the rerun failed: $(cat "$work/second")"
[ "$(grep -c ': kept (' "$work/second")" -eq 4 ] || fail "not every run kept: $(cat "$work/second")"
grep -q "dense: no summary in" "$work/second" || fail "$(cat "$work/second")"
[ "$sums" = "$(md5sum "$work/out/"*.jsonl)" ] || fail "--skip-existing changed the curves"
grep -q "^Final test perplexity" "$work/out/lm_perplexity.md" || fail "no table after the rerun"
echo "lm_perplexity_test: ok"
