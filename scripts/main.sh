#!/usr/bin/env bash
# README command (1): install what is missing, build, and run the main job on its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/bin/dgc bench compress "$@"
