#!/usr/bin/env bash
# tools/gpu_check_releases.sh RELEASE...: make gpu-check's runs on one build once per NCCL release, side by side on
# the local GPUs: "found" (the NCCL the build links against: torch's on the GPU machines) or a VERSION preloaded from
# .nccl/VERSION (tools/nccl_preload.sh; ../shared/nccl/README.md), e.g. `found 2.30.7 2.29.7`. The build must serve every one of them
# (make NCCL_RELEASES=all). Every gpu_check.sh variable applies to each (GPU_CHECK_SKIP, GPU_CHECK_ONLY, ...), and
# GPU_CHECK_PARTS="1/4 2/4" runs those parts of each release's check (gpu_check.sh's GPU_CHECK_PART) side by side
# too. GPU_CHECK_BENCH defaults to 0 here: benchmarks that share a GPU with other runs measure nothing. Each check
# gets ports of its own (NCCL_EXT_PORT for the launcher's NCCL_COMM_ID, MASTER_PORT for single-process torch).
# Each release and part writes $GPU_CHECK_OUT/gpu-check-<time>-nccl<release>[-part<k>of<n>].json (its "nccl" field
# names the loaded release and the part of our libraries that served it); its log goes to $GPU_CHECK_LOGS (default
# $GPU_CHECK_OUT). Exit status: 0 if every release passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-bench/results}
logs=${GPU_CHECK_LOGS:-$out}
mkdir -p "$out" "$logs"
export GPU_CHECK_BENCH=${GPU_CHECK_BENCH:-0}
parts=(${GPU_CHECK_PARTS:-1/1})
names=() pids=()
[ $# -gt 0 ] || { echo "usage: tools/gpu_check_releases.sh found|VERSION..." >&2; exit 2; }
for r in "$@"; do
  for p in "${parts[@]}"; do
    tag=nccl$r
    [ "$p" != 1/1 ] && tag="$tag-part${p%/*}of${p#*/}"
    pre=()
    [ "$r" != found ] && pre=(tools/nccl_preload.sh "$r")
    port=$((29517 + 16 * ${#pids[@]}))
    NCCL_EXT_PORT=$port MASTER_PORT=$((port + 8)) GPU_CHECK_OUT=$out GPU_CHECK_TAG=$tag GPU_CHECK_PART=$p \
      "${pre[@]}" tools/gpu_check.sh > "$logs/$tag.log" 2>&1 &
    names+=("$tag") pids+=($!)
  done
done
status=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "== ${names[$i]}: exit $rc ($logs/${names[$i]}.log)"
  grep -E "^NCCL:|passed, .* failed|^results:" "$logs/${names[$i]}.log"
  grep -E "FAIL" "$logs/${names[$i]}.log" | head -5
  [ $rc -eq 0 ] || status=1
done
exit $status
