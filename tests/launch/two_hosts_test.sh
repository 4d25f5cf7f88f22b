#!/usr/bin/env bash
# Two "hosts" as two network namespaces joined by a veth pair (10.77.<n>.1 and 10.77.<n>.2), each
# running the real torchrun agent with --nnodes 2 --node_rank R --master_addr 10.77.<n>.1 and two
# processes: the agent of node 0 serves the c10d store, the four workers are its clients and
# meet over the veth link. Runs `dgc bench exchange` and `dgc train`.
# Skipped (exit 77) without root, iproute2, network namespaces or python3-torch.
#   two_hosts_test.sh DGC_BINARY TORCHRUN_PY
set -euo pipefail
dgc=$1
torchrun=$2
source "$(dirname "$0")/common.sh"

python=/usr/bin/python3
if ! "$python" -c "import torch.distributed.run" >/dev/null 2>&1; then
  echo "skipped: python3-torch is not installed (no torch at $python)"
  exit 77
fi
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 for network namespaces"
  exit 77
fi
tag="dgcl$$"
if ! ip netns add "${tag}a" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here"
  exit 77
fi
extra_cleanup='ip netns delete "${tag}a" 2>/dev/null || true; ip netns delete "${tag}b" 2>/dev/null || true'
ip netns add "${tag}b"
subnet="10.77.$(($$ % 250)).0"
addr_a="${subnet%.0}.1"
addr_b="${subnet%.0}.2"
ip link add "${tag}va" netns "${tag}a" type veth peer name "${tag}vb" netns "${tag}b"
ip -n "${tag}a" addr add "$addr_a/24" dev "${tag}va"
ip -n "${tag}b" addr add "$addr_b/24" dev "${tag}vb"
for ns in a b; do
  ip -n "${tag}$ns" link set lo up
  ip -n "${tag}$ns" link set "${tag}v$ns" up
done
ip netns exec "${tag}b" ping -c 1 -W 5 "$addr_a" >/dev/null || fail "the namespaces cannot reach each other"

# node R N LOG ARGS...: the torchrun agent of node R in namespace N, two workers.
node() {
  local rank=$1 ns=$2 log=$3
  shift 3
  ip netns exec "${tag}$ns" timeout 240 "$python" "$torchrun" --nnodes 2 --node_rank "$rank" \
    --nproc_per_node 2 --master_addr "$addr_a" --master_port "$port" --no_python "$dgc" "$@" \
    >"$work/$log" 2>&1 &
  pids+=($!)
}
finish() {
  codes=()
  for pid in "${pids[@]}"; do
    if wait "$pid"; then codes+=(0); else codes+=($?); fi
  done
  pids=()
}

port=29500  # each namespace has its own ports: torchrun's default is free there
node 0 a bench-node0.log bench exchange --numel 20000 --repeats 2 --dense-repeats 1 --json --timeout 60
node 1 b bench-node1.log bench exchange --numel 20000 --repeats 2 --dense-repeats 1 --json --timeout 60
finish
[ "${codes[*]}" = "0 0" ] || fail "bench exchange on two hosts: exit codes ${codes[*]}"
line=$(grep -o '{.*}' "$work/bench-node0.log" | head -1)
for want in '"verified":true' '"dense_verified":true' '"workers":4' '"launch":"torchrun"'; do
  grep -qF "$want" <<<"$line" || fail "bench exchange on two hosts: no $want in: $line"
done
echo "two hosts, bench exchange: verified"

train=(train --model mlp --epochs 1 --train-examples 1000 --test-examples 200 --progress lines
  --timeout 120)
node 0 a train-node0.log "${train[@]}"
node 1 b train-node1.log "${train[@]}"
finish
[ "${codes[*]}" = "0 0" ] || fail "train on two hosts: exit codes ${codes[*]}"
grep -qF "4 workers (torchrun (agent store at $addr_a:$port), node 0, gloo" "$work/train-node0.log" ||
  fail "train on two hosts: not 4 workers through the agent's store"
grep -q "^result: test accuracy" "$work/train-node0.log" || fail "train on two hosts: no result"
echo "two hosts, train: finished"
echo "two_hosts_test: ok"
