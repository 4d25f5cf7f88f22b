#!/usr/bin/env bash
# README command (1): install what is missing, build, and run the main job on its defaults:
# `dgc train` trains the default CNN on Fashion-MNIST with 4 local workers and DGC at density
# 0.001 (after a warm-up epoch), a few epochs, then prints the test accuracy, the bytes sent and
# the compression ratio. Extra arguments go to `dgc train` (see `build/bin/dgc train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/bin/dgc train "$@"
