#!/usr/bin/env bash
# Runs bench/step_slow_network.sh on the default CNN's shapes (2 ranks, 2 timed steps) over the
# 100mbit profile and checks that it wrote one JSON line with the link's fields and the wire time,
# a table row, the charts (PNG and SVG), and that it left no namespace behind. Exit 77 (skipped)
# without root or netns support.
#   step_slow_network_test.sh path/to/step_slow_network.sh path/to/dgc
set -euo pipefail
script="$1"
dgc="$2"
# shellcheck source=require_netns.sh
source "$(dirname "$0")/require_netns.sh"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
timeout 240 "$script" --dgc "$dgc" --ranks 2 --profiles 100mbit --out "$out" -- \
  --model cnn --steps 2 --compute-seconds 0.05 | tee "$out/log"
jsonl="$out/steps.jsonl"
[ "$(wc -l <"$jsonl")" -eq 1 ] || { echo "FAIL: $jsonl has not 1 line"; cat "$jsonl"; exit 1; }
for text in '"benchmark":"step"' '"model":"cnn"' '"workers":2' '"profile":"100mbit"' '"dgc_wire_seconds":'; do
  grep -q "$text" "$jsonl" || { echo "FAIL: no $text in $jsonl"; cat "$jsonl"; exit 1; }
done
grep -q "^| 100mbit | cnn | 2 | 0.050 s | " "$out/step_slow_network.md" ||
  { echo "FAIL: no table row"; cat "$out/step_slow_network.md"; exit 1; }
expect_charts "$out/plots" replay-step-time replay-step-speedup
# The namespaces this run created (named in its log) are gone.
expect_namespaces_removed "$out/log"
echo "PASS"
