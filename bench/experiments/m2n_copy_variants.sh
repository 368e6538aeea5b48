#!/usr/bin/env bash
# nccl_m2n's local copy kernel (copyKernel, nccl_m2n/src/exec_kernels.cu) in variants, timed in one session: each
# variant is a copy of this tree with one sed edit, built (m2n_bench only) and run as `m2n_bench --nranks 1
# --max-mib 256` (a contiguous and a transposing [16384, 8192] bf16 reshard beside the copy engine):
#   v0     the tree as it is (copyKernel without a register cap);
#   lb2    __launch_bounds__(kThreads, 2): registers capped for two CTAs an SM (815bc16 to session 12; slower in both
#          cases on one H200: docs/PERFORMANCE.md);
#   u8     kCopyUnroll = 8 (move.h): eight 16-byte loads in flight a thread in the contiguous copy, not four;
#   seg4   kCopySegmentElements = 1 << 18: a CTA's segment four times as long (fewer, longer segments);
#   pipe   kTilePipelined = true (exec_kernels.cu): a tile round's stores after the next round's loads are issued;
#   cs     kCopyStreaming = true (move.h): the contiguous copy's 16-byte loads and stores evict-first (__ldcs/__stcs);
#   grid   kMaxCtas = 528 (exec_kernels.cu): at most 4 CTAs an SM of an H200 at once, not 1024 CTAs in waves.
# Each variant's copyKernel registers and spills (cuobjdump) are printed beside its times.
# (Session 12 also timed a packed variant of the 2-byte whole tiles, pairs of rows in 4-byte shared words and one
# 16-byte shared load a destination vector: 295 us transposed against 237 us for the element-by-element tiles, so
# it did not land.)
# Run from the repository root on a GPU machine (one GPU is enough). Prints the 256 MiB rows of each variant.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/variant.sh"
mk() { local name=$1; shift; mk_variant m2n_bench "/tmp/m2nv-$name" "$@"; }  # name, shell edit applied inside the copy
kernel=nccl_m2n/src/exec_kernels.cu
objdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
mk v0 true &
mk lb2 "grep -q '__launch_bounds__(kThreads) copyKernel' $kernel &&
        sed -i 's/__launch_bounds__(kThreads) copyKernel/__launch_bounds__(kThreads, 2) copyKernel/' $kernel" &
mk u8 "grep -q 'constexpr int kCopyUnroll = 4;' nccl_m2n/src/move.h &&
       sed -i 's/constexpr int kCopyUnroll = 4;/constexpr int kCopyUnroll = 8;/' nccl_m2n/src/move.h" &
mk seg4 "grep -q 'kCopySegmentElements = 1 << 16;' nccl_m2n/src/move.h &&
         sed -i 's/kCopySegmentElements = 1 << 16;/kCopySegmentElements = 1 << 18;/' nccl_m2n/src/move.h" &
mk pipe "grep -q 'constexpr bool kTilePipelined = false;' $kernel &&
         sed -i 's/constexpr bool kTilePipelined = false;/constexpr bool kTilePipelined = true;/' $kernel" &
mk cs "grep -q 'constexpr bool kCopyStreaming = false;' nccl_m2n/src/move.h &&
       sed -i 's/constexpr bool kCopyStreaming = false;/constexpr bool kCopyStreaming = true;/' nccl_m2n/src/move.h" &
mk grid "grep -q 'constexpr int kMaxCtas = 1024;' $kernel &&
         sed -i 's/constexpr int kMaxCtas = 1024;/constexpr int kMaxCtas = 528;/' $kernel" &
wait
for v in ${VARIANTS:-v0 lb2 u8 seg4 pipe cs grid}; do
  [ -x /tmp/m2nv-$v/b/bin/m2n_bench ] || continue
  echo "=== $v"
  "$objdump" --dump-resource-usage /tmp/m2nv-$v/b/lib/libnccl_m2n.so 2>/dev/null | grep -A1 copyKernel |
    grep -o "REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*" | tr '\n' ' '
  echo
  for run in 1 2; do  # twice: the spread between runs of one binary
    (cd /tmp/m2nv-$v && timeout 120 b/bin/m2n_bench --nranks 1 --max-mib 256 2>&1 | grep -E "16384x8192")
  done
done
