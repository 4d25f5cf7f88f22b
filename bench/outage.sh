#!/usr/bin/env bash
# What a link outage costs a training run: `dgc train` over the mobile profile
# (bench/slow_network.sh: 20 Mbit/s, 10 ms one way per link, 0.05% loss per link), once without
# an outage and once per outage length D, rank 1's link taken down for D seconds once training is
# under way (dgc-linkemu --signal-outage, signalled WAIT seconds after rank 0 printed its
# start-up lines, which it does right before its first step). Prints one row per run: the
# outage, the exit status, the wall time of the run, the final test accuracy, and the slowest
# single exchange of the run (rank 0's `exchange_seconds_max`) and its excess over the run
# without an outage: the time the outage cost, read from the one step that waited it out, so that
# it does not depend on how fast the rest of the run went on a shared machine. Rank 0's metrics
# go to DIR/outage-D.jsonl.
#
#   bench/outage.sh [--outages "1 10 60"] [--ranks 2] [--timeout 60] [--wait 10] [--dgc PATH]
#                   [--out DIR] [-- extra dgc train flags]
#
# Defaults: the mlp on 20,000 examples, 2 epochs, DGC (d = 0.001), 2 ranks; needs what
# slow_network.sh needs (root, network namespaces, iproute2, ping). Logs go to DIR
# (runs/outage).
set -euo pipefail
cd "$(dirname "$0")/.."

outages="1 10 60"
ranks=2
timeout_s=60
wait_s=10
dgc=build/bin/dgc
out=runs/outage
extra=(--model mlp --epochs 2 --train-examples 20000 --test-examples 2000 --threads 1)
while (($#)); do
  case "$1" in
    --outages) outages=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --wait) wait_s=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "outage.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

run_pid=""
stop() { [ -z "$run_pid" ] || kill -TERM "$run_pid" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT

# one D: a run with rank 1's link down for D seconds (0: no outage); sets `row`.
one() {
  local d=$1 log="$out/outage-$1.log" start end status=0 pid emu
  rm -f "$out/outage-$d.jsonl"
  local emu_args=()
  [ "$d" = 0 ] || emu_args=(--linkemu-args "--signal-outage vr1:$d")
  start=$(date +%s%3N)
  bench/slow_network.sh --bench train --profiles mobile --ranks "$ranks" --dgc "$dgc" \
    --run-timeout 1200 --out "$out/outage-$d.jsonl" "${emu_args[@]}" -- "${extra[@]}" --timeout "$timeout_s" >"$log" 2>&1 &
  run_pid=$!
  if [ "$d" != 0 ]; then
    # Rank 0 (a dgc child of the script) prints its start-up lines right before its first step:
    # then WAIT seconds of training, then the outage.
    local rank0="" output=""
    for _ in $(seq 6000); do
      kill -0 "$run_pid" 2>/dev/null || break
      for pid in $(pgrep -P "$run_pid" -x "$(basename "$dgc" | cut -c1-15)" || true); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx RANK=0 && rank0=$pid
      done
      [ -n "$rank0" ] && output=$(readlink "/proc/$rank0/fd/1" 2>/dev/null || true)
      [ -n "$output" ] && grep -q "^  job " "$output" 2>/dev/null && break
      sleep 0.1
    done
    sleep "$wait_s"
    emu=$(pgrep -P "$run_pid" -x dgc-linkemu || true)
    [ -n "$emu" ] && kill -USR1 "$emu"
  fi
  wait "$run_pid" || status=$?
  run_pid=""
  end=$(date +%s%3N)
  local accuracy wall slowest excess=-
  accuracy=$(sed -nE 's/.*result: test accuracy ([0-9.]+%).*/\1/p' "$log" | head -1)
  wall=$(sed -nE 's/.*  wall time: (.*)/\1/p' "$log" | head -1)
  # No metrics when the run ended at its timeout (the outage outlasted it).
  slowest=$( (sed -nE 's/.*"exchange_seconds_max":([0-9.eE+-]+).*/\1/p' "$out/outage-$d.jsonl" \
    2>/dev/null || true) | sort -g | tail -1)
  [ "$d" = 0 ] && baseline_slowest=$slowest
  if [ -n "$slowest" ] && [ -n "${baseline_slowest:-}" ] && [ "$d" != 0 ]; then
    excess=$(awk -v a="$slowest" -v b="$baseline_slowest" 'BEGIN { printf "%.1f s", a - b }')
  fi
  [ -z "$slowest" ] || slowest=$(awk -v a="$slowest" 'BEGIN { printf "%.2f s", a }')
  row=$(printf "%-8s %6s %10s %12s %10s %14s %10s" "${d} s" "$status" "${wall:--}" \
    "$(((end - start)))" "${accuracy:--}" "${slowest:--}" "$excess")
  grep -h "linkemu: vr1 \(down\|up\)" "$log" | sed "s/^/  /" >&2 || true
}

echo "outage.sh: $ranks ranks, mobile profile, --timeout $timeout_s, dgc train ${extra[*]}"
echo "outage.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-8s %6s %10s %12s %10s %14s %10s\n" outage status "wall (dgc)" "script (ms)" accuracy \
  "slowest exch." "its excess"
for d in 0 $outages; do
  one "$d"
  echo "$row"
done
echo "outage.sh: load $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"
