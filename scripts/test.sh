#!/usr/bin/env bash
# README command (2): install what is missing, build, and run the whole test suite: the main
# suite (build/), then the sanitizer and fuzzing part (scripts/test_reliability.sh: build-asan,
# build-tsan). Both parts always run; the command fails if either failed. Its time on a fresh
# clone is in docs/testing.md. DGC_TEST_SANITIZERS=0 leaves the second part out.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
built=$(date +%s)
# Open MPI refuses to run as root unless told; the multi-process tests start mpirun.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
main=0
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 || main=$?
tested=$(date +%s)
echo "test: set-up and main build $((built - start)) s, main suite $((tested - built)) s"
reliability=0
if [ "${DGC_TEST_SANITIZERS:-1}" != 0 ]; then
  scripts/test_reliability.sh || reliability=$?
  end=$(date +%s)
  echo "test: sanitizers and fuzzing $((end - tested)) s; in all $((end - start)) s"
fi
if ((main != 0 || reliability != 0)); then
  echo "test: FAILED: main suite exit status $main, sanitizers and fuzzing exit status" \
       "$reliability" >&2
  exit 1
fi
echo "test: all passed"
