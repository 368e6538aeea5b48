#!/usr/bin/env bash
# tools/gpu_sanitize.sh's scheduling without a GPU: a stand-in nvidia-smi and compute-sanitizer (which writes a
# passing JSON line, or fails). One job and three run the same rows to the same verdicts; with three, every row of
# virtual ranks starts after the last of the others has ended and runs alone; a failed row fails the call; a time
# budget leaves rows not run and a resumed call runs only those, giving the rows done earlier their verdicts again from
# their logs (a row of virtual ranks that printed a wrong result fails, though it timed out); rows of virtual ranks keep
# their own timeout, and the EP ones their grid (--sms) and device-wait budget;
# GPU_SANITIZE_OURS_ONLY's rows get the kernel filters, and NCCL's kernels are excluded but under initcheck;
# GPU_SANITIZE_MODES keeps the modes it names, and GPU_SANITIZE_SKIP leaves out the rows a JSON settled; a stalled
# coschedule_probe row is named in the inconclusive rows of virtual ranks of its tool and mode.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "NVIDIA stand-in GPU"\n' > "$tmp/bin/nvidia-smi"
cat > "$tmp/bin/sanitizer" <<'STUB'
#!/usr/bin/env bash
# Logs its start and end (for the order) and whether it got the libraries' kernel filters and NCCL's kernels'
# exclusion, sleeps (FAKE_SLEEP_VIRTUAL for rows of virtual ranks), writes the test's JSON line, exits with FAKE_RC.
json="" prev="" tag="" ours=0 excl=0
for a in "$@"; do
  [ "$prev" = "--json" ] && json=$a; [ "$a" = kns=ncclep ] && ours=1; [ "$a" = kns=ncclDevKernel ] && excl=1; prev=$a
done
tag=$(basename "$json")
echo "$tag $ours$excl" >> "$FAKE_TRACE.filters"
echo "start $(date +%s.%N) $tag" >> "$FAKE_TRACE"
nap=${FAKE_SLEEP:-0.3}
case $tag in *virtual* | *mixed*) nap=${FAKE_SLEEP_VIRTUAL:-$nap} ;; esac
sleep "$nap"
[ -n "$json" ] && echo '{"test": "stand-in", "pass": true}' >> "$json"
echo "end $(date +%s.%N) $tag" >> "$FAKE_TRACE"
echo "========= ERROR SUMMARY: 0 errors"
exit "${FAKE_RC:-0}"
STUB
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/sanitizer"
run() {  # run TAG [VAR=VALUE...]: one call, its output in $tmp/TAG.log, its JSON in $tmp/TAG/
  local tag=$1
  shift
  env PATH="$tmp/bin:$PATH" COMPUTE_SANITIZER="$tmp/bin/sanitizer" FAKE_TRACE="$tmp/$tag.trace" \
    GPU_CHECK_OUT="$tmp/$tag" \
    GPU_SANITIZE_TOOLS=memcheck GPU_SANITIZE_ONLY='^(symmem|ep_ht)$' "$@" \
    bash "$root/tools/gpu_sanitize.sh" > "$tmp/$tag.log" 2>&1
}
summary() { grep -E "^[0-9]+ passed" "$tmp/$1.log"; }
fail=0
run one GPU_SANITIZE_JOBS=1 || { echo "FAIL: one job"; tail -5 "$tmp/one.log"; fail=1; }
run three GPU_SANITIZE_JOBS=3 || { echo "FAIL: three jobs"; tail -5 "$tmp/three.log"; fail=1; }
want="7 passed, 0 failed, 0 inconclusive, 0 not run"
[ "$(summary one)" = "$want" ] || { echo "FAIL: one job: $(summary one)"; fail=1; }
[ "$(summary three)" = "$want" ] || { echo "FAIL: three jobs: $(summary three)"; fail=1; }
# With three jobs: the others overlap, and each virtual row runs alone after all of them.
python3 - "$tmp/three.trace" <<'PY' || fail=1
import sys
ev = [l.split() for l in open(sys.argv[1])]
spans = {}
for kind, t, tag in ev:
    spans.setdefault(tag, {})[kind] = float(t)
