#!/usr/bin/env bash
# The DGC exchange benchmark (`dgc bench exchange`), replayed steps (`dgc bench step`) or real
# training (`dgc train`) on a real, rate-limited network.
#
# Each rank runs as its own `dgc bench exchange` (or `step`, `train`) process (torchrun-style variables, Gloo over TCP)
# in its own network namespace. Every rank namespace has one veth pair to a switch that lives in a
# namespace of its own; both ends of every veth are shaped with tc tbf to the rate under test, so
# each rank's link is limited in both directions (a star network of full-duplex links, like ranks
# on one Ethernet switch). The switch is a Linux bridge, or, for links with delay or loss,
# dgc-linkemu (a learning switch with per-port delay and loss, built with dgc: this kernel has no
# netem). Addresses come from the benchmarking range 198.18.0.0/15 (198.18.0.1 .. 198.18.0.N).
# Everything the script creates (namespaces, veths, bridge, addresses, the switch process) is
# removed on exit, also on error or Ctrl-C, and the rank processes are stopped.
#
#   bench/slow_network.sh [--ranks 4] [--profiles "1gbit 100mbit"] [--rates R] [--delay-ms D]
#                         [--loss P] [--numel N] [--out FILE] [--dgc PATH] [--burst BYTES]
#                         [--leaf QDISC] [--repeats N] [--dense-repeats N] [--run-timeout S]
#                         [--linkemu-args "ARGS"]
#                         [--bench exchange|step|train|command] [-- extra options of the dgc command]
#
# Link profiles (--profiles, run in turn; the settings of each link between a rank and the switch):
#   1gbit     tbf rate 1gbit both ways, Linux bridge (no added delay or loss)
#   100mbit   tbf rate 100mbit both ways, Linux bridge
#   mobile    a phone-class link: tbf rate 20mbit both ways; dgc-linkemu adds 10 ms one way on
#             each link crossed (rank -> switch -> rank: 20 ms, so a 40 ms round trip between two
#             ranks) and loses 0.05% of the frames on each link crossed (about 0.1% between two
#             ranks); GSO limited to one segment on the ranks so that loss is per packet
#   --rates "R1 R2 ..." with optional --delay-ms D (one way, per link) and --loss P (per link
#             crossed): free-form links, one run per rate, named after the rate (e.g. 50mbit)
#   --bench step   run `dgc bench step` (replayed dense and DGC training steps of real models'
#                  shapes; e.g. -- --model resnet50 --compute-seconds 0.1) instead of
#                  `dgc bench exchange`; prints one row per model and link
#   --bench train  run `dgc train` (e.g. -- --compression none --train-examples 15000); prints one
#                  row per link: final test metric, wall time, time per step and its exchange
#                  part, wire bytes; with --out, rank 0's --metrics lines (one per epoch) with the
#                  link fields added. bench/train_slow_network.sh runs dense and DGC per profile.
#   --bench command  run the command after -- as every rank (e.g. a PyTorch program: the
#                  torchrun variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are
#                  set, and GLOO_SOCKET_IFNAME=eth0 so that Gloo uses the shaped link); prints the
#                  JSON lines ({...}) of rank 0's output as they are
#   --dgc PATH     the dgc program (default build/bin/dgc); dgc-linkemu is taken from beside it
#   --burst BYTES  tbf bucket (default: 1 ms at the rate, at least 6056 B)
#   --leaf QDISC   queue under tbf instead of its FIFO, e.g. fq_codel (as on a typical host)
#   --linkemu-args "ARGS"  more options for dgc-linkemu (links with delay or loss), e.g. outages:
#                  "--outage vr1:30:10" takes rank 1's link down 30 s after the switch started,
#                  for 10 s; "--random-outages vr1:2:1" two 1 s outages a minute on average
#                  (bench/linkemu/linkemu.cc); its outage lines are printed after the run
#   -- ...         options passed to every `dgc bench exchange` (or `step`, `train`; with command:
#                  the command), e.g. --exchange direct
#
# Needs root (network namespaces, veth, tc), iproute2 (`ip`, `tc`) and, for delay or loss, ping
# (iputils-ping: the script measures the round trip before it runs and stops if the delay is not
# in effect). A shaping step that fails stops the benchmark: it never runs unshaped. When the
# ranks share fewer cores than there are ranks, or other jobs run, their scheduling delays show
# up in the times; `chrt -f 10 bench/slow_network.sh ...` (real-time priority) reduces that.
# Prints, per profile: both times, the speedup, the wire-time bound (bytes on the busiest link /
# bandwidth, payload bytes as counted by dgc; TCP/IP/Ethernet headers add about 4-5% on the wire)
# and dgc/(bound + 5 ms). --out FILE appends rank 0's JSON line per profile, with "profile",
# "rate", "delay_ms" and "loss" added.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

