#!/usr/bin/env bash
# Runs bench/train_slow_network.sh on a tiny training run (2 ranks, 640 Fashion-MNIST examples,
# 2 epochs) over the 100mbit profile and checks that it wrote, for dense and DGC, one metrics
# line per epoch with the link's fields, a table row per run, and the charts (PNG and SVG), and
# that it left no namespace behind. Exit 77 (skipped) without root, netns support or the data.
#   train_slow_network_test.sh path/to/train_slow_network.sh path/to/dgc
set -euo pipefail
script="$1"
dgc="$2"

# shellcheck source=require_netns.sh
source "$(dirname "$0")/require_netns.sh"
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "skipped: Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"
  exit 77
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if "$script" --dgc "$dgc" --out "$out" --bogus 2>"$out/err"; then
  echo "FAIL: an unknown argument was accepted"; exit 1
fi
grep -q "unknown argument --bogus" "$out/err" || { echo "FAIL: no clear error"; cat "$out/err"; exit 1; }

timeout 300 "$script" --dgc "$dgc" --ranks 2 --profiles 100mbit --out "$out" -- \
  --train-examples 640 --test-examples 200 --epochs 2 --warmup-epochs 1 | tee "$out/log"
for run in dense dgc; do
  metrics="$out/100mbit/$run.jsonl"
  [ "$(wc -l <"$metrics")" -eq 2 ] || { echo "FAIL: $metrics has not 2 lines"; cat "$metrics"; exit 1; }
  grep -q '"profile":"100mbit","rate":"100mbit"' "$metrics" || { echo "FAIL: no link fields in $metrics"; exit 1; }
  grep -q '"exchange_seconds":' "$metrics" || { echo "FAIL: no exchange_seconds in $metrics"; exit 1; }
  grep -q "^| 100mbit | 2 | $run | " "$out/train_slow_network.md" || { echo "FAIL: no $run row"; cat "$out/train_slow_network.md"; exit 1; }
done
grep -q '"compression":"none"' "$out/100mbit/dense.jsonl" || { echo "FAIL: the dense run was not dense"; exit 1; }
grep -q '"compression":"dgc"' "$out/100mbit/dgc.jsonl" || { echo "FAIL: the DGC run was not DGC"; exit 1; }
expect_charts "$out/100mbit/plots" train-100mbit-test_accuracy-epoch train-100mbit-test_accuracy-time
# The namespaces this run created (named in its log) are gone.
expect_namespaces_removed "$out/log"
echo "PASS"
