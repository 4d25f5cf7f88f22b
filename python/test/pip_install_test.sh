#!/usr/bin/env bash
# `pip install .` as a user runs it, offline: a fresh virtual environment that sees the system's
# torch (--system-site-packages), `pip install --no-build-isolation --no-index` of a copy of this
# checkout (tracked and untracked, not ignored files: what is being tested, without the build
# folders), then, from outside the source tree so that only the installed package can be
# imported: the import-time version checks, and the 2-process hook test (hook_worker.py
# equivalence) over the installed dgc. The temporary folder is removed on exit.
#   pip_install_test.sh PYTHON SOURCE_DIR
# CMAKE_BUILD_PARALLEL_LEVEL: compile jobs of the package build (default 2).
set -euo pipefail
python=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

mkdir "$work/src"
git -C "$source" ls-files --cached --others --exclude-standard -z |
  (cd "$source" && tar --null -T - -cf -) | tar -xf - -C "$work/src"
"$python" -m venv --system-site-packages "$work/venv"
venv=$work/venv/bin/python
start=$(date +%s)
if ! DGC_BUILD_DIR=$work/cmake "$venv" -m pip install --no-build-isolation --no-index --no-deps \
  "$work/src" >"$work/pip.log" 2>&1; then
  echo "FAIL: pip install --no-build-isolation --no-index" >&2
  tail -n 60 "$work/pip.log" >&2
  exit 1
fi
echo "pip install: $(($(date +%s) - start)) s"

cd "$work"
installed=$("$venv" -c 'import dgc, dgc.torch; print(dgc.__file__)')
case $installed in
  "$work/venv/"*) echo "dgc imported from the environment: ${installed#"$work/"}" ;;
  *) echo "FAIL: dgc imported from $installed, not from the virtual environment" >&2; exit 1 ;;
esac
# An unsupported torch is refused at import, with what to do.
"$venv" - <<'PY'
import torch
real = torch.__version__
torch.__version__ = "0.4.1"
try:
    import dgc
except ImportError as error:
    assert "dgc supports torch 1.13" in str(error), error
else:
    raise AssertionError("torch 0.4.1 was accepted")
print("torch 0.4.1 refused at import")
PY
test=$source/python/test
"$venv" "$test/spawn_ranks.py" 2 200 "$venv" "$test/hook_worker.py" equivalence
echo "python pip_install_test: ok"
