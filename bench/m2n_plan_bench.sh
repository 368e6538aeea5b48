#!/usr/bin/env bash
# Planner benchmark (CPU): a DeepSeek-V3-like model (46,182 tensors) from 256 trainer ranks (tp=8,pp=8,dp=4,ep=4)
# to 64 inference ranks (tp=8,dp=8,ep=8), 8 GPUs per NVLink domain. Times the per-rank plan of 8 ranks (the
# busiest first), with its schedule and the tables an execute reads (the host work of ncclM2nPlanCreate after the
# ranks' agreement), on one core and writes bench/results/m2n_plan_bench-<time>.json with the CPU and git commit.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
OUTDIR=${BENCH_OUT:-bench/results}
mkdir -p "$OUTDIR"
out="$OUTDIR/m2n_plan_bench-$(date -u +%Y%m%dT%H%M%SZ).json"
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
$pin "$BUILDDIR/bin/m2n_plan" bench/configs/deepseek-v3.json --src tp=8,pp=8,dp=4,ep=4 --dst tp=8,dp=8,ep=8 \
  --ranks-per-node 8 --bench-ranks 8 --json > "$out.tmp"
python3 - "$out.tmp" "$out" <<'PY'
import json, platform, subprocess, sys, datetime
d = json.load(open(sys.argv[1]))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = "unknown"
d["machine"] = {"cpu": cpu, "cores_used": 1, "git_commit": commit,
                "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
d["command"] = "bench/m2n_plan_bench.sh"
json.dump(d, open(sys.argv[2], "w"), indent=1)
times = sorted(r["seconds"] for r in d["per_rank_plan"])
# The host work of ncclM2nPlanCreate after the agreement: plan, schedule and the execute's tables.
totals = sorted(r["seconds"] + r["schedule_seconds"] + r.get("tables_seconds", 0) for r in d["per_rank_plan"])
print("m2n_plan_bench: %s, %d tensors, %d ranks: per-rank plan median %.3f s, max %.3f s; plan + schedule + tables "
      "median %.3f s, max %.3f s, on one core (%s)"
      % (d["model"], d["tensors"], d["ranks"], times[len(times) // 2], times[-1], totals[len(totals) // 2],
         totals[-1], cpu))
print("results: %s" % sys.argv[2])
PY
rm -f "$out.tmp"
