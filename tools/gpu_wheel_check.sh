#!/usr/bin/env bash
# `pip install .` as a user does it, then the README's Python quick start and the one-rank Python GPU tests on the
# installed package, on a GPU machine without internet (our device machines). The one build dependency missing
# there, scikit-build-core (CMake, ninja, torch and its NCCL wheel are present), comes from a wheelhouse made where
# PyPI is reachable:
#   python3 -m pip download --only-binary :all: --dest .wheelhouse "scikit-build-core>=0.10"
# (.wheelhouse/ is ignored by git: carry it to the machine; NCCL_EXT_WHEELHOUSE names another folder). The package is
# built without build isolation (this machine's CMake and ninja) and installed with --target into $BUILDDIR-wheel/
# site; pytest runs from outside the source tree with only that folder on PYTHONPATH, so nothing is imported from
# python/. Usage: tools/gpu_wheel_check.sh [pytest arguments] (default: the quick start, test_ep_gpu.py and
# test_m2n_gpu.py). make test-python is the same on a machine with PyPI (a fresh venv, torch from PyPI).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
b=${BUILDDIR:-build}
[[ $b = /* ]] || b=$root/$b
out=$b-wheel
wheelhouse=${NCCL_EXT_WHEELHOUSE:-$root/.wheelhouse}
py=${PYTHON:-python3}
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
rm -rf "$out"
mkdir -p "$out"
if ! "$py" -c "import scikit_build_core" 2>/dev/null; then
  if [ ! -d "$wheelhouse" ]; then
    echo "gpu-wheel-check: no scikit-build-core here and no wheelhouse at $wheelhouse (this script's header says how)"
    exit 2
  fi
  "$py" -m pip install -q --no-index --find-links "$wheelhouse" "scikit-build-core>=0.10"
fi
echo "gpu-wheel-check: pip install $root (no build isolation) into $out/site"
"$py" -m pip install -q --no-build-isolation --no-deps --target "$out/site" "$root"
cd "$out"
export PYTHONPATH=$out/site
"$py" - "$out" <<'PY'
import os, sys
import nccl.ep, nccl.m2n
where = os.path.dirname(nccl.ep.__file__)
assert where.startswith(sys.argv[1]), "nccl.ep imported from %s, not the installed package" % where
print("gpu-wheel-check: nccl.ep", nccl.ep.version(), "nccl.m2n", nccl.m2n.version(), "from", where)
PY
if [ $# -eq 0 ]; then
  set -- "$root/tests/python/test_readme_quickstart.py" "$root/tests/python/test_ep_gpu.py" \
    "$root/tests/python/test_m2n_gpu.py"
fi
"$py" -m pytest -q -p no:cacheprovider "$@"
