#!/usr/bin/env bash
# make test-python: the Python package as a user gets it. Builds the wheel from this tree (pip wheel .:
# scikit-build-core, CMake and ninja from PyPI, the two libraries for every NCCL release family and architecture),
# installs it into a fresh virtual environment with pytest, hypothesis, jax (CPU) and torch (NCCL_EXT_TEST_TORCH: the
# version, default 2.11.0, NCCL 2.28.9; 0: no torch, the torch tests skip), imports both modules and runs tests/python
# from outside the source tree, so that nothing is imported from python/. Then the same wheel beside other NCCL
# releases (tests/python/nccl_release_check.py, no torch): each of NCCL_EXT_TEST_NCCL (default 2.29.7 2.30.7 2.31.2
# 2.32.6: the NCCL of torch 2.12/2.13, of 2.14/2.15, 2.31 and the newest) must be served by the part built for its
# family, and NCCL_EXT_TEST_NCCL_REFUSED (default 2.27.7) refused with a message; and, when NCCL_EXT_TEST_TORCH_LATEST
# names a torch (default 2.15.0; 0: skip), that torch imported first and tests/python beside it. Needs no GPU (the GPU
# tests skip without one). Outputs in $(BUILDDIR)-py: dist/ (the wheel), venv-nccl/, and venv/ (the first torch) or,
# when the second torch runs, venv-latest/ in its place: a torch venv is about 5 GB, so one is kept on disk at a time,
# and pip keeps no cache (PIP_NO_CACHE_DIR), which would hold every wheel a second time.
set -euo pipefail
export PIP_NO_CACHE_DIR=1
root=$(cd "$(dirname "$0")/.." && pwd)
b=${BUILDDIR:-build}
[[ $b = /* ]] || b=$root/$b
out=$b-py
py=${PYTHON:-python3}
torch_version=${NCCL_EXT_TEST_TORCH:-2.11.0}
rm -rf "$out/dist" "$out/venv" "$out/venv-nccl" "$out/venv-latest"
mkdir -p "$out"
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
echo "python-test: building the wheel"
"$py" -m pip wheel "$root" --no-deps -w "$out/dist" -q
wheel=$(ls "$out"/dist/nccl_ext-*.whl)
"$py" -m venv "$out/venv"
pip=("$out/venv/bin/python" -m pip install -q)
"${pip[@]}" "$wheel" pytest hypothesis jax  # jax (CPU): nccl.ep.jax's tracing and lowering tests
if [ "$torch_version" != 0 ]; then
  echo "python-test: installing torch $torch_version"
  "${pip[@]}" "torch==$torch_version"
fi
cd "$out"
echo "python-test: import"
venv/bin/python -c "import nccl.ep, nccl.m2n; print('nccl.ep', nccl.ep.version(), 'nccl.m2n', nccl.m2n.version())"
venv/bin/python -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
# nccl.ep.jax's FFI handlers against the installed jaxlib's headers (the wheel, built in isolation, has no jax to
# build them with): compiled, not linked.
jax_include=$(venv/bin/python -c "import jax.ffi; print(jax.ffi.include_dir())")
echo "python-test: nccl_ep/jax/ffi.cc against $jax_include"
"${CXX:-c++}" -std=c++17 -fsyntax-only -Wall -Wextra -Werror -isystem "$jax_include" -I"$root" \
  -I"${CUDA_HOME:-/usr/local/cuda}/include" "$root/nccl_ep/jax/ffi.cc"

echo "python-test: the wheel beside other NCCL releases"
"$py" -m venv "$out/venv-nccl"
"$out/venv-nccl/bin/python" -m pip install -q "$wheel"
for v in ${NCCL_EXT_TEST_NCCL-2.29.7 2.30.7 2.31.2 2.32.6}; do
  "$out/venv-nccl/bin/python" -m pip install -q --force-reinstall "nvidia-nccl-cu13==$v"
  "$out/venv-nccl/bin/python" "$root/tests/python/nccl_release_check.py" --expect "$v"
done
for v in ${NCCL_EXT_TEST_NCCL_REFUSED-2.27.7}; do
  "$out/venv-nccl/bin/python" -m pip install -q --force-reinstall "nvidia-nccl-cu13==$v"
  "$out/venv-nccl/bin/python" "$root/tests/python/nccl_release_check.py" --expect-refused "$v"
done

latest=${NCCL_EXT_TEST_TORCH_LATEST:-2.15.0}
if [ "$latest" != 0 ]; then
  echo "python-test: the wheel beside torch $latest"
  rm -rf "$out/venv"
  "$py" -m venv "$out/venv-latest"
  "$out/venv-latest/bin/python" -m pip install -q "$wheel" pytest hypothesis "torch==$latest"
  "$out/venv-latest/bin/python" "$root/tests/python/nccl_release_check.py" --torch
  "$out/venv-latest/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
fi