original_args=("$@")
ranks=4
bench=exchange
profiles=""
rates=""
delay_ms=0
loss=0
numel=""
out=""
dgc="build/bin/dgc"
burst=""
repeats=""
dense_repeats=""
run_timeout=""
leaf=""
linkemu_args=""
extra=()

while (($#)); do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --profiles) profiles="$2"; shift 2 ;;
    --bench) bench="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --delay-ms) delay_ms="$2"; shift 2 ;;
    --loss) loss="$2"; shift 2 ;;
    --numel) numel="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --dgc) dgc="$2"; shift 2 ;;
    --burst) burst="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --dense-repeats) dense_repeats="$2"; shift 2 ;;
    --run-timeout) run_timeout="$2"; shift 2 ;;
    --leaf) leaf="$2"; shift 2 ;;
    --linkemu-args) linkemu_args="$2"; shift 2 ;;
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
[[ "$bench" = exchange || "$bench" = step || "$bench" = train || "$bench" = command ]] ||
  die "--bench must be exchange, step, train or command, got '$bench'"
[[ "$delay_ms" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay-ms must be a number of milliseconds, got '$delay_ms'"
[[ "$loss" =~ ^(0(\.[0-9]+)?|1)$ ]] || die "--loss must be a probability in [0, 1], got '$loss'"
if [ -n "$profiles" ] && [ -n "$rates" ]; then
  die "give --profiles or --rates (free-form links), not both"
fi
[ -n "$profiles" ] || [ -n "$rates" ] || profiles="1gbit 100mbit"

# Links to run, one per line: name rate delay_ms loss.
links=()
for p in $profiles; do
  case "$p" in
    1gbit) links+=("1gbit 1gbit 0 0") ;;
    100mbit) links+=("100mbit 100mbit 0 0") ;;
    mobile) links+=("mobile 20mbit 10 0.0005") ;;
    *) die "unknown profile '$p': 1gbit, 100mbit or mobile (or --rates R --delay-ms D --loss P)" ;;
  esac
done
for r in $rates; do links+=("$r $r $delay_ms $loss"); done

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
emulate=0
for link in "${links[@]}"; do
  read -r _ rate d l <<<"$link"
  rate_bps "$rate" >/dev/null
  if [ "$d" != 0 ] || [ "$l" != 0 ]; then emulate=1; fi
done
linkemu="$(dirname "$dgc")/dgc-linkemu"
if ((emulate)); then
  [ -x "$linkemu" ] || die "links with delay or loss need dgc-linkemu beside the dgc program ($linkemu); build it (scripts/setup.sh)"
  command -v ping >/dev/null || die "links with delay or loss need ping to check them; install iputils-ping (Debian: apt-get install iputils-ping)"
fi

# Names: one set per invocation, so concurrent runs do not collide.
tag="dgcbench$$"
bridge_ns="${tag}br"
rank_ns() { echo "${tag}r$1"; }
rank_addr() { echo "198.18.0.$(($1 + 1))"; }
workdir="$(mktemp -d "${TMPDIR:-/tmp}/dgcbench.XXXXXX")"
pids=()
created_ns=()
switch_pid=""

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}" $switch_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}" $switch_pid; do
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

# Topology: switch namespace with br0; per rank a namespace with eth0 <-> vr<i> (on br0, or a port
# of dgc-linkemu for links with delay or loss).
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

