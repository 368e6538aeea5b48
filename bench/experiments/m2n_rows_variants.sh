#!/usr/bin/env bash
# nccl_m2n's row moves (move.h, moveSegmentShare) in two variants, timed in one session with m2n_bench --stages:
#   v0      the tree: runs below 32 KB take a warp each (a lane's 16-byte vectors four at a time, groupCopy's
#           unrolled loop), only longer runs the whole CTA;
#   cta4k   up to 03ce44f: a run of at least 4 KB takes the whole CTA (512 threads, one 16-byte
#           vector each per 8 KB row: one load in flight per thread), shorter runs a warp each.
# Shard(0) -> Shard(1) of [16384, 8192] bf16 moves rows of 8 KB (every copy, pack and unpack), so it shows the
# difference; the 1-rank contiguous and transposing copies (one long run, tiles) guard against a regression.
# Run from the repository root on a GPU machine with a built tree (build/); prints each variant's rows.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/variant.sh"
old='const bool wide = ext \* d.elemBytes >= 32768;' new='const bool wide = ext * d.elemBytes >= 4096;'
mk_variant m2n_bench /tmp/m2nr-cta4k "grep -q '$old' nccl_m2n/src/move.h && sed -i 's/$old/$new/' nccl_m2n/src/move.h"
for v in v0 cta4k; do
  b=build; [ $v = cta4k ] && b=/tmp/m2nr-cta4k/b
  [ -x $b/bin/m2n_bench ] || { echo "=== $v: not built"; continue; }
  echo "=== $v"
  for a in "--nranks 2 --one-gpu virtual" "--nranks 4 --one-gpu virtual" \
           "--nranks 2 --one-gpu virtual --zero-copy pull"; do
    timeout 90 $b/bin/m2n_bench $a --stages --case s0_s1 --min-mib 16 --max-mib 256 ${JSON:+--json $JSON.$v} 2>&1 |
      grep -E "s0_s1|stages"
  done
  timeout 90 $b/bin/m2n_bench --nranks 1 --min-mib 256 --max-mib 256 ${JSON:+--json $JSON.$v} 2>&1 |
    grep -E "copy|transpose"
done
