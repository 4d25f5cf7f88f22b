#!/usr/bin/env bash
# Checks the simulated cluster (dgc-sim, docs/scaling.md) against measured links: the exchange
# times of the dense allreduce and of the three DGC exchanges on the ResNet-50-sized gradient,
# (a) measured in network namespaces with bench/slow_network.sh (`dgc bench exchange`, compute
# excluded, ranks idle, Gloo over TCP, one process per rank), and (b) simulated with dgc-sim on
# the matching platform file (SMPI's MPI, compute set to 0, a barrier before each exchange as in
# `dgc bench exchange`). Prints one table: simulated, measured and the error of each
# (simulated / measured - 1).
#
#   bench/sim_validate.sh [--ranks "2 4 8"] [--profiles "1gbit 100mbit"] [--dir DIR]
#                         [--dgc PATH] [--sim PATH] [--repeats N] [--dense-repeats N]
#                         [--no-chrt] [--skip-measured] [--skip-simulated] [--table-only]
#
#   --dir DIR        where the JSON lines go: DIR/measured.jsonl, DIR/simulated.jsonl (appended;
#                    --table-only just prints the table of what is there). Default runs/sim-validate
#   --repeats N      timed DGC exchanges per measured run (median; default 10)
#   --dense-repeats N  timed dense allreduces per measured run (default 1; every run has one, so
#                    each (ranks, link) gets three: the table takes their median)
#   --no-chrt        do not run the measured ranks at real-time priority (chrt -f 10, the default,
#                    keeps other processes from delaying them; docs/exchange-benchmark.md)
#
# The measured gradient: one compressed tensor of 25,502,912 elements plus a dense-path tensor of
# 54,120 (ResNet-50's parameters on the compressed and on the dense path; density 0.001; uniform
# random values, so the ranks' selections are independent). The simulated one: ResNet-50's real
# tensor shapes, overlap 0 (independent selections). Measured runs need root (namespaces, tc).
# Links: 1gbit <-> bench/platforms/ethernet-1g.xml, 100mbit <-> ethernet-100m.xml.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks="2 4 8"
profiles="1gbit 100mbit"
dir=runs/sim-validate
dgc=build/bin/dgc
sim=build/sim/dgc-sim
repeats=10
dense_repeats=1
chrt=1
measured=1
simulated=1
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --profiles) profiles=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --sim) sim=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --dense-repeats) dense_repeats=$2; shift 2 ;;
    --no-chrt) chrt=0; shift ;;
    --skip-measured) measured=0; shift ;;
    --skip-simulated) simulated=0; shift ;;
    --table-only) measured=0; simulated=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sim_validate.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"

platform_of() {
  case "$1" in
    1gbit) echo ethernet-1g ;;
    100mbit) echo ethernet-100m ;;
    *) echo "sim_validate.sh: no platform file for profile '$1' (1gbit or 100mbit)" >&2; exit 2 ;;
  esac
}
platforms=""
for p in $profiles; do platforms="$platforms $(platform_of "$p")"; done

if ((measured)); then
  prefix=()
  ((chrt)) && prefix=(chrt -f 10)
  for r in $ranks; do
    for algorithm in allgather direct sparse-allreduce; do
      echo "== measured: $r ranks, $algorithm, links: $profiles"
      "${prefix[@]}" bench/slow_network.sh --ranks "$r" --profiles "$profiles" --dgc "$dgc" \
        --repeats "$repeats" --dense-repeats "$dense_repeats" --out "$dir/measured.jsonl" \
        -- --exchange "$algorithm" --numel 25502912 --dense-numel 54120
    done
  done
fi

if ((simulated)); then
  echo "== simulated: nodes $ranks, platforms$platforms"
  bench/sim_scaling.sh --sim "$sim" --out "$dir/simulated.jsonl" --models resnet50 \
    --platforms "${platforms# }" --nodes "$ranks" \
    -- --compute-seconds 0 --steps 3 --exchange-barrier
fi

python3 bench/sim_validate_table.py "$dir/measured.jsonl" "$dir/simulated.jsonl"
