#!/usr/bin/env bash
# examples/train_fmnist.py --hook dgc under the real torchrun agent (scripts/torchrun.py) with
# --max_restarts 2 and --checkpoint: the worker of local rank 1 SIGKILLed after its checkpoint of
# step 20; the agent restarts the group, the example resumes from the newest step both ranks have,
# the job exits 0, and the final weights equal the uninterrupted run's (the same command without
# the kill) bit for bit (SHA-256 of the parameters). Every process is bounded by `timeout` and
# stopped on exit.
#   example_restart_test.sh PYTHON TORCHRUN_PY EXAMPLE
set -euo pipefail
python=$1
torchrun=$2
example=$3
source "$(dirname "$0")/../../tests/launch/common.sh"
for v in RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK \
  TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_USE_AGENT_STORE; do
  unset "$v"
done

every=10
args=(--train-examples 6000 --test-examples 500 --epochs 3 --checkpoint-every "$every")

# job LOG PREFIX: the example under torchrun in the background (its process group is the
# `timeout`'s own, killed on exit).
job() {
  timeout -k 10 240 "$python" "$torchrun" --nproc_per_node 2 --max_restarts 2 --monitor_interval 1 \
    --master_addr 127.0.0.1 --master_port "$(free_port)" "$example" "${args[@]}" \
    --checkpoint "$2" --json "$work/$1.json" >"$work/$1.log" 2>&1 &
  job_pid=$!
  pids+=("$job_pid")
}
finish() {
  if ! wait "$job_pid"; then fail "$1 did not exit 0"; fi
}
digest() { sed -n 's/.*"weights_sha256": "\([0-9a-f]*\)".*/\1/p' "$work/$1.json"; }

job reference "$work/reference"
finish "the uninterrupted run"
grep -q "no checkpoint under .* yet: a new run" "$work/reference.log" ||
  fail "the first attempt did not start fresh"

job restart "$work/kill"
end=$(($(now_ms) + 120000))
victim=
while [ -z "$victim" ]; do
  [ "$(now_ms)" -lt "$end" ] || fail "no worker of local rank 1 found"
  for p in $(pgrep -f "$work/kill" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF LOCAL_RANK=1 || continue
    tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qF train_fmnist.py || continue
    victim=$p
  done
  sleep 0.05
done
while [ ! -f "$work/kill.step20.rank1.pt" ]; do
  [ "$(now_ms)" -lt "$end" ] || fail "no checkpoint of step 20 within 120 s"
  sleep 0.02
done
kill -KILL "$victim"
finish "the run with a killed worker (the agent should have restarted it)"
resumed=$(grep -o "resumed from .*: step [0-9]*" "$work/restart.log" | head -1) ||
  fail "the restarted group did not resume from a checkpoint"
[ -n "$(digest reference)" ] || fail "no weights digest in the uninterrupted run's result"
[ "$(digest reference)" = "$(digest restart)" ] ||
  fail "final weights differ: $(digest reference) uninterrupted, $(digest restart) restarted"
echo "worker killed after step 20; $resumed; final weights identical: $(digest restart)"
