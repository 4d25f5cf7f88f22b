#!/usr/bin/env bash
# `dgc train` and `dgc bench exchange` launched by the real torchrun agent (Debian's python3-torch
# at /usr/bin/python3), 2 and 4 processes on this host: the agent serves the c10d store on
# --master_port (TORCHELASTIC_USE_AGENT_STORE=True) and every worker is a client of it.
#
# Debian's torchrun 1.13 fails on Python 3.11 before it starts any worker (Std.from_str returns
# None); scripts/torchrun.py runs torchrun's own torch.distributed.run.main() with that one
# parser replaced. Skipped (exit 77) where python3-torch is not installed.
#   torchrun_test.sh DGC_BINARY TORCHRUN_PY
set -euo pipefail
dgc=$1
torchrun=$2
source "$(dirname "$0")/common.sh"

python=/usr/bin/python3
if ! "$python" -c "import torch.distributed.run" >/dev/null 2>&1; then
  echo "skipped: python3-torch is not installed (no torch at $python); scripts/setup.sh installs it"
  exit 77
fi

for n in 2 4; do
  port=$(free_port)
  timeout 150 "$python" "$torchrun" --nproc_per_node "$n" --master_addr 127.0.0.1 \
    --master_port "$port" --no_python "$dgc" bench exchange --numel 20000 --repeats 2 \
    --dense-repeats 1 --json --timeout 60 >"$work/bench$n.log" 2>&1 ||
    fail "torchrun --nproc_per_node $n dgc bench exchange failed"
  line=$(grep -o '{.*}' "$work/bench$n.log" | head -1)
  for want in '"verified":true' '"dense_verified":true' '"launch":"torchrun"' \
    "\"workers\":$n" '"backend":"gloo"'; do
    grep -qF "$want" <<<"$line" || fail "bench exchange, $n processes: no $want in: $line"
  done

  port=$(free_port)
  timeout 240 "$python" "$torchrun" --nproc_per_node "$n" --master_addr 127.0.0.1 \
    --master_port "$port" --no_python "$dgc" train --model mlp --epochs 1 \
    --train-examples 2000 --test-examples 500 --progress lines --timeout 120 \
    >"$work/train$n.log" 2>&1 || fail "torchrun --nproc_per_node $n dgc train failed"
  grep -qF "$n workers (torchrun (agent store at 127.0.0.1:$port), node 0, gloo" \
    "$work/train$n.log" || fail "train, $n processes: not through the agent's store"
  grep -q "^result: test accuracy" "$work/train$n.log" || fail "train, $n processes: no result"
  echo "torchrun --nproc_per_node $n: bench exchange verified, train finished"
done
echo "torchrun_test: ok"
