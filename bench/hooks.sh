#!/usr/bin/env bash
# DDP communication hooks side by side: examples/train_fmnist.py (the CNN of `dgc train` in plain
# PyTorch) with dense DDP, PyTorch's fp16 hook, PowerSGD rank 1 and rank 4, and the DGC hook, same
# model, data, seed and schedule, N processes over Gloo (spawned like torchrun's workers: RANK,
# WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on loopback, or with --network PROFILE each in its own
# network namespace behind a shaped link (bench/slow_network.sh --bench command; PROFILE 1gbit,
# 100mbit or mobile; needs root). Writes one JSON line per hook to OUT/results.jsonl, each run's
# log to OUT/<hook>.log, and prints the table (bench/hooks_table.py).
#
#   bench/hooks.sh [--out DIR] [--ranks 4] [--hooks "none fp16 powersgd1 powersgd4 dgc"]
#                  [--network PROFILE] [--run-timeout S]
#                  [-- options of examples/train_fmnist.py, e.g. --epochs 3]
#
# Needs the Python package built (build/python) and Debian's python3-torch at /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/hooks
ranks=4
hooks="none fp16 powersgd1 powersgd4 dgc"
run_timeout=3600
network=""
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --hooks) hooks=$2; shift 2 ;;
    --run-timeout) run_timeout=$2; shift 2 ;;
    --network) network=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hooks.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
python=/usr/bin/python3
[ -f build/python/dgc/__init__.py ] || { echo "hooks.sh: build the Python package first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
: >"$out/results.jsonl"
echo "hooks.sh: $ranks processes, ${network:-loopback}, $(date -u +%Y-%m-%dT%H:%M:%SZ), load average:$(uptime | sed 's/.*load average://')"
for hook in $hooks; do
  case "$hook" in
    powersgd*) args=(--hook powersgd --powersgd-rank "${hook#powersgd}") ;;
    *) args=(--hook "$hook") ;;
  esac
  echo "hooks.sh: $hook: train_fmnist.py ${args[*]} $*"
  status=0
  if [ -n "$network" ]; then
    # Rank 0 runs in a namespace: its result comes back as the JSON line slow_network.sh prints.
    bench/slow_network.sh --bench command --ranks "$ranks" --profiles "$network" \
      --run-timeout "$run_timeout" -- env PYTHONPATH=build/python OMP_NUM_THREADS=1 "$python" \
      examples/train_fmnist.py "${args[@]}" "$@" >"$out/$hook.log" 2>&1 &&
      grep "^$network {" "$out/$hook.log" | sed "s/^$network //" >>"$out/results.jsonl" ||
      status=$?
  else
    PYTHONPATH=build/python OMP_NUM_THREADS=1 "$python" python/test/spawn_ranks.py "$ranks" \
      "$run_timeout" "$python" examples/train_fmnist.py "${args[@]}" --json "$out/results.jsonl" \
      "$@" >"$out/$hook.log" 2>&1 || status=$?
  fi
  if ((status != 0)); then
    echo "hooks.sh: $hook failed; its log:" >&2
    tail -n 30 "$out/$hook.log" >&2
    exit 1
  fi
  { grep '^epoch' "$out/$hook.log" || true; } | sed 's/^/  /'
  echo "  load average:$(uptime | sed 's/.*load average://')"
done
"$python" bench/hooks_table.py "$out/results.jsonl"
