#!/usr/bin/env bash
# The real torchrun agent (scripts/torchrun.py) brings `dgc train --resume auto` back after a
# lost worker and after a lost node; one command line for the first attempt and every restart:
#   1. restart: --max_restarts 2, 3 workers, a checkpoint every 10 steps; the worker of local rank
#      1 SIGKILLed inside epoch 1, after its checkpoint of step 20; the agent restarts the group,
#      the job exits 0, the final checkpoint files of the 3 ranks equal those of the uninterrupted
#      run (the same command without the kill) byte for byte, and at most 10 steps are computed
#      twice. Prints the time from the kill to training again, split into its parts;
#   2. elastic shrink: 3 agents of one worker each, --nnodes 2:3 (c10d rendezvous on loopback, its
#      store served by a separate process as an etcd would be); one agent and its worker SIGKILLed
#      for good inside epoch 1; the other two restart at world size 2 from the last checkpoint
#      (the state of 3 handed over to 2), finish every epoch and exit 0.
# Skipped (exit 77) where python3-torch is not installed.
#   restart_test.sh DGC_BINARY TORCHRUN_PY
set -euo pipefail
dgc=$1
torchrun=$2
source "$(dirname "$0")/common.sh"

python=/usr/bin/python3
if ! "$python" -c "import torch.distributed.run" >/dev/null 2>&1; then
  echo "skipped: python3-torch is not installed (no torch at $python); scripts/setup.sh installs it"
  exit 77
fi
for v in RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK \
  TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_USE_AGENT_STORE OMP_NUM_THREADS \
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE; do
  unset "$v"
done

# Every agent runs under `timeout`, which makes it the leader of a process group of its own (the
# agent and its workers): stopped as a group on exit, whatever happened.
groups=()
stop_groups() {
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  sleep 0.3
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
}
trap 'stop_groups; cleanup' EXIT

# Each output line prefixed with the milliseconds since the epoch at which it arrived.
stamp() {
  local line
  while IFS= read -r line; do printf '%s %s\n' "$((${EPOCHREALTIME/./} / 1000))" "$line"; done
}
# agent LOG ARGS...: torchrun in the background, its output (and its workers') time-stamped.
agent() {
  local log=$1
  shift
  LOGLEVEL=INFO timeout 200 "$python" "$torchrun" --monitor_interval 1 "$@" \
    > >(stamp >"$work/$log") 2>&1 &
  groups+=($!)
  agent_pid=$!
}
# wait_agent PID SECONDS: its exit code in `code` (bounded).
wait_agent() {
  local end=$(($(now_ms) + $2 * 1000))
  while kill -0 "$1" 2>/dev/null; do
    [ "$(now_ms)" -lt "$end" ] || fail "torchrun $1 still running after $2 s"
    sleep 0.1
  done
  if wait "$1"; then code=0; else code=$?; fi
}
# wait_file PATH SECONDS
wait_file() {
  local end=$(($(now_ms) + $2 * 1000))
  while [ ! -f "$1" ]; do
    [ "$(now_ms)" -lt "$end" ] || fail "$1 did not appear within $2 s"
    sleep 0.05
  done
}
# worker_pid PREFIX VARIABLE=VALUE: the dgc worker whose command line holds PREFIX and whose
# environment holds the variable (bounded).
worker_pid() {
  local end=$(($(now_ms) + 30000)) p
  while [ "$(now_ms)" -lt "$end" ]; do
    for p in $(pgrep -x dgc || true); do
      tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF "$1" || continue
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "$2" || continue
      echo "$p"
      return
    done
    sleep 0.05
  done
  fail "no worker with $2 running on $1"
}
# first_ms LOG PATTERN: the time stamp of the first line of LOG matching PATTERN (grep -E).
first_ms() { grep -E "$2" "$1" | head -1 | cut -d' ' -f1; }

every=10
train=(train --model mlp --epochs 2 --train-examples 3000 --test-examples 300 --threads 1
  --progress lines --timeout 10 --checkpoint-every "$every" --checkpoint-keep 2 --resume auto)
single=(--nproc_per_node 3 --max_restarts 2 --master_addr 127.0.0.1 --no_python "$dgc")

# 1. The uninterrupted run, then the same command with a worker killed.
port=$(free_port)
agent reference.log --master_port "$port" "${single[@]}" "${train[@]}" --checkpoint "$work/reference"
wait_agent "$agent_pid" 180
[ "$code" = 0 ] || fail "the uninterrupted run exited $code"
grep -q "no checkpoint under .* yet: a new run (--resume auto)" "$work/reference.log" ||
  fail "the first attempt did not start fresh"

port=$(free_port)
agent restart.log --master_port "$port" "${single[@]}" "${train[@]}" --checkpoint "$work/kill"
job=$agent_pid
victim=$(worker_pid "$work/kill" LOCAL_RANK=1)
wait_file "$work/kill.step20.rank1" 120
kill -KILL "$victim"
t_kill=$(now_ms)
newest=$(ls "$work"/kill.step*.rank* | sed -E 's/.*\.step([0-9]+)\.rank.*/\1/' | sort -n | tail -1)
wait_agent "$job" 180
[ "$code" = 0 ] || fail "the job exited $code after the kill (the agent should have restarted it)"
resumed=$(grep -o "resumed from .*: step [0-9]*" "$work/restart.log" | head -1) ||
  fail "no restart from a checkpoint"
