#!/usr/bin/env bash
# `dgc train` end to end on a slice of the real data: --help, the metrics file, the summary,
# checkpoint + resume through the command line, checkpoints inside epochs (--checkpoint-every,
# --checkpoint-keep), a run killed (SIGKILL) mid-epoch and resumed to the same final checkpoint
# bytes as the uninterrupted run, a damaged newest checkpoint refused naming the previous one and
# --resume-step resuming from it, and the errors a user meets first.
# Usage: cli_train_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$dgc" train --help >"$work/help" || fail "--help exited non-zero"
for flag in --density --warmup-epochs --warmup-stages --momentum --nesterov --weight-decay \
  --clip-norm --lr --lr-warmup-epochs --batch-size --workers --backend --compression --epochs \
  --seed --checkpoint --checkpoint-every --checkpoint-keep --resume --resume-step --metrics \
  --model --data --min-compress-numel --on-nonfinite --max-consecutive-skips --set \
  --selection-scope; do
  grep -q -- "$flag" "$work/help" || fail "--help does not list $flag"
done
# The experiment settings behind --set, and the defaults of each task from the tasks' table.
for key in lr_in_velocity= clip_scaling= dense_path= lr_decay= lr_step_epochs= lr_step_gamma=; do
  grep -q -- "$key" "$work/help" || fail "--help does not list --set $key"
done
grep -q -- "default: 32 (image), 10 (lm), 4 (speech)" "$work/help" || fail "--batch-size defaults per task"
grep -q -- "default: on (image, speech), off (lm)" "$work/help" || fail "--masking defaults per task"
grep -q -- "default: 1024 (image), - (lm, speech)" "$work/help" || fail "--lr-batch-limit defaults per task"
# --link is for --exchange auto, and names a platform or a rate.
if "$dgc" train --link ethernet-1g --epochs 1 >"$work/bad" 2>&1; then fail "--link without auto was accepted"; fi
grep -q -- "add --exchange auto" "$work/bad" || fail "--link without auto: $(cat "$work/bad")"
if "$dgc" train --exchange auto --link fast --epochs 1 >"$work/bad" 2>&1; then fail "--link fast was accepted"; fi
grep -q -- "RATE_MBIT\[:LATENCY_MS\]" "$work/bad" || fail "--link fast: $(cat "$work/bad")"
# The learning-rate rule's batches mean nothing without the rule.
for flag in "--lr-batch 256" "--lr-batch-limit 512"; do
  # shellcheck disable=SC2086
  if "$dgc" train --lr-scaling none $flag --epochs 1 >"$work/bad" 2>&1; then
    fail "$flag with --lr-scaling none was accepted"
  fi
  grep -q -- "add --lr-scaling sqrt" "$work/bad" || fail "$flag without the rule: $(cat "$work/bad")"
done

small=(--workers 2 --train-examples 1024 --test-examples 200 --batch-size 16 --density 0.01
       --progress lines)
"$dgc" train "${small[@]}" --epochs 2 --checkpoint "$work/ckpt" --metrics "$work/m.jsonl" \
  >"$work/out" || fail "training failed: $(cat "$work/out")"
[ "$(wc -l <"$work/m.jsonl")" -eq 2 ] || fail "expected 2 metrics lines, got: $(cat "$work/m.jsonl")"
for key in epoch train_loss test_accuracy message_bytes dense_gradient_bytes compression_ratio \
  seconds skipped_steps; do
  grep -q "\"$key\":" "$work/m.jsonl" || fail "metrics lack $key"
done
# The keys' names before docs/glossary.md's words (renamed; dgc plot still reads them).
for key in bytes_sent dense_bytes; do
  ! grep -q "\"$key\":" "$work/m.jsonl" || fail "metrics still write the old key $key"
done
grep -q "^result: test accuracy" "$work/out" || fail "no summary: $(cat "$work/out")"
grep -q "compression ratio: .*x whole run, .*x after warm-up" "$work/out" || fail "no ratio line"
grep -q "momentum factor masking on" "$work/out" || fail "image does not mask by default: $(head -5 "$work/out")"
# 2 workers x 16 of 1024 examples: 32 steps per epoch, checkpoints after steps 32 and 64.
for f in ckpt.step32.rank0 ckpt.step32.rank1 ckpt.step64.rank0 ckpt.step64.rank1; do
  [ -f "$work/$f" ] || fail "checkpoint file $f missing: $(ls "$work")"
