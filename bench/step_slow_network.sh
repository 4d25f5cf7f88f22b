#!/usr/bin/env bash
# Replayed training steps of large models over shaped links, for several rank counts:
# bench/slow_network.sh --bench step (`dgc bench step`: complete dense and DGC optimizer steps over
# a model's real tensor shapes, forward/backward replaced by a stated compute time) once per rank
# count, every profile in each; collects the JSON lines, writes a markdown table with the scaling
# efficiency of dense and DGC and which part of a DGC step is compression, exchange and wire time,
# and draws the step time and speedup against the number of ranks (dgc plot).
#
#   bench/step_slow_network.sh [--ranks "2 4 8"] [--profiles "1gbit 100mbit mobile"] [--out DIR]
#                              [--dgc PATH] [-- options of dgc bench step, e.g. --model resnet50]
#
# Defaults: --ranks "2 4 8", --profiles "1gbit 100mbit mobile", --out runs/step_slow_network,
# -- --model resnet50 --compute-seconds 0.1 --steps 3. Needs root (see bench/slow_network.sh).
# Writes OUT/steps.jsonl, OUT/step_slow_network.md and OUT/plots/*.{png,svg}. All ranks share
# this machine's cores: with more ranks than cores the compression of every rank competes for them.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

ranks_list="2 4 8"
profiles="1gbit 100mbit mobile"
out=runs/step_slow_network
dgc=build/bin/dgc
extra=(--model resnet50 --compute-seconds 0.1 --steps 3)
while (($#)); do
  case "$1" in
    --ranks) ranks_list=$2; shift 2 ;;
    --profiles) profiles=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dgc) dgc=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "step_slow_network: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$dgc" ] || { echo "step_slow_network: $dgc not found; build first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
jsonl="$out/steps.jsonl"
: >"$jsonl"
for ranks in $ranks_list; do
  echo "== $ranks ranks: bench/slow_network.sh --bench step --ranks $ranks --profiles \"$profiles\" -- ${extra[*]}"
  bench/slow_network.sh --bench step --ranks "$ranks" --profiles "$profiles" --dgc "$dgc" \
    --out "$jsonl" -- "${extra[@]}" 2>&1 | tee "$out/ranks$ranks.log"
done
[ -s "$jsonl" ] || { echo "step_slow_network: no results; see the logs in $out" >&2; exit 1; }

table="$out/step_slow_network.md"
{
  echo "| link | model | ranks | compute | dense step | DGC step | speedup | scaling eff. dense | scaling eff. DGC | DGC compress | DGC exchange | of it wire time | bytes sent per rank (DGC / dense) |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  paste -d ' ' <(field profile <"$jsonl") <(field model <"$jsonl") <(field workers <"$jsonl") \
    <(field compute_seconds <"$jsonl") <(field step_seconds_dense <"$jsonl") \
    <(field step_seconds_dgc <"$jsonl") <(field scaling_efficiency_dense <"$jsonl") \
    <(field scaling_efficiency_dgc <"$jsonl") <(field dgc_compress_seconds <"$jsonl") \
    <(field dgc_exchange_seconds <"$jsonl") <(field dgc_wire_seconds <"$jsonl") \
    <(field wire_bytes_sent_per_rank bytes_sent_per_rank <"$jsonl") \
    <(field dense_wire_bytes_per_rank dense_bytes_sent_per_rank <"$jsonl") |
    sort -k1,1 -k2,2 -k3,3n |
    awk '{
      printf "| %s | %s | %d | %.3f s | %.3f s | %.3f s | %.1fx | %.3f | %.3f | %.1f ms | %.1f ms | %.1f ms | %.2f MB / %.1f MB |\n",
             $1, $2, $3, $4, $5, $6, $5 / $6, $7, $8, 1e3 * $9, 1e3 * $10, 1e3 * $11, $12 / 1e6, $13 / 1e6
    }'
} >"$table"
"$dgc" plot "$jsonl" --out "$out/plots" --name replay >/dev/null
echo
cat "$table"
echo "step_slow_network: charts in $out/plots"
