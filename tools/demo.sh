#!/usr/bin/env bash
# The main job (`make demo`). On a machine with GPUs: the symmetric-memory all-to-all smoke run on every local GPU
# (later issues add the EP and M2N benchmarks here). Without GPUs: says so and does what needs none.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
export NCCL_NVLS_ENABLE=0

"$BUILDDIR/bin/nccl_ext_info" || exit 1
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$NGPU" -eq 0 ]; then
  echo
  echo "No GPU on this machine: the GPU demo is skipped. What runs without one: 'make test' (host tests)."
  exit 0
fi
echo
echo "== $NGPU GPU(s): LSA all-to-all through symmetric memory, every element checked"
"$BUILDDIR/bin/symmetric_memory_test" --test smoke --nranks "$NGPU"
