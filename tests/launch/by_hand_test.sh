#!/usr/bin/env bash
# The four variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set by hand, as a script or a
# scheduler would: rank 0 serves the c10d store on MASTER_PORT for the rendezvous only.
#   - dgc bench exchange, 2 processes, then a second run on the same port right after;
#   - dgc train, 2 processes with LOCAL_WORLD_SIZE=2: libtorch threads = cores / 2 each;
#   - MASTER_PORT taken by another program: every rank says so, within the timeout;
#   - nothing at MASTER_ADDR:MASTER_PORT (loopback, nothing listening), by hand and with
#     torchrun's agent variables but no agent: every rank says what to do, within the timeout.
#   by_hand_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
source "$(dirname "$0")/common.sh"

launch_vars=(RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK
  TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_USE_AGENT_STORE OMP_NUM_THREADS
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE)
for v in "${launch_vars[@]}"; do unset "$v"; done

# start NAME RANK WORLD PORT [VAR=value...] -- ARGS...: one rank in the background (bounded).
start() {
  local name=$1 rank=$2 world=$3 port=$4
  shift 4
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  env RANK="$rank" WORLD_SIZE="$world" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "${vars[@]}" \
    timeout "${run_timeout:-120}" "$dgc" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
}
# finish: waits for the started ranks; sets `codes` to their exit codes in start order.
finish() {
  codes=()
  for pid in "${pids[@]}"; do
    if wait "$pid"; then codes+=(0); else codes+=($?); fi
  done
  pids=()
}

bench=(bench exchange --numel 20000 --repeats 2 --dense-repeats 1 --json --timeout 60)

# 1. Two processes, rank 0 serving; rank 1 starts first and waits for it.
port=$(free_port)
start run1-rank1 1 2 "$port" -- "${bench[@]}"
sleep 0.5
start run1-rank0 0 2 "$port" -- "${bench[@]}"
finish
[ "${codes[*]}" = "0 0" ] || fail "first run on port $port: exit codes ${codes[*]}"
grep -q '"verified":true' "$work/run1-rank0.log" || fail "first run: not verified"

# 2. Again on the same port right after: rank 0 stopped serving when the rendezvous ended.
start run2-rank0 0 2 "$port" -- "${bench[@]}"
start run2-rank1 1 2 "$port" -- "${bench[@]}"
finish
[ "${codes[*]}" = "0 0" ] || fail "second run on port $port: exit codes ${codes[*]}"
grep -q '"verified":true' "$work/run2-rank0.log" || fail "second run: not verified"
echo "two runs on port $port, one after the other: ok"

# 3. dgc train with LOCAL_WORLD_SIZE=2 (and no OMP_NUM_THREADS): cores / 2 threads per worker.
cores=$(nproc)
threads=$((cores / 2 > 0 ? cores / 2 : 1))
port=$(free_port)
train=(train --model mlp --epochs 1 --train-examples 2000 --test-examples 500 --progress lines
  --timeout 60)
start train-rank0 0 2 "$port" LOCAL_WORLD_SIZE=2 LOCAL_RANK=0 -- "${train[@]}"
start train-rank1 1 2 "$port" LOCAL_WORLD_SIZE=2 LOCAL_RANK=1 -- "${train[@]}"
finish
[ "${codes[*]}" = "0 0" ] || fail "train by hand: exit codes ${codes[*]}"
grep -qF "2 workers (MASTER_ADDR/MASTER_PORT (rank 0 serves the store at 127.0.0.1:$port), gloo, $threads libtorch threads each)" \
  "$work/train-rank0.log" || fail "train by hand: expected $threads threads per worker on $cores cores"
grep -q "^result: test accuracy" "$work/train-rank0.log" || fail "train by hand: no result"
echo "train by hand, LOCAL_WORLD_SIZE=2 on $cores cores: $threads threads per worker: ok"

# 4. MASTER_PORT held by another program (a listener that never answers): rank 0 cannot serve,
#    rank 1 reaches something that is not a store; both say so within the 3 s timeout.
port=$(free_port)
python3 -c "
import socket, sys, time
s = socket.socket(); s.bind(('0.0.0.0', $port)); s.listen(8); print('listening', flush=True)
time.sleep(60)" >"$work/holder.out" 2>&1 &
holder=$!
extra_cleanup='kill "$holder" 2>/dev/null || true'
for _ in $(seq 1 300); do grep -q listening "$work/holder.out" && break; sleep 0.1; done
grep -q listening "$work/holder.out" || fail "could not hold port $port"
taken=(bench exchange --numel 1000 --repeats 1 --timeout 3)
# A rank that hung would be killed at 60 s (exit 124, no message); the messages below say the 3 s
# bound was applied. The elapsed bound is loose: starting a process that loads libtorch takes
# seconds, tens of seconds on a heavily loaded 2-core machine.
run_timeout=60
t0=$(now_ms)
start taken-rank0 0 2 "$port" -- "${taken[@]}"
start taken-rank1 1 2 "$port" -- "${taken[@]}"
finish
elapsed=$(($(now_ms) - t0))
[ "${codes[*]}" = "1 1" ] || fail "taken port: exit codes ${codes[*]} (expected 1 1)"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
grep -q "MASTER_PORT $port on 127.0.0.1 is already in use" "$work/taken-rank0.log" ||
  fail "rank 0 did not say the port is taken"
grep -q "no answer within 3000 ms. Is MASTER_PORT $port held by a program that is not this run's store" \
  "$work/taken-rank1.log" || fail "rank 1 did not say what holds the port"
# Both ranks one after the other: rank 0 at once, rank 1 at its 3 s timeout; slack for start-up.
[ "$elapsed" -lt 55000 ] || fail "taken port: the ranks took $elapsed ms with a 3 s timeout"
echo "taken port: both ranks said so in $elapsed ms (3 s timeout): ok"

# 5. Nothing listening at MASTER_ADDR:MASTER_PORT (127.0.0.1, a free port).
port=$(free_port)
t0=$(now_ms)
start unreachable 1 2 "$port" -- "${taken[@]}"
finish
elapsed=$(($(now_ms) - t0))
[ "${codes[*]}" = "1" ] || fail "rank 1 without rank 0: exit code ${codes[*]} (expected 1)"
grep -q "rank 1 could not reach the store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:$port within 3000 ms (last error: Connection refused); rank 0 serves it: is rank 0 running on 127.0.0.1" \
  "$work/unreachable.log" || fail "unreachable store: unclear message"
[ "$elapsed" -lt 55000 ] || fail "unreachable store: $elapsed ms with a 3 s timeout"
# torchrun's agent variables, but no agent: every rank is a client and says the agent is missing.
agent=(TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=test TORCHELASTIC_RESTART_COUNT=0)
t0=$(now_ms)
start agent-rank0 0 2 "$port" "${agent[@]}" -- "${taken[@]}"
start agent-rank1 1 2 "$port" "${agent[@]}" -- "${taken[@]}"
finish
elapsed=$(($(now_ms) - t0))
for r in 0 1; do
  grep -q "rank $r could not reach the store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:$port within 3000 ms.*is the torchrun agent of node 0 running" \
    "$work/agent-rank$r.log" || fail "rank $r without the agent: unclear message"
done
[ "${codes[*]}" = "1 1" ] || fail "without the agent: exit codes ${codes[*]}"
[ "$elapsed" -lt 55000 ] || fail "missing agent: $elapsed ms with a 3 s timeout"
echo "unreachable store (by hand, and torchrun's variables without the agent): ok"
echo "by_hand_test: ok"