done

# dgc plan takes the model of a run's checkpoints: the prefix reads the newest rank-0 file.
"$dgc" plan --checkpoint "$work/ckpt" --nodes 16 --platform ethernet-1g --compute-seconds 0.01 \
  >"$work/plan" 2>&1 || fail "dgc plan --checkpoint failed: $(cat "$work/plan")"
params=$(grep -o "^dgc train: [a-z0-9]*, [0-9]* parameters" "$work/out" | grep -o "[0-9]* parameters")
[ -n "$params" ] || fail "no parameter count in the training output: $(head -3 "$work/out")"
grep -q "^model $work/ckpt.step64.rank0: $params (" "$work/plan" ||
  fail "dgc plan --checkpoint: expected '$params' of $work/ckpt.step64.rank0: $(cat "$work/plan")"
grep -q "^verdict: " "$work/plan" || fail "dgc plan --checkpoint: no verdict: $(cat "$work/plan")"
if "$dgc" plan --checkpoint "$work/nothing" --nodes 4 --platform ethernet-1g \
  --compute-seconds 0.01 >"$work/bad" 2>&1; then fail "dgc plan took a missing checkpoint"; fi
grep -q "no checkpoint at $work/nothing: give a checkpoint file" "$work/bad" ||
  fail "dgc plan, missing checkpoint: $(cat "$work/bad")"

# The pipelined step trains (one message per step and its lookahead, said at start-up), with
# Nesterov momentum unless told otherwise, and refuses what it cannot do.
"$dgc" train "${small[@]}" --epochs 1 --pipeline 1 >"$work/pipelined" 2>&1 ||
  fail "training with --pipeline 1 failed: $(cat "$work/pipelined")"
grep -q "the pipelined step (--pipeline 1)" "$work/pipelined" ||
  fail "--pipeline 1: no start-up line: $(head -8 "$work/pipelined")"
grep -q "pipelined (--pipeline 1): .* own selection applied (a lookahead" "$work/pipelined" ||
  fail "--pipeline 1: no line on its lookahead: $(head -9 "$work/pipelined")"
grep -q "momentum 0.9 (Nesterov)" "$work/pipelined" ||
  fail "--pipeline 1 did not turn on Nesterov momentum: $(head -9 "$work/pipelined")"
"$dgc" train "${small[@]}" --epochs 1 --pipeline 1 --no-nesterov >"$work/heavy_ball" 2>&1 ||
  fail "training with --pipeline 1 --no-nesterov failed: $(cat "$work/heavy_ball")"
if grep -q "(Nesterov)" "$work/heavy_ball"; then
  fail "--pipeline 1 --no-nesterov ran Nesterov momentum: $(head -9 "$work/heavy_ball")"
fi
grep -q "^result: test accuracy" "$work/pipelined" || fail "--pipeline 1: no result: $(tail -3 "$work/pipelined")"
# A stated link of 5 ms or more one way pipelines by default; --pipeline 0 keeps the step synchronous.
"$dgc" train "${small[@]}" --epochs 1 --exchange auto --link mobile >"$work/slow_link" 2>&1 ||
  fail "training over --link mobile failed: $(cat "$work/slow_link")"
grep -q "the default for a --link of 5 ms or more one way" "$work/slow_link" ||
  fail "--link mobile did not pipeline: $(head -9 "$work/slow_link")"
"$dgc" train "${small[@]}" --epochs 1 --exchange auto --link mobile --pipeline 0 \
  >"$work/slow_link_sync" 2>&1 || fail "--link mobile --pipeline 0 failed: $(cat "$work/slow_link_sync")"
if grep -q "pipelined (--pipeline 1)" "$work/slow_link_sync"; then
  fail "--link mobile --pipeline 0 pipelined: $(head -9 "$work/slow_link_sync")"
fi
for flag in "--on-nonfinite skip" "--residual-stats"; do
  # shellcheck disable=SC2086
  if "$dgc" train --pipeline 1 $flag --epochs 1 >"$work/bad" 2>&1; then
    fail "--pipeline 1 with $flag was accepted"
  fi
  grep -q -- "--pipeline 1" "$work/bad" || fail "--pipeline 1 with $flag: $(cat "$work/bad")"
