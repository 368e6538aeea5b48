"""An analytic model of hierarchical High-Throughput dispatch and combine across NVLink domains (issue "nccl_ep
across NVLink domains"): predicted time from the bytes each link carries and link rates, for N nodes of G GPUs.

    python bench/ep_model.py [--nodes 2,4,8,16] [--tokens 4096] [--hidden 7168] [--topk 8] [--experts 256]
                             [--node-limit 4] [--nvlink-GBps 340] [--nic-GBps 50] [--json FILE]

The scheme modelled (the issue's): a token crosses the rail once per destination node other than its own, to the GPU
with the sender's local index there, which forwards it over NVLink to the GPUs of that node hosting its experts;
tokens for the sender's own node go over NVLink directly. Combine reverses the path and reduces inside the node
before the rail hop, so it moves the same rows with the combine row size. Routing: each token's top-k experts are
distinct and uniformly random among E (experts split evenly over ranks); with --node-limit M, first M nodes are
chosen per token (DeepSeek-V3's group-limited gating: M = 4) and the experts among theirs. Per rank:

    rail bytes    = T x (expected other nodes hit) x row bytes
    NVLink bytes  = T x (expected other GPUs of its own node hit) x row bytes
                  + (tokens arriving over the rail) x (expected other GPUs of the node they must reach) x row bytes
    time          = max(rail bytes / NIC rate, NVLink bytes / NVLink rate) + a fixed latency (the two overlap
                    when chunked, as the design requires)

The probabilities are exact hypergeometric terms (tests/python/test_ep_model_cpu.py checks them against sampling).
Rates are inputs: the defaults are 50 GB/s per 400 Gb/s NIC (the issue) and 340 GB/s of NVLink per H200 (the best
public intranode EP figure on H200, shared/reference/ep-anchors.md); replace them with measured ones. Byte
convention: each row's bytes once per link crossing. What it is not: a measurement. It has not been checked
against runs across domains yet (none exist: issue 12), and DeepEP's published internode numbers (H800, whose
NVLink is 160 GB/s) are printed beside it for scale only.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import comb

# DeepEP V1 normal kernels, internode, H800 + CX7 400 Gb/s, 4096 tokens, hidden 7168, top-4 groups, top-8 experts,
# FP8 dispatch, BF16 combine: RDMA GB/s by EP size (shared/reference/ep-anchors.md).
DEEPEP_H800_RDMA_GBPS = {16: (43, 43), 32: (58, 57), 64: (51, 50)}


def p_none(pool: int, hosted: int, k: int) -> float:
    """Probability that k distinct experts drawn uniformly from `pool` miss all `hosted` of them."""
    if hosted <= 0:
        return 1.0
    if k > pool - hosted:
        return 0.0
    return comb(pool - hosted, k) / comb(pool, k)


def expected_hits(nodes: int, gpus: int, experts: int, k: int, node_limit: int = 0) -> dict:
    """Expected counts per token, seen from the sender: other nodes hit, other GPUs of its own node hit, and for a
    node that is hit, the GPUs of it hit other than the rail receiver (the GPU with the sender's local index)."""
    per_node, per_gpu = experts // nodes, experts // (nodes * gpus)
    m = nodes if node_limit <= 0 else min(node_limit, nodes)
    pool = m * per_node  # experts a token may pick from, once its m nodes are chosen
    # A given node is among the chosen m with probability m / nodes (all nodes alike, the sender's own included).
    chosen = m / nodes
    p_node = chosen * (1 - p_none(pool, per_node, k))
    p_gpu = chosen * (1 - p_none(pool, per_gpu, k))
    other_nodes = (nodes - 1) * p_node
    own_gpus = (gpus - 1) * p_gpu
    # Inside a hit node: the GPUs hit, minus the receiver itself when it is hit (it keeps its copy).
    gpus_hit_given_node = gpus * p_gpu / p_node if p_node > 0 else 0.0
    receiver_hit_given_node = p_gpu / p_node if p_node > 0 else 0.0
    forward = gpus_hit_given_node - receiver_hit_given_node
    return {"other_nodes": other_nodes, "own_node_gpus": own_gpus, "forward_per_arrival": forward,
            "p_node": p_node, "p_gpu": p_gpu}


def predict(nodes: int, gpus: int, tokens: int, hidden: int, k: int, experts: int, dispatch_row: int,
            combine_row: int, nvlink_gbps: float, nic_gbps: float, latency_us: float, node_limit: int = 0) -> dict:
    h = expected_hits(nodes, gpus, experts, k, node_limit)
    out = {"nodes": nodes, "gpus": nodes * gpus, **h}
    for kind, row in (("dispatch", dispatch_row), ("combine", combine_row)):
        rail = tokens * h["other_nodes"] * row
        arrivals = tokens * h["other_nodes"]  # symmetric traffic: as many rows arrive as leave
        nvl = tokens * h["own_node_gpus"] * row + arrivals * h["forward_per_arrival"] * row
        t_rail, t_nvl = rail / (nic_gbps * 1e9), nvl / (nvlink_gbps * 1e9)
        t = max(t_rail, t_nvl) + latency_us * 1e-6
        out[kind] = {"rail_bytes": rail, "nvlink_bytes": nvl, "rail_us": t_rail * 1e6, "nvlink_us": t_nvl * 1e6,
                     "time_us": t * 1e6, "bound": "rail" if t_rail >= t_nvl else "nvlink",
                     "rail_GBps_logical": rail / t / 1e9}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4,8,16")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--node-limit", type=int, default=4, help="nodes a token may reach (0: any)")
    ap.add_argument("--dispatch", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--nvlink-GBps", type=float, default=340.0)
    ap.add_argument("--nic-GBps", type=float, default=50.0)
    ap.add_argument("--latency-us", type=float, default=25.0, help="fixed cost of a call (launch, flags)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    meta = 8 + 12 * a.topk  # a row's flag and per-expert ids, weights and indices (ht.h MetaLayout)
    dispatch_row = (a.hidden + 4 * (a.hidden // 128) if a.dispatch == "fp8" else 2 * a.hidden) + meta
    combine_row = 2 * a.hidden
    rows = [predict(int(n), a.gpus, a.tokens, a.hidden, a.topk, a.experts, dispatch_row, combine_row, a.nvlink_GBps,
                    a.nic_GBps, a.latency_us, a.node_limit) for n in a.nodes.split(",")]
    print("ep_model: %d tokens x %d, top-%d of %d, %s dispatch, node limit %s, NVLink %.0f GB/s, NIC %.0f GB/s"
          % (a.tokens, a.hidden, a.topk, a.experts, a.dispatch, a.node_limit or "none", a.nvlink_GBps, a.nic_GBps))
    print("  nodes GPUs  other nodes/token  dispatch us (bound, rail GB/s)  combine us (bound, rail GB/s)  "
          "DeepEP H800 RDMA GB/s")
    for r in rows:
        d, c = r["dispatch"], r["combine"]
        dep = DEEPEP_H800_RDMA_GBPS.get(r["gpus"])
        print("  %5d %4d  %17.2f  %8.1f (%6s, %5.1f)        %8.1f (%6s, %5.1f)       %s" % (
            r["nodes"], r["gpus"], r["other_nodes"], d["time_us"], d["bound"], d["rail_GBps_logical"], c["time_us"],
            c["bound"], c["rail_GBps_logical"], "%d / %d" % dep if dep else "-"))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"test": "ep_model", "args": vars(a), "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