virt = {t: s for t, s in spans.items() if "virtual" in t or "mixed" in t}
other = {t: s for t, s in spans.items() if t not in virt}
if len(virt) != 3 or len(other) != 4:
    sys.exit("FAIL: rows %d virtual, %d others" % (len(virt), len(other)))
if max(s["end"] for s in other.values()) > min(s["start"] for s in virt.values()):
    sys.exit("FAIL: a row of virtual ranks started before the others ended")
for a, sa in virt.items():
    for b, sb in spans.items():
        if a != b and sa["start"] < sb["end"] and sb["start"] < sa["end"]:
            sys.exit("FAIL: %s overlapped %s" % (a, b))
if not any(sa["start"] < sb["end"] and sb["start"] < sa["end"]
           for a, sa in other.items() for b, sb in other.items() if a < b):
    sys.exit("FAIL: no two rows ran at once")
PY
run failing GPU_SANITIZE_JOBS=3 FAKE_RC=1 && { echo "FAIL: failed rows passed the call"; fail=1; }
[ "$(summary failing)" = "0 passed, 7 failed, 0 inconclusive, 0 not run" ] ||
  { echo "FAIL: failing: $(summary failing)"; fail=1; }
# A budget that leaves rows for later (each row may take 2 s of a 4 s budget), then a resumed call for the rest.
run part1 GPU_SANITIZE_JOBS=3 GPU_SANITIZE_RESUME="$tmp/raw" GPU_SANITIZE_RUN_TIMEOUT=2 GPU_SANITIZE_BUDGET_S=4 \
  FAKE_SLEEP=1
n1=$(wc -l < "$tmp/raw/done.tsv")
run part2 GPU_SANITIZE_JOBS=3 GPU_SANITIZE_RESUME="$tmp/raw"
n2=$(wc -l < "$tmp/raw/done.tsv")
{ [ "$n1" -gt 0 ] && [ "$n1" -lt 7 ] && [ "$n2" -eq 7 ]; } ||
  { echo "FAIL: resumed: $n1 rows, then $n2 (want some, then 7)"; fail=1; }
[ "$(summary part2)" = "$want" ] || { echo "FAIL: resumed: $(summary part2)"; fail=1; }
# A resumed call gives rows done earlier their verdict again from their logs under the suppression list as it is:
# a 99 whose only report is NCCL's (an entry added later) passes; a pass whose log holds a report of ours fails; a
# mixed row that timed out with NCCL's report only is inconclusive. The four other rows run and pass.
rv="$tmp/rv"
mkdir -p "$rv"
nccl_report='========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
========='
ours_report='========= Invalid __global__ read of size 16 bytes
=========     at ncclext::dev::copyRows(...)+0x1a0 in copy.cuh:80
========='
done_row() {  # done_row TAG N RC LOG-TEXT: a row an earlier call ran, with a passing JSON line and its log
  echo '{"test": "stand-in", "pass": true}' > "$rv/$1.$2.jsonl"
  printf '%s\n' "$4" > "$rv/$1.$2.log"
  printf '%s\t%s\t%s\t1.0\t/elsewhere/%s.%s.jsonl\t/elsewhere/%s.%s.log\n' "$1" "$2" "$3" "$1" "$2" "$1" "$2" \
    >> "$rv/done.tsv"
}
done_row 'symmem[memcheck,virtual]' 2 99 "$nccl_report"
done_row 'symmem[memcheck]' 1 0 "$ours_report
gpu-sanitize: the test's exit status: 0"
done_row 'ep_ht[memcheck,mixed]' 4 124 "$nccl_report
rank 1: a device wait timed out after 120 s"
done_row 'ep_ht[memcheck,virtual]' 2 98 "rank 1 [hidden 8 bf16, em] combine differs at token/col (0, 0)
rank 3 combine: a device wait timed out after 20 s
gpu-sanitize: the test's exit status: 124"
run reverdict GPU_SANITIZE_JOBS=3 GPU_SANITIZE_RESUME="$rv" && { echo "FAIL: reverdict: a failed row passed"; fail=1; }
[ "$(summary reverdict)" = "4 passed, 2 failed, 1 inconclusive, 0 not run" ] ||
  { echo "FAIL: reverdict: $(summary reverdict)"; fail=1; }