done

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
# (2 workers x 16: the image task's lr sqrt-scaled from 128, 0.1 -> 0.05 and 0.05 -> 0.025)
grep -q "setting 'lr' is 0.05 in the checkpoint but 0.025 now" "$work/bad" || fail "$(cat "$work/bad")"

# Checkpoints inside epochs: every 10 steps, the newest 3 kept. The uninterrupted run first.
every=(--epochs 2 --checkpoint-every 10 --checkpoint-keep 3)
"$dgc" train "${small[@]}" "${every[@]}" --checkpoint "$work/whole" >"$work/whole.out" ||
  fail "training with --checkpoint-every failed: $(cat "$work/whole.out")"
kept=$(cd "$work" && ls whole.step*.rank0 | sed 's/^whole.step\([0-9]*\).rank0$/\1/' | sort -n |
  tr '\n' ' ')
[ "$kept" = "50 60 64 " ] ||
  fail "expected the newest 3 steps (50 60 64) kept, found: $kept"
grep -q "last checkpoint: $work/whole.step64.rank0 .. .rank1 (3 kept per rank)" "$work/whole.out" ||
  fail "no checkpoint line in the summary: $(tail -3 "$work/whole.out")"

# resume_run NAME ARGS...: --resume; when the ranks' newest steps differ (killed while writing),
# the message names the step to pass, and the run resumes from it with --resume-step.
resume_run() {
  local name=$1
  shift
  if "$dgc" train "$@" --resume >"$work/$name.out" 2>&1; then return 0; fi
  local step
  step=$(grep -o "newest checkpoints are from different steps.*--resume-step [0-9]*" \
    "$work/$name.out" | grep -o "[0-9]*$") || fail "$name: resume failed: $(cat "$work/$name.out")"
  "$dgc" train "$@" --resume-step "$step" >"$work/$name.out" 2>&1 ||
    fail "$name: resume from step $step failed: $(cat "$work/$name.out")"
}

# The same run killed (SIGKILL, the whole process) inside epoch 2, once step 40's files of both
# ranks exist (with only one rank's, the newest step both have can be 32, the end of epoch 1),
# then resumed: the final checkpoint files equal the uninterrupted run's byte for byte.
"$dgc" train "${small[@]}" "${every[@]}" --checkpoint "$work/killed" >"$work/killed.out" 2>&1 &
victim=$!
for _ in $(seq 1 1200); do
  [ -f "$work/killed.step40.rank0" ] && [ -f "$work/killed.step40.rank1" ] && break
  kill -0 "$victim" 2>/dev/null || break
  sleep 0.05
done
kill -KILL "$victim" 2>/dev/null || true
wait "$victim" 2>/dev/null || true
[ -f "$work/killed.step40.rank0" ] && [ -f "$work/killed.step40.rank1" ] ||
  fail "the run never reached step 40: $(cat "$work/killed.out")"
[ ! -f "$work/killed.step64.rank0" ] || fail "the run finished before it was killed: no resume test"
resume_run resumed "${small[@]}" "${every[@]}" --checkpoint "$work/killed"
grep -q "resumed from $work/killed.step[0-9]*.rank0: step [0-9]*, inside epoch 2 after" \
  "$work/resumed.out" || fail "not resumed inside epoch 2: $(head -8 "$work/resumed.out")"
for r in 0 1; do
  cmp -s "$work/whole.step64.rank$r" "$work/killed.step64.rank$r" ||
    fail "rank $r: the resumed run's final checkpoint differs from the uninterrupted run's"
done
echo "killed at $(grep -o "step [0-9]*, inside epoch 2" "$work/resumed.out"), resumed: final checkpoints identical"

# A damaged newest checkpoint (one byte changed in rank 1's step 64) is refused with the previous
# step named; --resume-step 60 resumes inside epoch 2 and ends with the same files again.
cp "$work/whole.step64.rank0" "$work/whole.final.rank0"
cp "$work/whole.step64.rank1" "$work/whole.final.rank1"
printf 'Z' | dd of="$work/whole.step64.rank1" bs=1 seek=4000 conv=notrunc status=none
if "$dgc" train "${small[@]}" "${every[@]}" --checkpoint "$work/whole" --resume \
  >"$work/damaged.out" 2>&1; then
  fail "a damaged newest checkpoint was accepted"
