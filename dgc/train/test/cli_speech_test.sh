#!/usr/bin/env bash
# `dgc train --task speech` end to end on a tiny corpus (16 + 4 utterances synthesised with
# espeak-ng into a fresh --cache-dir) and a tiny model: progress while the corpus is generated,
# the metrics file and summary, the cache reused by a second run, the speech flags refused on other
# tasks and the other tasks' flags refused on speech, and the message without espeak-ng.
# Usage: cli_speech_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$dgc" train --help >"$work/help" || fail "--help exited non-zero"
for flag in --corpus-seed --corpus-train --corpus-test --gru-hidden --gru-layers --frame-stack \
  --cache-dir; do
  grep -q -- "$flag" "$work/help" || fail "--help does not list $flag"
done

speech=(--task speech --corpus-train 16 --corpus-test 4 --gru-hidden 16 --gru-layers 1
        --workers 2 --batch-size 4)
if ! command -v espeak-ng >/dev/null; then
  echo "cli_speech_test: espeak-ng is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
"$dgc" train "${speech[@]}" --cache-dir "$work/cache" --epochs 2 --progress bar --metrics "$work/speech.jsonl" \
  >"$work/speech" 2>"$work/speech.err" || fail "speech training failed: $(cat "$work/speech" "$work/speech.err")"
grep -q "synthesising 20 / 20 utterances with espeak-ng" "$work/speech.err" ||
  fail "no generation progress: $(cat "$work/speech.err")"
[ -f "$work/cache/speech-v1-seed1-train16-test4/manifest.tsv" ] || fail "no corpus in --cache-dir"
[ "$(wc -l <"$work/speech.jsonl")" -eq 2 ] || fail "expected 2 metrics lines: $(cat "$work/speech.jsonl")"
for key in epoch train_loss test_token_error_rate test_utterance_error_rate \
  noisy_test_token_error_rate noisy_test_utterance_error_rate message_bytes dense_gradient_bytes \
  compression_ratio seconds; do
  grep -q "\"$key\":" "$work/speech.jsonl" || fail "speech metrics lack $key"
done
grep -q "utt/s" "$work/speech" || fail "speech progress shows no utt/s: $(cat "$work/speech")"
grep -q "clip norm 1 " "$work/speech" || fail "speech does not clip by default: $(head -5 "$work/speech")"
grep -q "^dgc train: gru, " "$work/speech" || fail "$(head -3 "$work/speech")"
grep -q "^result: test TER [0-9.]*% after 2 epochs" "$work/speech" || fail "$(cat "$work/speech")"

# The second run reads the cache: nothing synthesised.
"$dgc" train "${speech[@]}" --cache-dir "$work/cache" --epochs 1 --compression none >"$work/again" 2>"$work/again.err" ||
  fail "second run failed: $(cat "$work/again" "$work/again.err")"
if grep -q synthesising "$work/again.err"; then fail "the cache was not reused"; fi
grep -q "compression none" "$work/again" || fail "$(cat "$work/again")"

# Flags of one task are refused on the others.
if "$dgc" train "${speech[@]}" --cache-dir "$work/cache" --bptt 10 >"$work/bad" 2>&1; then fail "--bptt accepted with speech"; fi
grep -q -- "--bptt belongs to --task lm" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${speech[@]}" --cache-dir "$work/cache" --model cnn >"$work/bad" 2>&1; then fail "--model accepted with speech"; fi
grep -q -- "--model belongs to --task image" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train --gru-hidden 8 >"$work/bad" 2>&1; then fail "--gru-hidden accepted with image"; fi
grep -q -- "--gru-hidden belongs to --task speech" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train --task lm --corpus-seed 2 >"$work/bad" 2>&1; then fail "--corpus-seed accepted with lm"; fi
grep -q -- "--corpus-seed belongs to --task speech" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${speech[@]}" --cache-dir "$work/cache" --train-examples 1 >"$work/bad" 2>&1; then
  fail "too few utterances accepted"
fi
grep -q "too few training utterances" "$work/bad" || fail "$(cat "$work/bad")"

# Without espeak-ng the corpus cannot be made: the message names the package.
if PATH=/nonexistent "$dgc" train "${speech[@]}" --cache-dir "$work/empty" >"$work/none" 2>&1; then
  fail "speech without espeak-ng succeeded"
fi
grep -q "apt-get install espeak-ng" "$work/none" || fail "$(cat "$work/none")"
[ ! -e "$work/empty/speech-v1-seed1-train16-test4" ] || fail "a half corpus was left behind"
echo "cli_speech_test: ok"
