"""nccl.ep as torch.library custom ops, so that dispatch and combine survive torch.compile (fullgraph) and CUDA
graphs:

    import nccl.ep.ops as epops
    handle = group.create_handle(topk_idx, layout="flat", sizing="worst_case")   # outside the compiled region
    hid = epops.register(handle)                       # an int the compiled graph carries (it names the shapes)
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

Low-Latency groups (decode) have their own ops on a registered Low-Latency handle (RANK_MAJOR or EXPERT_MAJOR; its
outputs are always worst-case sized):

    tokens, scales, weights, local_ids, src_info, expert_counts, rank_counts = \
        torch.ops.nccl_ep.ll_dispatch(hid, x, topk_idx, topk_weights_or_None, fp8, round_scale)
    out = torch.ops.nccl_ep.ll_combine(hid, y, owner_topk_weights_or_None)   # [T, H] bf16

`ll_dispatch` binds the routing (local) and sends: tokens [N, H] (bf16, rows past the counts zeroed so that nothing
computed on them is NaN; or float8_e4m3fn quantised by the sender with `fp8`, scales [N, H/128], rows past the
counts as left), weights (RANK_MAJOR [N, K], EXPERT_MAJOR [N], when given; else [0]), local_ids (RANK_MAJOR [N, K]
int32, -1 elsewhere; EXPERT_MAJOR [0]), src_info [N] and copies of this dispatch's counts. `ll_combine` is the
group's combine (EXPERT_MAJOR: owner-weighted with the given weights, as DeepEP's low_latency_combine, or weighted by
the dispatched ones). Autograd as nccl.ep.autograd's Low-Latency formulas (bf16 tokens): x, both weight tensors and
y; `ll_redispatch` (the handle's routing as bound) is combine's gradient.
Ordering: combine must consume a tensor computed from dispatch's outputs (it does in any MoE layer), which keeps the
two in order in a compiled graph; the group's calls must still run in the same order on every rank.
Mutation: every op declares `mutates_args=()`, truly: no tensor argument is written (outputs are new tensors). What
changes is the routing bound to the handle behind `handle_id`, state outside torch's view; the data dependency above
orders the calls that read it (the GPU tests run torch.library.opcheck on combine).
"""

from __future__ import annotations

import itertools
import threading
import zlib

import torch

from . import Handle, NcclInvalidArgument, NcclInvalidUsage, _combine_weights
from .autograd import _bf16_parts, _column_weights, _columns_of, _from_bf16_parts, _onehot_parts, _valid_rows

_lock = threading.Lock()
_handles: dict[int, Handle] = {}
_ids = itertools.count(1)


def _shape_key(handle: Handle) -> int:
    """31 bits naming everything the fake implementations read of `handle` (the outputs' static shapes). A compiled
    graph holds the id as a constant and the shapes as code, and torch's on-disk caches (inductor's FX graph cache)
    key on the graph: an id that named a counter only would let a later process, with a handle of other shapes
    under the same number (another world size, other token counts), load a graph compiled for the first."""
    g = handle.group
    sig = (bool(getattr(handle, "low_latency", False)), handle.layout, handle.num_tokens, handle.topk,
           handle.output_rows(), g.local_experts, getattr(g, "size", None))
    return zlib.crc32(repr(sig).encode()) & 0x7FFFFFFF


