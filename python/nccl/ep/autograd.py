"""Differentiable dispatch and combine: the gradient of dispatch is a combine of the received rows' gradients, and
the gradient of combine is a dispatch of the output's gradient through the same handle.

    recv_x, recv_w, handle = nccl.ep.autograd.dispatch(group, x, topk_idx, topk_weights)
    y = experts(recv_x, handle.topk_local, recv_w)      # weights applied by the caller, as in DeepEP
    out = nccl.ep.autograd.combine(group, y, handle)     # [T, H]: unweighted sum over the ranks each token went to
    out.sum().backward()                                 # grads for x, topk_weights and whatever made y

Layouts:
- FLAT (High-Throughput) and RANK_MAJOR (Low-Latency): one row per (token, rank) carrying the token's K weights
  (0 where the expert is elsewhere); differentiable in x, topk_weights and y. topk_weights' gradient keeps only the
  slots whose expert the receiving rank hosts (the others carried zeros). Low-Latency combine moves bf16 only, so
  the weights' gradients travel as three bf16 parts each (hi + mid + lo: the 24 bits of an fp32 mantissa), exactly:
  only the rank hosting a slot's expert sends a nonzero part for it.
- EXPERT_MAJOR (Low-Latency): one row per (token, expert); dispatch is differentiable in x (its gradient sums a
  token's expert rows: an owner-weighted combine with weights 1) and in topk_weights (each row carries its own
  weight; the row's gradient goes back to its token's top-k column), and combine, given the owner's topk_weights
  (as DeepEP's low_latency_combine), in y (each row's gradient is the token's output gradient times the row's
  weight) and in those weights (the dot product of the token's output gradient with the row, taken where the row
  is). A row's scalar reaches its owner in its top-k column: the expert side learns each row's column from one
  more dispatch (of a 16-byte row per token whose weights are the column numbers), places the scalar there as three
  bf16 parts, and the owner-weighted combine with weights 1 sums a token's rows, whose columns are apart: exact.
  That costs one dispatch and one combine of narrow rows per differentiated weight tensor.
- EXPERT_MAJOR (High-Throughput): as Low-Latency's, where combine weights each row with the dispatched weights (the
  last dispatch's on the handle): `combine(group, y, handle, topk_weights=w)` takes that tensor so that its
  gradient flows, and each unweighted sum of the backward (x's gradient, the scalars' return) follows a narrow
  dispatch with weights 1 (one more narrow dispatch each).

The handle (nccl.ep.Handle) stays alive for the backward pass; close it after backward."""

from __future__ import annotations

import torch

from . import Group, Handle, _combine_weights


def _bf16_parts(w):
    """fp32 [rows, k] -> bf16 [rows, 3k padded to a multiple of 8 columns] (rows of a multiple of 16 bytes, which
    combine moves): hi, mid and lo parts with hi + mid + lo == w in fp32 for normal values."""
    hi = w.to(torch.bfloat16)
    r = w - hi.float()
    mid = r.to(torch.bfloat16)
    lo = (r - mid.float()).to(torch.bfloat16)
    parts = torch.cat((hi, mid, lo), dim=1)
    pad = -parts.shape[1] % 8
    return torch.nn.functional.pad(parts, (0, pad)).contiguous() if pad else parts.contiguous()


def _from_bf16_parts(parts, k):
    p = parts.float()
    return p[:, :k] + p[:, k:2 * k] + p[:, 2 * k:3 * k]


def _narrow_dispatch(group: Group, handle: Handle, weights):
    """A dispatch of a zero row of 16 bytes per token with these top-k weights [T, k] (what EXPERT_MAJOR outputs
    learn from it: each row's weight)."""
    zeros = torch.zeros(handle.num_tokens, 8, dtype=torch.bfloat16, device=weights.device)
    return group.dispatch(zeros, handle=handle, topk_weights=weights.contiguous())


