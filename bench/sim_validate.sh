#!/usr/bin/env bash
# Checks the simulated cluster (dgc-sim, docs/scaling.md) against measured links: the exchange
# times of the dense allreduce and of the three DGC exchanges on the ResNet-50-sized gradient,
# (a) measured in network namespaces with bench/slow_network.sh (`dgc bench exchange`, compute
# excluded, ranks idle, Gloo over TCP, one process per rank), and (b) simulated with dgc-sim on
# the matching platform file (SMPI's MPI, compute set to 0, a barrier before each exchange as in
# `dgc bench exchange`). Prints one table: simulated, and per tbf bucket setting the measured
# time and the error (simulated / measured - 1).
#
#   bench/sim_validate.sh [--ranks "2 4 8"] [--profiles "1gbit 100mbit"] [--dir DIR]
#                         [--dgc PATH] [--sim PATH] [--repeats N] [--dense-repeats N]
#                         [--bursts "default 15140"] [--no-chrt] [--skip-measured]
#                         [--skip-simulated] [--table-only]
#
#   --dir DIR        where the JSON lines go (appended): DIR/measured-burst-B.jsonl per bucket B,
#                    DIR/simulated.jsonl; --table-only prints the table of what is there.
#                    Default runs/sim-validate
#   --repeats N      timed DGC exchanges per measured run (median; default 10)
#   --dense-repeats N  timed dense allreduces per measured run (default 1; every run has one, so
#                    each (ranks, link) gets three: the table takes their median)
#   --bursts "B ..."  the tc tbf buckets of the measured links, one set of runs (and one pair of
#                    columns) each: "default" is slow_network.sh's own (1 ms at the rate: 125 KB at
#                    1 Gbit/s, 12.5 KB at 100 Mbit/s), a number is bytes (15140: ten 1514-byte
#                    frames, 121 us at 1 Gbit/s). A large bucket lets the first bytes of a message
#                    leave at the veth's speed (a third of a 2-rank DGC message at 1 Gbit/s), where
#                    a real link sends every byte at its rate; a small one wakes the shaper more
#                    often and costs the ranks CPU. Default: "default 15140"
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
bursts="default 15140"
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
    --bursts) bursts=$2; shift 2 ;;
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

# Output file and table label of a bucket setting.
burst_file() { echo "$dir/measured-burst-$1.jsonl"; }
burst_label() {
  if [ "$1" = default ]; then echo "tbf bucket 1 ms"; else echo "tbf bucket $1 B"; fi
}

if ((measured)); then
  prefix=()
  ((chrt)) && prefix=(chrt -f 10)
  for burst in $bursts; do
    burst_option=()
    [ "$burst" = default ] || burst_option=(--burst "$burst")
    for r in $ranks; do
      for algorithm in allgather direct sparse-allreduce; do
        echo "== measured: $r ranks, $algorithm, links: $profiles, tbf bucket: $burst"
        "${prefix[@]}" bench/slow_network.sh --ranks "$r" --profiles "$profiles" --dgc "$dgc" \
          --repeats "$repeats" --dense-repeats "$dense_repeats" "${burst_option[@]}" \
          --out "$(burst_file "$burst")" \
          -- --exchange "$algorithm" --numel 25502912 --dense-numel 54120
      done
    done
  done
fi

if ((simulated)); then
  echo "== simulated: nodes $ranks, platforms$platforms"
  bench/sim_scaling.sh --sim "$sim" --out "$dir/simulated.jsonl" --models resnet50 \
    --platforms "${platforms# }" --nodes "$ranks" \
    -- --compute-seconds 0 --steps 3 --exchange-barrier
fi

columns=()
for burst in $bursts; do columns+=("$(burst_label "$burst")=$(burst_file "$burst")"); done
python3 bench/sim_validate_table.py "$dir/simulated.jsonl" "${columns[@]}"
