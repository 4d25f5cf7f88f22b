#!/usr/bin/env bash
# The DGC exchange benchmark (`dgc bench exchange`) on a real, rate-limited network.
#
# Each rank runs as its own `dgc bench exchange` process (torchrun-style variables, Gloo over TCP)
# in its own network namespace. Every rank namespace has one veth pair to a bridge that lives in a
# namespace of its own; both ends of every veth are shaped with tc tbf to the rate under test, so
# each rank's link is limited in both directions (a star network of full-duplex links, like ranks
# on one Ethernet switch). Addresses come from the benchmarking range 198.18.0.0/15
# (198.18.0.1 .. 198.18.0.N). Everything the script creates (namespaces, veths, bridge, addresses)
# is removed on exit, also on error or Ctrl-C, and the rank processes are stopped.
#
#   bench/slow_network.sh [--ranks 4] [--rates "1gbit 100mbit"] [--numel N] [--out FILE]
#                         [--dgc PATH] [--burst BYTES] [--leaf QDISC] [--repeats N]
#                         [--dense-repeats N] [--run-timeout S] [-- extra dgc bench exchange options]
#
#   --dgc PATH     the dgc program (default build/bin/dgc)
#   --burst BYTES  tbf bucket (default: 1 ms at the rate, at least 6056 B)
#   --leaf QDISC   queue under tbf instead of its FIFO, e.g. fq_codel (as on a typical host)
#   -- ...         options passed to every `dgc bench exchange`, e.g. --exchange direct
#
# Needs root (network namespaces, veth, tc) and iproute2 (`ip`, `tc`). When the ranks share fewer
# cores than there are ranks, or other jobs run, their scheduling delays show up in the times;
# `chrt -f 10 bench/slow_network.sh ...` (real-time priority for the ranks) reduces that.
# Prints, per rate: both times, the speedup, the wire-time bound (bytes on the busiest link /
# bandwidth, payload bytes as counted by dgc; TCP/IP/Ethernet headers add about 4-5% on the wire)
# and dgc/(bound + 5 ms). --out FILE appends rank 0's JSON line per rate, with "rate" added.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

original_args=("$@")
ranks=4
rates="1gbit 100mbit"
numel=""
out=""
dgc="build/bin/dgc"
burst=""
repeats=""
dense_repeats=""
run_timeout=""
leaf=""
extra=()

while (($#)); do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --numel) numel="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --dgc) dgc="$2"; shift 2 ;;
    --burst) burst="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --dense-repeats) dense_repeats="$2"; shift 2 ;;
    --run-timeout) run_timeout="$2"; shift 2 ;;
    --leaf) leaf="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "slow_network: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "slow_network: $*" >&2; exit 1; }

if ! [[ "$ranks" =~ ^[0-9]+$ ]] || ((ranks < 2 || ranks > 250)); then
  die "--ranks must be 2..250, got '$ranks'"
fi
[[ -z "$numel" || "$numel" =~ ^[0-9]+$ ]] || die "--numel must be a positive integer, got '$numel'"
[[ -z "$burst" || "$burst" =~ ^[0-9]+$ ]] || die "--burst must be a number of bytes, got '$burst'"
[[ -z "$run_timeout" || "$run_timeout" =~ ^[0-9]+$ ]] || die "--run-timeout must be seconds"

if [ "$(id -u)" -ne 0 ]; then
  die "needs root to create network namespaces, veth pairs and tc qdiscs; run it as root, e.g. sudo $0 ${original_args[*]}"
fi
for tool in ip tc awk sed; do
  command -v "$tool" >/dev/null || die "'$tool' not found; install iproute2 (ip, tc) and awk/sed (Debian: apt-get install iproute2 gawk sed)"
done
[ -x "$dgc" ] || die "dgc program not found at '$dgc'; build it first (scripts/setup.sh) or pass --dgc PATH"
dgc="$(cd "$(dirname "$dgc")" && pwd)/$(basename "$dgc")"

