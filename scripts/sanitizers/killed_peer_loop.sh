#!/usr/bin/env bash
# Runs the tests that kill a peer mid-collective many times in a row under ThreadSanitizer
# (build-tsan) and AddressSanitizer + UndefinedBehaviorSanitizer (build-asan), with the suite's
# sanitizer options, and stops at the first failure (its log is kept). A check of the error
# path's lifetime rule (docs/reliability.md) that a single suite run cannot give: the race it
# guards against showed up in one run of four. Not part of the test command (minutes).
#
#   scripts/sanitizers/killed_peer_loop.sh [RUNS]     (default 50; builds what it needs)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/sanitizers/env.sh
runs=${1:-50}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [RUNS] (a positive count)" >&2; exit 2; }

# The exchange with a peer SIGKILLed during each algorithm; the communicator with a peer
# SIGKILLed between collectives (a ring allreduce and allgatherv per iteration); the
# communicator's in-process failure tests (a stalled rank, a rank that throws).
tests=(
  "exchange_test ExchangeMultiProcess.KilledPeer*"
  "comm_test MultiProcess.KilledPeer*:Failure.*"
)
log=$(mktemp -d "${TMPDIR:-/tmp}/dgc-killed-peer-XXXXXX")
for build in build-tsan build-asan; do
  cmake --preset "${build#build-}" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target exchange_test exchange_worker comm_test \
    comm_worker >/dev/null
  for entry in "${tests[@]}"; do
    read -r binary filter <<<"$entry"
    start=$(date +%s)
    for ((i = 1; i <= runs; i++)); do
      if ! "$build/tests/$binary" --gtest_filter="$filter" >"$log/last.log" 2>&1; then
        mv "$log/last.log" "$log/$build.$binary.run$i.log"
        echo "killed-peer loop: $build $binary ($filter): FAILED in run $i of $runs;" \
             "log: $log/$build.$binary.run$i.log" >&2
        exit 1
      fi
    done
    echo "killed-peer loop: $build $binary ($filter): $runs of $runs runs passed" \
         "in $(($(date +%s) - start)) s"
  done
done
rm -rf "$log"
