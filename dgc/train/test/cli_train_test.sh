#!/usr/bin/env bash
# `dgc train` end to end on a slice of the real data: --help, the metrics file, the summary,
# checkpoint + resume through the command line, and the errors a user meets first.
# Usage: cli_train_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$dgc" train --help >"$work/help" || fail "--help exited non-zero"
for flag in --density --warmup-epochs --warmup-stages --momentum --nesterov --weight-decay \
  --clip-norm --lr --lr-warmup-epochs --batch-size --workers --backend --compression --epochs \
  --seed --checkpoint --resume --metrics --model --data --min-compress-numel; do
  grep -q -- "$flag" "$work/help" || fail "--help does not list $flag"
done

small=(--workers 2 --train-examples 1024 --test-examples 200 --batch-size 16 --density 0.01
       --progress lines)
"$dgc" train "${small[@]}" --epochs 2 --checkpoint "$work/ckpt" --metrics "$work/m.jsonl" \
  >"$work/out" || fail "training failed: $(cat "$work/out")"
[ "$(wc -l <"$work/m.jsonl")" -eq 2 ] || fail "expected 2 metrics lines, got: $(cat "$work/m.jsonl")"
for key in epoch train_loss test_accuracy bytes_sent dense_bytes compression_ratio seconds; do
  grep -q "\"$key\":" "$work/m.jsonl" || fail "metrics lack $key"
done
grep -q "^result: test accuracy" "$work/out" || fail "no summary: $(cat "$work/out")"
grep -q "compression ratio: .*x whole run, .*x after warm-up" "$work/out" || fail "no ratio line"
[ -f "$work/ckpt.rank0" ] && [ -f "$work/ckpt.rank1" ] || fail "checkpoint files missing"

# Resuming a finished run evaluates the same model again.
"$dgc" train "${small[@]}" --epochs 2 --checkpoint "$work/ckpt" --resume >"$work/resumed" ||
  fail "resume failed: $(cat "$work/resumed")"
first=$(grep -o "^result: test accuracy [0-9.]*%" "$work/out")
again=$(grep -o "^result: test accuracy [0-9.]*%" "$work/resumed")
[ "$first" = "$again" ] || fail "resumed model differs: '$first' vs '$again'"

# Resuming with other settings is refused with a clear message.
if "$dgc" train "${small[@]}" --epochs 2 --lr 0.05 --checkpoint "$work/ckpt" --resume \
  >"$work/bad" 2>&1; then
  fail "resume with another --lr succeeded"
fi
grep -q "setting 'lr' is 0.1 in the checkpoint but 0.05 now" "$work/bad" || fail "$(cat "$work/bad")"

if "$dgc" train --data "$work/none" >"$work/nodata" 2>&1; then fail "missing data accepted"; fi
grep -q "dataset-fashion-mnist" "$work/nodata" || fail "$(cat "$work/nodata")"
echo "cli_train_test: ok"
