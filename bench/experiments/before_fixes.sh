#!/usr/bin/env bash
# The reliability fixes of the one-GPU issue, each undone once in a copy of this tree, to show that the GPU tests
# catch the defect (run on one GPU from the repository root; prints one verdict line per variant):
#   shuffle      combine's reduction loops bounded per lane again (`i0 < vecs`): rows of fewer than 32 x 4 vectors
#                (hidden 8) leave lanes out of __shfl_sync and the warp hangs: ep_ht_test must not finish (timeout).
#   repeat       routing no longer checks for an expert named twice by one token: ep_ht_test must FAIL (the repeat
#                goes unreported).
#   host-atomic  the error word claimed with a system-scope atomic on mapped host memory again: ep_ht_test under
#                compute-sanitizer memcheck must report it (the bad-expert case records an error).
# Usage: bench/experiments/before_fixes.sh [variant ...]
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$(pwd)
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(shuffle repeat host-atomic)
for v in "${variants[@]}"; do
  dir=/tmp/before-$v
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$ROOT" && tar --exclude=./build --exclude=./build-* --exclude=./shared --exclude=./.git -cf - .) | tar -xf - -C "$dir"
  cd "$dir" || exit 1
  case $v in
    shuffle) perl -pi -e 's/i0 - lane < vecs/i0 < vecs/g' nccl_ep/src/ht/combine.cu
             grep -c "i0 < vecs" nccl_ep/src/ht/combine.cu ;;
    repeat) perl -pi -e 's/for \(int j = 0; j < k; j\+\+\) \{/for (int j = 0; j < 0; j++) {/' nccl_ep/src/ht/route.cu
            grep -c "j < 0" nccl_ep/src/ht/route.cu ;;
    host-atomic) perl -pi -e 's/atomicCAS\(s\.claim, armed, armed \+ 1\)/atomicCAS_system((unsigned int*)&s.word->resets, armed, armed)/' common/device/sync.cuh
                 grep -c "atomicCAS_system" common/device/sync.cuh ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  { make BUILDDIR=b configure && cmake --build b --target ep_ht_test -j "$(nproc)"; } > build.log 2>&1 ||
    { echo "$v: build failed"; tail -5 build.log; cd "$ROOT"; continue; }
  case $v in
    shuffle) timeout 60 b/bin/ep_ht_test --nranks 1 --quick --timeout-s 3 > run.log 2>&1; rc=$?
             echo "before-fix $v: ep_ht_test --nranks 1 --quick exit $rc (124 = still running after 60 s: the hang)" ;;
    repeat) timeout 120 b/bin/ep_ht_test --nranks 1 --quick > run.log 2>&1; rc=$?
            echo "before-fix $v: ep_ht_test --nranks 1 --quick exit $rc (1 = FAIL)"; grep -m2 "repeats" run.log ;;
    host-atomic) timeout 300 "$SAN" --tool memcheck --error-exitcode 99 b/bin/ep_ht_test --nranks 1 --quick > run.log 2>&1
                 rc=$?
                 echo "before-fix $v: compute-sanitizer memcheck ep_ht_test exit $rc (99 = sanitizer errors)"
                 grep -m3 -E "system-scoped|ERROR SUMMARY" run.log ;;
  esac
  grep -E "PASS|FAIL" run.log | head -2
  [ -n "${BEFORE_FIXES_OUT:-}" ] && cp run.log "$BEFORE_FIXES_OUT/before-$v.log"
  cd "$ROOT"
done
