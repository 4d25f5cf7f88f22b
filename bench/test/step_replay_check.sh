#!/usr/bin/env bash
# dgc bench step --replay on the default CNN's shapes (2 worker threads, 2 timed steps): the
# gradients emitted in backward order over the compute time, dense and DGC each as one message and
# in buckets overlapped with the replay. Checks the JSON line's replay fields: both overlapped runs
# cut the model into several buckets, every replayed step holds the compute, the exposed time is
# what the step took beyond it, and the ratios to the target's bound are the quotients they claim.
#   step_replay_check.sh path/to/dgc
set -euo pipefail
dgc="$1"
line="$("$dgc" bench step --model cnn --workers 2 --steps 2 --untimed-iterations 1 \
  --compute-seconds 0.05 --replay --bucket-cap-mb 0.2 --no-single --json)"
echo "$line"
for field in replay buckets_dense buckets_dgc step_seconds_dense step_seconds_dgc \
  step_seconds_dense_one_message step_seconds_dgc_one_message dgc_exposed_seconds \
  dense_exposed_seconds dgc_wait_seconds dgc_one_message_work_seconds \
  dgc_one_message_exchange_seconds dgc_bound_seconds dgc_step_over_bound dense_bound_seconds \
  dense_step_over_bound; do
  grep -q "\"$field\":" <<<"$line" || { echo "FAIL: no $field"; exit 1; }
done
/usr/bin/awk -v l="$line" 'BEGIN {
  n = split(l, kv, ",")
  for (i = 1; i <= n; i++) { split(kv[i], p, ":"); gsub(/[{}"]/, "", p[1]); v[p[1]] = p[2] + 0 }
  c = v["compute_seconds"]
  ok = c == 0.05 && v["buckets_dense"] >= 2 && v["buckets_dgc"] >= 3 &&
       v["step_seconds_dgc"] >= c && v["step_seconds_dense"] >= c &&
       v["step_seconds_dgc_one_message"] >= c && v["step_seconds_dense_one_message"] >= c &&
       (v["dgc_exposed_seconds"] - (v["step_seconds_dgc"] - c))^2 < 1e-8 &&
       v["dgc_bound_seconds"] >= c &&
       (v["dgc_step_over_bound"] - v["step_seconds_dgc"] / v["dgc_bound_seconds"])^2 < 1e-6 &&
       (v["dense_step_over_bound"] - v["step_seconds_dense"] / v["dense_bound_seconds"])^2 < 1e-6
  if (!ok) { print "FAIL: inconsistent replay figures"; exit 1 }
}'
echo PASS