for change in 'symmem\[memcheck,virtual\] on 2 .* exit 99 -> 0' 'symmem\[memcheck\] on 1 .* exit 0 -> 99' \
              'ep_ht\[memcheck,mixed\] on 4 .* exit 124 -> 98' 'ep_ht\[memcheck,virtual\] on 2 .* exit 98 -> 124'; do
  grep -q "$change" "$tmp/reverdict.log" || { echo "FAIL: reverdict: no line matching '$change'"; fail=1; }
done
[ "$(grep -c "earlier call (GPU_SANITIZE_RESUME)$" "$tmp/reverdict.log")" = 4 ] ||
  { echo "FAIL: reverdict: rows run again"; fail=1; }
# Rows of virtual ranks under their own timeout: killed, inconclusive; the others keep the run timeout.
run vt GPU_SANITIZE_JOBS=3 GPU_SANITIZE_RUN_TIMEOUT=5 GPU_SANITIZE_VIRTUAL_TIMEOUT=1 FAKE_SLEEP_VIRTUAL=3
[ "$(summary vt)" = "4 passed, 0 failed, 3 inconclusive, 0 not run" ] ||
  { echo "FAIL: virtual timeout: $(summary vt)"; fail=1; }
# A stalled coschedule_probe row of the same tool and mode (this call's, or settled in GPU_SANITIZE_SKIP's JSON) is
# named in the inconclusive rows of virtual ranks ("tool_stall"); GPU_SANITIZE_TOOL_STALLS=not-run makes them not run.
stall() {  # stall TAG [VAR=VALUE...]: rows of virtual ranks, killed by their timeout
  local tag=$1
  shift
  run "$tag" GPU_SANITIZE_MODES="virtual mixed" GPU_SANITIZE_VIRTUAL_TIMEOUT=1 FAKE_SLEEP_VIRTUAL=3 "$@"
}
stall_of() {  # stall_of TAG: ep_ht's rows and their tool_stall, if any
  python3 -c 'import json, sys; print(" ".join("%s:%s" % (r["name"], r.get("tool_stall", "-"))
      for r in json.load(open(sys.argv[1]))["runs"] if r["name"].startswith("ep_ht")))' "$tmp"/$1/gpu-sanitize-*.json
}
stall stall GPU_SANITIZE_ONLY='^(coschedule_probe|ep_ht)$' GPU_SANITIZE_RESUME="$tmp/stall_raw"
[ "$(summary stall)" = "0 passed, 0 failed, 4 inconclusive, 0 not run" ] ||
  { echo "FAIL: stall: $(summary stall)"; fail=1; }
want_s="ep_ht[memcheck,virtual]:coschedule_probe[memcheck,virtual] on 2 ranks stalled (this call)"
want_s="$want_s ep_ht[memcheck,mixed]:coschedule_probe[memcheck,mixed] on 4 ranks stalled (this call)"
[ "$(stall_of stall)" = "$want_s" ] || { echo "FAIL: stall: $(stall_of stall)"; fail=1; }
stall stall_not_run GPU_SANITIZE_ONLY='^(coschedule_probe|ep_ht)$' GPU_SANITIZE_RESUME="$tmp/stall_raw" \
  GPU_SANITIZE_TOOL_STALLS=not-run
[ "$(summary stall_not_run)" = "0 passed, 0 failed, 2 inconclusive, 2 not run" ] ||
  { echo "FAIL: stall, not-run: $(summary stall_not_run)"; fail=1; }
grep -q "ep_ht\[memcheck,mixed\] .*not run: memcheck does not run two streams' kernels" "$tmp/stall_not_run.log" ||
  { echo "FAIL: stall, not-run: no reason"; fail=1; }
python3 - "$tmp"/stall/gpu-sanitize-*.json "$tmp/probe_settled.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["runs"] = [r for r in d["runs"] if r["name"].startswith("coschedule_probe")]
json.dump(d, open(sys.argv[2], "w"))
PY
stall stall_skip GPU_SANITIZE_ONLY='^(coschedule_probe|ep_ht)$' GPU_SANITIZE_MODES=virtual \
  GPU_SANITIZE_SKIP="$tmp/probe_settled.json"
