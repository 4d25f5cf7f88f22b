#!/usr/bin/env bash
# Soak: a long DGC run of `dgc train` (local workers) that must not grow. Samples the process's
# resident memory (VmRSS, and the peak VmHWM) every second while it trains, and compares, between
# the start (the first epochs after the density warm-up) and the end (the last epochs), the
# resident memory and the time per step from the --metrics lines (train_seconds / iterations).
#
#   bench/soak.sh [--steps 5000] [--workers 4] [--examples 6400] [--out DIR] [--dgc PATH]
#                 [-- extra `dgc train` options]
#
# Defaults: at least 5,000 DGC steps with 4 workers on the first 6,400 Fashion-MNIST training
# examples (50 steps per epoch at batch 32, so 100 epochs), 1,000 test examples per evaluation,
# d = 0.001 after a one-epoch warm-up. Writes OUT/soak.jsonl (--metrics), OUT/rss.tsv (seconds,
# completed epochs, VmRSS kB, VmHWM kB), OUT/train.log and the table OUT/soak.md. Exits 1 when the
# resident memory at the end exceeds the start by more than 2% + 8 MB, or the median time per step
# of the last 5 epochs exceeds the first 5 (after warm-up) by more than 25%; the step time
# follows the machine's load, so read that verdict next to the load averages the table records.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=5000
workers=4
out=runs/soak
dgc=build/bin/dgc
extra=()
train_examples=6400
die() { echo "soak: $*" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --examples) train_examples="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --dgc) dgc="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 100 ]] || die "--steps must be a number >= 100, got '$steps'"
[[ "$workers" =~ ^[0-9]+$ && "$workers" -ge 1 ]] || die "--workers must be a positive number"
[ -x "$dgc" ] || die "no dgc program at $dgc: build first (cmake --build build) or pass --dgc"
[[ "$train_examples" =~ ^[0-9]+$ ]] || die "--examples must be a number of training examples"
batch=32
per_epoch=$((train_examples / (batch * workers)))
((per_epoch >= 1)) || die "fewer than one step per epoch with $workers workers"
epochs=$(((steps + per_epoch - 1) / per_epoch))
((epochs >= 12)) || die "--steps $steps gives only $epochs epochs of $per_epoch steps; the comparison needs at least 12"
mkdir -p "$out"
rm -f "$out/soak.jsonl" "$out/rss.tsv"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "soak: $epochs epochs x $per_epoch steps = $((epochs * per_epoch)) steps, $workers workers; load $load_start"

"$dgc" train --workers "$workers" --epochs "$epochs" --batch-size "$batch" \
  --train-examples "$train_examples" --test-examples 1000 --progress lines \
  --metrics "$out/soak.jsonl" "${extra[@]}" >"$out/train.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
start=$SECONDS
# One sample a second while it runs (bounded by the process's life).
while kill -0 "$pid" 2>/dev/null; do
  if status="$(cat "/proc/$pid/status" 2>/dev/null)"; then
    rss="$(awk '/^VmRSS:/ { print $2 }' <<<"$status")"
    hwm="$(awk '/^VmHWM:/ { print $2 }' <<<"$status")"
    done_epochs="$(grep -c '^{' "$out/soak.jsonl" 2>/dev/null || true)"
    [ -n "$rss" ] && printf '%d\t%d\t%s\t%s\n' "$((SECONDS - start))" "${done_epochs:-0}" "$rss" "$hwm" >>"$out/rss.tsv"
  fi
  sleep 1
done
status=0
wait "$pid" || status=$?
trap - EXIT
if ((status != 0)); then
  tail -20 "$out/train.log" >&2
  die "dgc train failed (status $status); log: $out/train.log"
fi
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 "$(dirname "$0")/soak_judge.py" "$out" "$epochs" "$load_start" "$load_end"
