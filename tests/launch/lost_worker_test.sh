#!/usr/bin/env bash
# A worker lost in the middle of `dgc train`, one process per rank, and the restart from the
# checkpoints the run wrote:
#   1. by hand (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT on loopback, Gloo), 3 ranks, rank 1
#      killed (SIGKILL) inside epoch 1: both survivors exit non-zero well within --timeout, each
#      with an error naming the peer it lost, at least one naming rank 1; the three restarted with
#      --resume end with final checkpoint files identical, byte for byte, to those of an
#      uninterrupted run;
#   2. by hand, rank 1 stalled (SIGSTOP): both survivors exit non-zero at --timeout, likewise;
#   3. under mpirun (MPI), rank 1 killed inside epoch 1: mpirun ends the job, names rank 1 and
#      exits non-zero; no process of the job is left; mpirun with --resume finishes the run;
#   4. under mpirun with Gloo (--backend gloo --rendezvous DIR), rank 1 stalled (SIGSTOP): the
#      survivors' errors name rank 1 at --timeout, and mpirun ends the job, non-zero.
#   lost_worker_test.sh DGC_BINARY [MPIRUN]   (without MPIRUN, cases 3 and 4 are skipped)
set -euo pipefail
dgc=$1
mpirun=${2:-}
source "$(dirname "$0")/common.sh"

for v in RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK \
  TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_USE_AGENT_STORE OMP_NUM_THREADS \
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE; do
  unset "$v"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# 3 workers x batch 32 of 3000 examples: 32 steps per epoch (the last batch short), 64 in all; a checkpoint every 10
# steps (steps 10, 20, 30 inside epoch 1). --timeout also bounds the rendezvous: every process
# must have loaded libtorch by then, which takes seconds on a loaded 2-core machine.
timeout_s=10
train=(train --model mlp --epochs 2 --train-examples 3000 --test-examples 300 --threads 1
  --progress lines --timeout "$timeout_s" --checkpoint-every 10 --checkpoint-keep 3)

# start NAME RANK PORT ARGS...: one rank by hand, in the background; its pid in ranks[RANK].
ranks=()
start() {
  local name=$1 rank=$2 port=$3
  shift 3
  (exec env RANK="$rank" WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$dgc" "$@") \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  ranks[$rank]=$!
}
# wait_exit PID SECONDS: waits (bounded) for a child of this shell; its exit code in `code`.
wait_exit() {
  local pid=$1 end=$(($(now_ms) + $2 * 1000)) state
  while [ "$(now_ms)" -lt "$end" ]; do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
    if [ "$state" = Z ] || [ "$state" = gone ]; then
      if wait "$pid"; then code=0; else code=$?; fi
      return 0
    fi
    sleep 0.05
  done
  fail "process $pid still running after $2 s"
}
# wait_file PATH SECONDS PID: until PATH exists (bounded; fails early when PID has ended).
wait_file() {
  local end=$(($(now_ms) + $2 * 1000))
  while [ ! -f "$1" ]; do
    [ "$(now_ms)" -lt "$end" ] || fail "$1 did not appear within $2 s"
    kill -0 "$3" 2>/dev/null || fail "process $3 ended before $1 appeared"
    sleep 0.05
  done
}
# run_by_hand NAME PORT ARGS...: 3 ranks to the end (bounded); fails unless all exit 0.
run_by_hand() {
  local name=$1 port=$2
  shift 2
  for r in 0 1 2; do start "$name-rank$r" "$r" "$port" "$@"; done
  for r in 0 1 2; do
    wait_exit "${ranks[$r]}" 300
    [ "$code" = 0 ] || fail "$name: rank $r exited with $code"
  done
  pids=()
}
# expect_survivors NAME LOST T0 LIMIT_MS: ranks other than LOST exit non-zero within LIMIT_MS of
# T0, each with an error naming the peer it lost, and at least one names rank LOST. (A survivor
# may learn of the failure from the other survivor, which closes its connections when it gives
# up, and then names that one: docs/reliability.md.)
expect_survivors() {
  local name=$1 lost=$2 t0=$3 limit=$4 elapsed named=0
  for r in 0 1 2; do
    [ "$r" = "$lost" ] && continue
    wait_exit "${ranks[$r]}" 120
    elapsed=$(($(now_ms) - t0))
    [ "$code" != 0 ] || fail "$name: survivor rank $r exited 0"
    [ "$elapsed" -lt "$limit" ] || fail "$name: rank $r ended $elapsed ms after, limit $limit ms"
    grep -q "^dgc: error: .*\(peer\|from\|to\) rank [0-9] " "$work/$name-rank$r.log" ||
      fail "$name: rank $r's error names no peer"
    if grep -q "^dgc: error: .*\(peer rank $lost \|from rank $lost \|to rank $lost \)" \
      "$work/$name-rank$r.log"; then
      named=$((named + 1))
    fi
    echo "$name: rank $r exited $code after $elapsed ms: $(grep -o "^dgc: error: .*rank [0-9] ([^)]*)" "$work/$name-rank$r.log" | head -1)"
  done
  [ "$named" -ge 1 ] || fail "$name: no survivor named rank $lost"
  echo "$name: $named of 2 survivors named rank $lost"
}