fi
grep -q "cannot resume from step 64: checkpoint $work/whole.step64.rank1 is truncated or corrupt" \
  "$work/damaged.out" || fail "unclear refusal: $(cat "$work/damaged.out")"
grep -q "The newest older checkpoint every rank can read is step 60 ($work/whole.step60.rank0 .. .rank1): resume from it with --resume-step 60" \
  "$work/damaged.out" || fail "the previous good checkpoint is not named: $(cat "$work/damaged.out")"
"$dgc" train "${small[@]}" "${every[@]}" --checkpoint "$work/whole" --resume-step 60 \
  --metrics "$work/from60.jsonl" >"$work/from60.out" 2>&1 ||
  fail "--resume-step 60 failed: $(cat "$work/from60.out")"
for r in 0 1; do
  cmp -s "$work/whole.final.rank$r" "$work/whole.step64.rank$r" ||
    fail "rank $r: resumed from step 60, the final checkpoint differs"
done
grep -q '"resumed_at_iteration":28' "$work/from60.jsonl" ||
  fail "the resumed epoch is not marked: $(cat "$work/from60.jsonl")"
grep -q "^epoch 2 .*(resumed after iteration 28)$" "$work/from60.out" ||
  fail "the resumed epoch's line is not marked: $(cat "$work/from60.out")"

if "$dgc" train "${small[@]}" --checkpoint-every 5 >"$work/bad" 2>&1; then
  fail "--checkpoint-every without --checkpoint accepted"
fi
grep -q -- "--checkpoint-every and --checkpoint-keep need --checkpoint PATH" "$work/bad" ||
  fail "$(cat "$work/bad")"

# The non-finite policy: one of two, and its bound only with skip.
if "$dgc" train "${small[@]}" --on-nonfinite ignore >"$work/bad" 2>&1; then
  fail "--on-nonfinite ignore accepted"
fi
grep -q -- "--on-nonfinite: ignore not in {stop,skip}" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${small[@]}" --max-consecutive-skips 3 >"$work/bad" 2>&1; then
  fail "--max-consecutive-skips without --on-nonfinite skip accepted"
fi
grep -q -- "--max-consecutive-skips bounds --on-nonfinite skip" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${small[@]}" --on-nonfinite skip --max-consecutive-skips 0 >"$work/bad" 2>&1; then
  fail "--max-consecutive-skips 0 accepted"
fi
grep -q -- "--max-consecutive-skips" "$work/bad" || fail "$(cat "$work/bad")"

# --resume takes nothing or 'auto'; auto needs --checkpoint and picks the step itself.
for bad in "--resume later --checkpoint $work/x" "--resume auto" \
  "--resume auto --resume-step 3 --checkpoint $work/x"; do
  # shellcheck disable=SC2086  # the flags as words
  if "$dgc" train "${small[@]}" $bad >"$work/bad" 2>&1; then fail "accepted: $bad"; fi
  grep -q -- "--resume takes no value or 'auto'\|--resume auto needs --checkpoint\|--resume auto picks the step itself" \
    "$work/bad" || fail "$bad: $(cat "$work/bad")"
done

# The learning rate inside the velocity is DGC's: refused on a dense run, also when given by its
# deprecated flag.
for setting in "--set lr_in_velocity=1" --lr-in-velocity; do
  # shellcheck disable=SC2086  # --set and its value are two words
  if "$dgc" train "${small[@]}" --compression none $setting >"$work/bad" 2>&1; then
    fail "$setting with --compression none accepted"
  fi
  grep -q -- "--set lr_in_velocity changes how DGC accumulates" "$work/bad" || fail "$(cat "$work/bad")"
done
# An unknown --set key names the known ones; a key beside its flag is refused.
if "$dgc" train "${small[@]}" --set lr_in_velocty=1 >"$work/bad" 2>&1; then
  fail "an unknown --set key accepted"
fi
grep -q -- "unknown --set key 'lr_in_velocty': the known keys are lr_in_velocity, clip_scaling" \
  "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${small[@]}" --set dense_path=fp16 --dense-path exact >"$work/bad" 2>&1; then
  fail "--set dense_path beside --dense-path accepted"
