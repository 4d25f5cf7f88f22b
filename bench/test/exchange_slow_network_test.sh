#!/usr/bin/env bash
# Runs bench/slow_network.sh on a tiny gradient (2 ranks, 1gbit) and checks that it reports a
# verified run and leaves no namespace behind. Exit 77 (skipped) without root or netns support.
#   exchange_slow_network_test.sh path/to/slow_network.sh path/to/dgc
set -euo pipefail
script="$1"
dgc="$2"

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: needs root for network namespaces"
  exit 77
fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: needs iproute2 (ip, tc)"
  exit 77
fi
probe="dgcbenchprobe$$"
if ! ip netns add "$probe" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here"
  exit 77
fi
ip netns delete "$probe"

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
log="$(timeout 150 "$script" --dgc "$dgc" --ranks 2 --rates 1gbit --numel 100000 --repeats 3 \
  --dense-repeats 1 --out "$out")"
echo "$log"
tag="$(sed -nE 's/^slow_network: namespaces (dgcbench[0-9]+)br .*/\1/p' <<<"$log")"
[ -n "$tag" ] || { echo "FAIL: the script did not name its namespaces"; exit 1; }
line="$(cat "$out")"
echo "$line"
grep -q '"verified":true' <<<"$line" || { echo "FAIL: not verified"; exit 1; }
grep -q '"rate":"1gbit"' <<<"$line" || { echo "FAIL: no rate"; exit 1; }
grep -q '"workers":2' <<<"$line" || { echo "FAIL: expected 2 workers"; exit 1; }
grep -q '"launch":"torchrun"' <<<"$line" || { echo "FAIL: expected torchrun launch"; exit 1; }
left="$(ip netns list | grep -c "^${tag}" || true)"
if [ "$left" -ne 0 ]; then
  echo "FAIL: $left of the script's namespaces left behind:"
  ip netns list | grep "^${tag}"
  exit 1
fi
echo "PASS"
