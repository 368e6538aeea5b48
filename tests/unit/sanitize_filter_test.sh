#!/usr/bin/env bash
# tools/sanitize_filter.py on hand-written compute-sanitizer logs: an API error raised inside libnccl is attributed
# to NCCL (exit 0); one raised by our code, a kernel report and a race report are ours (exit 1, each listed).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/nccl.log" <<'LOG'
========= COMPUTE-SANITIZER
========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
=========         Host Frame: ncclext::Domain::create(...) [0x218e9] in libnccl_ep.so
=========
========= ERROR SUMMARY: 1 error
LOG
cat > "$tmp/ours.log" <<'LOG'
========= Program hit cudaErrorLaunchFailure (error 719) on CUDA API call to cudaStreamQuery.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclext::waitStream(...) [0x33d4f] in ep_ht_test
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
=========
========= Invalid __global__ system-scoped atomic of size 4 bytes
=========     at ncclext::dev::recordError(...)+0x1a0 in sync.cuh:80
=========
========= Error: Race reported between Write access at ncclep::finishCall(...)+0xd5c0 in ht_copy.cuh:95
=========     and Read access at ncclep::finishCall(...)+0xd6d0 in ht_copy.cuh:103 [4 hazards]
=========
========= ERROR SUMMARY: 3 errors
LOG
fail=0
python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/nccl.log" > "$tmp/a" ||
  { echo "FAIL: an API error inside libnccl was counted as ours"; cat "$tmp/a"; fail=1; }
grep -q "attributed to NCCL by the suppression list: 1, ours: 0" "$tmp/a" || { echo "FAIL: summary"; cat "$tmp/a"; fail=1; }
if python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/ours.log" > "$tmp/b"; then
  echo "FAIL: reports of ours were filtered"; cat "$tmp/b"; fail=1
fi
grep -q "ours: 3" "$tmp/b" || { echo "FAIL: want 3 reports of ours"; cat "$tmp/b"; fail=1; }
[ $fail -eq 0 ] && echo "sanitize_filter: 2 logs, verdicts as expected"
exit $fail
