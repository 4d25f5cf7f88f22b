#!/usr/bin/env bash
# Runs bench/slow_network.sh on a tiny gradient (2 ranks) over the 1gbit profile (Linux bridge)
# and the mobile profile (dgc-linkemu: 40 ms round trip, loss), and checks that it reports a
# verified run per profile, with the profile's settings, that the emulated delay was measured, and
# that it leaves no namespace or switch process behind. An unknown profile is refused before
# anything is created. Exit 77 (skipped) without root or netns support.
#   exchange_slow_network_test.sh path/to/slow_network.sh path/to/dgc
set -euo pipefail
script="$1"
dgc="$2"

# shellcheck source=require_netns.sh
source "$(dirname "$0")/require_netns.sh"

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if "$script" --dgc "$dgc" --profiles bogus 2>"$out"; then
  echo "FAIL: an unknown profile was accepted"; exit 1
fi
grep -q "unknown profile 'bogus'" "$out" || { echo "FAIL: no clear error for a bad profile"; cat "$out"; exit 1; }
: >"$out"

log="$(timeout 150 "$script" --dgc "$dgc" --ranks 2 --profiles "1gbit mobile" --numel 100000 \
  --repeats 3 --dense-repeats 1 --out "$out")"
echo "$log"
tag="$(sed -nE 's/^slow_network: namespaces (dgcbench[0-9]+)br .*/\1/p' <<<"$log")"
[ -n "$tag" ] || { echo "FAIL: the script did not name its namespaces"; exit 1; }
cat "$out"
[ "$(wc -l <"$out")" -eq 2 ] || { echo "FAIL: expected one result per profile"; exit 1; }
for profile in 1gbit mobile; do
  line="$(grep "\"profile\":\"$profile\"" "$out" || true)"
  [ -n "$line" ] || { echo "FAIL: no result for profile $profile"; exit 1; }
  grep -q '"verified":true' <<<"$line" || { echo "FAIL: $profile not verified"; exit 1; }
  grep -q '"workers":2' <<<"$line" || { echo "FAIL: expected 2 workers"; exit 1; }
  grep -q '"launch":"torchrun"' <<<"$line" || { echo "FAIL: expected torchrun launch"; exit 1; }
done
grep -q '"profile":"mobile","rate":"20mbit","delay_ms":10,"loss":0.0005' "$out" ||
  { echo "FAIL: mobile profile settings missing from its result"; exit 1; }
grep -qE 'ping rank 0 -> rank 1: min round trip (3[6-9]|[4-9][0-9])\.' <<<"$log" ||
  { echo "FAIL: the mobile profile's round trip was not measured at about 40 ms"; exit 1; }
grep -q '"linkemu":"stopped"' <<<"$log" || { echo "FAIL: dgc-linkemu did not report its counters"; exit 1; }
# Replayed training steps (dgc bench step) on the default CNN's shapes over the 100mbit profile.
: >"$out"
steplog="$(timeout 150 "$script" --dgc "$dgc" --bench step --ranks 2 --profiles 100mbit --repeats 2 \
  --out "$out" -- --model cnn --compute-seconds 0.05)"
echo "$steplog"
grep -q '"benchmark":"step","model":"cnn"' "$out" || { echo "FAIL: no step result"; exit 1; }
grep -q '"workers":2,"link":"100mbit"' "$out" || { echo "FAIL: step result lacks workers/link"; exit 1; }
grep -qE '^100mbit +2 cnn ' <<<"$steplog" || { echo "FAIL: no step table row"; exit 1; }
tag2="$(sed -nE 's/^slow_network: namespaces (dgcbench[0-9]+)br .*/\1/p' <<<"$steplog")"

left="$(ip netns list | grep -cE "^(${tag}|${tag2})" || true)"
if [ "$left" -ne 0 ]; then
  echo "FAIL: $left of the script's namespaces left behind:"
  ip netns list | grep "^${tag}"
  exit 1
fi
echo "PASS"
