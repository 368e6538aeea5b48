"""Inputs every rank derives for every rank, for the tests of several ranks that check their own outputs against
torch without any exchange (test_ep_ll_ranks.py, test_ep_ht_ranks.py, test_deepep_ranks.py). Values are multiples
of 1/8 small enough that every product and sum those tests form is exact in fp32. Also a check both EP modes'
tests share (check_flat_rail_traffic)."""

import os

import torch


def routed_tokens(s, R, *, max_tokens, hidden, local, topk, seed, n_weights=1):
    """Source s's tokens among R ranks: (the routing [T_s, topk] over R * local experts, distinct ids with some -1;
    x [T_s, hidden] bf16 in [-4, 4]; n_weights weight tensors [T_s, topk] in [1/8, 1]), T_s in [5, max_tokens)."""
    gen = torch.Generator().manual_seed(seed + 17 * s + R)
    T = 5 + (7 * s + seed) % (max_tokens - 5)
    E = R * local
    k = min(topk, E)
    idx = torch.full((T, topk), -1, dtype=torch.int64)
    for t in range(T):
        idx[t, :k] = torch.randperm(E, generator=gen)[:k]
    idx[torch.rand(T, topk, generator=gen) < 0.15] = -1
    x = (torch.randint(-32, 33, (T, hidden), generator=gen) * 0.125).to(torch.bfloat16)
    weights = [torch.randint(1, 9, (T, topk), generator=gen) * 0.125 for _ in range(n_weights)]
    return (idx, x, *weights)


def on_rank(idx, d, local):
    """Whether each column's expert lives on rank d (local experts a rank)."""
    return (idx >= 0) & (idx // local == d)


def check_flat_rail_traffic(info, high_throughput):
    """Group.info() of a group over the flat exchange (one-GPU nodes): messages to each rank of another domain, its
    slices whole (Low-Latency: one a call, through an inbox; High-Throughput: one per region, two, straight into the
    window); the rail's own memory: an outbox per rank of another domain (Low-Latency: and an inbox); nothing with
    one domain."""
    G = info["domain_size"] if info["n_domains"] > 1 else 0
    assert info["rail_messages_per_domain"] == G * (2 if high_throughput else 1), info
    assert info["rail_dispatch_domain_bytes"] == G * info["rail_dispatch_bytes"], info
    assert info["rail_combine_domain_bytes"] == G * info["rail_combine_bytes"], info
    assert info["rail_relayed"] == 0 and info["rail_hierarchical"] == 0, info
    # High-Throughput's NVLink rows beside its rail rounds (NCCL_EXT_RAIL_OVERLAP=1; off by default).
    overlap = high_throughput and G and os.environ.get("NCCL_EXT_RAIL_OVERLAP", "0") == "1"
    assert info["rail_overlapped"] == (1 if overlap else 0), info
    remote = (info["n_domains"] - 1) * info["domain_size"] if G else 0
    box = info["rail_dispatch_bytes"] + info["rail_combine_bytes"] + info["rail_combine_owner_bytes"]
    boxes = remote if high_throughput else 2 * remote
    # An outbox holds one slice of each region (and, HT, the handle's count row: R + E + chunks + 1 ints).
    assert boxes * box <= info["rail_staging_bytes"] <= boxes * (box + (1 << 16)), info
