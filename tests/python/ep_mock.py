"""A one-rank Low-Latency group in EXPERT_MAJOR written in torch on the CPU, as nccl.ep documents its semantics, for
the CPU tests of nccl.ep.autograd and nccl.ep.ops (tests of the formulas, not of the library)."""

import types

import torch


class MockLowLatency:
    """Dispatch rows e * M + i (i < expert_counts[e]) hold the tokens routed to expert e in token order, each with
    its own dispatched weight (rows past the counts: NaN, as unwritten memory may be); combine sums each token's
    rows in fp32, weighted by the owner's topk_weights when given (else by the dispatched ones), and returns bf16."""

    low_latency, size = True, 1

    def __init__(self, experts, max_tokens):
        self.local_experts, self.max_tokens_per_rank = experts, max_tokens
        self.calls = []

    def dispatch(self, x, handle, topk_weights=None, out_dtype=None, round_scale=False):
        idx, m = handle.topk_idx, self.max_tokens_per_rank
        tokens = torch.full((self.local_experts * m, x.shape[1]), float("nan")).to(x.dtype)
        weights = torch.full((self.local_experts * m,), float("nan"))
        counts = torch.zeros(self.local_experts, dtype=torch.int32)
        handle.rows = []
        for e in range(self.local_experts):
            for t in range(idx.shape[0]):
                ks = (idx[t] == e).nonzero().flatten().tolist()
                if ks:
                    r = e * m + int(counts[e])
                    tokens[r], weights[r] = x[t], 1.0 if topk_weights is None else topk_weights[t, ks[0]]
                    handle.rows.append((r, t, ks[0]))
                    counts[e] += 1
        handle.dispatched = weights
        self.calls.append(("dispatch", x.shape[1]))
        return types.SimpleNamespace(tokens=tokens, topk_weights=None if topk_weights is None else weights,
                                     expert_counts=counts, rank_counts=torch.tensor([idx.shape[0]], dtype=torch.int32),
                                     topk_idx=None, scales=None,
                                     src_info=torch.zeros(self.local_experts * m, dtype=torch.int32))

    def combine(self, y, handle, topk_weights=None):
        out = torch.zeros(handle.num_tokens, y.shape[1])
        for r, t, k in handle.rows:
            out[t] += (handle.dispatched[r] if topk_weights is None else topk_weights[t, k]) * y[r].float()
        self.calls.append(("combine", y.shape[1]))
        return out.to(torch.bfloat16)


class MockLowLatencyHandle:
    low_latency, layout, sizing = True, "expert_major", "worst_case"

    def __init__(self, group, topk_idx):
        self.group = group
        self.update(topk_idx)

    def update(self, topk_idx, stream=None):
        self.topk_idx, self.num_tokens, self.topk = topk_idx, topk_idx.shape[0], topk_idx.shape[1]

    def output_rows(self):
        return self.group.local_experts * self.group.size * self.group.max_tokens_per_rank


class MockHighThroughput:
    """One rank of a High-Throughput group in EXPERT_MAJOR with exact sizing: each local expert's zone holds the
    tokens routed to it in token order, padded to `alignment` rows (pads: NaN tokens, weight 0); the handle's
    expert_counts / expert_offsets give the zones; combine weights each row with the last dispatch's weights and
    sums a token's rows in fp32, returning y's dtype."""

    low_latency, size = False, 1

    def __init__(self, experts, alignment=4):
        self.local_experts, self.alignment = experts, alignment
        self.calls = []

    def dispatch(self, x, handle, topk_weights=None):
        idx, a = handle.topk_idx, self.alignment
        zones = [[(t, (idx[t] == e).nonzero().flatten().tolist()[0]) for t in range(idx.shape[0]) if (idx[t] == e).any()]
                 for e in range(self.local_experts)]
        starts, at = [], 0
        for z in zones:
            starts.append(at)
            at += -(-len(z) // a) * a
        tokens = torch.full((at, x.shape[1]), float("nan")).to(x.dtype)
        weights = torch.zeros(at)
        handle.rows = []
        for e, z in enumerate(zones):
            for i, (t, k) in enumerate(z):
                r = starts[e] + i
                tokens[r], weights[r] = x[t], 1.0 if topk_weights is None else topk_weights[t, k]
                handle.rows.append((r, t, k))
        handle.expert_counts = torch.tensor([len(z) for z in zones], dtype=torch.int32)
        handle.expert_offsets = torch.tensor(starts, dtype=torch.int32)
        handle.dispatched = weights
        self.calls.append(("dispatch", x.shape[1]))
        return types.SimpleNamespace(tokens=tokens, topk_weights=None if topk_weights is None else weights,
                                     topk_idx=None, expert_counts=handle.expert_counts)

    def combine(self, y, handle, topk_weights=None):
        assert topk_weights is None, "High-Throughput combine takes no owner weights"
        out = torch.zeros(handle.num_tokens, y.shape[1])
        for r, t, k in handle.rows:
            out[t] += handle.dispatched[r] * y[r].float()
        self.calls.append(("combine", y.shape[1]))
        return out.to(y.dtype)


class MockHighThroughputHandle:
    low_latency, layout, sizing = False, "expert_major", "exact"

    def __init__(self, group, topk_idx):
        self.group, self.topk_idx, self.num_tokens, self.topk = group, topk_idx, topk_idx.shape[0], topk_idx.shape[1]
