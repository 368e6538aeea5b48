#!/usr/bin/env bash
# nccl_m2n's local copy kernel (copyKernel, nccl_m2n/src/exec_kernels.cu) in variants, timed in one session: each
# variant is a copy of this tree with one sed edit, built (m2n_bench only) and run as `m2n_bench --nranks 1
# --max-mib 256` (a contiguous and a transposing [16384, 8192] bf16 reshard beside the copy engine). Asks which
# change of 815bc16 / d9ae3d7 took the contiguous case from 87% to 79% of the copy engine (docs/PERFORMANCE.md):
#   v0    the tree as it is (__launch_bounds__(kThreads, 2));
#   lb1   __launch_bounds__(kThreads): no register cap for two CTAs an SM.
# Run from the repository root on a GPU machine (one GPU is enough). Prints the 256 MiB rows of each variant.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/variant.sh"
mk() { local name=$1; shift; mk_variant m2n_bench "/tmp/m2nv-$name" "$@"; }  # name, shell edit applied inside the copy
kernel=nccl_m2n/src/exec_kernels.cu
mk v0 true &
mk lb1 "grep -q '__launch_bounds__(kThreads, 2) copyKernel' $kernel &&
        sed -i 's/__launch_bounds__(kThreads, 2) copyKernel/__launch_bounds__(kThreads) copyKernel/' $kernel" &
wait
for v in v0 lb1; do
  [ -x /tmp/m2nv-$v/b/bin/m2n_bench ] || continue
  echo "=== $v"
  for run in 1 2; do  # twice: the spread between runs of one binary
    (cd /tmp/m2nv-$v && timeout 120 b/bin/m2n_bench --nranks 1 --max-mib 256 2>&1 | grep -E "16384x8192")
  done
done
