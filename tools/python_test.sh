#!/usr/bin/env bash
# make test-python: the Python package as a user gets it. Builds the wheel from this tree (pip wheel .:
# scikit-build-core, CMake and ninja from PyPI, the two libraries), installs it into a fresh virtual environment with
# pytest and torch (NCCL_EXT_TEST_TORCH: the version, default 2.11.0, whose NCCL wheel is the release the build
# pins; 0: no torch, the torch tests skip), imports both modules and runs tests/python from outside the source tree,
# so that nothing is imported from python/. Needs no GPU (the GPU tests skip without one).
# Outputs in $(BUILDDIR)-py: dist/ (the wheel), venv/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
b=${BUILDDIR:-build}
[[ $b = /* ]] || b=$root/$b
out=$b-py
py=${PYTHON:-python3}
torch_version=${NCCL_EXT_TEST_TORCH:-2.11.0}
rm -rf "$out/dist" "$out/venv"
mkdir -p "$out"
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
echo "python-test: building the wheel"
"$py" -m pip wheel "$root" --no-deps -w "$out/dist" -q
wheel=$(ls "$out"/dist/nccl_ext-*.whl)
"$py" -m venv "$out/venv"
pip=("$out/venv/bin/python" -m pip install -q)
"${pip[@]}" "$wheel" pytest
if [ "$torch_version" != 0 ]; then
  echo "python-test: installing torch $torch_version"
  "${pip[@]}" "torch==$torch_version"
fi
cd "$out"
echo "python-test: import"
venv/bin/python -c "import nccl.ep, nccl.m2n; print('nccl.ep', nccl.ep.version(), 'nccl.m2n', nccl.m2n.version())"
venv/bin/python -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