def register(handle: Handle) -> int:
    """The id the ops take for `handle`: High-Throughput FLAT with worst-case sizing (dispatch / combine), or a
    Low-Latency handle (ll_dispatch / ll_combine). unregister() it before closing it. The id's high bits hash the
    handle's static shapes (_shape_key), its low 24 bits count registrations in this process."""
    if getattr(handle, "low_latency", False):
        if handle.layout not in ("rank_major", "expert_major"):  # Handle refuses others; kept for stand-ins
            raise NcclInvalidArgument("nccl.ep.ops: a Low-Latency handle is 'rank_major' or 'expert_major'")
    elif handle.layout != "flat" or handle.sizing != "worst_case":
        raise NcclInvalidArgument("nccl.ep.ops: a handle of layout 'flat' and sizing 'worst_case' is needed (static "
                                  "shapes); this one is %s / %s" % (handle.layout, handle.sizing))
    key = _shape_key(handle) << 24
    with _lock:
        hid = key | (next(_ids) & 0xFFFFFF)
        while hid in _handles:  # after 2**24 registrations in one process
            hid = key | (next(_ids) & 0xFFFFFF)
        _handles[hid] = handle
    return hid


def unregister(handle_id: int) -> None:
    with _lock:
        _handles.pop(handle_id, None)


def _handle(handle_id: int, low_latency: bool = False) -> Handle:
    if not isinstance(handle_id, int):  # a SymInt when torch.compile made the id dynamic: specialise on it
        handle_id = int(handle_id)
    h = _handles.get(handle_id)
    if h is None:
        raise NcclInvalidUsage("nccl.ep.ops: no handle registered as %d" % handle_id)
    if bool(getattr(h, "low_latency", False)) != low_latency:
        raise NcclInvalidUsage("nccl.ep.ops: handle %d is a %s handle; use the %s ops" % (
            handle_id, "Low-Latency" if not low_latency else "High-Throughput",
            "ll_dispatch / ll_combine" if not low_latency else "dispatch / combine"))
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


# -- Low-Latency ---------------------------------------------------------------------------------------------------
_FP8_BLOCK = 128


