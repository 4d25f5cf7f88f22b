#!/usr/bin/env bash
# `dgc train` with a job secret, end to end: --help lists the flag and the variable; a short run
# with DGC_JOB_SECRET (and one with --job-secret-file) says its messages are authenticated, and
# the secret appears neither on the command line (ps), nor in the output, nor in the checkpoints;
# a run without a secret says it is not authenticated; a secret file others can read, both ways
# at once, and a short secret are refused; two processes given different secrets both stop well
# within the timeout, each with an error naming the secret.
# Usage: cli_job_secret_test.sh DGC_BINARY
set -euo pipefail
dgc=$1
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset DGC_JOB_SECRET RANK WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE

"$dgc" train --help >"$work/help" || fail "--help exited non-zero"
grep -q -- "--job-secret-file" "$work/help" || fail "--help does not list --job-secret-file"
grep -q "DGC_JOB_SECRET" "$work/help" || fail "--help does not name DGC_JOB_SECRET"

secret="s3cret-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
small=(--workers 2 --train-examples 256 --test-examples 64 --batch-size 16 --density 0.01
       --epochs 1 --progress lines)

# With DGC_JOB_SECRET: authenticated; the secret is not on any command line while it runs.
DGC_JOB_SECRET=$secret "$dgc" train "${small[@]}" --checkpoint "$work/ckpt" \
  >"$work/env.out" 2>&1 &
pid=$!
pids+=("$pid")
seen_running=0
for _ in $(seq 1 200); do
  if [ -r "/proc/$pid/cmdline" ]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" >"$work/cmdline"
    # ps into a file first: a grep running at the same time would show the secret in its own args.
    ps -eo args >"$work/ps"
    grep -q -- " train " "$work/cmdline" || { sleep 0.05; continue; }  # not yet exec'd
    grep -qF -- "$secret" "$work/cmdline" && fail "the secret is on the command line"
    grep -qF -- "$secret" "$work/ps" && fail "the secret is in ps output"
    seen_running=1
    break
  fi
  sleep 0.05
done
wait "$pid" || fail "training with DGC_JOB_SECRET failed: $(cat "$work/env.out")"
[ "$seen_running" = 1 ] || fail "the run ended before its command line could be read"
grep -q "messages and rendezvous values authenticated (HMAC-SHA256, job secret)" "$work/env.out" ||
  fail "no authentication line: $(head -8 "$work/env.out")"
grep -q "^result: test accuracy" "$work/env.out" || fail "no result: $(cat "$work/env.out")"
grep -qF -- "$secret" "$work/env.out" && fail "the secret is in the output"
ls "$work"/ckpt.step* >/dev/null 2>&1 || fail "no checkpoint written: $(ls "$work")"
grep -qaF -- "$secret" "$work"/ckpt.step* && fail "the secret is in a checkpoint"

# With --job-secret-file (mode 600): the same; only the path is on the command line.
printf '%s\n' "$secret" >"$work/secret"
chmod 600 "$work/secret"
"$dgc" train "${small[@]}" --job-secret-file "$work/secret" >"$work/file.out" 2>&1 ||
  fail "training with --job-secret-file failed: $(cat "$work/file.out")"
grep -q "messages and rendezvous values authenticated" "$work/file.out" ||
  fail "no authentication line: $(head -8 "$work/file.out")"

# Without a secret the summary says so.
"$dgc" train "${small[@]}" >"$work/none.out" 2>&1 || fail "training failed: $(cat "$work/none.out")"
grep -q "messages not authenticated (no job secret" "$work/none.out" ||
  fail "no 'not authenticated' line: $(head -8 "$work/none.out")"

# Refused before anything starts, without printing the secret.
chmod 644 "$work/secret"
if "$dgc" train "${small[@]}" --job-secret-file "$work/secret" >"$work/open.out" 2>&1; then
  fail "a secret file others can read was accepted"
fi
grep -q "chmod 600" "$work/open.out" || fail "$(cat "$work/open.out")"
chmod 600 "$work/secret"
if DGC_JOB_SECRET=$secret "$dgc" train "${small[@]}" --job-secret-file "$work/secret" \
  >"$work/both.out" 2>&1; then
  fail "a secret given both ways was accepted"
fi
grep -q "one way only" "$work/both.out" || fail "$(cat "$work/both.out")"
if DGC_JOB_SECRET=short "$dgc" train "${small[@]}" >"$work/short.out" 2>&1; then
  fail "a 5-byte secret was accepted"
fi
grep -q "openssl rand -hex 32" "$work/short.out" || fail "$(cat "$work/short.out")"
cat "$work"/*.out | grep -qF -- "$secret" && fail "the secret was printed"

# Two processes through MASTER_ADDR/MASTER_PORT with different secrets: both stop with an error,
# long before the 60 s timeout.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DGC_JOB_SECRET="$secret-$r" \
    timeout 50 "$dgc" train --train-examples 256 --test-examples 64 --batch-size 16 --epochs 1 \
    --progress lines --timeout 60 >"$work/rank$r.log" 2>&1 &
  pids+=("$!")
done
for r in 0 1; do
  if wait "${pids[-1 - r]}"; then fail "rank with a different secret succeeded"; fi
done
took=$(($(date +%s) - start))
[ "$took" -lt 50 ] || fail "different secrets took ${took}s to stop"
# Both name the job secret: the rank that finds the other's tag invalid first publishes the
# abort, which the other cannot authenticate either; rank 0, which serves the store, keeps
# serving until rank 1 has acknowledged (without that, rank 1 could only say the store went away).
for r in 0 1; do
  grep -q "job secret" "$work/rank$r.log" || fail "rank $r: $(cat "$work/rank$r.log")"
  grep -qF -- "$secret" "$work/rank$r.log" && fail "rank $r printed the secret"
done
echo "different secrets: both ranks stopped after ${took}s: $(grep -h "error" "$work/rank0.log" | head -1)"
echo "PASS"