fi
grep -q -- "--set dense_path and --dense-path set the same thing" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" train "${small[@]}" --set lr_decay=step >"$work/bad" 2>&1; then
  fail "--set lr_decay=step without milestones accepted"
fi
grep -q -- "add --set lr_step_epochs" "$work/bad" || fail "$(cat "$work/bad")"

# Global selection: one threshold over every tensor, said at start-up, the whole run's bytes in
# the group's part; refused on a dense run and beside the flags of the dense path it replaces.
"$dgc" train "${small[@]}" --epochs 1 --selection-scope global --metrics "$work/global.jsonl" \
  >"$work/global" 2>&1 || fail "global selection failed: $(cat "$work/global")"
grep -q "selection global: one threshold over all 413802 elements of the 8 tensors" \
  "$work/global" || fail "$(cat "$work/global")"
grep -q '"message_bytes_compressed":0,' "$work/global.jsonl" || fail "$(cat "$work/global.jsonl")"
if "$dgc" train "${small[@]}" --compression none --selection-scope global >"$work/bad" 2>&1; then
  fail "--selection-scope global with --compression none accepted"
fi
grep -q -- "--selection-scope global is how DGC selects" "$work/bad" || fail "$(cat "$work/bad")"
for flag in "--dense-path exact" "--dense-path-density 0.2" "--min-compress-numel 10" \
  "--compress-1d"; do
  # shellcheck disable=SC2086  # the flag and its value are two words
  if "$dgc" train "${small[@]}" --selection-scope global $flag >"$work/bad" 2>&1; then
    fail "--selection-scope global with $flag accepted"
  fi
  grep -q -- "${flag%% *} chooses how the tensors left out of compression travel" "$work/bad" ||
    fail "$(cat "$work/bad")"
done
if "$dgc" train "${small[@]}" --selection-scope layer >"$work/bad" 2>&1; then
  fail "--selection-scope layer accepted"
fi
grep -q -- "--selection-scope" "$work/bad" || fail "$(cat "$work/bad")"

# A misspelt command is named, with the command meant, at every level.
status=0
"$dgc" trian --epochs 1 >"$work/bad" 2>&1 || status=$?
((status == 2)) || fail "dgc trian exited $status: $(cat "$work/bad")"
grep -q "'trian' is not a command of dgc; did you mean 'dgc train'?" "$work/bad" || fail "$(cat "$work/bad")"
if "$dgc" --help | grep -q '^  bench'; then
  if "$dgc" bench exchnage >"$work/bad" 2>&1; then fail "dgc bench exchnage accepted"; fi
  grep -q "did you mean 'dgc bench exchange'?" "$work/bad" || fail "$(cat "$work/bad")"
fi
if "$dgc" train --data "$work/none" >"$work/nodata" 2>&1; then fail "missing data accepted"; fi
grep -q "dataset-fashion-mnist" "$work/nodata" || fail "$(cat "$work/nodata")"

# The language-model task on a tiny slice, with its own corpus cache.
for flag in --task --cache-dir --vocabulary --embedding --hidden --bptt --dropout; do
  grep -q -- "$flag" "$work/help" || fail "--help does not list $flag"
done
lm=(--task lm --workers 2 --train-examples 200 --test-examples 40 --batch-size 4 --bptt 10
    --vocabulary 500 --embedding 16 --hidden 16 --density 0.01)
"$dgc" train "${lm[@]}" --cache-dir "$work/cache" --epochs 2 --progress bar --metrics "$work/lm.jsonl" \
  --checkpoint "$work/lmck" >"$work/lm" ||
  fail "lm training failed: $(cat "$work/lm")"
[ -f "$work/cache/kjv-corpus-v1.txt" ] || fail "no corpus cache in --cache-dir"
[ "$(wc -l <"$work/lm.jsonl")" -eq 2 ] || fail "expected 2 lm metrics lines: $(cat "$work/lm.jsonl")"
for key in epoch train_loss validation_perplexity test_perplexity message_bytes dense_gradient_bytes \
  compression_ratio seconds; do
  grep -q "\"$key\":" "$work/lm.jsonl" || fail "lm metrics lack $key"