def _ll_shapes(h: Handle, hidden: int, weights: bool, fp8: bool):
    """Shapes and dtypes of ll_dispatch's outputs."""
    rows, k, rm = h.output_rows(), h.topk, h.layout == "rank_major"
    e4m3 = getattr(torch, "float8_e4m3fn", None)
    return (((rows, hidden), e4m3 if fp8 else torch.bfloat16), ((rows, hidden // _FP8_BLOCK) if fp8 else (0,),
            torch.float32), (((rows, k) if rm else (rows,)) if weights else (0,), torch.float32),
            ((rows, k) if rm else (0,), torch.int32), ((rows,), torch.int32),
            ((h.group.local_experts,), torch.int32), ((h.group.size,), torch.int32))


def _ll_send(h: Handle, x, topk_weights, fp8: bool, round_scale: bool):
    """One Low-Latency dispatch on the handle as bound; the outputs as ll_dispatch returns them."""
    e4m3 = getattr(torch, "float8_e4m3fn", None)
    w = None if topk_weights is None else topk_weights.float().contiguous()
    recv = h.group.dispatch(x.contiguous(), handle=h, topk_weights=w, out_dtype=e4m3 if fp8 else None,
                            round_scale=round_scale)
    ec, rc = recv.expert_counts.clone(), recv.rank_counts.clone()
    valid = _valid_rows(h.group, h.layout, ec, rc)
    tokens = recv.tokens
    if not fp8:
        tokens = torch.where(valid.unsqueeze(1), tokens, torch.zeros_like(tokens))
    empty = x.new_empty((0,), dtype=torch.float32)
    weights = empty
    if w is not None:
        weights = recv.topk_weights
        weights = torch.where(valid.view((-1,) + (1,) * (weights.dim() - 1)), weights, torch.zeros_like(weights))
    ids = recv.topk_idx.clone() if h.layout == "rank_major" else x.new_empty((0,), dtype=torch.int32)
    scales = recv.scales if fp8 else empty.clone()
    src = recv.src_info.clone() if recv.src_info is not None else x.new_empty((h.output_rows(),), dtype=torch.int32)
    return tokens, scales, weights, ids, src, ec, rc


def _ll_fake(h: Handle, x, weights: bool, fp8: bool):
    return tuple(x.new_empty(shape, dtype=dt) for shape, dt in _ll_shapes(h, x.shape[1], weights, fp8))


def _ll_check(h: Handle, x, what: str):
    if x.shape[0] != h.num_tokens:
        raise NcclInvalidArgument("nccl_ep::%s: %d tokens for a handle of %d (its shapes are static)"
                                  % (what, x.shape[0], h.num_tokens))


@torch.library.custom_op("nccl_ep::ll_dispatch", mutates_args=())
def ll_dispatch(handle_id: int, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None,
                fp8: bool, round_scale: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                       torch.Tensor, torch.Tensor, torch.Tensor]:
    h = _handle(handle_id, low_latency=True)
    h.update(topk_idx)
    return _ll_send(h, x, topk_weights, fp8, round_scale)


@ll_dispatch.register_fake
def _(handle_id, x, topk_idx, topk_weights, fp8, round_scale):
    h = _handle(handle_id, low_latency=True)
    _ll_check(h, x, "ll_dispatch")
    return _ll_fake(h, x, topk_weights is not None, fp8)


@torch.library.custom_op("nccl_ep::ll_redispatch", mutates_args=())
def ll_redispatch(handle_id: int, x: torch.Tensor, topk_weights: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 rows x [T, H] through the handle's routing as bound (tokens, weights, expert_counts, rank_counts):
    ll_combine's gradient, and the top-k columns of EXPERT_MAJOR weight gradients."""
    tokens, _, weights, _, _, ec, rc = _ll_send(_handle(handle_id, low_latency=True), x, topk_weights, False, False)
    return tokens, weights, ec, rc


@ll_redispatch.register_fake
def _(handle_id, x, topk_weights):
    h = _handle(handle_id, low_latency=True)
    tokens, _, weights, _, _, ec, rc = _ll_fake(h, x, topk_weights is not None, False)
    return tokens, weights, ec, rc


@torch.library.custom_op("nccl_ep::ll_combine", mutates_args=())
def ll_combine(handle_id: int, y: torch.Tensor, topk_weights: torch.Tensor | None) -> torch.Tensor:
    h = _handle(handle_id, low_latency=True)
    w = None if topk_weights is None else topk_weights.float().contiguous()
    return h.group.combine(y.to(torch.bfloat16).contiguous(), h, topk_weights=w)


@ll_combine.register_fake
def _(handle_id, y, topk_weights):
    h = _handle(handle_id, low_latency=True)
    return y.new_empty((h.num_tokens, y.shape[1]), dtype=torch.bfloat16)


def _ll_to_owner(handle_id: int, num_tokens: int, s, cols, k: int):
    """Per-row fp32 scalars s [rows] -> [T, k] at each token's owner in the row's top-k column (EXPERT_MAJOR):
    nccl.ep.autograd's _onehot_parts, summed by the owner-weighted combine with weights 1."""
    ones = torch.ones(num_tokens, k, dtype=torch.float32, device=s.device)
    return _from_bf16_parts(torch.ops.nccl_ep.ll_combine(handle_id, _onehot_parts(s, cols, k), ones), k)


def _ll_columns(handle_id: int, num_tokens: int, k: int, device):
    """Each EXPERT_MAJOR row's top-k column (-1 past the counts, where ll_redispatch zeroed the weights): a dispatch
    of a 16-byte zero row per token with nccl.ep.autograd's _column_weights."""
    zeros = torch.zeros(num_tokens, 8, dtype=torch.bfloat16, device=device)
    _, weights, _, _ = torch.ops.nccl_ep.ll_redispatch(handle_id, zeros, _column_weights(num_tokens, k, device))
    return _columns_of(weights, k)


def _ll_dispatch_setup(ctx, inputs, output):
    handle_id, x, topk_idx, topk_weights, fp8, _ = inputs
    h = _handle(handle_id, low_latency=True)
    ctx.handle_id, ctx.layout, ctx.x_dtype, ctx.fp8 = handle_id, h.layout, x.dtype, fp8
    ctx.num_tokens, ctx.k = topk_idx.shape[0], topk_idx.shape[1]
    ctx.w_dtype = None if topk_weights is None else topk_weights.dtype
    valid = _valid_rows(h.group, h.layout, output[5], output[6])
    ctx.valid = valid
    ctx.local = (output[3] >= 0) & valid.unsqueeze(1) if h.layout == "rank_major" else None


def _ll_dispatch_backward(ctx, grad_tokens, grad_scales, grad_weights, grad_ids, grad_src, grad_ec, grad_rc):
    if ctx.fp8:
        raise NotImplementedError("nccl_ep::ll_dispatch with fp8=True is not differentiable")
    grad_x = grad_w = None
    hid, em = ctx.handle_id, ctx.layout == "expert_major"
    if grad_tokens is not None:
        ones = torch.ones(ctx.num_tokens, ctx.k, dtype=torch.float32, device=grad_tokens.device) if em else None
        grad_x = torch.ops.nccl_ep.ll_combine(hid, grad_tokens.to(torch.bfloat16), ones).to(ctx.x_dtype)
    if grad_weights is not None and ctx.w_dtype is not None and grad_weights.numel():
        if em:
            s = torch.where(ctx.valid, grad_weights.float(), torch.zeros_like(grad_weights, dtype=torch.float32))
            cols = _ll_columns(hid, ctx.num_tokens, ctx.k, grad_weights.device)
            grad_w = _ll_to_owner(hid, ctx.num_tokens, s, cols, ctx.k)
        else:
            w = torch.where(ctx.local, grad_weights.float(), torch.zeros_like(grad_weights, dtype=torch.float32))
            grad_w = _from_bf16_parts(torch.ops.nccl_ep.ll_combine(hid, _bf16_parts(w), None), ctx.k)
        grad_w = grad_w.to(ctx.w_dtype)
    return None, grad_x, None, grad_w, None, None


def _ll_combine_setup(ctx, inputs, output):
    handle_id, y, topk_weights = inputs
    h = _handle(handle_id, low_latency=True)
    ctx.handle_id, ctx.y_dtype, ctx.num_tokens, ctx.k = handle_id, y.dtype, h.num_tokens, h.topk
    ctx.w = None if topk_weights is None else topk_weights.detach()
    ctx.w_dtype = None if topk_weights is None else topk_weights.dtype
    ctx.rows = y.detach() if topk_weights is not None else None


def _ll_combine_backward(ctx, grad_out):
    hid, w = ctx.handle_id, ctx.w
    g = grad_out.to(torch.bfloat16)
    tokens, weights, ec, rc = torch.ops.nccl_ep.ll_redispatch(hid, g, None if w is None else w.float())
    grad_y = tokens.float() if w is None else tokens.float() * weights.unsqueeze(1)  # rows past the counts: 0
    grad_w = None
    if w is not None:  # d out[t] / d w[t, k] = <grad_out[t], row (t, k)>, taken where the row is
        h = _handle(hid, low_latency=True)
        valid = _valid_rows(h.group, h.layout, ec, rc)
        dots = (tokens.float() * ctx.rows.float()).sum(dim=1)
        dots = torch.where(valid, dots, torch.zeros_like(dots))  # y's rows past the counts may hold anything
        cols = _ll_columns(hid, ctx.num_tokens, ctx.k, grad_out.device)
        grad_w = _ll_to_owner(hid, ctx.num_tokens, dots, cols, ctx.k).to(ctx.w_dtype)
    return None, grad_y.to(ctx.y_dtype), grad_w


torch.library.register_autograd("nccl_ep::ll_dispatch", _ll_dispatch_backward, setup_context=_ll_dispatch_setup)
torch.library.register_autograd("nccl_ep::ll_combine", _ll_combine_backward, setup_context=_ll_combine_setup)
