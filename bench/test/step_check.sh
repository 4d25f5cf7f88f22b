#!/usr/bin/env bash
# dgc bench step on the default CNN's shapes (2 worker threads, 2 timed steps): one JSON line with
# every field the results pages use, consistent with itself; an unknown model is refused.
#   step_check.sh path/to/dgc
set -euo pipefail
dgc="$1"
line="$("$dgc" bench step --model cnn --workers 2 --steps 2 --untimed-iterations 1 --compute-seconds 0.05 \
  --bandwidth-gbit 1 --link test --json)"
echo "$line"
for field in model workers link compute_seconds step_seconds_dense step_seconds_dgc speedup \
  wire_bytes_sent_per_rank wire_bytes_received_per_rank dense_wire_bytes_per_rank message_bytes \
  dense_gradient_bytes scaling_efficiency_dense scaling_efficiency_dgc dgc_compress_seconds \
  dgc_exchange_seconds dgc_update_seconds dgc_wire_seconds compression_ratio; do
  grep -q "\"$field\":" <<<"$line" || { echo "FAIL: no $field"; exit 1; }
done
grep -q '"model":"cnn","parameters":413802,"workers":2,"link":"test"' <<<"$line" ||
  { echo "FAIL: model, parameters, workers or link wrong"; exit 1; }
/usr/bin/awk -v l="$line" 'BEGIN {
  n = split(l, kv, ",")
  for (i = 1; i <= n; i++) { split(kv[i], p, ":"); gsub(/[{}"]/, "", p[1]); v[p[1]] = p[2] + 0 }
  ok = v["step_seconds_dense"] > 0.05 && v["step_seconds_dgc"] > 0.05 &&
       (v["speedup"] - v["step_seconds_dense"] / v["step_seconds_dgc"])^2 < 1e-6 &&
       v["scaling_efficiency_dgc"] > 0 && v["compression_ratio"] > 10 &&
       v["wire_bytes_sent_per_rank"] > 0 &&
       v["wire_bytes_sent_per_rank"] < v["dense_wire_bytes_per_rank"] / 10
  if (!ok) { print "FAIL: inconsistent figures"; exit 1 }
}'
if "$dgc" bench step --model resnet18 2>err.txt; then echo "FAIL: unknown model accepted"; exit 1; fi
grep -q "unknown model 'resnet18'" err.txt || { echo "FAIL: unclear error"; cat err.txt; exit 1; }
rm -f err.txt
echo PASS