done
grep -q "tokens/s" "$work/lm" || fail "lm progress shows no tokens/s: $(cat "$work/lm")"
grep -q "clip norm 0.25" "$work/lm" || fail "lm does not clip by default: $(head -5 "$work/lm")"
# lm turns momentum factor masking off by default (lm_task_defaults); --masking turns it on.
grep -q "momentum factor masking off" "$work/lm" || fail "lm masks by default: $(head -5 "$work/lm")"
"$dgc" train "${lm[@]}" --cache-dir "$work/cache" --epochs 1 --masking --progress lines >"$work/lm_masking" ||
  fail "lm training with --masking failed: $(cat "$work/lm_masking")"
grep -q "momentum factor masking on" "$work/lm_masking" || fail "--masking ignored: $(head -5 "$work/lm_masking")"
grep -q "^result: test perplexity [0-9.]* after 2 epochs" "$work/lm" || fail "$(cat "$work/lm")"
# lm selects over the whole model by default (lm_task_defaults); --selection-scope tensor is the
# paper's, with its dense path; the dense path's flags without it name the default.
grep -q "selection global: one threshold over all" "$work/lm" || fail "lm selects per tensor: $(head -5 "$work/lm")"
"$dgc" train "${lm[@]}" --cache-dir "$work/cache" --epochs 1 --selection-scope tensor \
  --dense-path exact --progress lines >"$work/lm_tensor" ||
  fail "lm training with --selection-scope tensor failed: $(cat "$work/lm_tensor")"
grep -q "dense path exact" "$work/lm_tensor" || fail "--selection-scope tensor ignored: $(head -5 "$work/lm_tensor")"
if "$dgc" train "${lm[@]}" --cache-dir "$work/cache" --dense-path exact >"$work/bad" 2>&1; then
  fail "lm with --dense-path and no --selection-scope accepted"
fi
grep -q -- "with --selection-scope global (the lm default) none is" "$work/bad" || fail "$(cat "$work/bad")"
"$dgc" train "${lm[@]}" --cache-dir "$work/cache" --epochs 1 --compression none --progress lines \
  >"$work/lm_dense" || fail "dense lm training failed: $(cat "$work/lm_dense")"
if grep -q "selection global" "$work/lm_dense"; then
  fail "dense lm run says it selects: $(head -5 "$work/lm_dense")"
fi

# dgc lm-words on the checkpoints after epochs 1 and 2: it evaluates as the run did (the same
# test perplexity as the run's result) and splits the loss by word frequency.
ckpts=($(ls "$work"/lmck.step*.rank1 | sort -V))
[ "${#ckpts[@]}" -eq 2 ] || fail "expected the checkpoints of 2 epochs: ${ckpts[*]}"
"$dgc" lm-words "${ckpts[@]}" --label one --label two --cache-dir "$work/cache" >"$work/words" ||
  fail "lm-words failed: $(cat "$work/words")"
final=$(sed -n 's/^result: test perplexity \([0-9.]*\) after.*/\1/p' "$work/lm")
grep -q "^test perplexity ([0-9]* tokens, 2 workers' layout): one [0-9.]*; two $final;" "$work/words" ||
  fail "lm-words does not reproduce the run's test perplexity $final: $(cat "$work/words")"
for band in "<eos>" "words 1-10" "words 101-498" "<unk>"; do
  grep -q "^| $band |" "$work/words" || fail "lm-words has no row for $band: $(cat "$work/words")"
done
grep -q "two - one: loss per token | share of the gap" "$work/words" || fail "$(cat "$work/words")"
if "$dgc" lm-words "${ckpts[0]}" --label a --label b --cache-dir "$work/cache" >"$work/bad" 2>&1; then
  fail "lm-words accepted two labels for one checkpoint"
fi
grep -q "give one per checkpoint" "$work/bad" || fail "$(cat "$work/bad")"
image_ckpt=$(ls "$work"/ckpt.step*.rank0 | head -n 1)
if "$dgc" lm-words "$image_ckpt" --cache-dir "$work/cache" >"$work/bad" 2>&1; then
  fail "lm-words accepted an image checkpoint"
fi
grep -q "is not of an lm run" "$work/bad" || fail "$(cat "$work/bad")"

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