# Rate string (tc syntax) -> bits per second.
rate_bps() {
  local r="${1,,}"
  local num unit
  num="$(sed -E 's/^([0-9.]+).*/\1/' <<<"$r")"
  unit="$(sed -E 's/^[0-9.]+//' <<<"$r")"
  [[ "$num" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "cannot read rate '$1' (use e.g. 1gbit, 100mbit)"
  case "$unit" in
    gbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e9 }' ;;
    mbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e6 }' ;;
    kbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e3 }' ;;
    *) die "rate '$1': unit must be gbit, mbit or kbit" ;;
  esac
}
for rate in $rates; do rate_bps "$rate" >/dev/null; done

# Names: one set per invocation, so concurrent runs do not collide.
tag="dgcbench$$"
bridge_ns="${tag}br"
rank_ns() { echo "${tag}r$1"; }
rank_addr() { echo "198.18.0.$(($1 + 1))"; }
workdir="$(mktemp -d "${TMPDIR:-/tmp}/dgcbench.XXXXXX")"
pids=()
created_ns=()

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # Deleting a namespace deletes the veth ends, addresses, qdiscs and the bridge inside it.
  for ns in "${created_ns[@]}"; do
    ip netns delete "$ns" 2>/dev/null || echo "slow_network: could not delete namespace $ns" >&2
  done
  rm -rf "$workdir"
  exit "$status"
}
trap cleanup EXIT
trap 'echo "slow_network: interrupted" >&2; exit 130' INT
trap 'echo "slow_network: terminated" >&2; exit 143' TERM

add_ns() {
  ip netns add "$1" || die "cannot create network namespace $1 (is this a container without CAP_SYS_ADMIN / netns support?)"
  created_ns+=("$1")
  ip -n "$1" link set lo up
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null || true
}

# Topology: bridge namespace with br0; per rank a namespace with eth0 <-> vr<i> on br0.
add_ns "$bridge_ns"
ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
for ((i = 0; i < ranks; i++)); do
  ns="$(rank_ns "$i")"
  add_ns "$ns"
  ip link add eth0 netns "$ns" type veth peer name "vr$i" netns "$bridge_ns"
  ip -n "$bridge_ns" link set "vr$i" master br0
  ip -n "$bridge_ns" link set "vr$i" up
  ip -n "$ns" addr add "$(rank_addr "$i")/16" dev eth0
  ip -n "$ns" link set eth0 up
done

# Shapes both ends of every veth: rank -> bridge (eth0 egress) and bridge -> rank (vr<i> egress).
shape() {
  local rate="$1" bps="$2"
  local b="$burst"
  if [ -z "$b" ]; then
    # Default bucket: 1 ms at the rate (125000 B at 1gbit), at least 4 full-size frames. Smaller
    # buckets cost throughput here (the qdisc's wake-ups come late and tokens above the bucket
    # are lost: 12.5 kB gave about 45% of 1 Gbit/s for a bulk transfer, 125 kB about 90%);
    # larger ones let more bytes through unshaped after an idle gap (at most one bucket per gap).
    b=$(awk -v bps="$bps" 'BEGIN { b = bps / 8 * 1e-3; if (b < 6056) b = 6056; printf "%d", b }')
  fi
  for ((i = 0; i < ranks; i++)); do
    for end in "$(rank_ns "$i") eth0" "$bridge_ns vr$i"; do
      read -r ns dev <<<"$end"
      ip netns exec "$ns" tc qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst "$b" latency 100ms
      if [ -n "$leaf" ]; then
        ip netns exec "$ns" tc qdisc replace dev "$dev" parent 1:1 "$leaf"
      fi
    done
  done
  echo "$b"
}

# Extracts a field of a one-line JSON object (numbers, booleans, strings without commas).
json_field() {
  sed -nE "s/.*\"$2\":\"?([^,\"}]*)\"?[,}].*/\1/p" <<<"$1"
}