def _column_weights(num_tokens: int, k: int, device):
    """Top-k weights that name their column: column c weighs c + 1 (a pad, which weighs 0, names none)."""
    return torch.arange(1, k + 1, dtype=torch.float32, device=device).expand(num_tokens, k).contiguous()


def _columns_of(row_weights, k: int, valid=None):
    """Each EXPERT_MAJOR row's top-k column (int64 [rows]) from the weights it received of a dispatch with
    _column_weights (a token names each expert at most once, so a row's (token, expert) has one column); -1 on pads
    and where `valid` (if given) is False."""
    col = row_weights.float().round().long() - 1
    ok = (col >= 0) & (col < k)
    if valid is not None:
        ok &= valid
    return torch.where(ok, col, torch.full_like(col, -1))


def _onehot_parts(s, cols, k: int):
    """Per-row fp32 scalars s [rows] placed in their top-k columns `cols` (-1: dropped), as three bf16 parts each
    (_bf16_parts): summed over a token's rows, whose columns are apart, they give [T, k] back exactly."""
    ok = cols >= 0
    onehot = torch.zeros(s.shape[0], k, dtype=torch.float32, device=s.device)
    vals = torch.where(ok, s.float(), torch.zeros_like(s, dtype=torch.float32))
    onehot.scatter_(1, cols.clamp(min=0).unsqueeze(1), vals.unsqueeze(1))
    return _bf16_parts(onehot)


def _em_columns(group: Group, handle: Handle, k: int, device):
    """EXPERT_MAJOR: each received row's top-k column (int64 [rows]; -1 on pads and, Low-Latency, past the counts),
    from a narrow dispatch with _column_weights."""
    recv = _narrow_dispatch(group, handle, _column_weights(handle.num_tokens, k, device))
    valid = _valid_rows(group, handle.layout, recv.expert_counts, recv.rank_counts) if group.low_latency else None
    return _columns_of(recv.topk_weights, k, valid)


def _unweighted_combine(group: Group, handle: Handle, y, k: int):
    """EXPERT_MAJOR: each token's rows y summed (fp32, y's dtype). Low-Latency: the owner-weighted combine with
    weights 1; High-Throughput, whose EXPERT_MAJOR combine weights the rows with the last dispatch's weights: after
    a narrow dispatch with weights 1."""
    ones = torch.ones(handle.num_tokens, k, dtype=torch.float32, device=y.device)
    if group.low_latency:
        return group.combine(y.contiguous(), handle, topk_weights=ones)
    _narrow_dispatch(group, handle, ones)
    return group.combine(y.contiguous(), handle)


def _em_to_owner(group: Group, handle: Handle, s, cols, k: int):
    """Per-row fp32 scalars s [rows] of an EXPERT_MAJOR output -> [T, k] fp32 at each token's owner, each in its
    row's top-k column `cols` (-1: no row, dropped): _onehot_parts, summed unweighted."""
    return _from_bf16_parts(_unweighted_combine(group, handle, _onehot_parts(s, cols, k), k), k)


def _valid_rows(group: Group, layout: str, expert_counts, rank_counts):
    """Low-Latency: which rows of a worst-case dispatch output hold data, from that dispatch's counts (the rest are
    left as they were, maybe not finite: zeroed here, so that nothing computed on them reaches a gradient)."""
    if layout == "rank_major":  # row s * M + j: slot j of source s
        counts, width = rank_counts, group.max_tokens_per_rank
    else:  # row e * R * M + i: row i of zone e
        counts, width = expert_counts, group.size * group.max_tokens_per_rank
    return (torch.arange(width, device=counts.device).unsqueeze(0) < counts.unsqueeze(1)).flatten()


