"""Differentiable dispatch and combine (FLAT layout): the gradient of dispatch is a combine of the received rows'
gradients, and the gradient of combine is a dispatch of the output's gradient through the same handle.

    recv_x, recv_w, handle = nccl.ep.autograd.dispatch(group, x, topk_idx, topk_weights)
    y = experts(recv_x, handle.topk_local, recv_w)      # weights applied by the caller, as in DeepEP
    out = nccl.ep.autograd.combine(group, y, handle)     # [T, H]: unweighted sum over the ranks each token went to
    out.sum().backward()                                 # grads for x, topk_weights and whatever made y

The handle (nccl.ep.Handle) stays alive for the backward pass; close it after backward. topk_weights' gradient
keeps only the slots whose expert the receiving rank hosts (the others carried zeros)."""

from __future__ import annotations

import torch

from . import Group, Handle, _combine_weights


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, group: Group, handle: Handle):
        recv = group.dispatch(x, handle=handle, topk_weights=topk_weights.float().contiguous())
        ctx.group, ctx.handle = group, handle
        ctx.local = recv.topk_idx >= 0
        ctx.x_dtype, ctx.w_dtype = x.dtype, topk_weights.dtype
        ctx.rows = recv.tokens.shape[0]
        handle.topk_local = recv.topk_idx
        return recv.tokens, recv.topk_weights

    @staticmethod
    def backward(ctx, grad_tokens, grad_weights):
        grad_x = grad_w = None
        if ctx.needs_input_grad[0] and grad_tokens is not None:
            grad_x = ctx.group.combine(grad_tokens.to(ctx.x_dtype).contiguous(), ctx.handle)
        if ctx.needs_input_grad[1] and grad_weights is not None:
            grad_w = _combine_weights(lambda w: ctx.group.combine(w, ctx.handle), grad_weights,
                                      ctx.local).to(ctx.w_dtype)
        return grad_x, grad_w, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group: Group, handle: Handle):
        ctx.group, ctx.handle, ctx.y_dtype = group, handle, y.dtype
        return group.combine(y.contiguous(), handle)

    @staticmethod
    def backward(ctx, grad_out):
        recv = ctx.group.dispatch(grad_out.to(ctx.y_dtype).contiguous(), handle=ctx.handle)
        return recv.tokens, None, None


def dispatch(group: Group, x, topk_idx, topk_weights, handle: Handle | None = None):
    """(recv_x, recv_topk_weights, handle), differentiable in x and topk_weights. FLAT layout; the handle's
    `topk_local` holds the received rows' local expert ids (int32, -1 elsewhere)."""
    if handle is None:
        handle = group.create_handle(topk_idx, layout="flat", sizing="exact")
    elif topk_idx is not None and topk_idx is not handle.topk_idx:
        handle.update(topk_idx)
    if handle.layout != "flat":
        raise NotImplementedError("nccl.ep.autograd: only the FLAT layout is differentiable yet")
    recv_x, recv_w = _Dispatch.apply(x, topk_weights, group, handle)
    return recv_x, recv_w, handle


def combine(group: Group, y, handle: Handle):
    """[T, H], differentiable in y: each token's rows summed over the ranks it went to."""
    return _Combine.apply(y, group, handle)
