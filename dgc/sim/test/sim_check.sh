#!/usr/bin/env bash
# Tests of dgc-sim (the simulated cluster), run by CTest:
#   sim_check.sh DGC_SIM PLATFORMS_DIR platforms   every platform file loads: a 2-host run of the
#                                                  small CNN on each gives its JSON line
#   sim_check.sh DGC_SIM PLATFORMS_DIR check       4 simulated hosts, every rank compressing for
#                                                  real with private buffers: every step's update
#                                                  of every exchange algorithm equals the
#                                                  reference computed from all ranks' selections
#                                                  (dgc/exchange/reference.h), and the dense
#                                                  allreduce sums, no mismatch
set -euo pipefail
sim=$1 platforms=$2 mode=$3
hosts=$(mktemp)
trap 'rm -f "$hosts"' EXIT
for i in $(seq 0 255); do echo "node-$i"; done >"$hosts"
run() {  # run NP PLATFORM ARGS...
  local np=$1 platform=$2
  shift 2
  timeout 120 smpirun -np "$np" -platform "$platforms/$platform.xml" -hostfile "$hosts" \
    --cfg=smpi/host-speed:1Gf --cfg=smpi/coll-selector:ompi "$sim" --model cnn \
    --platform "$platform" "$@" 2>/dev/null
}
case "$mode" in
  platforms)
    count=0
    for f in "$platforms"/*.xml; do
      p=$(basename "$f" .xml)
      line=$(run 2 "$p" --algorithms allgather --steps 1 --warmup-steps 1)
      echo "$line"
      echo "$line" | grep '"nodes":2,' | grep -q "\"platform\":\"$p\"" || {
        echo "FAIL: platform $p gave no result line" >&2
        exit 1
      }
      count=$((count + 1))
    done
    [ "$count" -ge 7 ] || { echo "FAIL: found $count platform files, expected 7" >&2; exit 1; }
    ;;
  check)
    out=$(run 4 ethernet-1g --algorithms dense,allgather,direct,sparse-allreduce --private-buffers \
      --check --sample-ranks 0 --steps 3 --warmup-steps 0 --overlap 0.3)
    echo "$out"
    for a in dense allgather direct sparse-allreduce; do
      echo "$out" | grep "\"algorithm\":\"$a\"" | grep -q '"check_mismatches":0,' || {
        echo "FAIL: $a: no line with check_mismatches 0" >&2
        exit 1
      }
    done
    # Every rank is sampled here, so the slowest sampled rank's exchange is the slowest rank's.
    echo "$out" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["exchange_sampled_s"] != r["exchange_s"]:
        sys.exit("FAIL: %s: exchange_sampled_s %r != exchange_s %r" % (r["algorithm"], r["exchange_sampled_s"], r["exchange_s"]))
'
    ;;
  *) echo "usage: sim_check.sh DGC_SIM PLATFORMS_DIR platforms|check" >&2; exit 2 ;;
esac
echo "PASS"
