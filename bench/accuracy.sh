#!/usr/bin/env bash
# Accuracy with and without DGC: trains a model (--model, default the CNN) on Fashion-MNIST twice
# with the same seed, data order and settings -- dense (--compression none) and DGC (d = 0.001
# after a one-epoch density warm-up in the paper's 4 exponential stages, the default dense path)
# -- with 4 local workers (--workers), a one-epoch linear learning-rate warm-up and cosine decay.
# Writes both
# curves (JSON lines, one object per epoch), both logs and a markdown table with DGC's message
# bytes per step split into compressed tensors, dense path and headers:
#
#   OUT/dense.jsonl OUT/dgc.jsonl OUT/dense.log OUT/dgc.log OUT/accuracy.md
#   OUT/accuracy-*.png and .svg: the charts of `dgc plot` (accuracy by epoch and by wall time,
#   bytes per epoch)
#
# Usage: bench/accuracy.sh [--model cnn|mlp|resnet20] [--out DIR] [--epochs N] [--seed S]
#                          [--workers N] [--lr LR] [--density D] [--value-type fp32|fp16|bf16]
#                          [--skip-existing]
#                          [--dgc BINARY] [--exchanges "allgather direct sparse-allreduce"]
#                          [--dense-paths "exact grouped fp16 bf16"]
#                          [-- extra `dgc train` flags for every run]
# --exchanges: one more DGC run per exchange algorithm named (same seed and settings, `--exchange
# A`), written to OUT/dgc-A.jsonl/.log, and OUT/exchanges.md with the final accuracy of each.
# --dense-paths: one more DGC run per dense-path strategy named (`--dense-path S`), written to
# OUT/dgc-dense-S.jsonl/.log, and OUT/dense-paths.md: final accuracy, ratio after warm-up and the
# message bytes per step after warm-up by part, for dense, the default DGC run and each strategy.
# --lr: both runs' learning rate (default 0.1). --density and --value-type: the DGC runs' density after warm-up (default 0.001) and wire type of
# the sent values (default fp32). --workers: local workers, each with a batch of 32 (the global batch grows with N; the DGC runs
# add --residual-stats, bench/accuracy_scale.sh). --skip-existing keeps a run whose metrics file
# already holds every epoch.
# Defaults: --model cnn, --out runs/accuracy, --epochs 10, --seed 1, --workers 4,
# --dgc build/bin/dgc. About 10 minutes on a 2-core machine for the CNN at 4 workers (ResNet-20 is
# about 6 times slower). Targets: DGC's
# final test accuracy within 0.5 points of dense (or above), and a compression ratio of at least
# 270x after warm-up, counting every byte of every message.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

model=cnn
out=runs/accuracy
epochs=10
seed=1
warmup=1
dgc=build/bin/dgc
workers=4
lr=0.1
density=0.001
value_type=fp32
skip_existing=0
extra=()
exchanges=""
dense_paths=""
while (($#)); do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --density) density=$2; shift 2 ;;
    --value-type) value_type=$2; shift 2 ;;
    --skip-existing) skip_existing=1; shift ;;
    --exchanges) exchanges=$2; shift 2 ;;
    --dense-paths) dense_paths=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "accuracy.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$dgc" ]; then
  echo "accuracy.sh: $dgc not found; build first (scripts/setup.sh)" >&2
  exit 1
fi
mkdir -p "$out"

# Everything but the compression is shared by both runs.
common=(--model "$model" --workers "$workers" --epochs "$epochs" --seed "$seed" --batch-size 32
        --lr "$lr" --lr-warmup-epochs 1 --lr-decay cosine --momentum 0.9 --weight-decay 1e-4)
run() {
  local name=$1
  shift
  if [ "$skip_existing" = 1 ] && kept_run "$out/$name.jsonl" "$epochs" "$name"; then return; fi
  echo "== $name: $dgc train ${common[*]} $* ${extra[*]}"
  "$dgc" train "${common[@]}" "$@" "${extra[@]}" --metrics "$out/$name.jsonl" | tee "$out/$name.log"
}
run dense --compression none
run dgc --compression dgc --density "$density" --value-type "$value_type" --warmup-epochs "$warmup" --warmup-stages 4 \
  --residual-stats
for exchange in $exchanges; do
  run "dgc-$exchange" --compression dgc --density "$density" --value-type "$value_type" --warmup-epochs "$warmup" --warmup-stages 4 \
    --exchange "$exchange"
done
for dense_path in $dense_paths; do
  run "dgc-dense-$dense_path" --compression dgc --density "$density" --value-type "$value_type" --warmup-epochs "$warmup" \
    --warmup-stages 4 --dense-path "$dense_path"
done