[ "$(stall_of stall_skip)" = \
  "ep_ht[memcheck,virtual]:coschedule_probe[memcheck,virtual] on 2 ranks stalled (probe_settled.json)" ] ||
  { echo "FAIL: stall, skip: $(stall_of stall_skip)"; fail=1; }
# GPU_SANITIZE_OURS_ONLY: the matching rows get the libraries' kernel filters, except under initcheck; NCCL's kernels
# are excluded everywhere but under initcheck (which follows what they write).
run ours GPU_SANITIZE_TOOLS="memcheck initcheck" GPU_SANITIZE_OURS_ONLY='^ep_ht$' ||
  { echo "FAIL: ours: $(summary ours)"; fail=1; }
got=$(sort "$tmp/ours.trace.filters" | sed 's/\.[0-9]*\.jsonl//' | paste -sd' ')
want_f="ep_ht[initcheck,mixed] 00 ep_ht[initcheck,nodes] 00 ep_ht[initcheck,virtual] 00 ep_ht[initcheck] 00"
want_f="$want_f ep_ht[memcheck,mixed] 11 ep_ht[memcheck,nodes] 11 ep_ht[memcheck,virtual] 11 ep_ht[memcheck] 11"
want_f="$want_f symmem[initcheck,nodes] 00 symmem[initcheck,virtual] 00 symmem[initcheck] 00"
want_f="$want_f symmem[memcheck,nodes] 01 symmem[memcheck,virtual] 01 symmem[memcheck] 01"
[ "$got" = "$want_f" ] || { echo "FAIL: filters: $got"; fail=1; }
# The EP rows of virtual ranks run small grids and a short device-wait budget; the others the test's grid and 120 s.
cmd_of() {  # cmd_of TAG: the command GPU_SANITIZE_LIST prints for row TAG
  GPU_SANITIZE_LIST=1 GPU_SANITIZE_TOOLS=memcheck GPU_SANITIZE_ONLY='^ep_ht$' bash "$root/tools/gpu_sanitize.sh" |
    awk -v t="$1" 'f { print; exit } $2 == t { f = 1 }'
}
for t in 'ep_ht[memcheck,virtual]' 'ep_ht[memcheck,mixed]'; do
  c=$(cmd_of "$t")
  [[ $c == *"--timeout-s 20 "* && $c == *" --sms 4"* ]] || { echo "FAIL: $t: $c"; fail=1; }
done
c=$(cmd_of 'ep_ht[memcheck,nodes]')
[[ $c == *"--timeout-s 120 "* && $c != *--sms* ]] || { echo "FAIL: ep_ht[memcheck,nodes]: $c"; fail=1; }
# GPU_SANITIZE_SKIP: the rows a JSON settled do not run again, and a row that failed there does.
python3 - "$tmp"/one/gpu-sanitize-*.json "$tmp/settled.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["runs"][0]["sanitize"] = "fail"
json.dump(d, open(sys.argv[2], "w"))
PY
run skip GPU_SANITIZE_SKIP="$tmp/settled.json"
{ [ "$(summary skip)" = "1 passed, 0 failed, 0 inconclusive, 0 not run" ] &&
  [ "$(grep -c '^start' "$tmp/skip.trace")" = 1 ]; } || { echo "FAIL: skip: $(summary skip)"; fail=1; }
# GPU_SANITIZE_MODES keeps the rows of the modes it names.
got=$(GPU_SANITIZE_LIST=1 GPU_SANITIZE_TOOLS=memcheck GPU_SANITIZE_ONLY='^ep_ht$' GPU_SANITIZE_MODES='nodes mixed' \
  bash "$root/tools/gpu_sanitize.sh" | awk '$2 ~ /\[/ { print $2 }' | paste -sd' ')
[ "$got" = "ep_ht[memcheck,nodes] ep_ht[memcheck,mixed]" ] || { echo "FAIL: modes: $got"; fail=1; }
[ $fail -eq 0 ] &&
  echo "gpu_sanitize_jobs: one and three jobs alike, virtual rows alone and last, failures and budgets kept," \
    "virtual rows' own timeout, grid and device-wait budget, kernel filters and NCCL's exclusion per tool, resumed" \
    "rows' verdicts read again, the probe's stalls named"
exit $fail