# The switch for one link: the bridge (no delay or loss) or dgc-linkemu on the vr<i> ends.
stop_linkemu() {
  [ -n "$switch_pid" ] || return 0
  kill -TERM "$switch_pid" 2>/dev/null || true
  wait "$switch_pid" 2>/dev/null || true
  switch_pid=""
  grep -h '^{\|^linkemu: .* \(down\|up\) at' "$workdir/linkemu.out" | sed 's/^/slow_network: /' || true
}
use_switch() {
  local d="$1" l="$2"
  stop_linkemu
  if [ "$d" = 0 ] && [ "$l" = 0 ]; then
    for ((i = 0; i < ranks; i++)); do
      ip -n "$bridge_ns" link set "vr$i" master br0
      ip -n "$(rank_ns "$i")" link set eth0 gso_max_segs 65535
    done
    return 0
  fi
  local ports=()
  for ((i = 0; i < ranks; i++)); do
    ip -n "$bridge_ns" link set "vr$i" nomaster
    ip -n "$(rank_ns "$i")" link set eth0 gso_max_segs 1
    ports+=("vr$i:$d:$l")
  done
  # shellcheck disable=SC2086  # --linkemu-args is a list of options
  ip netns exec "$bridge_ns" "$linkemu" $linkemu_args "${ports[@]}" >"$workdir/linkemu.out" 2>&1 &
  switch_pid=$!
  for _ in $(seq 50); do
    grep -q '^linkemu: ready' "$workdir/linkemu.out" && break
    kill -0 "$switch_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^linkemu: ready' "$workdir/linkemu.out" ||
    die "dgc-linkemu did not start: $(cat "$workdir/linkemu.out")"
  # The delay must be in effect: rank 0 -> rank 1 crosses two links each way (4 x d).
  local rtt
  rtt="$(ip netns exec "$(rank_ns 0)" ping -n -q -c 5 -i 0.2 -W 5 "$(rank_addr 1)" |
    sed -nE 's|.*= ([0-9.]+)/.*|\1|p')"
  [ -n "$rtt" ] || die "no ping reply between rank 0 and rank 1 through dgc-linkemu; not running unshaped"
  awk -v rtt="$rtt" -v d="$d" 'BEGIN { exit !(rtt >= 0.9 * 4 * d) }' ||
    die "round trip through dgc-linkemu is ${rtt} ms, expected at least $(awk -v d="$d" 'BEGIN { print 0.9 * 4 * d }') ms; not running unshaped"
  echo "slow_network: dgc-linkemu ${d} ms and loss ${l} per link; ping rank 0 -> rank 1: min round trip ${rtt} ms"
}

# Extracts a field of a one-line JSON object (numbers, booleans, strings without commas).
json_field() {
  sed -nE "s/.*\"$2\":\"?([^,\"}]*)\"?[,}].*/\1/p" <<<"$1"
}

