#!/usr/bin/env python3
"""Plots an ep_bench result (bench/run_ep_bench.sh): dispatch and combine time and NVLink bandwidth against tokens
per rank (bf16, hidden 7168, FLAT, best SM count of each row), and time against SMs at 4096 tokens.
Usage: bench/plot_ep_bench.py bench/results/ep_bench-<time>.json docs/ep_bench.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

doc = json.load(open(sys.argv[1]))
rows = [r for r in doc["rows"] if r["dtype"] == "bf16" and r["layout"] == "flat" and r["hidden"] == 7168]
peer = next((b["GBps"] for b in doc["baselines"] if b["what"] == "peer_copy_ce_0to1"), None)
fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
for op, color in (("dispatch", "tab:blue"), ("combine", "tab:orange")):
    best = {}
    for r in rows:
        if r["what"] == "ep_" + op and (r["tokens"] not in best or r["us_median"] < best[r["tokens"]]["us_median"]):
            best[r["tokens"]] = r
    ts = sorted(best)
    ax[0].plot(ts, [best[t]["us_median"] for t in ts], "o-", color=color, label=op)
    ax[1].plot(ts, [best[t]["nvlink_GBps"] for t in ts], "o-", color=color, label=op)
    sweep = sorted((r["sms"], r["us_median"]) for r in rows if r["what"] == "ep_" + op and r["tokens"] == 4096)
    ax[2].plot([s for s, _ in sweep], [u for _, u in sweep], "o-", color=color, label=op)
ax[0].set(xscale="log", yscale="log", xlabel="tokens per rank", ylabel="median time (us)", title="time, best SM count")
ax[1].set(xscale="log", xlabel="tokens per rank", ylabel="GB/s over NVLink per rank", title="NVLink bandwidth")
if peer:
    ax[1].axhline(peer, color="gray", ls="--", label="copy-engine peer copy (same run)")
ax[2].set(xlabel="SMs", ylabel="median time (us)", title="4096 tokens: time vs SMs")
ax[2].axhline(197.9, color="tab:blue", ls=":", label="DeepEP dispatch, 128 SMs")
ax[2].axhline(212.6, color="tab:orange", ls=":", label="DeepEP combine, 128 SMs")
for a in ax:
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
gpus = doc.get("gpus", ["?"])
fig.suptitle("nccl_ep HT, bf16, hidden 7168, top-8 of 256 experts, %d x %s (commit %s)"
             % (len(gpus), gpus[0].split(",")[0], doc["git_commit"][:7]), fontsize=10)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("wrote", sys.argv[2])
