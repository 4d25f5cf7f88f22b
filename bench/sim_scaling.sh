#!/usr/bin/env bash
# Runs dgc-sim (dgc/sim: the complete dense and DGC steps on a cluster simulated by SimGrid's
# SMPI) over models, platforms (bench/platforms/*.xml) and node counts, one smpirun per
# (model, platform, nodes), and appends rank 0's JSON lines to --out, each with the run's wall
# time and the simulator's peak memory (proportional set size, sampled every 2 s).
#
#   bench/sim_scaling.sh [--out FILE] [--sim PATH] [--models "alexnet resnet50"]
#                        [--platforms "ethernet-1g ethernet-10g"] [--nodes "1 4 16 64"]
#                        [--skip-existing] [-- options of dgc-sim, e.g. --steps 2 --overlap 0]
#
# SMPI settings (the same for every run; docs/scaling.md explains them):
#   smpi/host-speed 1Gf     = the platforms' host speed: 1 s of CPU here is 1 s simulated;
#   smpi/coll-selector ompi  Open MPI's choice of collective algorithms (the real backend);
#   smpi/bw-factor 0.97      TCP/IP over Ethernet carries 1448 payload bytes per 1500-byte frame
#                            (plus preamble and gaps), about 0.95-0.97 of the line rate;
#   smpi/lat-factor 1        the platform latency as written (SMPI's default factors, fitted to
#                            another cluster, multiply it by up to 11.6).
set -euo pipefail
cd "$(dirname "$0")/.."

out=sim_scaling.jsonl
sim=build/sim/dgc-sim
models="alexnet resnet50"
platforms="ethernet-1g ethernet-10g"
nodes="1 4 16 64"
skip_existing=0
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --sim) sim=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --platforms) platforms=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --skip-existing) skip_existing=1; shift ;;
    --) shift; break ;;
    *) echo "sim_scaling.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$sim" ] || { echo "sim_scaling.sh: $sim not found (build with SimGrid installed)" >&2; exit 1; }

hosts=$(mktemp)
trap 'rm -f "$hosts"' EXIT
for i in $(seq 0 255); do echo "node-$i"; done >"$hosts"

# peak_pss PID: the largest Pss (KiB) of PID's smpimain descendants until PID exits.
peak_pss() {
  local peak=0 p v
  while kill -0 "$1" 2>/dev/null; do
    for p in $(pgrep -P "$1" 2>/dev/null) $(pgrep -f "simgrid/smpimain.*--sim-run-$1" 2>/dev/null); do
      v=$(awk '/^Pss:/{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || true)
      [ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v
    done
    sleep 2
  done
  echo "$peak"
}

for model in $models; do
  for platform in $platforms; do
    for n in $nodes; do
      if ((skip_existing)) && [ -f "$out" ] &&
        grep "\"platform\":\"$platform\"" "$out" | grep -q "\"model\":\"$model\".*\"nodes\":$n,"; then
        echo "== $model $platform $n nodes: kept"
        continue
      fi
      echo "== $model $platform $n nodes"
      lines=$(mktemp)
      start=$(date +%s.%N)
      smpirun -np "$n" -platform "bench/platforms/$platform.xml" -hostfile "$hosts" \
        --cfg=smpi/host-speed:1Gf --cfg=smpi/coll-selector:ompi \
        --cfg=smpi/bw-factor:0:0.97 --cfg=smpi/lat-factor:0:1 \
        "$sim" --model "$model" --platform "$platform" "$@" >"$lines" 2>"$lines.err" &
      run=$!
      peak=$(peak_pss "$run")
      status=0
      wait "$run" || status=$?
      wall=$(echo "$(date +%s.%N) - $start" | bc)
      if [ "$status" -ne 0 ]; then
        grep -v 'xbt_cfg\|smpi_coll' "$lines.err" | tail -5 >&2
        echo "sim_scaling.sh: $model $platform $n nodes failed ($status)" >&2
        rm -f "$lines" "$lines.err"
        exit 1
      fi
      grep '^{' "$lines" | sed "s/}\$/,\"run_wall_s\":$wall,\"run_peak_pss_kib\":$peak}/" | tee -a "$out"
      rm -f "$lines" "$lines.err"
    done
  done
done
