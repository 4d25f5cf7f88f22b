#!/usr/bin/env bash
# Perplexity with and without DGC on the language-modelling task: trains the word-level 2-layer
# LSTM on the King James Bible (dgc train --task lm) twice with the same seed, data, model and
# settings -- dense (--compression none) and DGC (d = 0.001 after a one-epoch density warm-up in
# the paper's 4 exponential stages, local gradient clipping the paper's way: each worker's share of
# the summed gradient at clip-norm / sqrt(N), clip_scaling paper) -- with 4 local
# workers, a one-epoch linear learning-rate warm-up and cosine decay. Writes both curves (JSON
# lines, one object per epoch), both logs and a markdown table:
#
#   OUT/dense.jsonl OUT/dgc.jsonl OUT/dense.log OUT/dgc.log OUT/lm_perplexity.md
#   OUT/plots/lm-*.png and .svg: the charts of `dgc plot` (when gnuplot is there)
#
# Usage: bench/lm_perplexity.sh [--out DIR] [--epochs N] [--seed S] [--train-examples N]
#                               [--warmup-epochs E] [--dgc BINARY] [--mean-clip] [--masking]
#                               [--per-tensor] [--skip-existing] [--checkpoints] [--workers N]
#                               [-- extra `dgc train` flags for all runs]
# DGC runs the lm task's defaults: momentum factor masking off and one threshold over the whole
# model (--selection-scope global; dgc/train/tasks/lm.h says why).
# --mean-clip adds a run: DGC with --set clip_scaling=mean (each worker's mean gradient clipped at
# clip-norm / sqrt(4), sqrt(4) to 4 times tighter than the dense baseline's clip).
# --masking adds a run: DGC with momentum factor masking (--masking, the paper's setting).
# --per-tensor adds a run: DGC selecting per tensor (--selection-scope tensor, the paper's
# Algorithm 1; its small tensors on the grouped dense path).
# --warmup-epochs E: DGC's density warm-up (default 1, the issue's benchmark; 4 stages); the
# ratio after warm-up counts the epochs after it.
# --skip-existing keeps a run whose OUT/NAME.jsonl already holds all N epochs (an interrupted
# benchmark goes on where it stopped; the dense run, which the DGC flags do not change, can be
# copied in from an earlier OUT). Training is deterministic for a given seed and build.
# --checkpoints makes every run checkpoint after each epoch (OUT/NAME.ckpt.step<S>.rank<r>, the
# newest kept), so that its final model is there to analyse (`dgc lm-words`: the loss by word
# frequency).
# --workers N: local workers (default 4), each with its batch of 10 x 35 tokens: the global batch
# grows with N and an epoch has fewer steps; the learning rate stays (the lm task keeps
# --lr-scaling none) and each worker's clip follows clip-norm / sqrt(N).
# Defaults: --out runs/lm_perplexity, --epochs 30, --seed 1, --train-examples 0 (all 28,002
# training verses: 526 steps per epoch, 15,780 in all), --dgc build/bin/dgc. The two runs go at
# once; on an otherwise idle 2-core machine they took 1h07m (dense) and 56m55s (DGC).
# Targets: DGC's final test perplexity within 3% of dense (or lower), and a compression ratio of
# at least 400x after warm-up, counting every byte of every message (the whole-run ratio next to
# it).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

out=runs/lm_perplexity
epochs=30
seed=1
train_examples=0
warmup=1
lr=5
clip=0.25
mean_clip=0
masking=0
per_tensor=0
skip_existing=0
checkpoints=0
workers=4
dgc=build/bin/dgc
extra=()
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --warmup-epochs) warmup=$2; shift 2 ;;
    --train-examples) train_examples=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --mean-clip) mean_clip=1; shift ;;
    --masking) masking=1; shift ;;
    --per-tensor) per_tensor=1; shift ;;
    --skip-existing) skip_existing=1; shift ;;
    --checkpoints) checkpoints=1; shift ;;
    --workers) workers=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "lm_perplexity.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$dgc" ]; then
  echo "lm_perplexity.sh: $dgc not found; build first (scripts/setup.sh)" >&2
  exit 1
fi
mkdir -p "$out"

# Everything but the compression is shared by both runs.
common=(--task lm --workers "$workers" --epochs "$epochs" --seed "$seed" --train-examples "$train_examples"
        --batch-size 10 --bptt 35 --vocabulary 5000 --embedding 100 --hidden 100 --dropout 0.2
        --lr "$lr" --lr-warmup-epochs 1 --lr-decay cosine --momentum 0.9
        --weight-decay 0 --progress lines)
# Both runs at once, so that they share whatever else loads the machine alike; each prints its
# command first and writes its own log.
run() {
  local name=$1
  shift
  if [ "$skip_existing" = 1 ] && kept_run "$out/$name.jsonl" "$epochs" "$name"; then
    return
  fi
  local own=(--metrics "$out/$name.jsonl")
  if [ "$checkpoints" = 1 ]; then
    own+=(--checkpoint "$out/$name.ckpt" --checkpoint-keep 1)
  fi
  echo "== $name: $dgc train ${common[*]} $* ${extra[*]} ${own[*]}" | tee "$out/$name.log"
  "$dgc" train "${common[@]}" "$@" "${extra[@]}" "${own[@]}" >>"$out/$name.log" 2>&1
}
# start NAME FLAGS...: runs NAME in the background (all runs go at once).
names=()
pids=()
start() {
  names+=("$1")
  run "$@" &
  pids+=($!)
}
dgc_flags=(--compression dgc --density 0.001 --warmup-epochs "$warmup" --warmup-stages 4)
start dense --compression none --clip-norm "$clip"
start dgc "${dgc_flags[@]}" --clip-norm "$clip"
if [ "$mean_clip" = 1 ]; then
  start dgc_mean_clip "${dgc_flags[@]}" --clip-norm "$clip" --set clip_scaling=mean