def _data_rows(group: Group, handle: Handle, recv):
    """Which rows of a dispatch output hold data (None: all of them): Low-Latency, those within the counts
    (_valid_rows); High-Throughput EXPERT_MAJOR, those within each expert's zone count (the zone's alignment pads,
    and with worst-case sizing the rows past the last zone, are left as they were)."""
    if group.low_latency:
        return _valid_rows(group, handle.layout, recv.expert_counts, recv.rank_counts)
    if handle.layout != "expert_major":
        return None
    r = torch.arange(recv.tokens.shape[0], device=recv.tokens.device)
    starts, counts = handle.expert_offsets.long(), handle.expert_counts.long()
    e = (torch.searchsorted(starts, r, right=True) - 1).clamp(min=0)
    return (r >= starts[e]) & (r < starts[e] + counts[e])


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, group: Group, handle: Handle):
        low_latency = group.low_latency
        recv = group.dispatch(x.to(torch.bfloat16) if low_latency else x, handle=handle,
                              topk_weights=topk_weights.float().contiguous())
        ctx.group, ctx.handle, ctx.layout = group, handle, handle.layout
        ctx.x_dtype, ctx.w_dtype, ctx.k = x.dtype, topk_weights.dtype, topk_weights.shape[1]
        tokens, weights, local = recv.tokens, recv.topk_weights, None
        if recv.topk_idx is not None:
            local = recv.topk_idx >= 0
        valid = _data_rows(group, handle, recv)
        if valid is not None:
            tokens = torch.where(valid.unsqueeze(1), tokens, torch.zeros_like(tokens))
            shape = (-1,) + (1,) * (weights.dim() - 1)
            weights = torch.where(valid.view(shape), weights, torch.zeros_like(weights))
            if local is not None:
                local &= valid.unsqueeze(1)
        ctx.local = local
        ctx.valid = valid
        handle.topk_local = recv.topk_idx
        return tokens, weights

    @staticmethod
    def backward(ctx, grad_tokens, grad_weights):
        grad_x = grad_w = None
        group, handle = ctx.group, ctx.handle
        if ctx.needs_input_grad[0] and grad_tokens is not None:
            if ctx.layout == "expert_major":  # the token's expert rows, summed
                dt = torch.bfloat16 if group.low_latency else ctx.x_dtype
                grad_x = _unweighted_combine(group, handle, grad_tokens.to(dt), ctx.k)
            elif group.low_latency:
                grad_x = group.combine(grad_tokens.to(torch.bfloat16).contiguous(), handle)
            else:
                grad_x = group.combine(grad_tokens.to(ctx.x_dtype).contiguous(), handle)
            grad_x = grad_x.to(ctx.x_dtype)
        if ctx.needs_input_grad[1] and grad_weights is not None:
            if ctx.layout == "expert_major":  # row r's weight came from its token's column cols[r]
                s = grad_weights.float()
                if ctx.valid is not None:
                    s = torch.where(ctx.valid, s, torch.zeros_like(s))
                cols = _em_columns(group, handle, ctx.k, grad_weights.device)
                grad_w = _em_to_owner(group, handle, s, cols, ctx.k).to(ctx.w_dtype)
            elif group.low_latency:
                w = torch.where(ctx.local, grad_weights.float(), torch.zeros_like(grad_weights, dtype=torch.float32))
                grad_w = _from_bf16_parts(group.combine(_bf16_parts(w), handle), ctx.k).to(ctx.w_dtype)
            else:
                grad_w = _combine_weights(lambda w: group.combine(w, handle), grad_weights, ctx.local).to(ctx.w_dtype)
        return grad_x, grad_w, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, topk_weights, group: Group, handle: Handle):
        ctx.group, ctx.handle, ctx.y_dtype = group, handle, y.dtype
        ctx.owner_weights = None if topk_weights is None else topk_weights.detach()
        if group.low_latency:
            y = y.to(torch.bfloat16)
        if topk_weights is None:
            return group.combine(y.contiguous(), handle)
        ctx.w_dtype, ctx.k = topk_weights.dtype, topk_weights.shape[1]
        ctx.rows = y if ctx.needs_input_grad[1] else None  # the weights' gradient takes dot products with them
        if not group.low_latency:  # High-Throughput EXPERT_MAJOR: weighted by the dispatch's (the same) weights
            return group.combine(y.contiguous(), handle)
        return group.combine(y.contiguous(), handle, topk_weights=topk_weights.float().contiguous())

    @staticmethod
    def backward(ctx, grad_out):
        group, handle, w = ctx.group, ctx.handle, ctx.owner_weights
        g = grad_out.to(torch.bfloat16 if group.low_latency else ctx.y_dtype).contiguous()
        if w is None:
            recv = group.dispatch(g, handle=handle)
            grad_y = recv.tokens
        else:  # each (token, expert) row: the token's output gradient times that row's owner weight
            recv = group.dispatch(g, handle=handle, topk_weights=w.float().contiguous())
            grad_y = recv.tokens.float() * recv.topk_weights.unsqueeze(1)
        valid = _data_rows(group, handle, recv)
        if valid is not None:
            grad_y = torch.where(valid.unsqueeze(1), grad_y, torch.zeros_like(grad_y))
        grad_w = None
        if w is not None and ctx.rows is not None:  # d out[t] / d w[t, k] = <grad_out[t], row (t, k)>
            dots = (recv.tokens.float() * ctx.rows.float()).sum(dim=1)
            if valid is not None:
                dots = torch.where(valid, dots, torch.zeros_like(dots))
            cols = _em_columns(group, handle, ctx.k, grad_out.device)
            grad_w = _em_to_owner(group, handle, dots, cols, ctx.k).to(ctx.w_dtype)
        return grad_y.to(ctx.y_dtype), grad_w, None, None


