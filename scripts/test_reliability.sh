#!/usr/bin/env bash
# The sanitizer and fuzzing part of the test command (docs/reliability.md), each in its own build
# folder, without libtorch, Python and MPI:
#   build-asan  AddressSanitizer (leak detection on) + UndefinedBehaviorSanitizer (halts on the
#               first finding): the core, comm and exchange suites and the fuzz regression replays
#   build-tsan  ThreadSanitizer: the thread-pool and exchange suites
#   build-fuzz  clang + libFuzzer + ASan/UBSan: every fuzz target for DGC_FUZZ_SECONDS (10) seconds
# scripts/test.sh runs it after the main suite; it can also be run alone (after
# scripts/setup.sh --no-build). Uses ccache when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# Sanitizer settings for every process the tests start (workers included). LSan suppressions:
# none needed; a finding fails the test that made it.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
seconds() { date +%s; }

start=$(seconds)
echo "== ASan + UBSan: core, comm, exchange, fuzz regressions (build-asan)"
cmake --preset asan "${launcher[@]}" >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600 \
  -L '^(core|comm|exchange|regression)$'
asan_done=$(seconds)

echo "== TSan: thread pool, exchange (build-tsan)"
cmake --preset tsan "${launcher[@]}" >/dev/null
cmake --build build-tsan -j "$jobs" --target core_thread_pool_test exchange_test exchange_worker
ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 600 -R '^ThreadPool\.'
ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 600 -L '^exchange$'
tsan_done=$(seconds)

echo "== libFuzzer: every target for its bounded time (build-fuzz)"
cmake --preset fuzz "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j "$jobs" --target dgc_fuzzers
ctest --test-dir build-fuzz --output-on-failure -j "$jobs" -L '^fuzz$'
fuzz_done=$(seconds)

echo "reliability: asan+ubsan $((asan_done - start)) s, tsan $((tsan_done - asan_done)) s," \
     "fuzz $((fuzz_done - tsan_done)) s (build and run each)"