host="$(uname -n)"
cores="$(nproc)"
echo "slow_network: $ranks ranks, each in its own namespace, star through a switch, links shaped with tc tbf both ways"
echo "slow_network: dgc=$dgc host=$host cores=$cores date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "slow_network: namespaces ${bridge_ns} (bridge) and $(rank_ns 0)..$(rank_ns $((ranks - 1))), addresses $(rank_addr 0)..$(rank_addr $((ranks - 1)))"
rows=()
failed=0
for link in "${links[@]}"; do
  read -r name rate link_delay link_loss <<<"$link"
  use_switch "$link_delay" "$link_loss"
  bps="$(rate_bps "$rate")"
  gbit="$(awk -v b="$bps" 'BEGIN { printf "%.6g", b / 1e9 }')"
  b="$(shape "$rate" "$bps")"
  if [ "$bench" = exchange ]; then
    args=(bench exchange --json --bandwidth-gbit "$gbit")
    [ -n "$numel" ] && args+=(--numel "$numel")
    [ -n "$repeats" ] && args+=(--repeats "$repeats")
    [ -n "$dense_repeats" ] && args+=(--dense-repeats "$dense_repeats")
    # Dense allreduce wire time (ring: 2(N-1)/N of the buffer) bounds the run time from below.
    n="${numel:-25557032}"
    dense_s="$(awk -v n="$n" -v r="$ranks" -v bps="$bps" 'BEGIN { printf "%d", 2 * (r - 1) / r * 4 * n * 8 / bps + 1 }')"
    collective_timeout=$((3 * dense_s + 60))
    limit="${run_timeout:-$((8 * dense_s + 180))}"
  elif [ "$bench" = command ]; then
    ((${#extra[@]})) || die "--bench command needs the command after --"
    limit="${run_timeout:-3600}"
  elif [ "$bench" = step ]; then
    # Replayed steps: the model (and so the run time) comes with the extra options.
    args=(bench step --json --link "$name" --bandwidth-gbit "$gbit")
    [ -n "$repeats" ] && args+=(--steps "$repeats")
    collective_timeout=600
    limit="${run_timeout:-3600}"
  else
    # Training: rank 0 writes one metrics line per epoch; Gloo binds to the address that routes
    # to MASTER_ADDR, so no --hostname.
    rm -f "$workdir/metrics.jsonl"
    args=(train --progress lines --metrics "$workdir/metrics.jsonl")
    collective_timeout=300
    limit="${run_timeout:-7200}"
  fi
  if [ "$bench" = command ]; then
    args=()
  else
    # A --timeout among the extra options (e.g. to test outages against it) replaces ours.
    [[ " ${extra[*]} " == *" --timeout "* ]] || args+=(--timeout "$collective_timeout")
    args+=("${extra[@]}")
  fi
  host_args=()
  [ "$bench" = train ] || host_args=(--hostname)
  echo "slow_network: link $name: rate $rate (tbf burst $b B), delay ${link_delay} ms and loss ${link_loss} per link, run limit ${limit}s: ${args[*]}"

  pids=()
  for ((i = 0; i < ranks; i++)); do
    if [ "$bench" = command ]; then
      ip netns exec "$(rank_ns "$i")" env MASTER_ADDR="$(rank_addr 0)" MASTER_PORT=29500 RANK="$i" \
        WORLD_SIZE="$ranks" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GLOO_SOCKET_IFNAME=eth0 "${extra[@]}" \
        >"$workdir/rank$i.out" 2>"$workdir/rank$i.err" &
    else
      ip netns exec "$(rank_ns "$i")" env MASTER_ADDR="$(rank_addr 0)" MASTER_PORT=29500 RANK="$i" \
        WORLD_SIZE="$ranks" "$dgc" "${args[@]}" ${host_args[@]:+"${host_args[@]}" "$(rank_addr "$i")"} \
        >"$workdir/rank$i.out" 2>"$workdir/rank$i.err" &
    fi
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
    echo "slow_network: link $name failed (status $status)" >&2
    failed=1
    continue
  fi
  pids=()
  if [ "$bench" = train ]; then
    lines="$(grep '^{' "$workdir/metrics.jsonl" 2>/dev/null || true)"
    grep -E '^(result|  compression ratio|  on the wire|  wall time|  exchange auto|  pipelined|  lr )' "$workdir/rank0.out" |
      sed "s/^/slow_network: link $name: /" || true
  else
    lines="$(grep '^{' "$workdir/rank0.out" || true)"
  fi
  [ -n "$lines" ] || { echo "slow_network: rank 0 printed no JSON on link $name" >&2; failed=1; continue; }
  if [ -n "$switch_pid" ] && ! kill -0 "$switch_pid" 2>/dev/null; then
    echo "slow_network: dgc-linkemu stopped during the run on link $name; result discarded" >&2
    failed=1
    continue
  fi
  if [ "$bench" = train ]; then
    rows+=("$(awk -v link="$name" -v r="$ranks" '
      function field(name,   m) {
        if (match($0, "\"" name "\":\"?[^,\"}]*")) {
          m = substr($0, RSTART, RLENGTH); sub(/^"[^"]*":"?/, "", m); return m
        }
        return ""
      }
      {
        c = field("compression"); seconds += field("seconds"); steps += field("iterations")
        train += field("train_seconds"); exch += field("exchange_seconds")
        wire += field("wire_bytes_sent"); epochs++
        metric = field("test_accuracy"); if (metric == "") metric = field("test_perplexity")
      }
      END {
        printf "%-8s %5d %-6s %6d %12s %9.1f %10.4f %10.4f %12.0f", link, r, c, epochs, metric,
               seconds, train / steps, exch / steps, wire
      }' <<<"$lines")")
  fi
  while read -r line; do
    if [ -n "$out" ]; then
      echo "${line%\}},\"profile\":\"$name\",\"rate\":\"$rate\",\"delay_ms\":$link_delay,\"loss\":$link_loss,\"tbf_burst_bytes\":$b,\"tbf_leaf\":\"${leaf:-fifo}\"}" >>"$out"
    fi
    [ "$bench" = train ] && continue
    if [ "$bench" = command ]; then
      rows+=("$name $line")
      continue
    fi
    if [ "$bench" = step ]; then
      rows+=("$(awk -v link="$name" -v r="$ranks" -v m="$(json_field "$line" model)" \
        -v c="$(json_field "$line" compute_seconds)" -v D="$(json_field "$line" step_seconds_dense)" \
        -v d="$(json_field "$line" step_seconds_dgc)" -v ed="$(json_field "$line" scaling_efficiency_dense)" \
        -v eg="$(json_field "$line" scaling_efficiency_dgc)" -v x="$(json_field "$line" dgc_exchange_seconds)" \
        -v w="$(json_field "$line" dgc_wire_seconds)" 'BEGIN {
          printf "%-8s %5d %-9s %9.3f %11.4f %11.4f %8.2f %8.3f %8.3f %11.4f %10.4f",
                 link, r, m, c, D, d, D / d, ed, eg, x, w }')")
      continue
    fi
    dgc_s="$(json_field "$line" dgc_seconds)"
    dense_s="$(json_field "$line" dense_seconds)"
    bound="$(json_field "$line" wire_bound_seconds)"
    dense_bound="$(json_field "$line" dense_wire_bound_seconds)"
    verified="$(json_field "$line" verified)"
    rows+=("$(awk -v rate="$name" -v r="$ranks" -v n="$(json_field "$line" numel)" \
      -v d="$dgc_s" -v D="$dense_s" -v b="$bound" -v B="$dense_bound" -v v="$verified" 'BEGIN {
        printf "%-8s %5d %10d %11.6f %11.6f %9.1f %11.6f %11.6f %10.2f %8s",
               rate, r, n, d, D, D / d, b, B, d / (b + 0.005), v }')")
  done <<<"$lines"
done

echo
stop_linkemu
if [ "$bench" = train ]; then
  printf "%-8s %5s %-6s %6s %12s %9s %10s %10s %12s\n" link ranks compr epochs test_metric \
    wall_s step_s exchange_s wire_bytes
  for row in "${rows[@]}"; do echo "$row"; done
  echo "(wall: all epochs with evaluation; step: training time per step; exchange: its part on rank 0; wire: rank 0 sent)"
elif [ "$bench" = command ]; then
  for row in "${rows[@]}"; do echo "$row"; done
elif [ "$bench" = step ]; then
  printf "%-8s %5s %-9s %9s %11s %11s %8s %8s %8s %11s %10s\n" link ranks model compute_s \
    step_dense step_dgc speedup eff_dns eff_dgc dgc_exch_s dgc_wire_s
  for row in "${rows[@]}"; do echo "$row"; done
  echo "(step = compute + the slowest rank's optimizer step, median; eff = one-rank step / N-rank step)"
else
  printf "%-8s %5s %10s %11s %11s %9s %11s %11s %10s %8s\n" link ranks numel dgc_s dense_s speedup \
    bound_s dense_bound "dgc/(b+5ms)" verified
  for row in "${rows[@]}"; do echo "$row"; done
  echo "(times: median over repeats of the slowest rank; bound: busiest link bytes / rate)"
fi
exit "$failed"