host="$(uname -n)"
cores="$(nproc)"
echo "slow_network: $ranks ranks, each in its own namespace, star through a bridge, links shaped with tc tbf both ways"
echo "slow_network: dgc=$dgc host=$host cores=$cores date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "slow_network: namespaces ${bridge_ns} (bridge) and $(rank_ns 0)..$(rank_ns $((ranks - 1))), addresses $(rank_addr 0)..$(rank_addr $((ranks - 1)))"
rows=()
failed=0
for rate in $rates; do
  bps="$(rate_bps "$rate")"
  gbit="$(awk -v b="$bps" 'BEGIN { printf "%.6g", b / 1e9 }')"
  b="$(shape "$rate" "$bps")"
  args=(bench exchange --json --bandwidth-gbit "$gbit")
  [ -n "$numel" ] && args+=(--numel "$numel")
  [ -n "$repeats" ] && args+=(--repeats "$repeats")
  [ -n "$dense_repeats" ] && args+=(--dense-repeats "$dense_repeats")
  # Dense allreduce wire time (ring: 2(N-1)/N of the buffer) bounds the run time from below.
  n="${numel:-25557032}"
  dense_s="$(awk -v n="$n" -v r="$ranks" -v bps="$bps" 'BEGIN { printf "%d", 2 * (r - 1) / r * 4 * n * 8 / bps + 1 }')"
  collective_timeout=$((3 * dense_s + 60))
  limit="${run_timeout:-$((8 * dense_s + 180))}"
  args+=(--timeout "$collective_timeout" "${extra[@]}")
  echo "slow_network: rate $rate (tbf burst $b B), run limit ${limit}s: ${args[*]}"

  pids=()
  for ((i = 0; i < ranks; i++)); do
    ip netns exec "$(rank_ns "$i")" env MASTER_ADDR="$(rank_addr 0)" MASTER_PORT=29500 RANK="$i" \
      WORLD_SIZE="$ranks" "$dgc" "${args[@]}" --hostname "$(rank_addr "$i")" \
      >"$workdir/rank$i.out" 2>"$workdir/rank$i.err" &
    pids+=($!)
  done
  # Bounded wait for every rank.
  deadline=$((SECONDS + limit))
  status=0
  for ((i = 0; i < ranks; i++)); do
    while kill -0 "${pids[$i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "slow_network: rank $i still running after ${limit}s; stopping all ranks" >&2
      status=124
      break
    fi
    wait "${pids[$i]}" || status=$?
  done
  if ((status != 0)); then
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
    for ((i = 0; i < ranks; i++)); do
      sed "s/^/  rank $i: /" "$workdir/rank$i.err" >&2
    done
    echo "slow_network: rate $rate failed (status $status)" >&2
    failed=1
    continue
  fi
  pids=()
  line="$(grep -m1 '^{' "$workdir/rank0.out" || true)"
  [ -n "$line" ] || { echo "slow_network: rank 0 printed no JSON at rate $rate" >&2; failed=1; continue; }
  if [ -n "$out" ]; then
    echo "${line%\}},\"rate\":\"$rate\",\"tbf_burst_bytes\":$b,\"tbf_leaf\":\"${leaf:-fifo}\"}" >>"$out"
  fi
  dgc_s="$(json_field "$line" dgc_seconds)"
  dense_s="$(json_field "$line" dense_seconds)"
  bound="$(json_field "$line" wire_bound_seconds)"
  dense_bound="$(json_field "$line" dense_wire_bound_seconds)"
  verified="$(json_field "$line" verified)"
  rows+=("$(awk -v rate="$rate" -v r="$ranks" -v n="$(json_field "$line" numel)" \
    -v d="$dgc_s" -v D="$dense_s" -v b="$bound" -v B="$dense_bound" -v v="$verified" 'BEGIN {
      printf "%-8s %5d %10d %11.6f %11.6f %9.1f %11.6f %11.6f %10.2f %8s",
             rate, r, n, d, D, D / d, b, B, d / (b + 0.005), v }')")
done

echo
printf "%-8s %5s %10s %11s %11s %9s %11s %11s %10s %8s\n" rate ranks numel dgc_s dense_s speedup \
  bound_s dense_bound "dgc/(b+5ms)" verified
for row in "${rows[@]}"; do echo "$row"; done
echo "(times: median over repeats of the slowest rank; bound: busiest link bytes / rate)"
exit "$failed"
