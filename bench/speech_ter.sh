#!/usr/bin/env bash
# Token error rate with and without DGC on the speech task: trains the 3-layer bidirectional GRU
# with CTC on the espeak-ng letters-and-digits corpus (dgc train --task speech) dense
# (--compression none) and with DGC (d = 0.001 after a two-epoch density warm-up in 4 exponential
# stages, local gradient clipping the paper's way, clip_scaling paper), 4 local workers, for each
# seed; dense and DGC of one seed share the seed, data, model and every other setting. The runs go
# one at a time (dense then DGC, seed by seed), so that each has the cores to itself. Writes the
# curves (JSON lines, one object per epoch), the logs, charts (dgc plot, when gnuplot is there) and
# a markdown table:
#
#   OUT/dense-seedS.jsonl OUT/dgc-seedS.jsonl OUT/*.log OUT/plots/ OUT/speech_ter.md
#
# Usage: bench/speech_ter.sh [--out DIR] [--seeds "1 2 3"] [--epochs N] [--train-examples N]
#                            [--warmup-epochs E] [--skip-existing] [--dgc BINARY]
#                            [-- extra `dgc train` flags for all runs]
# --skip-existing keeps a run whose OUT/NAME-seedS.jsonl already holds all N epochs (an interrupted
# benchmark goes on where it stopped; dense runs, which --warmup-epochs does not change, can be
# copied in from an earlier OUT). Training is deterministic for a given seed and build.
# Defaults: --out runs/speech_ter, --seeds "1 2 3", --epochs 10, --train-examples 0 (all 3,000),
# --warmup-epochs 2 (DGC's density warm-up, 4 stages; the ratio after warm-up counts the epochs
# after it), --dgc build/bin/dgc. The extra flags must not repeat one set here (dgc train refuses a
# repeated option). The corpus (3,000 + 500 utterances, corpus seed 1) is synthesised on the
# first run into the cache directory (a few minutes). About 45 seconds per epoch (7.5 minutes a
# run) on an idle 2-core machine.
# Targets: DGC's mean final test TER within 1 point of dense's; a compression ratio of at least
# 400x after warm-up, counting every byte of every message (dense gradient bytes / bytes sent
# per worker in the epochs after the warm-up).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

out=runs/speech_ter
seeds="1 2 3"
epochs=10
train_examples=0
warmup=2
skip_existing=0
dgc=build/bin/dgc
extra=()
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --train-examples) train_examples=$2; shift 2 ;;
    --warmup-epochs) warmup=$2; shift 2 ;;
    --skip-existing) skip_existing=1; shift ;;
    --dgc) dgc=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "speech_ter.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$dgc" ]; then
  echo "speech_ter.sh: $dgc not found; build first (scripts/setup.sh)" >&2
  exit 1
fi
mkdir -p "$out"
echo "load before the runs: $(uptime)" | tee "$out/load.txt"

# Everything but the compression (and the seed) is shared by all runs; the task's defaults (lr,
# clip norm, batch size) are written out so that the table says what ran.
common=(--task speech --workers 4 --epochs "$epochs" --train-examples "$train_examples"
        --batch-size 4 --lr 0.25 --clip-norm 1 --lr-warmup-epochs 1 --lr-decay cosine
        --momentum 0.9 --weight-decay 0 --progress lines)
dgc_flags=(--compression dgc --density 0.001 --warmup-epochs "$warmup" --warmup-stages 4)
run() {
  local name=$1 seed=$2
  shift 2
  if [ "$skip_existing" = 1 ] &&
    kept_run "$out/$name-seed$seed.jsonl" "$epochs" "$name seed $seed"; then
    return
  fi
  echo "== $name seed $seed: $dgc train ${common[*]} --seed $seed $* ${extra[*]}" |
    tee "$out/$name-seed$seed.log"
  "$dgc" train "${common[@]}" --seed "$seed" "$@" "${extra[@]}" \
    --metrics "$out/$name-seed$seed.jsonl" >>"$out/$name-seed$seed.log" 2>&1 || {
    echo "speech_ter.sh: $name seed $seed failed; see $out/$name-seed$seed.log" >&2
    tail -n 3 "$out/$name-seed$seed.log" >&2
    exit 1
  }
  grep -H -E "^result|compression ratio|wall time" "$out/$name-seed$seed.log"
  echo "load after $name seed $seed: $(uptime)" | tee -a "$out/load.txt"
}
for seed in $seeds; do
  run dense "$seed" --compression none
  run dgc "$seed" "${dgc_flags[@]}"
done

# The table, from the JSON lines (flat objects; no jq needed).
last() { field "$1" <"$2" | tail -n 1; }
{
  echo "| seed | dense test TER | DGC test TER | dense noisy TER | DGC noisy TER | dense utt. err. | DGC utt. err. | DGC ratio after warm-up | DGC ratio, whole run |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for seed in $seeds; do
    d=$out/dense-seed$seed.jsonl
    g=$out/dgc-seed$seed.jsonl
    ratios=$(paste -d ' ' <(field epoch <"$g") <(field message_bytes bytes_sent <"$g") \
      <(field dense_gradient_bytes dense_bytes <"$g") |
      awk -v warmup="$warmup" '{ sent += $2; dense += $3; if ($1 > warmup) { sp += $2; dp += $3 } }
        END { printf "%.1f %.1f", (sp > 0 ? dp / sp : 0), dense / sent }')
    echo "$seed $(last test_token_error_rate "$d") $(last test_token_error_rate "$g") \
$(last noisy_test_token_error_rate "$d") $(last noisy_test_token_error_rate "$g") \
$(last test_utterance_error_rate "$d") $(last test_utterance_error_rate "$g") $ratios"
  done | awk '
    {
      printf "| %d | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.1fx | %.1fx |\n", $1, 100*$2, 100*$3, 100*$4, 100*$5, 100*$6, 100*$7, $8, $9
      n++; d += $2; g += $3; dn += $4; gn += $5; r += $8
    }
    END {
      printf "| mean | %.2f%% | %.2f%% | %.2f%% | %.2f%% | | | %.1fx | |\n", 100*d/n, 100*g/n, 100*dn/n, 100*gn/n, r/n
      printf "\nMean final test TER over %d seed(s): dense %.2f%%, DGC %.2f%% (DGC - dense = %+.2f points).\n", n, 100*d/n, 100*g/n, 100*(g-d)/n
    }'
} | tee "$out/speech_ter.md"

if command -v gnuplot >/dev/null; then
  files=()
  labels=()
  for seed in $seeds; do
    files+=("$out/dense-seed$seed.jsonl" "$out/dgc-seed$seed.jsonl")
    labels+=(--label "dense seed $seed" --label "DGC seed $seed")
  done
  "$dgc" plot "${files[@]}" "${labels[@]}" --out "$out/plots" --name speech \
    --metric test_token_error_rate --title "speech, 4 workers" >/dev/null &&
    echo "charts: $out/plots/speech-test_token_error_rate-epoch.png (and -time, -bytes)"
fi
