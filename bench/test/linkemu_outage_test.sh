#!/usr/bin/env bash
# dgc-linkemu's outages (a link down for a stated time, every frame dropped, then restored), and a
# `dgc train` run that keeps going across a 1-second outage. Two "hosts" as network namespaces,
# each with one veth to a switch namespace in which dgc-linkemu forwards between them (5 ms one
# way per link, no loss):
#   1. ping every 0.1 s for 3 s with rank 1's link taken down for 1 s (SIGUSR1, --signal-outage):
#      about 10 of the 30 echoes are lost (3 to 20 accepted: a loaded machine pings less often),
#      the last answered; linkemu prints the outage;
#   2. `dgc train` by hand on the two hosts (--timeout 10), uninterrupted, then the same run with
#      rank 1's link down for 1 s in the middle of training: it exits 0 without a restart, frames
#      were dropped during the outage, and both ranks' final checkpoints equal the uninterrupted
#      run's byte for byte (TCP retransmitted; only time was lost).
# Skipped (exit 77) where network namespaces cannot be created (not root, no iproute2).
#   linkemu_outage_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
linkemu="$(dirname "$dgc")/dgc-linkemu"
source "$(dirname "$0")/require_netns.sh"
[ -x "$linkemu" ] || { echo "FAIL: no dgc-linkemu beside $dgc"; exit 1; }

tag="dgco$$"
work=$(mktemp -d)
pids=()
switch_pid=""
cleanup() {
  for pid in "${pids[@]}" $switch_pid; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${pids[@]}" $switch_pid; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in s 0 1; do ip netns delete "$tag$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log "$work"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; } >&2; done
  exit 1
}
now_ms() { date +%s%3N; }

for ns in s 0 1; do
  ip netns add "$tag$ns"
  ip -n "$tag$ns" link set lo up
done
addr=(198.18.0.1 198.18.0.2)
for i in 0 1; do
  ip link add eth0 netns "$tag$i" type veth peer name "vr$i" netns "${tag}s"
  ip -n "${tag}s" link set "vr$i" up
  ip -n "$tag$i" addr add "${addr[$i]}/16" dev eth0
  ip -n "$tag$i" link set eth0 up
  ip -n "$tag$i" link set eth0 gso_max_segs 1
done
ip netns exec "${tag}s" "$linkemu" vr0:5:0 vr1:5:0 --signal-outage vr1:1 \
  >"$work/linkemu.out" 2>&1 &
switch_pid=$!
for _ in $(seq 100); do
  grep -q '^linkemu: ready' "$work/linkemu.out" && break
  kill -0 "$switch_pid" 2>/dev/null || break
  sleep 0.05
done
grep -q '^linkemu: ready' "$work/linkemu.out" || fail "dgc-linkemu did not start"

# 1. ping across a 1 s outage.
ip netns exec "${tag}0" timeout 20 ping -n -c 30 -i 0.1 -W 2 "${addr[1]}" >"$work/ping.out" 2>&1 &
ping_pid=$!
sleep 1
kill -USR1 "$switch_pid"
wait "$ping_pid" || true
received=$(sed -nE 's/.* ([0-9]+) received.*/\1/p' "$work/ping.out")
[ -n "$received" ] || fail "ping printed no summary"
lost=$((30 - received))
# About 10 are lost on an idle machine; on a loaded one ping sends less often than every 0.1 s,
# so fewer fall inside the outage. The last ones must be answered: the link came back.
{ [ "$lost" -ge 3 ] && [ "$lost" -le 20 ]; } || fail "a 1 s outage lost $lost of 30 echoes sent every 0.1 s"
grep -q "icmp_seq=30 " "$work/ping.out" || fail "the last echo was not answered after the outage"
grep -q '^linkemu: vr1 down at [0-9.]* s for 1.000 s$' "$work/linkemu.out" || fail "no outage line"
grep -q '^linkemu: vr1 up at ' "$work/linkemu.out" || fail "no line for the link's return"
echo "1. ping: $lost of 30 echoes lost in a 1 s outage: $(grep '^linkemu: vr1' "$work/linkemu.out" | tr '\n' ' ')"

# 2. dgc train on the two hosts, without and with an outage in the middle.
train=(train --model mlp --epochs 1 --train-examples 3000 --test-examples 200 --threads 1
  --progress lines --timeout 10 --checkpoint-every 20 --checkpoint-keep 1)
ranks=()
run_pair() {
  local name=$1 port=$2
  for i in 0 1; do
    ip netns exec "$tag$i" env RANK=$i WORLD_SIZE=2 MASTER_ADDR="${addr[0]}" MASTER_PORT="$port" \
      timeout 240 "$dgc" "${train[@]}" --checkpoint "$work/$name" >"$work/$name-rank$i.log" 2>&1 &
    pids+=($!)
    ranks[$i]=$!
  done
}
finish_pair() {
  local name=$1
  for i in 0 1; do
    wait "${ranks[$i]}" || fail "$name: rank $i exited with $?"
  done
  pids=()
}
t0=$(now_ms)
run_pair reference 29500
finish_pair reference
reference_ms=$(($(now_ms) - t0))

t0=$(now_ms)
run_pair outage 29501
for _ in $(seq 2400); do
  [ -f "$work/outage.step20.rank1" ] && break
  kill -0 "${ranks[1]}" 2>/dev/null || break
  sleep 0.05
done
[ -f "$work/outage.step20.rank1" ] || fail "outage: step 20 was not written"
drops_before=$(grep -c '^linkemu: vr1 down' "$work/linkemu.out")
kill -USR1 "$switch_pid"
finish_pair outage
outage_ms=$(($(now_ms) - t0))
[ "$(grep -c '^linkemu: vr1 down' "$work/linkemu.out")" -gt "$drops_before" ] ||
  fail "outage: linkemu took no outage"
! grep -q "resumed from" "$work/outage-rank0.log" || fail "outage: the run restarted"
for i in 0 1; do
  final=$(ls "$work"/reference.step*.rank$i | sort -V | tail -1)
  cmp -s "$final" "$work/outage.${final##*/reference.}" ||
    fail "rank $i: the final checkpoint differs from the uninterrupted run's"
done
kill -TERM "$switch_pid"
wait "$switch_pid" || true
switch_pid=""
counters=$(grep '^{' "$work/linkemu.out")
drops=$(sed -nE 's/.*"outage_drops":([0-9]+).*/\1/p' <<<"$counters")
[ "${drops:-0}" -gt 0 ] || fail "no frame was dropped by an outage: $counters"
echo "2. dgc train across a 1 s outage: exit 0 on both ranks, final checkpoints identical;" \
  "$reference_ms ms uninterrupted, $outage_ms ms with the outage (loaded machine); linkemu: $counters"
echo "linkemu_outage_test: ok"