# 1. SIGKILL by hand, then resume; the reference is the same run uninterrupted.
port=$(free_port)
run_by_hand reference "$port" "${train[@]}" --checkpoint "$work/reference"
port=$(free_port)
for r in 0 1 2; do start kill-rank$r "$r" "$port" "${train[@]}" --checkpoint "$work/kill"; done
wait_file "$work/kill.step20.rank1" 240 "${ranks[1]}"
kill -KILL "${ranks[1]}"
t0=$(now_ms)
wait_exit "${ranks[1]}" 10
expect_survivors kill 1 "$t0" $((timeout_s * 1000))
pids=()
[ ! -f "$work/kill.step64.rank0" ] || fail "kill: the run ended before the kill"
port=$(free_port)
resume=(--checkpoint "$work/kill" --resume)
for r in 0 1 2; do start resume-rank$r "$r" "$port" "${train[@]}" "${resume[@]}"; done
for r in 0 1 2; do wait_exit "${ranks[$r]}" 300; codes[$r]=$code; done
pids=()
if [ "${codes[*]}" != "0 0 0" ]; then
  # Killed between two ranks' writes: the message names the step every rank has.
  step=$(grep -o "newest checkpoints are from different steps.*--resume-step [0-9]*" \
    "$work/resume-rank0.log" | grep -o "[0-9]*$") || fail "resume: exit codes ${codes[*]}"
  port=$(free_port)
  run_by_hand resume "$port" "${train[@]}" --checkpoint "$work/kill" --resume-step "$step"
fi
grep -o "resumed from .*" "$work/resume-rank0.log" || fail "resume: no 'resumed from' line"
for r in 0 1 2; do
  cmp -s "$work/reference.step64.rank$r" "$work/kill.step64.rank$r" ||
    fail "rank $r: the resumed run's final checkpoint differs from the uninterrupted run's"
done
echo "1. killed by hand, resumed: final checkpoints of the 3 ranks identical to the reference: ok"

# 2. SIGSTOP by hand: the survivors time out, naming rank 1.
port=$(free_port)
for r in 0 1 2; do start stop-rank$r "$r" "$port" "${train[@]}" --checkpoint "$work/stop"; done
wait_file "$work/stop.step10.rank1" 240 "${ranks[1]}"
kill -STOP "${ranks[1]}"
t0=$(now_ms)
expect_survivors stop 1 "$t0" $((timeout_s * 1000 + 15000))
kill -KILL "${ranks[1]}"
kill -CONT "${ranks[1]}" 2>/dev/null || true
wait_exit "${ranks[1]}" 10
pids=()
echo "2. stalled by hand: ok"

if [ -z "$mpirun" ]; then
  echo "lost_worker_test: ok (mpirun cases skipped: built without MPI)"
  exit 0
fi
mpi=("$mpirun" --oversubscribe --bind-to none -np 3)
# rank_pid MPIRUN_PID RANK: the pid of that rank's process (a child of mpirun), bounded.
rank_pid() {
  local end=$(($(now_ms) + 60000)) p
  while [ "$(now_ms)" -lt "$end" ]; do
    for p in $(pgrep -P "$1" || true); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
        echo "$p"
        return
      fi
    done
    sleep 0.05
  done
  fail "no process of rank $2 under mpirun $1"
}

