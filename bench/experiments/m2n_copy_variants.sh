#!/usr/bin/env bash
# nccl_m2n's local copy kernels (copyKernel for plain segments, tileKernel for tile segments; nccl_m2n/src/
# exec_kernels.cu) in variants, timed in one session: each variant is a copy of this tree with one sed edit, built
# (m2n_bench only) and run as `m2n_bench --nranks 1 --max-mib 256` (a contiguous and a transposing [16384, 8192] bf16
# reshard beside the copy engine):
#   v0     the tree as it is (no register cap on either kernel);
#   p2     kPlainMinCtas = 2: the plain kernel (the contiguous case) capped for two CTAs an SM;
#   p3     kPlainMinCtas = 3;
#   seg4   kCopySegmentElements = 1 << 18: every copy's segments four times as long (session 13: faster at 256 MiB,
#          twice as slow at 1 and 16 MiB, hence long segments for long copies only, kLongCopyElements in move.h);
#   grid   kMaxCtas = 528: at most 4 CTAs an SM of an H200 at once, not 1024 CTAs in waves.
# Each variant's two kernels' registers, stack and spills (cuobjdump) are printed beside its times.
# Measured and gone (docs/PERFORMANCE.md as of commit 272b2be): __launch_bounds__(512, 2) on the one kernel both paths shared (slower in
# both cases, session 12), a packed 2-byte tile (session 12), and session 12's TileRound refactor of the whole-tile
# rounds (348 us transposed in session 13 against 237 us before it, with a 368-byte stack frame), with its
# pipelined rounds (405 us), eight loads in flight in the contiguous copy (203 us against 167 us) and evict-first
# loads and stores (162 us).
# Run from the repository root on a GPU machine (one GPU is enough). Prints the 256 MiB rows of each variant.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/variant.sh"
mk() { local name=$1; shift; mk_variant m2n_bench "/tmp/m2nv-$name" "$@"; }  # name, shell edit applied inside the copy
kernel=nccl_m2n/src/exec_kernels.cu
objdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
mk v0 true &
mk p2 "grep -q 'constexpr int kPlainMinCtas = 1;' $kernel &&
       sed -i 's/constexpr int kPlainMinCtas = 1;/constexpr int kPlainMinCtas = 2;/' $kernel" &
mk p3 "grep -q 'constexpr int kPlainMinCtas = 1;' $kernel &&
       sed -i 's/constexpr int kPlainMinCtas = 1;/constexpr int kPlainMinCtas = 3;/' $kernel" &
mk seg4 "grep -q 'kCopySegmentElements = 1 << 16;' nccl_m2n/src/move.h &&
         sed -i 's/kCopySegmentElements = 1 << 16;/kCopySegmentElements = 1 << 18;/' nccl_m2n/src/move.h" &
mk grid "grep -q 'constexpr int kMaxCtas = 1024;' $kernel &&
         sed -i 's/constexpr int kMaxCtas = 1024;/constexpr int kMaxCtas = 528;/' $kernel" &
wait
for v in ${VARIANTS:-v0 p2 p3 seg4 grid}; do
  [ -x /tmp/m2nv-$v/b/bin/m2n_bench ] || continue
  echo "=== $v"
  "$objdump" --dump-resource-usage /tmp/m2nv-$v/b/lib/libnccl_m2n.so 2>/dev/null |
    awk '/Function.*(copyKernel|tileKernel)/ { k = $0 ~ /tileKernel/ ? "tiles:" : "plain:"; getline; print k, $0 }' |
    grep -o "^[a-z]*:\|REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*" | tr '\n' ' '
  echo
  for run in 1 2; do  # twice: the spread between runs of one binary
    (cd /tmp/m2nv-$v && timeout 120 b/bin/m2n_bench --nranks 1 --max-mib 256 2>&1 | grep -E "16384x8192")
  done
done
