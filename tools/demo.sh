#!/usr/bin/env bash
# The main job (`make demo`). On a machine with GPUs: the symmetric-memory all-to-all on every local GPU, every
# element checked, and the EP benchmark at the default shape. On any machine: what an EP High-Throughput group takes
# in memory on 1-8 nodes of 8 GPUs (nccl_ext_info, through ncclEpGroupInfoQuery), and the M2N planner on a bundled
# model config (DeepSeek-V3-like, 256 trainer ranks -> 64 inference ranks). Without GPUs it says so and runs what
# needs none.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
export NCCL_NVLS_ENABLE=0

"$BUILDDIR/bin/nccl_ext_info" || exit 1
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$NGPU" -eq 0 ]; then
  echo "No GPU on this machine: the GPU demo is skipped; the M2N planner needs none."
else
  echo
  echo "== $NGPU GPU(s): LSA all-to-all through symmetric memory, every element checked"
  "$BUILDDIR/bin/symmetric_memory_test" --test smoke --nranks "$NGPU" || exit 1
  echo
  echo "== $NGPU GPU(s): EP High-Throughput dispatch/combine, 4096 tokens x 7168 bf16, top-8 of 256 experts"
  "$BUILDDIR/bin/ep_bench" --nranks "$NGPU" --quick || exit 1
fi
if [ -x "$BUILDDIR/bin/m2n_plan" ]; then
  echo
  echo "== M2N planner: $BUILDDIR/bin/m2n_plan bench/configs/deepseek-v3.json --src tp=8,pp=8,dp=4,ep=4 --dst tp=8,dp=8,ep=8 --bench-ranks 4"
  "$BUILDDIR/bin/m2n_plan" bench/configs/deepseek-v3.json --src tp=8,pp=8,dp=4,ep=4 --dst tp=8,dp=8,ep=8 \
    --bench-ranks 4 || exit 1
else
  echo "m2n_plan was not built (it needs nlohmann-json3-dev and libcli11-dev)."
fi
