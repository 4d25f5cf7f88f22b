#!/usr/bin/env bash
# The DDP hook under the real torchrun agent (scripts/torchrun.py: Debian's torchrun 1.13 with its
# Python 3.11 parser fixed), 2 and 4 processes: the hook equals the C++ DistributedOptimizer, and
# a state dict resumes bit for bit. Every process is bounded by `timeout`.
#   torchrun_test.sh PYTHON TORCHRUN_PY HOOK_WORKER
set -euo pipefail
python=$1
torchrun=$2
worker=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

run() {
  local n=$1 case=$2
  if ! timeout -k 10 200 "$python" "$torchrun" --nproc_per_node "$n" --master_addr 127.0.0.1 \
    --master_port "$(free_port)" "$worker" "$case" >"$work/$case$n.log" 2>&1; then
    echo "FAIL: torchrun --nproc_per_node $n hook_worker.py $case" >&2
    tail -n 40 "$work/$case$n.log" >&2
    exit 1
  fi
  grep -q "rank 0 of $n: launched by torchrun" "$work/$case$n.log" || {
    echo "FAIL: $case, $n processes: not started by torchrun's agent" >&2
    exit 1
  }
  echo "torchrun --nproc_per_node $n $case: ok"
}

run 2 equivalence
run 4 equivalence
run 2 resume
echo "python torchrun_test: ok"
