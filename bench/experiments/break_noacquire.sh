#!/usr/bin/env bash
# Shows that the EP GPU test can fail: a copy of this tree in which dispatch and combine receivers stop waiting for
# the row flags (warpAcquire returns at once), built and run on 2 ranks; ep_ht_test must exit 1 with data
# mismatches. Run from the repository root on a machine with 2+ GPUs, or with one GPU and the arguments of a
# one-GPU mode (e.g. `bench/experiments/break_noacquire.sh --one-gpu virtual --nranks 4`). Result of one run:
# bench/results/ep_ht_break-noacquire-*.txt.
set -u
export NCCL_NVLS_ENABLE=0
rm -rf /tmp/b-noacq && mkdir -p /tmp/b-noacq
tar --exclude=./build-gpu --exclude=./build --exclude=./shared --exclude=./.git -cf - . | tar -xf - -C /tmp/b-noacq
cd /tmp/b-noacq
perl -0pi -e 's/(warpAcquire\([^)]*\) \{\n)/$1  return true;\n/' nccl_ep/src/ht/copy.cuh
grep -A2 'bool warpAcquire' nccl_ep/src/ht/copy.cuh | head -3
make BUILDDIR=b CUDA_HOME=/usr/local/cuda configure >/tmp/b.log 2>&1 && cmake --build b --target ep_ht_test -j 16 >>/tmp/b.log 2>&1 ||
  { echo "build failed"; tail -5 /tmp/b.log; exit 1; }
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--nranks 2)
timeout 180 b/bin/ep_ht_test "${args[@]}" > /tmp/b.run 2>&1; echo "break noacquire: ep_ht_test ${args[*]} exit $?"
grep -E "PASS|FAIL" /tmp/b.run | head -4
grep -c "differ" /tmp/b.run