# 3. SIGKILL under mpirun (MPI): mpirun ends the job and names the rank; then resume.
"${mpi[@]}" "$dgc" "${train[@]}" --checkpoint "$work/mpi" >"$work/mpi.log" 2>&1 &
job=$!
pids+=("$job")
victim=$(rank_pid "$job" 1)
others=("$(rank_pid "$job" 0)" "$(rank_pid "$job" 2)")
wait_file "$work/mpi.step20.rank1" 240 "$victim"
kill -KILL "$victim"
t0=$(now_ms)
wait_exit "$job" 120
elapsed=$(($(now_ms) - t0))
pids=()
[ "$code" != 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -q "\(mpirun\|mpiexec\) noticed that process rank 1 .* exited on signal 9" "$work/mpi.log" ||
  fail "mpirun did not name rank 1"
[ "$elapsed" -lt $((timeout_s * 1000)) ] || fail "mpirun ended $elapsed ms after the kill"
# The other ranks' processes are gone too (bounded: they may take a moment to be reaped).
for p in "${others[@]}"; do
  for _ in $(seq 1 200); do
    state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo gone)
    [ "$state" = gone ] || [ "$state" = Z ] && break
    sleep 0.05
  done
  [ "$state" = gone ] || [ "$state" = Z ] || fail "rank process $p outlived mpirun by 10 s"
done
echo "3. killed under mpirun: mpirun exited $code after $elapsed ms: $(grep -o "\(mpirun\|mpiexec\) noticed that process rank 1 .*" "$work/mpi.log")"
"${mpi[@]}" "$dgc" "${train[@]}" --checkpoint "$work/mpi" --resume >"$work/mpi-resume.log" 2>&1 &
job=$!
pids+=("$job")
wait_exit "$job" 300
pids=()
if [ "$code" != 0 ]; then
  step=$(grep -o "newest checkpoints are from different steps.*--resume-step [0-9]*" \
    "$work/mpi-resume.log" | head -1 | grep -o "[0-9]*$") ||
    fail "mpirun --resume exited $code"
  "${mpi[@]}" "$dgc" "${train[@]}" --checkpoint "$work/mpi" --resume-step "$step" \
    >"$work/mpi-resume.log" 2>&1 &
  job=$!
  pids+=("$job")
  wait_exit "$job" 300
  pids=()
  [ "$code" = 0 ] || fail "mpirun --resume-step $step exited $code"
fi
grep -q "resumed from $work/mpi.step[0-9]*.rank0" "$work/mpi-resume.log" ||
  fail "mpirun --resume: no 'resumed from' line"
[ -f "$work/mpi.step64.rank2" ] || fail "mpirun --resume: no final checkpoint"
echo "   resumed under mpirun: $(grep -o "resumed from .*" "$work/mpi-resume.log")"

# 4. SIGSTOP under mpirun with Gloo: the survivors' errors name rank 1; mpirun ends the job.
"${mpi[@]}" "$dgc" "${train[@]}" --backend gloo --rendezvous "$work/rdv" \
  --checkpoint "$work/gloo" >"$work/gloo.log" 2>&1 &
job=$!
pids+=("$job")
victim=$(rank_pid "$job" 1)
wait_file "$work/gloo.step10.rank1" 240 "$victim"
kill -STOP "$victim"
t0=$(now_ms)
wait_exit "$job" 120
elapsed=$(($(now_ms) - t0))
pids=()
kill -KILL "$victim" 2>/dev/null || true
[ "$code" != 0 ] || fail "mpirun exited 0 after a rank stalled"
[ "$(grep -c "^dgc: error: .*\(from\|to\) rank 1 " "$work/gloo.log")" -ge 1 ] ||
  fail "no survivor named rank 1"
[ "$elapsed" -lt $((timeout_s * 1000 + 30000)) ] || fail "mpirun ended $elapsed ms after the stall"
echo "4. stalled under mpirun (gloo): mpirun exited $code after $elapsed ms; $(grep -c "^dgc: error: .*rank 1 " "$work/gloo.log") survivor(s) named rank 1"
echo "lost_worker_test: ok"
