#!/usr/bin/env bash
# Accuracy when a worker is lost for good halfway: the default CNN with DGC on the schedule of
# bench/accuracy.sh (10 epochs, 32 per worker, lr 0.1 at a global batch of 128 with the image
# task's sqrt rule, 1-epoch lr warm-up and cosine, d = 0.001 after a 1-epoch density warm-up in 4
# stages, seed 1), three runs:
#   w4      4 workers, uninterrupted (its epoch-end checkpoints kept)
#   w3      3 workers, uninterrupted
#   shrink  w4's checkpoint set after epoch --at (default 5) resumed by 3 workers with
#           --resume auto, as torchrun's elastic restart does after a node is lost: the lost
#           rank's residual and momentum handed over, the lr at 3 workers' rate, the epoch's
#           consumed examples kept (docs/reliability.md, "Elastic restarts")
# and a table OUT/shrink.md: final test accuracy of each and the differences.
#
#   bench/shrink_accuracy.sh [--out DIR] [--at EPOCH] [--epochs N] [--dgc PATH] [--skip-existing]
#
# Defaults: --out runs/shrink, --at 5, --epochs 10, --dgc build/bin/dgc. About 25 minutes on an
# idle 2-core machine. Checkpoints (a few MB per rank and epoch) go to OUT/ckpt.
set -euo pipefail
cd "$(dirname "$0")/.."

out=runs/shrink
at=5
epochs=10
dgc=build/bin/dgc
skip_existing=0
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --at) at=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --skip-existing) skip_existing=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "shrink_accuracy.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$dgc" ]; then
  echo "shrink_accuracy.sh: $dgc not found; build first (scripts/setup.sh)" >&2
  exit 1
fi
if ((at < 1 || at >= epochs)); then
  echo "shrink_accuracy.sh: --at must be an epoch between 1 and $((epochs - 1))" >&2
  exit 2
fi
mkdir -p "$out/ckpt"

common=(--model cnn --epochs "$epochs" --seed 1 --batch-size 32 --lr 0.1 --lr-warmup-epochs 1
        --lr-decay cosine --momentum 0.9 --weight-decay 1e-4 --compression dgc --density 0.001
        --warmup-epochs 1 --warmup-stages 4 --progress lines)

done_run() { [ "$skip_existing" = 1 ] && [ "$(wc -l <"$out/$1.jsonl" 2>/dev/null || echo 0)" -ge "$epochs" ]; }

run() {
  local name=$1
  shift
  if done_run "$name"; then
    echo "== $name: kept ($out/$name.jsonl has $epochs epochs)"
    return
  fi
  echo "== $name: $dgc train ${common[*]} $*"
  "$dgc" train "${common[@]}" "$@" | tee "$out/$name.log"
}

rm_unless_done() { done_run "$1" || rm -f "$out/$1.jsonl"; }

rm_unless_done w4
run w4 --workers 4 --checkpoint "$out/ckpt/w4" --checkpoint-keep 0 --metrics "$out/w4.jsonl"
rm_unless_done w3
run w3 --workers 3 --metrics "$out/w3.jsonl"

# The checkpoint set of w4 after epoch $at: step = at x iterations per epoch.
per_epoch=$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$out/w4.jsonl" | head -1)
step=$((at * per_epoch))
if ! done_run shrink; then
  rm -f "$out/shrink.jsonl" "$out/ckpt/shrink".*
  for r in 0 1 2 3; do
    src="$out/ckpt/w4.step$step.rank$r"
    if [ ! -f "$src" ]; then
      echo "shrink_accuracy.sh: $src is missing (w4 keeps every epoch's checkpoint)" >&2
      exit 1
    fi
    cp "$src" "$out/ckpt/shrink.step$step.rank$r"
  done
  # The shrunk run's metrics start with w4's first epochs, as the restarted job's file would.
  head -n "$at" "$out/w4.jsonl" >"$out/shrink.jsonl"
fi
run shrink --workers 3 --checkpoint "$out/ckpt/shrink" --resume auto --metrics "$out/shrink.jsonl"

final() { tail -1 "$out/$1.jsonl" | sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p'; }
a4=$(final w4)
a3=$(final w3)
as=$(final shrink)
{
  echo "| run | workers | final test accuracy | against w4 |"
  echo "|---|---|---:|---:|"
  awk -v a4="$a4" -v a3="$a3" -v as="$as" -v at="$at" 'BEGIN {
    printf "| w4 (uninterrupted) | 4 | %.2f%% | |\n", 100 * a4
    printf "| w3 (uninterrupted) | 3 | %.2f%% | %+.2f |\n", 100 * a3, 100 * (a3 - a4)
    printf "| shrink (4, then 3 after epoch %d) | 4 -> 3 | %.2f%% | %+.2f |\n", at, 100 * as, 100 * (as - a4)
  }'
} | tee "$out/shrink.md"
