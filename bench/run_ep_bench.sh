#!/usr/bin/env bash
# EP benchmark with its baselines measured in the same run, at 2, 4 and 8 ranks (those the local GPUs allow; 1 on a
# single GPU; EP_BENCH_RANKS overrides): for each rank count ep_bench (High-Throughput) and ep_bench --mode ll
# (Low-Latency), then (2+ ranks, PyTorch present) bench/baselines/baseline_torch.py --world N: copy-engine peer copy,
# NCCL all_to_all, and the PyTorch all_to_all_single MoE dispatcher; then, with NVIDIA_EP_VENV, NVIDIA's
# nccl-extensions at 1 rank and bench/ep_vs_nvidia.py's pairing of its rows with ours. Writes
# $OUTDIR/ep_bench-<UTC>.json (machine, rows, ll_rows, baselines, vs_nvidia; every row and baseline names its rank
# count) and prints the comparison at the default shape.
# Usage: BUILDDIR=build bench/run_ep_bench.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
OUTDIR=${BENCH_OUT:-bench/results}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
RANKS=${EP_BENCH_RANKS:-$(for n in 2 4 8; do [ "$n" -le "$NGPU" ] && echo $n; done)}
[ -n "$RANKS" ] || RANKS=1
: > "$tmp/baseline.jsonl"
for n in $RANKS; do
  echo "== ep_bench on $n ranks"
  "$BUILDDIR/bin/ep_bench" --nranks "$n" --json "$tmp/ep.jsonl" "$@" || { echo "ep_bench failed"; exit 1; }
  echo "== ep_bench --mode ll on $n ranks"
  "$BUILDDIR/bin/ep_bench" --mode ll --nranks "$n" --json "$tmp/ll.jsonl" "$@" ||
    { echo "ep_bench --mode ll failed"; exit 1; }
  if [ "$n" -ge 2 ] && python3 -c 'import torch' 2>/dev/null; then
    timeout 600 python3 bench/baselines/baseline_torch.py --world "$n" >> "$tmp/baseline.jsonl" 2> "$tmp/baseline.err" ||
      { echo "baseline_torch.py --world $n failed:"; tail -5 "$tmp/baseline.err"; }
  fi
done
# NVIDIA's nccl-extensions (1 rank), in its own venv (tools/nvidia_ep_wheelhouse.sh): its rows join the baselines.
# NVIDIA_EP_NCCL_HOME (an unpacked NCCL 2.30.x) becomes its NCCL_HOME and LD_PRELOAD, in its process only.
if [ -n "${NVIDIA_EP_VENV:-}" ]; then
  echo "== NVIDIA nccl-extensions baseline ($NVIDIA_EP_VENV)"
  nv_env=(-u PYTHONPATH)
  [ -z "${NVIDIA_EP_NCCL_HOME:-}" ] ||
    nv_env+=(NCCL_HOME="$NVIDIA_EP_NCCL_HOME" LD_PRELOAD="$NVIDIA_EP_NCCL_HOME/lib/libnccl.so.2")
  env "${nv_env[@]}" timeout 600 "$NVIDIA_EP_VENV/bin/python" bench/baselines/baseline_nvidia_ep.py \
    --json "$tmp/nvidia.jsonl" "$@"
  rc=$?; [ $rc -eq 0 ] || [ $rc -eq 77 ] || echo "baseline_nvidia_ep.py failed (exit $rc)"
  if [ -s "$tmp/nvidia.jsonl" ]; then
    cat "$tmp/nvidia.jsonl" >> "$tmp/baseline.jsonl"
    python3 bench/ep_vs_nvidia.py --ours "$tmp"/ep.jsonl "$tmp"/ll.jsonl --nvidia "$tmp/nvidia.jsonl" \
      --json "$tmp/vs_nvidia.json" || echo "ep_vs_nvidia.py failed"
  fi
else
  echo "NVIDIA nccl-extensions baseline skipped: NVIDIA_EP_VENV is not set"
fi
python3 - "$tmp/ep.jsonl" "$tmp/baseline.jsonl" "$OUTDIR/ep_bench-$stamp.json" <<'PY'
import json, os, subprocess, sys, datetime
def lines(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
ep, base = lines(sys.argv[1]), lines(sys.argv[2])
tmp = os.path.dirname(sys.argv[1])
ll = lines(os.path.join(tmp, "ll.jsonl"))
vs = os.path.join(tmp, "vs_nvidia.json")
vs = json.load(open(vs))["rows"] if os.path.exists(vs) else []
sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
doc = {"kind": "ep_bench", "command": "bench/run_ep_bench.sh", "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "git_commit": os.environ.get("NCCL_EXT_GIT_COMMIT") or sh("git rev-parse HEAD 2>/dev/null") or "unknown",
       "gpus": sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").splitlines(),
       "rows": ep, "ll_rows": ll, "baselines": base, "vs_nvidia": vs}
json.dump(doc, open(sys.argv[3], "w"), indent=1)
def pick(what, **kw):
    for r in ep:
        if r["what"] == what and all(r.get(k) == v for k, v in kw.items()): yield r
for n in sorted({r["nranks"] for r in ep}):
    nb = [b for b in base if b.get("world", 2) == n]
    peer = next((b["GBps"] for b in nb if b["what"] == "peer_copy_ce_0to1"), None)
    torch_d = [b["us"] for b in nb if b["what"] == "naive_torch_moe_dispatch" and b["T"] == 4096]
    torch_c = [b["us"] for b in nb if b["what"] == "naive_torch_moe_combine" and b["T"] == 4096]
    print("\n%d ranks. baselines (same run): copy-engine peer copy %s GB/s; PyTorch dispatcher dispatch %s us, "
          "combine %s us" % (n, "%.1f" % peer if peer else "n/a", "%.0f" % max(torch_d) if torch_d else "n/a",
                             "%.0f" % max(torch_c) if torch_c else "n/a"))
    # DeepEP's figures (shared/reference/deepep-2xH200.md) are for 2 ranks only.
    for op, deepep in (("dispatch", 197.9 if n == 2 else None), ("combine", 212.6 if n == 2 else None)):
        rows = list(pick("ep_" + op, dtype="bf16", layout="flat", tokens=4096, hidden=7168, nranks=n))
        if not rows:
            continue
        best = min(rows, key=lambda r: r["us_median"])
        line = "%s bf16 4096x7168 top-8: best %.1f us at %d SMs (%.1f GB/s over NVLink" % (
            op, best["us_median"], best["sms"], best["nvlink_GBps"])
        if peer:
            line += ", %.0f%% of peer copy" % (100 * best["nvlink_GBps"] / peer)
        if best.get("ce_same_bytes_us_median"):
            line += ", %.0f%% of the copy engine moving the same bytes (%.1f us)" % (
                100 * best["ce_same_bytes_us_median"] / best["us_median"], best["ce_same_bytes_us_median"])
        bs = min(rows, key=lambda r: r.get("us_median_synced", 1e9))
        line += "; ranks synced before each call: %.1f us at %d SMs)" % (bs["us_median_synced"], bs["sms"])
        if deepep:
            line += "; DeepEP best %.1f us" % deepep
        tb = torch_d if op == "dispatch" else torch_c
        if tb:
            line += "; %.1fx faster than PyTorch" % (max(tb) / best["us_median"])
        print(line)
print("results: %s" % sys.argv[3])
PY
