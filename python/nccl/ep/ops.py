"""nccl.ep as torch.library custom ops, so that dispatch and combine survive torch.compile (fullgraph) and CUDA
graphs:

    import nccl.ep.ops as epops
    handle = group.create_handle(topk_idx, layout="flat", sizing="worst_case")   # outside the compiled region
    hid = epops.register(handle)                       # an int the compiled graph carries
    @torch.compile(fullgraph=True)
    def layer(x, topk_idx, w):
        tokens, local_ids, recv_w, counts = torch.ops.nccl_ep.dispatch(hid, x, topk_idx, w)
        y = experts(tokens, local_ids, recv_w)         # rows past the receive count: left as they were
        return torch.ops.nccl_ep.combine(hid, y)       # [T, H]

The ops work on a registered handle of worst-case sizing (static output shapes: nothing waits on the host) and FLAT
layout: `dispatch` binds the routing (ncclEpUpdateHandle) and sends the tokens; its outputs are the received rows
[max rows, H], their local expert ids [max rows, K] (int32, -1 elsewhere), their weights [max rows, K] (fp32) and a
copy of the per-local-expert receive counts. `combine` returns each token's rows summed ([T, H]); `redispatch`
sends rows through the routing as bound (combine's gradient). All have fake (meta) implementations for tracing;
dispatch and combine have an autograd formula (dispatch's gradient is a combine, combine's a redispatch). One handle
per layer: a backward uses the routing its handle holds then.
Ordering: combine must consume a tensor computed from dispatch's outputs (it does in any MoE layer), which keeps the
two in order in a compiled graph; the group's calls must still run in the same order on every rank.
"""

from __future__ import annotations

import itertools
import threading

import torch

from . import Handle, NcclInvalidArgument, NcclInvalidUsage, _combine_weights

_lock = threading.Lock()
_handles: dict[int, Handle] = {}
_ids = itertools.count(1)


def register(handle: Handle) -> int:
    """The id the ops take for `handle` (FLAT layout, worst-case sizing). unregister() it before closing it."""
    if handle.layout != "flat" or handle.sizing != "worst_case":
        raise NcclInvalidArgument("nccl.ep.ops: a handle of layout 'flat' and sizing 'worst_case' is needed (static "
                                  "shapes); this one is %s / %s" % (handle.layout, handle.sizing))
    with _lock:
        hid = next(_ids)
        _handles[hid] = handle
    return hid


def unregister(handle_id: int) -> None:
    with _lock:
        _handles.pop(handle_id, None)


def _handle(handle_id: int) -> Handle:
    h = _handles.get(handle_id)
    if h is None:
        raise NcclInvalidUsage("nccl.ep.ops: no handle registered as %d" % handle_id)
    return h


@torch.library.custom_op("nccl_ep::dispatch", mutates_args=())
def dispatch(handle_id: int, x: torch.Tensor, topk_idx: torch.Tensor,
             topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h = _handle(handle_id)
    h.update(topk_idx)
    recv = h.group.dispatch(x, handle=h, topk_weights=topk_weights.float().contiguous())
    return recv.tokens, recv.topk_idx, recv.topk_weights, h.expert_counts.clone()


@dispatch.register_fake
def _(handle_id, x, topk_idx, topk_weights):
    h = _handle(handle_id)
    if topk_idx.shape[0] != h.num_tokens or x.shape[0] != h.num_tokens:
        raise NcclInvalidArgument("nccl_ep::dispatch: %d tokens for a handle of %d (its shapes are static)"
                                  % (x.shape[0], h.num_tokens))
    rows, k = h.output_rows(), topk_idx.shape[1]
    return (x.new_empty((rows, x.shape[1])), x.new_empty((rows, k), dtype=torch.int32),
            x.new_empty((rows, k), dtype=torch.float32), x.new_empty((h.group.local_experts,), dtype=torch.int32))


@torch.library.custom_op("nccl_ep::redispatch", mutates_args=())
def redispatch(handle_id: int, x: torch.Tensor) -> torch.Tensor:
    """The rows of x [T, H] sent through the handle as last bound (no new routing, no weights): combine's gradient."""
    h = _handle(handle_id)
    return h.group.dispatch(x.contiguous(), handle=h).tokens


@redispatch.register_fake
def _(handle_id, x):
    return x.new_empty((_handle(handle_id).output_rows(), x.shape[1]))


@torch.library.custom_op("nccl_ep::combine", mutates_args=())
def combine(handle_id: int, y: torch.Tensor) -> torch.Tensor:
    h = _handle(handle_id)
    return h.group.combine(y.contiguous(), h)


@combine.register_fake
def _(handle_id, y):
    return y.new_empty((_handle(handle_id).num_tokens, y.shape[1]))


# Autograd: the same formulas as nccl.ep.autograd (FLAT): d dispatch = combine of the rows' gradients (and of the
# weights' gradients where the receiving rank hosts the expert), d combine = dispatch of the output's gradient.
def _dispatch_setup(ctx, inputs, output):
    ctx.handle_id = inputs[0]
    ctx.local = output[1] >= 0
    ctx.x_dtype, ctx.w_dtype = inputs[1].dtype, inputs[3].dtype


def _dispatch_backward(ctx, grad_tokens, grad_idx, grad_weights, grad_counts):
    grad_x = grad_w = None
    if grad_tokens is not None:
        grad_x = torch.ops.nccl_ep.combine(ctx.handle_id, grad_tokens.to(ctx.x_dtype).contiguous())
    if grad_weights is not None:
        grad_w = _combine_weights(lambda w: torch.ops.nccl_ep.combine(ctx.handle_id, w), grad_weights,
                                  ctx.local).to(ctx.w_dtype)
    return None, grad_x, None, grad_w


def _combine_setup(ctx, inputs, output):
    ctx.handle_id, ctx.y_dtype = inputs[0], inputs[1].dtype


def _combine_backward(ctx, grad_out):
    return None, torch.ops.nccl_ep.redispatch(ctx.handle_id, grad_out.to(ctx.y_dtype).contiguous())


torch.library.register_autograd("nccl_ep::dispatch", _dispatch_backward, setup_context=_dispatch_setup)
torch.library.register_autograd("nccl_ep::combine", _combine_backward, setup_context=_combine_setup)
