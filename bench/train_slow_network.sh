#!/usr/bin/env bash
# Training over shaped links: `dgc train`, dense and DGC, with 4 ranks, each in its own network
# namespace (bench/slow_network.sh --bench train), per link profile. Records per run the time per
# step (and its exchange part), the wall time, the final test accuracy and the bytes on the wire,
# and, per profile, the wall time each run needed to reach the dense run's final accuracy less
# 0.5 points; draws the test accuracy by epoch and by wall time (dgc plot), dense against DGC, one
# chart pair per profile, with the target accuracy drawn as a dashed line.
#
#   bench/train_slow_network.sh [--profiles "100mbit mobile"] [--ranks 4] [--out DIR]
#                               [--direct] [--stated-link] [--dgc PATH]
#                               [-- extra `dgc train` options for every run]
#
# Defaults: --profiles "1gbit 100mbit mobile", --ranks 4, --out runs/train_slow_network; the runs
# use the default CNN on Fashion-MNIST with `dgc train`'s defaults (4 epochs, DGC d = 0.001 after
# a one-epoch warm-up); shorten them with e.g. -- --train-examples 15000. Needs root (see
# bench/slow_network.sh). --direct adds a third run per profile, dgc-direct: DGC with --exchange
# direct (two rounds of latency per exchange instead of the ring's 2(N-1)). --stated-link: the DGC
# run states its link as a user on it would (`--exchange auto --link PLATFORM`, the profile's
# platform of bench/platforms: 1gbit ethernet-1g, 100mbit ethernet-100m, mobile mobile), so it
# runs the exchange `dgc plan`'s cost model predicts fastest and, on the mobile link, the
# pipelined step; the dense run stays `dgc train`'s default, buckets overlapped with the backward
# pass. Writes OUT/<profile>/{dense,dgc,dgc-direct}.jsonl (rank 0's --metrics lines with the link fields), the
# logs (.log), OUT/<profile>/plots/*.{png,svg} and the table OUT/train_slow_network.md.
# Targets (issues): over 100mbit and mobile, DGC reaches the dense run's final accuracy (within 0.5
# points) in at most half of dense's wall time; over mobile with --stated-link (pipelined), in at
# most a quarter of the overlapped dense run's.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

profiles="1gbit 100mbit mobile"
ranks=4
out=runs/train_slow_network
dgc=build/bin/dgc
runs="dense dgc"
stated_link=0
extra=()
while (($#)); do
  case "$1" in
    --profiles) profiles=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --direct) runs="dense dgc dgc-direct"; shift ;;
    --stated-link) stated_link=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_slow_network: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$dgc" ] || { echo "train_slow_network: $dgc not found; build first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"

# platform_of PROFILE: the platform of bench/platforms that describes the profile's link.
platform_of() {
  case "$1" in
    1gbit) echo ethernet-1g ;;
    100mbit) echo ethernet-100m ;;
    mobile) echo mobile ;;
    *) echo "train_slow_network: --stated-link knows no platform for profile $1" >&2; exit 2 ;;
  esac
}

if ((stated_link)); then
  for profile in $profiles; do platform_of "$profile" >/dev/null; done
fi

table="$out/train_slow_network.md"
{
  echo "| link | ranks | run | final test accuracy | wall time | time per step | of it exchange | wire bytes sent (rank 0) | time to dense's final accuracy - 0.5 points | DGC speed-up to that accuracy |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
} >"$table"
for profile in $profiles; do
  dir="$out/$profile"
  mkdir -p "$dir"
  for run in $runs; do
    case "$run" in
      dense) flags=(--compression none) ;;
      dgc) flags=(--compression dgc)
        if ((stated_link)); then flags+=(--exchange auto --link "$(platform_of "$profile")"); fi ;;
      dgc-direct) flags=(--compression dgc --exchange direct) ;;
    esac
    rm -f "$dir/$run.jsonl"
    echo "== $profile, $run: bench/slow_network.sh --bench train --ranks $ranks --profiles $profile -- ${flags[*]} ${extra[*]}"
    bench/slow_network.sh --bench train --ranks "$ranks" --profiles "$profile" --dgc "$dgc" \
      --out "$dir/$run.jsonl" -- "${flags[@]}" "${extra[@]}" 2>&1 |
      tee "$dir/$run.log"
    [ -s "$dir/$run.jsonl" ] || { echo "train_slow_network: no metrics from the $profile $run run; see $dir/$run.log" >&2; exit 1; }
  done
  target=$(tail -n 1 "$dir/dense.jsonl" | field test_accuracy | awk '{ printf "%.6f", $1 - 0.005 }')
  declare -A reach=()
  for run in $runs; do
    # Wall time (cumulative "seconds") at the end of the first epoch at or above the target.
    reach[$run]=$(paste -d ' ' <(field seconds <"$dir/$run.jsonl") <(field test_accuracy <"$dir/$run.jsonl") |
      awk -v t="$target" '{ s += $1 } $2 >= t && !found { printf "%.1f", s; found = 1 } END { if (!found) print "-" }')
  done
  for run in $runs; do
    paste -d ' ' <(field seconds <"$dir/$run.jsonl") <(field train_seconds <"$dir/$run.jsonl") \
      <(field exchange_seconds <"$dir/$run.jsonl") <(field iterations <"$dir/$run.jsonl") \
      <(field wire_bytes_sent <"$dir/$run.jsonl") <(field test_accuracy <"$dir/$run.jsonl") |
      awk -v link="$profile" -v r="$ranks" -v run="$run" -v reach="${reach[$run]}" \
        -v dense_reach="${reach[dense]}" -v target="$target" '
        { s += $1; train += $2; exch += $3; steps += $4; wire += $5; acc = $6 }
        END {
          speedup = (run != "dense" && reach != "-" && dense_reach != "-") ? sprintf("%.2fx", dense_reach / reach) : ""
          printf "| %s | %d | %s | %.2f%% | %.1f s | %.1f ms | %.1f ms | %.1f MB | %s (target %.2f%%) | %s |\n",
                 link, r, run, 100 * acc, s, 1e3 * train / steps, 1e3 * exch / steps, wire / 1e6,
                 (reach == "-" ? "not reached" : reach " s"), 100 * target, speedup
        }' >>"$table"
  done
  files=() labels=()
  for run in $runs; do
    files+=("$dir/$run.jsonl")
    case "$run" in
      dense) labels+=(--label dense) ;;
      dgc) labels+=(--label "$( ((stated_link)) && echo "DGC, --link $(platform_of "$profile")" || echo DGC)") ;;
      dgc-direct) labels+=(--label "DGC, direct exchange") ;;
    esac
  done
  "$dgc" plot "${files[@]}" "${labels[@]}" --out "$dir/plots" --name "train-$profile" \
    --title "$profile, $ranks ranks" --target "$target" \
    --target-label "dense's final accuracy - 0.5 points" >/dev/null
  echo "train_slow_network: charts in $dir/plots"
done
echo
cat "$table"