def dispatch(group: Group, x, topk_idx, topk_weights, handle: Handle | None = None, layout: str | None = None):
    """(recv_x, recv_topk_weights, handle), differentiable in x and (FLAT, RANK_MAJOR) topk_weights. The layout is
    the handle's, or `layout` for a new one (High-Throughput: "flat"; Low-Latency: "rank_major" by default, or
    "expert_major"). FLAT and RANK_MAJOR: the handle's `topk_local` holds the received rows' local expert ids
    (int32, -1 elsewhere)."""
    if handle is None:
        if layout is None:
            layout = "rank_major" if group.low_latency else "flat"
        sizing = "worst_case" if group.low_latency else "exact"
        handle = group.create_handle(topk_idx, layout=layout, sizing=sizing)
    elif topk_idx is not None and topk_idx is not handle.topk_idx:
        handle.update(topk_idx)
    if topk_weights is None:
        topk_weights = torch.ones(topk_idx.shape, dtype=torch.float32, device=x.device)
    recv_x, recv_w = _Dispatch.apply(x, topk_weights, group, handle)
    return recv_x, recv_w, handle


def combine(group: Group, y, handle: Handle, topk_weights=None):
    """[T, H], differentiable in y: FLAT and RANK_MAJOR each token's rows summed over the ranks it went to;
    EXPERT_MAJOR each token's expert rows weighted by `topk_weights` [T, K] (required there; differentiable too) and
    summed: Low-Latency, the owner's (DeepEP's low_latency_combine); High-Throughput, whose combine weights the rows
    with the dispatched weights, the very tensor given to dispatch (the combine must follow that dispatch on the
    handle, with no other dispatch between)."""
    if handle.layout == "expert_major":
        if topk_weights is None:
            raise NotImplementedError("nccl.ep.autograd.combine: EXPERT_MAJOR takes the top-k weights it applies (Low-"
                                      "Latency: the owner's; High-Throughput: the dispatched ones)")
    elif topk_weights is not None:
        raise NotImplementedError("nccl.ep.autograd.combine: topk_weights are for EXPERT_MAJOR; FLAT and "
                                  "RANK_MAJOR rows come already weighted by the caller")
    return _Combine.apply(y, topk_weights, group, handle)
