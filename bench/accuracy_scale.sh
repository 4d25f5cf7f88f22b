#!/usr/bin/env bash
# Accuracy as users scale out: bench/accuracy.sh (dense and DGC, same seed, data order and
# schedule) at each number of local workers, each with a batch of 32 -- the global batch grows
# with the workers and an epoch has fewer steps, as when a user adds GPUs. Writes each pair under
# OUT/wN/ and, from them:
#
#   OUT/scale.md          one row per N: steps, dense and DGC final test accuracy, the gap, DGC's
#                         compression ratio after warm-up and over the run, and where the residual
#                         stands at the end (mean age of a sent element, elements never sent)
#   OUT/scale-gap.png/.svg  DGC - dense (points) against workers, with the 0.5-point target band
#
# Usage: bench/accuracy_scale.sh [--workers "4 8 16 32 64"] [--out DIR] [--model cnn]
#                                [--epochs N] [--seed S] [--density D] [--value-type T]
#                                [--dgc BINARY] [-- extra flags for every run]
# --density, --value-type: the DGC runs' (bench/accuracy.sh; defaults 0.001 and fp32).
# Runs already complete under OUT are kept (bench/accuracy.sh --skip-existing), so an interrupted
# sweep continues where it stopped. Each pair of the CNN takes 10-20 minutes on a 2-core machine
# (an epoch's compute is the same at any N; more processes share the cores).
set -euo pipefail
cd "$(dirname "$0")/.."

workers_list="4 8 16 32 64"
out=runs/accuracy-scale
model=cnn
epochs=10
seed=1
density=0.001
value_type=fp32
dgc=build/bin/dgc
extra=()
while (($#)); do
  case "$1" in
    --workers) workers_list=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --density) density=$2; shift 2 ;;
    --value-type) value_type=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "accuracy_scale.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

for n in $workers_list; do
  echo "=== $n workers x 32"
  bench/accuracy.sh --model "$model" --epochs "$epochs" --seed "$seed" --workers "$n" \
    --density "$density" --value-type "$value_type" --out "$out/w$n" --dgc "$dgc" --skip-existing ${extra[@]+-- "${extra[@]}"}
done

dirs=()
for n in $workers_list; do dirs+=("$out/w$n"); done
/usr/bin/env python3 bench/accuracy_scale.py --out "$out" "${dirs[@]}"
