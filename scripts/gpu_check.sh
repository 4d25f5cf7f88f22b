#!/usr/bin/env bash
# The prepared check for a GPU machine (docs/python.md, "The GPU check"): one command, a few
# minutes, nothing fetched (pip runs with --no-index). On the machine's own torch:
#   1. builds the package: a virtual environment that sees the system's packages
#      (--system-site-packages, so the machine's torch), `pip install --no-build-isolation
#      --no-index .` of this checkout into it;
#   2. runs the device tests from that install: the device compressor against the core on CUDA
#      tensors (device_compressor_test.py), the hook with compressor="device" against
#      compressor="core" with CUDA tensors, 2 processes over Gloo, and world size 1 over NCCL
#      (hook_worker.py device), and the core path's equivalence test (2 processes, CPU);
#   3. times one compression step on ResNet-50's 25,557,032 floats against torch.topk and a
#      streaming pass, and counts the device-to-host bytes of one training step with the hook
#      (bench/device_step.py);
#   4. prints one JSON line (the last line of its output) and exits non-zero if a step failed.
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--python PYTHON] [--venv ENV] [--keep]
# --device cpu: the same steps on the CPU (no NCCL), to check the script where there is no GPU.
# --python: the interpreter whose torch to build against (default: python3). --keep: leave the
# work folder (logs, the environment) and print its path. DGC_GPU_CHECK_BUILD_LIMIT: seconds the
# package build may take (600; about one minute on 16 cores, several on a busy 2-core machine).
# --venv ENV: skip step 1 and use the environment ENV, where dgc is installed already (a second
# run on the same machine, within its time).
set -uo pipefail
device=cuda
python=python3
keep=0
reuse=
while (($#)); do
  case $1 in
    --device) device=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --venv) reuse=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $device in cuda | cpu) ;; *) echo "gpu_check.sh: --device cuda or cpu, got '$device'" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)

if ! torch_info=$("$python" -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.version.cuda)' 2>&1); then
  echo "gpu_check.sh: $python cannot import torch ($torch_info): pass --python PYTHON" >&2
  exit 2
fi
read -r torch_version cuda_available cuda_version <<<"$torch_info"
if [[ $device == cuda && $cuda_available != True ]]; then
  echo "gpu_check.sh: no CUDA device: torch $torch_version (CUDA $cuda_version) at $python reports" \
    "torch.cuda.is_available() = $cuda_available. Run it on the GPU machine, or pass --device cpu" \
    "to run the same steps on the CPU" >&2
  exit 2
fi

work=$(mktemp -d)
if ((keep)); then
  echo "gpu_check.sh: work folder $work" >&2
else
  trap 'rm -rf "$work"' EXIT
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
unset PYTHONPATH
declare -A results
failed=0
seconds() { echo $(($(date +%s) - $1)); }

# step NAME TIMEOUT COMMAND...: runs it with its output in $work/NAME.log; a failure prints the
# log's end and is remembered.
step() {
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  if timeout -k 10 "$limit" "$@" >"$work/$name.log" 2>&1; then
    results[$name]="pass $(seconds "$start")s"
    echo "gpu_check.sh: $name passed ($(seconds "$start") s)" >&2
  else
    results[$name]="FAIL $(seconds "$start")s"
    failed=1
    echo "gpu_check.sh: $name FAILED ($(seconds "$start") s); the end of its output:" >&2
    tail -n 30 "$work/$name.log" >&2
  fi
}

# 1. The package, built against this torch, from a copy of the checkout (pip builds in the
# source folder: the checkout's own build/ stays as it is).
if [[ -n $reuse ]]; then
  venv=$(cd "$reuse" && pwd)/bin/python
  if "$venv" -c 'import dgc.torch' >"$work/build.log" 2>&1; then
    results[build]="skipped (--venv)"
  else
    results[build]="FAIL (--venv: dgc does not import)"
    failed=1
    tail -n 20 "$work/build.log" >&2
  fi
else
mkdir "$work/src"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$root" ls-files --cached --others --exclude-standard -z |
    (cd "$root" && tar --null -T - -cf -) | tar -xf - -C "$work/src"
else
  tar -C "$root" --exclude='./build*' -cf - . | tar -xf - -C "$work/src"
fi
"$python" -m venv --system-site-packages "$work/venv" || exit 1
venv=$work/venv/bin/python
DGC_BUILD_DIR=$work/cmake CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  step build "${DGC_GPU_CHECK_BUILD_LIMIT:-600}" \
  "$venv" -m pip install --no-build-isolation --no-index --no-deps "$work/src"
fi

# 2. The tests, from the installed package (run outside the checkout).
test=$root/python/test
cd "$work" || exit 1
if [[ ${results[build]} == pass* || ${results[build]} == skipped* ]]; then
  step device_compressor 120 "$venv" "$test/device_compressor_test.py" --device "$device"
  step hook_device_gloo_2 240 "$venv" "$test/spawn_ranks.py" 2 220 \
    "$venv" "$test/hook_worker.py" device --device "$device"
  if [[ $device == cuda ]]; then
    step hook_device_nccl_1 180 "$venv" "$test/spawn_ranks.py" 1 160 \
      "$venv" "$test/hook_worker.py" device --device cuda --backend nccl
  fi
  step hook_core_equivalence_2 180 "$venv" "$test/spawn_ranks.py" 2 160 \
    "$venv" "$test/hook_worker.py" equivalence
  # 3. The timing.
  repeats=20
  [[ $device == cpu ]] && repeats=3
  step bench 240 "$venv" "$root/bench/device_step.py" --device "$device" --repeats "$repeats"
fi

# 4. One JSON line.
bench=null
if [[ ${results[bench]:-} == pass* ]]; then
  bench=$(grep '^{' "$work/bench.log" | tail -n 1)
  [[ -n $bench ]] || bench=null
fi
tests=$(for name in "${!results[@]}"; do printf '"%s": "%s",' "$name" "${results[$name]}"; done)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "{\"check\": \"gpu_check\", \"commit\": \"$commit\", \"device\": \"$device\", \"torch\": \"$torch_version\", \"cuda\": \"$cuda_version\", \"steps\": {${tests%,}}, \"bench\": $bench, \"passed\": $((failed == 0 ? 1 : 0))}"
exit "$failed"