fi
if [ "$masking" = 1 ]; then
  start dgc_masking "${dgc_flags[@]}" --clip-norm "$clip" --masking
fi
if [ "$per_tensor" = 1 ]; then
  start dgc_tensor "${dgc_flags[@]}" --clip-norm "$clip" --selection-scope tensor
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if [ "$status" -ne 0 ]; then
  echo "lm_perplexity.sh: a run failed; see the logs in $out" >&2
  for name in "${names[@]}"; do tail -n 3 "$out/$name.log" >&2; done
  exit 1
fi
for name in "${names[@]}"; do
  # A run kept by --skip-existing may have come without its log.
  grep -H -E "^result|compression ratio|wall time" "$out/$name.log" 2>/dev/null ||
    echo "$name: no summary in $out/$name.log"
done

# The table, from the JSON lines (flat objects; no jq needed).
paste -d ' ' <(field epoch <"$out/dense.jsonl") <(field test_perplexity <"$out/dense.jsonl") \
  <(field test_perplexity <"$out/dgc.jsonl") <(field density <"$out/dgc.jsonl") \
  <(field message_bytes bytes_sent <"$out/dgc.jsonl") \
  <(field dense_gradient_bytes dense_bytes <"$out/dgc.jsonl") \
  <(field train_loss <"$out/dense.jsonl") <(field train_loss <"$out/dgc.jsonl") \
  <(field validation_perplexity <"$out/dense.jsonl") \
  <(field validation_perplexity <"$out/dgc.jsonl") |
  awk -v warmup="$warmup" '
    BEGIN {
      print "| epoch | dense train loss | DGC train loss | dense valid. ppl | DGC valid. ppl | dense test ppl | DGC test ppl | DGC density (end of epoch) | DGC ratio |"
      print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }
    {
      printf "| %d | %.4f | %.4f | %.2f | %.2f | %.2f | %.2f | %g | %.1fx |\n", $1, $7, $8, $9, $10, $2, $3, $4, $6/$5
      sent += $5; dense += $6
      if ($1 > warmup) { sent_post += $5; dense_post += $6 }
      last_dense = $2; last_dgc = $3
    }
    END {
      print ""
      printf "Final test perplexity: dense %.2f, DGC %.2f (DGC / dense = %.4f, %+.2f%%).\n", last_dense, last_dgc, last_dgc/last_dense, 100*(last_dgc/last_dense-1)
      printf "DGC compression ratio (dense gradient bytes / bytes sent per worker, headers and dense-path tensors included): %.1fx over the whole run, %.1fx after warm-up.\n", dense/sent, (sent_post > 0 ? dense_post/sent_post : 0)
    }' | tee "$out/lm_perplexity.md"
# variant_table NAME HEADER FLAG: the extra DGC run NAME's test perplexity beside dense's and
# DGC's per epoch, with its own ratio, and the final line "With FLAG: ...".
variant_table() {
  local name=$1 header=$2 flag=$3
  paste -d ' ' <(field epoch <"$out/dense.jsonl") <(field test_perplexity <"$out/dense.jsonl") \
    <(field test_perplexity <"$out/dgc.jsonl") <(field test_perplexity <"$out/$name.jsonl") \
    <(field message_bytes bytes_sent <"$out/$name.jsonl") \
    <(field dense_gradient_bytes dense_bytes <"$out/$name.jsonl") |
    awk -v header="$header" -v flag="$flag" '
      BEGIN { print ""; print header; print "|---:|---:|---:|---:|---:|" }
      { printf "| %d | %.2f | %.2f | %.2f | %.1fx |\n", $1, $2, $3, $4, $6/$5; last_dense = $2; last = $4 }
      END { printf "\nWith %s: DGC %.2f against dense %.2f (%+.2f%%).\n", flag, last, last_dense, 100*(last/last_dense-1) }
    ' | tee -a "$out/lm_perplexity.md"
}
if [ "$mean_clip" = 1 ]; then
  variant_table dgc_mean_clip "$(printf '| epoch | dense test ppl (clip %g on the average) | DGC test ppl (paper scaling: each mean gradient at %g x sqrt(4)) | DGC test ppl (mean scaling: at %g / sqrt(4)) | its ratio |' "$clip" "$clip" "$clip")" \
    "--set clip_scaling=mean"
fi
if [ "$masking" = 1 ]; then
  variant_table dgc_masking \
    "| epoch | dense test ppl | DGC test ppl (no masking, the default) | DGC test ppl (--masking) | its ratio |" \
    "--masking"
fi
if [ "$per_tensor" = 1 ]; then
  variant_table dgc_tensor \
    "| epoch | dense test ppl | DGC test ppl (global selection, the default) | DGC test ppl (--selection-scope tensor) | its ratio |" \
    "--selection-scope tensor"
fi

if command -v gnuplot >/dev/null; then
  plot_runs=("$out/dense.jsonl" "$out/dgc.jsonl")
  labels=(--label dense --label DGC)
  if [ "$masking" = 1 ]; then
    plot_runs+=("$out/dgc_masking.jsonl")
    labels+=(--label "DGC, masking")
  fi
  if [ "$per_tensor" = 1 ]; then
    plot_runs+=("$out/dgc_tensor.jsonl")
    labels+=(--label "DGC, per tensor")
  fi
  "$dgc" plot "${plot_runs[@]}" "${labels[@]}" --out "$out/plots" \
    --name lm --metric test_perplexity --title "lm, $workers workers" >/dev/null &&
    echo "charts: $out/plots/lm-test_perplexity-epoch.png (and -time, -bytes)"
fi
