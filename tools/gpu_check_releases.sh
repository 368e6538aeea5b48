#!/usr/bin/env bash
# tools/gpu_check_releases.sh [VERSION...]: make gpu-check's runs on one build once per NCCL release, side by side on
# the local GPUs: "found" (the NCCL the build links against: torch's on the GPU machines) and each VERSION preloaded
# from .nccl/VERSION (tools/nccl_preload.sh; ../shared/nccl/README.md). The build must serve every one of them
# (make NCCL_RELEASES=all). Every gpu_check.sh variable applies to each (GPU_CHECK_PART, GPU_CHECK_SKIP, ...);
# GPU_CHECK_BENCH defaults to 0 here (benchmarks that share a GPU with other runs measure nothing).
# Each release writes $GPU_CHECK_OUT/<release>/gpu-check-<time>.json (its "nccl" field names the loaded release and
# the part of our libraries that served it) and its log to $GPU_CHECK_OUT/<release>.log.
# Exit status: 0 if every release passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-bench/results}
export GPU_CHECK_BENCH=${GPU_CHECK_BENCH:-0}
releases=(found "$@")
pids=()
for r in "${releases[@]}"; do
  mkdir -p "$out/$r"
  if [ "$r" = found ]; then
    GPU_CHECK_OUT=$out/$r tools/gpu_check.sh > "$out/$r.log" 2>&1 &
  else
    GPU_CHECK_OUT=$out/$r tools/nccl_preload.sh "$r" tools/gpu_check.sh > "$out/$r.log" 2>&1 &
  fi
  pids+=($!)
done
status=0
for i in "${!releases[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "== NCCL ${releases[$i]}: exit $rc ($out/${releases[$i]}.log)"
  grep -E "^NCCL:|passed|FAIL" "$out/${releases[$i]}.log" | tail -8
  [ $rc -eq 0 ] || status=1
done
exit $status
