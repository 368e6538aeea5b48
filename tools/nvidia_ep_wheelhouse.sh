#!/usr/bin/env bash
# Wheels for NVIDIA's nccl-extensions 0.1.0 (its `nccl.ep`), the baseline that bench/baselines/baseline_nvidia_ep.py
# drives, and the virtual environment it runs in on the GPU machine (Python 3.12, x86_64, no PyPI there).
#
# Their package installs `nccl/ep` and `nccl/m2n`, the same import paths as ours, so it lives in a venv of its own and
# our python/ is never on its path (run it with PYTHONPATH unset; the driver refuses to run if `nccl.ep` resolves
# outside the venv).
#
#   tools/nvidia_ep_wheelhouse.sh [--lean] DIR      (here, with PyPI) pip download the wheels into DIR, print sizes
#   tools/nvidia_ep_wheelhouse.sh --venv VENV DIR   (on the GPU machine) make VENV from DIR's wheels
#
# What is downloaded: nccl-extensions 0.1.0 and nccl4py with no dependencies resolved by pip, then the
# dependencies of their [cu13] extras by hand, minus three:
#   - torch: the machine's python3 has 2.11; the venv sees its site-packages through a .pth file placed after the
#     venv's own (that python3 is itself a venv, /opt/torch/.venv, so `venv --system-site-packages` would expose
#     the base interpreter's site-packages, not torch's);
#   - nvidia-nccl-cu13==2.30.7 (their [cu13] pin): not on this index (2.27.7, 2.32.x only) and 216 MB as PyPI ships
#     it; ../shared/nccl/2.30.7 is the same release for sm_90, loaded with LD_PRELOAD, its headers as NCCL_HOME
#     (nccl.ep JIT-compiles its kernels against NCCL_HOME/include);
#   - nvidia-cutlass-dsl (nccl4py[cu13]): used by nccl.core.device.cute only, never by nccl.ep;
#   - numpy and packaging: the machine has them.
# --lean also leaves out cuda-core and cuda-bindings (the machine has both; --venv checks that their versions fit:
# cuda-core ~= 1.0, cuda-bindings 13.x).
set -euo pipefail

PY_VER=3.12
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
CORE=(nccl-extensions==0.1.0 nccl4py==0.6.0 "cuda-pathfinder>=1.5.4,<2")
CUDA=("cuda-core~=1.0" "cuda-bindings~=13.0")
DEVICE_LIMIT=$((64 << 20))

usage() { grep '^#   tools/' "$0" | sed 's/^#   //'; exit 2; }

download() {
  local dir=$1; shift
  local specs=("${CORE[@]}")
  [ "${1:-}" = lean ] || specs+=("${CUDA[@]}")
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VER" --implementation cp \
    --abi cp312 "${PLAT[@]}" -d "$dir" "${specs[@]}"
  local total=0 size f
  echo "wheels in $dir:"
  for f in "$dir"/*.whl; do
    size=$(stat -c %s "$f"); total=$((total + size))
    printf "  %8.1f MiB  %s\n" "$(echo "$size / 1048576" | bc -l)" "$(basename "$f")"
  done
  printf "total %.1f MiB (a device call carries 64 MiB in all, the checkout included)\n" \
    "$(echo "$total / 1048576" | bc -l)"
  local nccl_gz=../shared/nccl/2.30.7/libnccl.so.2.30.7.gz
  [ -f "$nccl_gz" ] || nccl_gz=/work/shared/nccl/2.30.7/libnccl.so.2.30.7.gz
  if [ -f "$nccl_gz" ]; then
    local with=$((total + $(stat -c %s "$nccl_gz")))
    printf "with NCCL 2.30.7 (%s): %.1f MiB\n" "$nccl_gz" "$(echo "$with / 1048576" | bc -l)"
    if [ "$with" -gt "$DEVICE_LIMIT" ]; then
      echo "over 64 MiB together: use --lean (the machine's cuda-core and cuda-bindings), or carry NCCL in one call"
      echo "(unpack it to /tmp/nccl-2.30.7 there) and the wheels in the next, on the same warm machine"
    fi
  fi
}

make_venv() {
  local venv=$1 dir=$2
  # The interpreter that has torch: its site-packages go after the venv's own, through a .pth file.
  local torch_site
  torch_site=$(env -u PYTHONPATH python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  python3 -m venv --without-pip "$venv"
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  env -u PYTHONPATH python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$dir"/*.whl
  echo "import site; site.addsitedir('$torch_site')" > "$site/zz_torch_site.pth"
  env -u PYTHONPATH "$venv/bin/python" - "$site" <<'PY'
import sys
from importlib.metadata import version
site = sys.argv[1]
import nccl.ep, cuda.core, cuda.bindings, torch
bad = []
if not nccl.ep.__file__.startswith(site):
    bad.append("nccl.ep resolves to %s, not the venv" % nccl.ep.__file__)
if not version("cuda-core").startswith("1."):
    bad.append("cuda-core %s (needs ~= 1.0: build the wheelhouse without --lean)" % version("cuda-core"))
if not cuda.bindings.__version__.startswith("13."):
    bad.append("cuda-bindings %s (needs 13.x: build the wheelhouse without --lean)" % cuda.bindings.__version__)
print("venv: nccl.ep %s, cuda-core %s, cuda-bindings %s, torch %s" % (
    nccl.ep.__file__, version("cuda-core"), cuda.bindings.__version__, torch.__version__))
if bad:
    sys.exit("; ".join(bad))
PY
}

case "${1:-}" in
  --venv) [ $# -eq 3 ] || usage; make_venv "$2" "$3" ;;
  --lean) [ $# -eq 2 ] || usage; download "$2" lean ;;
  -h|--help|"") usage ;;
  *) [ $# -eq 1 ] || usage; download "$1" ;;
esac
