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
  token's expert rows: an owner-weighted combine with weights 1), and combine, given the owner's topk_weights (as
  DeepEP's low_latency_combine), in y (each row's gradient is the token's output gradient times the row's weight).
  The weights' gradients are not implemented there (the expert side does not know which top-k column a row came
  from): topk_weights that require grad are refused with NotImplementedError. High-Throughput EXPERT_MAJOR is not
  differentiable yet (NotImplementedError).

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


def _valid_rows(group: Group, layout: str, recv):
    """Low-Latency: which rows of a worst-case dispatch output hold data (the rest are left as they were, maybe not
    finite: zeroed here, so that nothing computed on them reaches a gradient)."""
    if layout == "rank_major":  # row s * M + j: slot j of source s
        counts, width = recv.rank_counts, group.max_tokens_per_rank
    else:  # row e * R * M + i: row i of zone e
        counts, width = recv.expert_counts, group.size * group.max_tokens_per_rank
    return (torch.arange(width, device=counts.device).unsqueeze(0) < counts.unsqueeze(1)).flatten()


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
        if low_latency:
            valid = _valid_rows(group, handle.layout, recv)
            tokens = torch.where(valid.unsqueeze(1), tokens, torch.zeros_like(tokens))
            shape = (-1,) + (1,) * (weights.dim() - 1)
            weights = torch.where(valid.view(shape), weights, torch.zeros_like(weights))
            if local is not None:
                local &= valid.unsqueeze(1)
        ctx.local = local
        handle.topk_local = recv.topk_idx
        return tokens, weights

    @staticmethod
    def backward(ctx, grad_tokens, grad_weights):
        grad_x = grad_w = None
        group, handle = ctx.group, ctx.handle
        if ctx.needs_input_grad[0] and grad_tokens is not None:
            if ctx.layout == "expert_major":  # the token's expert rows, summed (owner weights 1)
                ones = torch.ones(handle.num_tokens, ctx.k, dtype=torch.float32, device=grad_tokens.device)
                grad_x = group.combine(grad_tokens.to(torch.bfloat16).contiguous(), handle, topk_weights=ones)
            elif group.low_latency:
                grad_x = group.combine(grad_tokens.to(torch.bfloat16).contiguous(), handle)
            else:
                grad_x = group.combine(grad_tokens.to(ctx.x_dtype).contiguous(), handle)
            grad_x = grad_x.to(ctx.x_dtype)
        if ctx.needs_input_grad[1] and grad_weights is not None:
            if group.low_latency:
                w = torch.where(ctx.local, grad_weights.float(), torch.zeros_like(grad_weights, dtype=torch.float32))
                grad_w = _from_bf16_parts(group.combine(_bf16_parts(w), handle), ctx.k).to(ctx.w_dtype)
            else:
                grad_w = _combine_weights(lambda w: group.combine(w, handle), grad_weights, ctx.local).to(ctx.w_dtype)
        return grad_x, grad_w, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, topk_weights, group: Group, handle: Handle):
        ctx.group, ctx.handle, ctx.y_dtype = group, handle, y.dtype
        ctx.owner_weights = topk_weights
        if group.low_latency:
            y = y.to(torch.bfloat16)
        if topk_weights is None:
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
        if group.low_latency:
            valid = _valid_rows(group, handle.layout, recv).unsqueeze(1)
            grad_y = torch.where(valid, grad_y, torch.zeros_like(grad_y))
        return grad_y.to(ctx.y_dtype), None, None, None


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
    if not group.low_latency and handle.layout != "flat":
        raise NotImplementedError("nccl.ep.autograd: High-Throughput %s is not differentiable yet (FLAT is)"
                                  % handle.layout.upper())
    if handle.layout == "expert_major" and topk_weights is not None and topk_weights.requires_grad:
        raise NotImplementedError("nccl.ep.autograd: the top-k weights' gradient through EXPERT_MAJOR is not "
                                  "implemented (use RANK_MAJOR, or pass weights that do not require grad)")
    if topk_weights is None:
        topk_weights = torch.ones(topk_idx.shape, dtype=torch.float32, device=x.device)
    recv_x, recv_w = _Dispatch.apply(x, topk_weights, group, handle)
    return recv_x, recv_w, handle


def combine(group: Group, y, handle: Handle, topk_weights=None):
    """[T, H], differentiable in y: FLAT and RANK_MAJOR each token's rows summed over the ranks it went to;
    EXPERT_MAJOR (Low-Latency) each token's expert rows weighted by the owner's `topk_weights` [T, K] (required
    there; their gradient is not implemented: refused if they require grad) and summed."""
    if handle.layout == "expert_major":
        if topk_weights is None:
            raise NotImplementedError("nccl.ep.autograd.combine: EXPERT_MAJOR takes the owner's topk_weights (the "
                                      "dispatched-weights path is not differentiable yet)")
        if topk_weights.requires_grad:
            raise NotImplementedError("nccl.ep.autograd.combine: the top-k weights' gradient through "
                                      "EXPERT_MAJOR is not implemented")
    elif topk_weights is not None:
        raise NotImplementedError("nccl.ep.autograd.combine: topk_weights are for EXPERT_MAJOR; FLAT and "
                                  "RANK_MAJOR rows come already weighted by the caller")
    return _Combine.apply(y, topk_weights, group, handle)
