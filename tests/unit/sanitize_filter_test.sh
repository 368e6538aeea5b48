#!/usr/bin/env bash
# tools/sanitize_filter.py on hand-written compute-sanitizer logs: an API error raised inside libnccl is attributed
# to NCCL (exit 0); one raised by our code, a kernel report and a race report are ours (exit 1, each listed); so are
# reports past the print limit; a shuffled backtrace (virtual ranks) is NCCL's only where it names the NCCL function
# that raises its error code. Then
# tools/gpu_check_report.py's verdicts: an inconclusive run (98) fails nothing, a failed one fails the report.
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
cat > "$tmp/unprinted.log" <<'LOG'
========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
=========
========= ERROR SUMMARY: 7 errors were not printed. Use --print-limit option to adjust the number of printed errors
LOG
cat > "$tmp/shuffled.log" <<'LOG'
========= Program hit error 209 on CUDA API call.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame:  [0x4cb045] in enqueue.cc
=========         Host Frame:  [0x1c461d] in ncclCommInitRankFunc(ncclAsyncJob*)
=========
========= Program hit /build/nccl/src/allocator.cc (error 800) due to "ncclext::SymmetricMemory::create(...)" on CUDA API call to ncclMemAlloc.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: makeFixture(...) [0xa4c69] in ncclCommInitRankFunc(ncclAsyncJob*)
=========
========= Program hit error 800 on CUDA API call.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclext::Domain::create(...) [0x218e9] in libnccl_ep.so
=========
LOG
fail=0
python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/unprinted.log" > "$tmp/u" &&
  { echo "FAIL: reports past the print limit were not counted"; cat "$tmp/u"; fail=1; }
grep -q "attributed to NCCL by the suppression list: 1, ours: 7" "$tmp/u" ||
  { echo "FAIL: unprinted"; cat "$tmp/u"; fail=1; }
python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/shuffled.log" > "$tmp/s" &&
  { echo "FAIL: an error 800 naming no NCCL function was filtered"; cat "$tmp/s"; fail=1; }
grep -q "attributed to NCCL by the suppression list: 2, ours: 1" "$tmp/s" ||
  { echo "FAIL: shuffled"; cat "$tmp/s"; fail=1; }
python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/nccl.log" > "$tmp/a" ||
  { echo "FAIL: an API error inside libnccl was counted as ours"; cat "$tmp/a"; fail=1; }
grep -q "attributed to NCCL by the suppression list: 1, ours: 0" "$tmp/a" || { echo "FAIL: summary"; cat "$tmp/a"; fail=1; }
if python3 "$root/tools/sanitize_filter.py" "$root/tools/sanitize_suppressions.txt" "$tmp/ours.log" > "$tmp/b"; then
  echo "FAIL: reports of ours were filtered"; cat "$tmp/b"; fail=1
fi
grep -q "ours: 3" "$tmp/b" || { echo "FAIL: want 3 reports of ours"; cat "$tmp/b"; fail=1; }
for rc in 0 98; do echo '{"pass": true}' > "$tmp/r$rc.jsonl"; echo "log $rc" > "$tmp/r$rc.log"; done
printf 'a\t1\t0\t1.0\t%s\t%s\nb[memcheck,virtual]\t2\t98\t9.0\t%s\t%s\n' "$tmp/r0.jsonl" "$tmp/r0.log" \
  "$tmp/r98.jsonl" "$tmp/r98.log" > "$tmp/runs.tsv"
python3 "$root/tools/gpu_check_report.py" --runs "$tmp/runs.tsv" --out "$tmp/r.json" --kind gpu-sanitize > "$tmp/c" ||
  { echo "FAIL: an inconclusive run failed the report"; cat "$tmp/c"; fail=1; }
grep -q "1 passed, 0 failed, 1 inconclusive" "$tmp/c" || { echo "FAIL: report summary"; cat "$tmp/c"; fail=1; }
printf 'c\t2\t1\t2.0\t%s\t%s\n' "$tmp/r0.jsonl" "$tmp/r0.log" >> "$tmp/runs.tsv"
if python3 "$root/tools/gpu_check_report.py" --runs "$tmp/runs.tsv" --out "$tmp/r.json" > "$tmp/d"; then
  echo "FAIL: a failed run passed the report"; cat "$tmp/d"; fail=1
fi
[ $fail -eq 0 ] && echo "sanitize_filter: 4 logs, verdicts as expected; report: inconclusive and failed runs told apart"
exit $fail