# The table, from the JSON lines (flat objects; no jq needed).
paste -d ' ' <(field epoch <"$out/dense.jsonl") <(field test_accuracy <"$out/dense.jsonl") \
  <(field test_accuracy <"$out/dgc.jsonl") <(field density <"$out/dgc.jsonl") \
  <(field message_bytes bytes_sent <"$out/dgc.jsonl") \
  <(field dense_gradient_bytes dense_bytes <"$out/dgc.jsonl") \
  <(field train_loss <"$out/dense.jsonl") <(field train_loss <"$out/dgc.jsonl") \
  <(field iterations <"$out/dgc.jsonl") <(field message_bytes_compressed <"$out/dgc.jsonl") \
  <(field message_bytes_dense_path <"$out/dgc.jsonl") \
  <(field message_bytes_headers <"$out/dgc.jsonl") |
  awk -v warmup="$warmup" '
    BEGIN {
      print "| epoch | dense train loss | DGC train loss | dense test acc. | DGC test acc. | DGC density (end of epoch) | DGC ratio | DGC bytes/step: compressed | dense path | headers |"
      print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }
    {
      printf "| %d | %.4f | %.4f | %.2f%% | %.2f%% | %g | %.1fx | %.0f | %.0f | %.0f |\n", $1, $7, $8, 100*$2, 100*$3, $4, $6/$5, $10/$9, $11/$9, $12/$9
      sent += $5; dense += $6
      if ($1 > warmup) { sent_post += $5; dense_post += $6 }
      last_dense = $2; last_dgc = $3
    }
    END {
      print ""
      printf "Final test accuracy: dense %.2f%%, DGC %.2f%% (DGC - dense = %+.2f points).\n", 100*last_dense, 100*last_dgc, 100*(last_dgc-last_dense)
      printf "DGC compression ratio (dense gradient bytes / bytes sent per worker, headers and dense-path tensors included): %.1fx over the whole run, %.1fx after warm-up.\n", dense/sent, (sent_post > 0 ? dense_post/sent_post : 0)
    }' | tee "$out/accuracy.md"

if [ -n "$exchanges" ]; then
  last() {  # last() NAME: final test accuracy of run NAME, in percent
    tail -n 1 "$out/$1.jsonl" | field test_accuracy | awk '{ printf "%.2f", 100 * $1 }'
  }
  dense_acc=$(last dense)
  {
    echo "| run | final test accuracy | minus dense (points) | compression ratio after warm-up |"
    echo "|---|---:|---:|---:|"
    echo "| dense | ${dense_acc}% | | |"
    for exchange in $exchanges; do
      acc=$(last "dgc-$exchange")
      ratio=$(paste -d ' ' <(field epoch <"$out/dgc-$exchange.jsonl") \
        <(field message_bytes bytes_sent <"$out/dgc-$exchange.jsonl") \
        <(field dense_gradient_bytes dense_bytes <"$out/dgc-$exchange.jsonl") |
        awk -v w="$warmup" '$1 > w { s += $2; d += $3 } END { printf "%.1fx", (s > 0 ? d / s : 0) }')
      echo "| DGC, --exchange $exchange | ${acc}% | $(awk -v a="$acc" -v d="$dense_acc" 'BEGIN { printf "%+.2f", a - d }') | $ratio |"
    done
  } | tee "$out/exchanges.md"
fi

if [ -n "$dense_paths" ]; then
  # One row per run: final accuracy, ratio and bytes per step after warm-up, by part.
  row() {  # row LABEL NAME
    local acc
    acc=$(tail -n 1 "$out/$2.jsonl" | field test_accuracy | awk '{ printf "%.2f", 100 * $1 }')
    paste -d ' ' <(field epoch <"$out/$2.jsonl") \
      <(field message_bytes bytes_sent <"$out/$2.jsonl") \
      <(field dense_gradient_bytes dense_bytes <"$out/$2.jsonl") \
      <(field iterations <"$out/$2.jsonl") \
      <(field message_bytes_compressed <"$out/$2.jsonl") \
      <(field message_bytes_dense_path <"$out/$2.jsonl") \
      <(field message_bytes_headers <"$out/$2.jsonl") |
      awk -v w="$warmup" -v label="$1" -v acc="$acc" -v dense_acc="$dense_acc" '
        $1 > w { s += $2; d += $3; n += $4; c += $5; p += $6; h += $7 }
        END {
          diff = label == "dense" ? "" : sprintf("%+.2f", acc - dense_acc)
          if (n == 0) { printf "| %s | %s%% | %s | | | | |\n", label, acc, diff; exit }
          printf "| %s | %s%% | %s | %.1fx | %.0f | %.0f | %.0f |\n", label, acc, diff, d / s, c / n, p / n, h / n
        }'
  }
  dense_acc=$(tail -n 1 "$out/dense.jsonl" | field test_accuracy | awk '{ printf "%.2f", 100 * $1 }')
  {
    echo "| run | final test accuracy | minus dense (points) | ratio after warm-up | bytes/step: compressed | dense path | headers |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    row dense dense
    row "DGC, default dense path" dgc
    for dense_path in $dense_paths; do
      row "DGC, --dense-path $dense_path" "dgc-dense-$dense_path"
    done
  } | tee "$out/dense-paths.md"
fi

# The charts (gnuplot); a failure here leaves the table and curves above intact.
"$dgc" plot "$out/dense.jsonl" "$out/dgc.jsonl" --out "$out" --name accuracy \
  --title "$model, 4 workers" ||
  echo "accuracy.sh: no charts (dgc plot failed; is gnuplot-nox installed?)" >&2
