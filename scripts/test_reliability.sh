#!/usr/bin/env bash
# The sanitizer and fuzzing part of the test command (docs/reliability.md), in build folders of
# their own, without libtorch, Python and MPI, built with clang (2.4 times faster than gcc at
# compiling with the sanitizers, and one build serves the suites and libFuzzer):
#   build-asan  AddressSanitizer (leak detection on) + UndefinedBehaviorSanitizer (halts on the
#               first finding), with libFuzzer's coverage: the core, comm and exchange suites, the
#               fuzz regression replays, then every fuzz target for DGC_FUZZ_SECONDS (10) seconds
#   build-tsan  ThreadSanitizer: the thread-pool, communicator and exchange suites
# scripts/test.sh (the README's test command) runs it after the main suite unless
# DGC_TEST_SANITIZERS=0; it can also be run alone (after scripts/setup.sh --no-build). Uses
# ccache when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
source scripts/sanitizers/env.sh  # the sanitizer options of every process the tests start
# The 10^6-element cases of the step test take a third of the core suite's time under ASan and
# run the same code as the smaller cases; the main build runs them. (The GoogleTest executables
# are CTest tests in shards, cmake/DgcTesting.cmake: cases are selected with GTEST_FILTER.)
asan_excluded='-Large/*'

start=$(date +%s)
echo "== ASan + UBSan (clang): core, comm, exchange, fuzz regressions (build-asan)"
cmake --preset asan "${launcher[@]}" >/dev/null
cmake --build build-asan -j "$jobs"
GTEST_FILTER="$asan_excluded" ctest --test-dir build-asan --output-on-failure -j "$jobs" \
  --timeout 900 -L '^(core|comm|exchange|regression)$'
asan_done=$(date +%s)

echo "== libFuzzer (clang, ASan + UBSan): every target for its bounded time (build-asan)"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -L '^fuzz$'
fuzz_done=$(date +%s)
# libFuzzer's final statistics per target, from ctest's log (docs/reliability.md's table).
awk '/Testing: fuzz\./ { target = $NF }
     /^stat::number_of_executed_units/ { runs[target] = $2 }
     /^stat::average_exec_per_sec/ { rate[target] = $2 }
     END { for (t in runs) printf "%-16s %10d executions %8d per second\n", t, runs[t], rate[t] }' \
  build-asan/Testing/Temporary/LastTest.log | sort

echo "== TSan (clang): thread pool, communicators, exchange (build-tsan)"
cmake --preset tsan "${launcher[@]}" >/dev/null
cmake --build build-tsan -j "$jobs" --target core_thread_pool_test comm_test comm_worker \
  exchange_test exchange_worker
ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 \
  -R '^core_thread_pool_test\.|^comm_test\.|^exchange_test\.'
tsan_done=$(date +%s)

echo "reliability: asan+ubsan build and suites $((asan_done - start)) s, fuzz runs" \
     "$((fuzz_done - asan_done)) s, tsan build and suites $((tsan_done - fuzz_done)) s"
