#!/usr/bin/env bash
# README command (2): install what is missing, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Open MPI refuses to run as root unless told; the multi-process tests start mpirun.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
# Sanitizers (ASan + UBSan, TSan) and fuzzing, in build-asan, build-tsan and build-fuzz.
scripts/test_reliability.sh