step=$(grep -o "[0-9]*$" <<<"$resumed")
for r in 0 1 2; do
  cmp -s "$work/reference.step64.rank$r" "$work/kill.step64.rank$r" ||
    fail "rank $r: the final checkpoint differs from the uninterrupted run's"
done
# Killed at a step in [newest, newest + every): resumed from newest, or from newest - every when
# the kill came between two ranks' writes of newest (the others then wait for it at that step).
[ "$step" -ge $((newest - every)) ] || fail "resumed from step $step, newest file was $newest"
# Where the time went, from the agent's and the restarted rank 0's time-stamped lines.
t_error=$(first_ms "$work/restart.log" "dgc: error:")
t_failed=$(first_ms "$work/restart.log" "Worker group FAILED")
t_started=$(grep -E "Starting worker group" "$work/restart.log" | sed -n 2p | cut -d' ' -f1)
t_again=$(first_ms "$work/restart.log" "training again")
line=$(grep "training again" "$work/restart.log" | head -1)
read -r command connect checkpoint < <(sed -E \
  's/.*training again ([0-9.]+) s after the command started: data and connect ([0-9.]+) s, checkpoint ([0-9.]+) s.*/\1 \2 \3/' <<<"$line")
ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 }'; }
echo "1. worker killed after step $newest was written; the job exited 0; final checkpoints of the 3"\
  "ranks identical to the uninterrupted run's; resumed from step $step (at most $every steps"\
  "recomputed)"
echo "   kill to training again: $((t_again - t_kill)) ms = detection by the agent" \
  "$((t_failed - t_kill)) ms (survivors' first error after $((t_error - t_kill)) ms) + agent" \
  "restart (stop, rendezvous, spawn) $((t_started - t_failed)) ms + process start-up (exec," \
  "loading libtorch) $((t_again - t_started - $(ms "$command"))) ms + data set and connect" \
  "$(ms "$connect") ms + checkpoint $(ms "$checkpoint") ms + model and handshake" \
  "$(($(ms "$command") - $(ms "$connect") - $(ms "$checkpoint"))) ms"

# 2. Elastic shrink: 3 agents, --nnodes 2:3, one killed for good.
store_port=$(free_port)
"$python" -c "
import time, datetime, torch.distributed as d
s = d.TCPStore('127.0.0.1', $store_port, is_master=True, timeout=datetime.timedelta(seconds=150),
               wait_for_workers=False)
print('store ready', flush=True)
time.sleep(150)" >"$work/store.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "store ready" "$work/store.log" && break; sleep 0.1; done
grep -q "store ready" "$work/store.log" || fail "the rendezvous store did not start"
elastic=(--nnodes 2:3 --nproc_per_node 1 --max_restarts 2 --rdzv_backend c10d
  --rdzv_endpoint "127.0.0.1:$store_port" --rdzv_id "shrink$$"
  --rdzv_conf "is_host=false,last_call_timeout=3" --no_python "$dgc")
nodes=()
for n in 0 1 2; do
  agent "elastic$n.log" "${elastic[@]}" "${train[@]}" --checkpoint "$work/shrink"
  nodes+=("$agent_pid")
done
wait_file "$work/shrink.step20.rank2" 150
victim_agent=${nodes[2]}
kill -KILL -- "-$victim_agent"
t_kill=$(now_ms)
for n in 0 1; do
  wait_agent "${nodes[$n]}" 180
  [ "$code" = 0 ] || fail "elastic: agent $n exited $code after another node was lost"
done
handed=$(grep -ho "resumed from .*(written by 3 workers; handed over to 2): step [0-9]*.*" \
  "$work"/elastic[01].log | head -1)
[ -n "$handed" ] || fail "elastic: no restart at 2 workers from the 3 workers' checkpoint"
grep -q "result: test accuracy" "$work"/elastic[01].log || fail "elastic: no result"
# 2 workers x 32 of 3000 examples: 47 iterations per epoch, 94 steps in all.
[ -f "$work/shrink.step94.rank1" ] || fail "elastic: the 2 workers did not finish at step 94"
t_again=$(grep -h "training again" "$work"/elastic[01].log | sort -n | tail -1 | cut -d' ' -f1)
t_failed=$(grep -h "Worker group FAILED" "$work"/elastic[01].log | sort -n | head -1 | cut -d' ' -f1)
t_complete=$(grep -h "Rendezvous complete" "$work"/elastic[01].log | sort -n | tail -1 | cut -d' ' -f1)
echo "2. elastic: one of 3 nodes lost for good, the 2 others restarted from the 3 workers'" \
  "checkpoint and finished (exit 0): ${handed}"
echo "   kill to training again: $((t_again - t_kill)) ms = detection by the agents" \
  "$((t_failed - t_kill)) ms + rendezvous without the lost node $((t_complete - t_failed)) ms" \
  "+ worker start-up to training $((t_again - t_complete)) ms"
echo "restart_test: ok"
