#!/usr/bin/env bash
# Nsight Compute on nccl_m2n's local copy kernels (tileKernel for `transpose`, copyKernel for `copy`), one launch each
# of the 1-rank cases of docs/PERFORMANCE.md ([16384, 8192] bf16, 256 MiB: contiguous `copy` and transposing
# `transpose`), to find what bounds them below the copy engine (targets 90% and 60%): speed of light, occupancy, launch
# statistics, warp states and the memory workload. Prints ncu's report per case; the reports stay in
# /tmp/m2n-<case>.ncu-rep. Run from the repository root on a GPU machine with a built tree (BUILDDIR, default build) and
# ncu on the PATH.
set -u
export NCCL_NVLS_ENABLE=0
BUILDDIR=${BUILDDIR:-build}
for c in transpose copy; do
  echo "=== $c"
  k=copyKernel; [ $c = transpose ] && k=tileKernel
  # The first launches are the benchmark's warm-ups; the 4th is a timed one.
  timeout 240 ncu --kernel-name regex:$k --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats -f -o /tmp/m2n-$c \
    "$BUILDDIR/bin/m2n_bench" --nranks 1 --case $c --min-mib 256 --max-mib 256 --iters 5 >/tmp/m2n-$c.ncu.log 2>&1 ||
    { echo "ncu failed:"; tail -20 /tmp/m2n-$c.ncu.log; continue; }
  ncu --import /tmp/m2n-$c.ncu-rep --print-units base 2>&1 | grep -vE "^ *-+ *$|^ *$" | head -120
done
