"""DeepEP V2's ElasticBuffer dispatch and combine in plain torch: the oracle of nccl.ep.deepep_elastic's tests
(test_deepep_elastic_cpu.py against a CPU model of nccl.ep, test_deepep_elastic_gpu.py on the GPU).

Ordering contract (DeepEP's deterministic order, which nccl.ep's layouts have): the tokens a rank receives are ordered
by global index, source rank * M + token (M = num_max_tokens_per_rank); expanded rows are grouped by local expert,
each zone starting at a multiple of the alignment (pad rows zero), and ordered by global index inside.

Combine data: every row value is k / 512 with |k| < 256, exact in bf16, and every sum the tests form is exact in fp32,
so that the only rounding is the one to bf16 that the contract places (after each rank's sum of its expanded rows
with allow_multiple_reduction, and at the end)."""

import torch


def align(n, a):
    return -(-n // a) * a


def fp8_tokens(x, packed=False):
    """x [T, H] as (e4m3 [T, H], fp32 scales [T, H / 128]), or with packed=True power-of-two scales as DeepEP's UE8M0
    packs them (int32 [T, ceil(H / 512)]: their exponent bytes, four a word, the first in the low byte). Dispatch
    forwards these bytes as they are."""
    s = x.float().abs().view(x.shape[0], -1, 128).amax(-1).clamp(min=1e-4) / 448
    if packed:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (x.float().view(x.shape[0], -1, 128) / s.unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn)
    if not packed:
        return q, s
    exponents = torch.nn.functional.pad((s.view(torch.int32) >> 23) & 0xFF, (0, -s.shape[1] % 4))
    words = exponents.view(x.shape[0], -1, 4) << torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    return q, words.sum(-1, dtype=torch.int32)


def value(g, j):
    """A number for token global index g and top-k column (or rank) j: k / 512, |k| <= 248 (row()'s base)."""
    return float(((g * 37 + j * 101) % 497) - 248) / 512


class Received:
    """What rank `me` receives from routings[s] ([T_s, K] int64 on the CPU, -1: none) with `local` experts a rank."""

    def __init__(self, routings, me, local, m, alignment=1):
        self.me, self.local, self.m, self.alignment = me, local, m, alignment
        self.k = routings[0].shape[1]
        lo = me * local
        self.tokens = []  # (source, token), by global index
        ids = []
        for s, idx in enumerate(routings):
            for t in range(idx.shape[0]):
                row = [int(e) - lo if lo <= int(e) < lo + local else -1 for e in idx[t]]
                if any(e >= 0 for e in row):
                    self.tokens.append((s, t))
                    ids.append(row)
        self.n = len(self.tokens)
        self.local_ids = torch.tensor(ids, dtype=torch.int64).view(self.n, self.k)
        self.gidx = [s * m + t for s, t in self.tokens]
        self.counts = [int((self.local_ids == e).sum()) for e in range(local)]
        self.offsets, at = [], 0
        for c in self.counts:
            self.offsets.append(at)
            at += align(c, alignment)
        self.expanded_rows = at
        # slots[i][j]: the expanded row of token i's column j (-1: its expert is elsewhere)
        self.slots = [[-1] * self.k for _ in range(self.n)]
        for e in range(local):
            r = self.offsets[e]
            for i in range(self.n):
                for j in range(self.k):
                    if int(self.local_ids[i, j]) == e:
                        self.slots[i][j] = r
                        r += 1

    def first_column(self, i):
        return next(j for j in range(self.k) if int(self.local_ids[i, j]) >= 0)

    def rows(self, per_source):
        """Rows [N, ...] gathered from per_source[s] ([T_s, ...]) in receive order."""
        if not self.tokens:
            return per_source[0][:0]
        return torch.stack([per_source[s][t] for s, t in self.tokens])

    def expanded(self, per_source):
        """Rows [expanded_rows, ...] of the expanded layout gathered from per_source[s] (pad rows zero)."""
        proto = per_source[0]
        out = torch.zeros((self.expanded_rows,) + tuple(proto.shape[1:]), dtype=proto.dtype)
        for i, (s, t) in enumerate(self.tokens):
            for j in range(self.k):
                if self.slots[i][j] >= 0:
                    out[self.slots[i][j]] = per_source[s][t]
        return out

    def expanded_weights(self, weights):
        """[expanded_rows] fp32: each row's weight (its token's column's), 0 on pads."""
        out = torch.zeros(self.expanded_rows, dtype=torch.float32)
        for i, (s, t) in enumerate(self.tokens):
            for j in range(self.k):
                if self.slots[i][j] >= 0:
                    out[self.slots[i][j]] = float(weights[s][t, j])
        return out

    def metadata(self, expanded):
        """recv_src_metadata [N, K + 2]: global index, source * K + first local column, the expanded rows (or -1)."""
        rows = []
        for i, (s, t) in enumerate(self.tokens):
            rows.append([self.gidx[i], s * self.k + self.first_column(i)] + (self.slots[i] if expanded else
                                                                              [-1] * self.k))
        return torch.tensor(rows, dtype=torch.int32).view(self.n, self.k + 2)

    def per_source_tokens(self, ranks):
        return [sum(1 for s, _ in self.tokens if s == r) for r in range(ranks)]


def row(g, j, hidden):
    """The test's expert output row for token global index g and top-k column (or rank) j: bf16 values of several
    magnitudes, so that the order of an fp32 sum of them shows in its bits."""
    col = torch.arange(hidden, dtype=torch.float64)
    return (value(g, j) * 3.3 + torch.sin(col * 0.37 + g) * (1 + (g + j) % 5)).to(torch.bfloat16)


def combine_inputs(rec, hidden, expanded):
    """The rows a rank gives combine: not expanded, row i = row(g_i, me); expanded, row (token i, column j) =
    row(g_i, j). [rows, hidden] bf16 (pads: NaN, never read)."""
    if not expanded:
        out = torch.full((rec.n, hidden), float("nan"), dtype=torch.bfloat16)
        for i in range(rec.n):
            out[i] = row(rec.gidx[i], rec.me, hidden)
        return out
    out = torch.full((rec.expanded_rows, hidden), float("nan"), dtype=torch.bfloat16)
    for i in range(rec.n):
        for j in range(rec.k):
            if rec.slots[i][j] >= 0:
                out[rec.slots[i][j]] = row(rec.gidx[i], j, hidden)
    return out


def rank_order(ids, local):
    """DeepEP V2's order of a token's ranks in combine: each rank at the last top-k column it hosts, columns in
    order."""
    ranks = [e // local if e >= 0 else -1 for e in ids]
    return [d for j, d in enumerate(ranks) if d >= 0 and d not in ranks[j + 1:]]


def combined(idx, me, local, m, hidden, expanded, multiple_reduction=True, biases=()):
    """What combine returns to rank `me` (its routing idx [T, K]) when every rank gave combine_inputs, in DeepEP's
    order and roundings: per token, from the biases' fp32 sum (or 0), each rank's part (not expanded: row(g, rank);
    expanded: the fp32 sum of row(g, j) over its columns there in column order, rounded to bf16 with
    multiple_reduction) in rank_order, in fp32, rounded to bf16 once. Expanded without multiple reduction (fp32 rows,
    nccl.ep's own path) the biases come after the parts, one by one."""
    t_count, k = idx.shape
    bias_first = multiple_reduction or not expanded
    out = torch.empty((t_count, hidden), dtype=torch.bfloat16)
    for t in range(t_count):
        g = me * m + t
        ids = [int(e) for e in idx[t]]
        acc = torch.zeros(hidden, dtype=torch.float32)
        if biases and bias_first:
            acc += biases[0][t].float() if len(biases) == 1 else biases[0][t].float() + biases[1][t].float()
        for d in rank_order(ids, local):
            if not expanded:
                acc += row(g, d, hidden).float()
                continue
            part = torch.zeros(hidden, dtype=torch.float32)
            for j in range(k):
                if ids[j] >= 0 and ids[j] // local == d:
                    part += row(g, j, hidden).float()
            acc += part.to(torch.bfloat16).float() if multiple_reduction else part
        if not bias_first:
            for b in biases:
                acc += b[t].float()
        out[t] = acc.to(torch.bfloat16)
    return out


def dst_slots(idx, local, ranks):
    """dst_buffer_slot_idx: each (token, column)'s position among the tokens that go to its expert's rank."""
    t_count, k = idx.shape
    seen = [0] * ranks
    out = torch.full((t_count, k), -1, dtype=torch.int32)
    for t in range(t_count):
        hit = sorted({int(e) // local for e in idx[t] if int(e) >= 0})
        for j in range(k):
            if int(idx[t, j]) >= 0:
                out[t, j] = seen[int(idx[t, j]) // local]
        for d in hit:
            seen[d] += 1
    return out
