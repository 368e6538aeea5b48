#!/usr/bin/env bash
# Kernel variants for tuning, timed in one session: each variant is a copy of this tree with one sed edit, built
# (ep_bench only) and run with `ep_bench --quick` (4096 x 7168 bf16, top-8 of 256, FLAT, every SM count). Run from
# the repository root on a machine with 2+ GPUs. Diagnostic variants give wrong or unordered results on purpose;
# they show where time goes and are never shipped. Result of one run: bench/results/ep_dispatch_variants-*.txt.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/variant.sh"
mk() { local name=$1; shift; mk_variant ep_bench "/tmp/v-$name" "$@"; }  # name, shell edit applied inside the copy
mk v0 true &
mk unroll8 "sed -i 's/constexpr int kUnroll = 4;/constexpr int kUnroll = 8;/' nccl_ep/src/ht/copy.cuh" &
mk nocopy "sed -i 's/      deliver<true>(x, lane, s, slot, expert, w, idx, row,/      if (false) deliver<true>(x, lane, s, slot, expert, w, idx, row,/' nccl_ep/src/ht/dispatch.cu" &
mk relaxed "sed -i 's/  if (lane == 0) ncclext::dev::storeRelease(remoteFlag, seq);/  if (lane == 0) *(volatile uint64_t*)remoteFlag = seq;/' nccl_ep/src/ht/copy.cuh" &
mk chunk16 "sed -i 's/constexpr int kChunkTokens = 32;/constexpr int kChunkTokens = 16;/' nccl_ep/src/ht.h" &
wait
for v in v0 unroll8 nocopy relaxed chunk16; do
  [ -x /tmp/v-$v/b/bin/ep_bench ] || continue
  echo "=== $v"; (cd /tmp/v-$v && timeout 120 b/bin/ep_bench --quick 2>&1 | grep -E "^disp|^comb|copy engine")
done
