"""nccl.ep.jax: MoE dispatch and combine for JAX, as XLA FFI custom calls (libnccl_ep_jax.so) inside jax.jit and
shard_map over an expert-parallel mesh axis.

    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import nccl.ep.jax as epjax

    jax.distributed.initialize()                      # one process per GPU
    mesh = jax.make_mesh((jax.device_count(),), ("ep",))
    group = epjax.group(mesh, "ep", num_experts=64, max_tokens_per_rank=4096, hidden=4096)   # collective, cached
    handle = group.handle(num_tokens=4096, topk=8)    # collective, outside jit: one per MoE layer

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
    def layer(x, topk_idx, topk_weights):             # this rank's tokens: [T, H], [T, K], [T, K]
        recv = epjax.dispatch(handle, x, topk_idx, topk_weights)
        y = experts(recv.tokens, recv.local_ids, recv.weights)   # [rows, H]; rows past the count are zero
        return epjax.combine(handle, y)                # [T, H]: each token's rows summed in fp32

Shapes are static: a handle is made outside jit for one token count and top-k (worst-case sizing: dispatch's
outputs hold the most rows any routing can produce; rows past the receive count are zero, local ids -1), so the
step compiles once and nothing waits on the host. Each call runs on the stream XLA gives it.

High-Throughput (training, prefill): `dispatch` / `combine` (FLAT layout), differentiable through jax.custom_vjp:
dispatch's gradient is a combine of the rows' gradients (and of the weights' gradients where the rank hosts the
expert), combine's a dispatch of the output's gradient through the same handle. Low-Latency (decode; groups made
with algorithm="low_latency"): `ll_dispatch` / `ll_combine` (RANK_MAJOR or EXPERT_MAJOR, optional fp8 on the way),
forward only (differentiating them raises JAX's error for FFI calls).

A handle holds the routing of its last dispatch: combine, and the backward pass, use that one. Use one handle per
dispatch site (a MoE layer); a layer's calls are ordered by the data flowing from dispatch to combine. The routing
is state of the handle, not data XLA sees: a handle must not dispatch twice in one step (micro-batches, shared
layers), and a `lax.scan` over layers shares one call site, so one handle, among all its layers, whose backward
passes would all use the last layer's routing (unless `jax.checkpoint` recomputes each layer's dispatch). Handles
are made outside jit, once the group's earlier steps finished (Handle waits for JAX's live arrays first).

Errors: arguments of the wrong shape or dtype raise NcclInvalidArgument at trace time, naming the argument; a
failed library call raises XLA's runtime error with the library's text at that call; a device wait that timed out
(a peer gone) is reported by the next call or by Group.check().

Groups come from JAX's world: the ranks of a mesh axis (one device of the mesh per process), with the NCCL unique id
shared through the key-value store of jax.distributed; one group per (mesh, axis, algorithm), cached; close() (or
Group.close()) shuts them down. This module imports no torch.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import threading
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._ext import _loader
from .._ext.closing import Closing
from .._ext.comm import _nccl_call, _UniqueId, id_from_bytes, id_to_bytes
from .._ext.cvalues import c_integer
from .._ext.errors import NcclError, NcclInvalidArgument, NcclInvalidUsage
from . import _ALGO, _FP8_BLOCK, _LAYOUT, _LL_MAX_TOKENS, _RECV_OVERFLOW, _GroupConfig
from . import _call as _ep_call

__all__ = ["Group", "Handle", "HandleSpec", "Dispatched", "LlDispatched", "group", "close", "dispatch", "combine",
           "ll_dispatch", "ll_combine", "register_targets", "TARGETS"]

# Custom call targets -> the handler symbols of libnccl_ep_jax.so.
TARGETS = {"nccl_ep_ht_dispatch": "ncclEpJaxHtDispatch", "nccl_ep_ht_redispatch": "ncclEpJaxHtRedispatch",
           "nccl_ep_ht_combine": "ncclEpJaxHtCombine", "nccl_ep_ll_dispatch": "ncclEpJaxLlDispatch",
           "nccl_ep_ll_combine": "ncclEpJaxLlCombine"}

_P = ctypes.c_void_p
_SIGNATURES = {
    "ncclEpJaxGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "ncclEpJaxHandleCreate": [ctypes.c_int64, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                              ctypes.POINTER(ctypes.c_int64)],
    "ncclEpJaxHandleDestroy": [ctypes.c_int64],
}
_LIBRARY = "libnccl_ep_jax.so"
_HT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
_lock = threading.Lock()
_registered = False


def _ffi_lib() -> ctypes.CDLL:
    """libnccl_ep_jax.so, bound once (after libnccl_ep and the NCCL it serves)."""
    path = _loader.library_dir() / _LIBRARY
    if not path.is_file():
        raise NcclInvalidUsage("nccl.ep.jax: %s is missing: this package was built without jaxlib's FFI headers "
                               "(pip install --no-build-isolation '.[jax]' with jax installed, or CMake with "
                               "-DNCCL_EXT_JAX=ON; NCCL_EXT_LIB_DIR points at a build tree's lib/)" % path)
    return _loader.bind("ep_jax", "EpJax", _SIGNATURES)


def _lib_call(name: str, *args) -> None:
    _loader.call(_ffi_lib(), "EpJax", name, *args)


def register_targets() -> None:
    """Registers the custom call targets (TARGETS) with XLA for platform CUDA, once. Group creation does it; a
    program traced and lowered without running needs no registration."""
    global _registered
    with _lock:
        if _registered:
            return
        lib = _ffi_lib()
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="CUDA")
        _registered = True


# -- static facts of a handle (what tracing reads) -----------------------------------------------------------------
@dataclass(frozen=True)
class HandleSpec:
    """What a jitted call knows of a handle: its registered id (the custom calls' `handle_id` attribute) and the
    static shapes. `rows`: dispatch's output rows (worst case); `ranks`, `local_experts`: the group's;
    `max_token_bytes`: the largest row the group moves; `max_tokens_per_rank`: Low-Latency slot count M."""

    id: int
    low_latency: bool
    layout: str
    num_tokens: int
    topk: int
    rows: int
    ranks: int
    local_experts: int
    max_token_bytes: int
    max_tokens_per_rank: int


def _spec(handle) -> HandleSpec:
    spec = getattr(handle, "spec", handle)
    if not isinstance(spec, HandleSpec):
        raise NcclInvalidArgument("handle must be a nccl.ep.jax Handle (Group.handle) or HandleSpec, not %s"
                                  % type(handle).__name__)
    return spec


def _shape_key(spec_fields: tuple) -> int:
    """31 bits naming a handle's static shapes: a compiled program holds the id, and JAX's persistent compilation
    cache keys on the program; an id naming a counter only would let another process with a handle of other shapes
    under the same number take a program compiled for the first (its calls then fail the handlers' shape checks)."""
    return zlib.crc32(repr(spec_fields).encode()) & 0x7FFFFFFF


_ids = itertools.count(1)


def _new_id(fields: tuple) -> int:
    return (_shape_key(fields) << 24) | (next(_ids) & 0xFFFFFF)


# -- trace-time checks ---------------------------------------------------------------------------------------------
def _aval(a, name: str):
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise NcclInvalidArgument("%s must be an array, not %s" % (name, type(a).__name__))
    return a


def _check_shape(a, name: str, shape: tuple, why: str = "") -> None:
    if tuple(a.shape) != tuple(shape):
        raise NcclInvalidArgument("%s has shape %s; expected %s%s" % (name, tuple(a.shape), tuple(shape), why))


def _check_rows(spec: HandleSpec, x, name: str, rows: int, dtypes, what: str) -> None:
    """x [rows, H] of one of `dtypes`, its row a multiple of 16 bytes within the group's max_token_bytes."""
    _aval(x, name)
    if x.ndim != 2:
        raise NcclInvalidArgument("%s must have 2 dimensions [rows, hidden]; got shape %s" % (name, tuple(x.shape)))
    if x.dtype not in [jnp.dtype(d) for d in dtypes]:
        raise NcclInvalidArgument("%s has dtype %s; %s takes %s" % (name, x.dtype, what,
                                                                     " or ".join(str(jnp.dtype(d)) for d in dtypes)))
    if x.shape[0] != rows:
        raise NcclInvalidArgument("%s has %d rows; the handle's shapes are static: %d (inside shard_map, this "
                                  "rank's share)" % (name, x.shape[0], rows))
    row = x.shape[1] * x.dtype.itemsize
    if row % 16 or row == 0 or row > spec.max_token_bytes:
        raise NcclInvalidArgument("%s: a row of %d bytes (%d x %s); the group moves rows of a multiple of 16 bytes "
                                  "up to max_token_bytes %d" % (name, row, x.shape[1], x.dtype, spec.max_token_bytes))


def _routing(spec: HandleSpec, topk_idx):
    _aval(topk_idx, "topk_idx")
    if not jnp.issubdtype(topk_idx.dtype, jnp.integer):
        raise NcclInvalidArgument("topk_idx has dtype %s; integer expert ids expected (-1: none)" % topk_idx.dtype)
    _check_shape(topk_idx, "topk_idx", (spec.num_tokens, spec.topk), " (the handle's [num_tokens, topk])")
    return topk_idx.astype(jnp.int32)


def _weights(spec: HandleSpec, topk_weights, name: str = "topk_weights"):
    _aval(topk_weights, name)
    if not jnp.issubdtype(topk_weights.dtype, jnp.floating):
        raise NcclInvalidArgument("%s has dtype %s; floating weights expected" % (name, topk_weights.dtype))
    _check_shape(topk_weights, name, (spec.num_tokens, spec.topk), " (the handle's [num_tokens, topk])")
    return topk_weights.astype(jnp.float32)


def _sds(shape, dtype, like):
    """The ShapeDtypeStruct of an output of a call on `like`: inside shard_map the outputs vary along the mesh axes
    `like` varies along (each rank's differ), which JAX must know (a psum of them, their transposes)."""
    aval = jax.typeof(like)
    mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
    if mat is not None and getattr(mat, "varying", None):
        sharding = jax.sharding.NamedSharding(aval.sharding.mesh, jax.sharding.PartitionSpec())
        return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat, sharding=sharding)
    vma = getattr(aval, "vma", None)  # earlier releases
    if vma:
        return jax.ShapeDtypeStruct(shape, dtype, vma=vma)
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(target: str, results, *args, **attrs):
    attrs = {k: (np.bool_(v) if isinstance(v, bool) else np.int64(v)) for k, v in attrs.items()}
    return jax.ffi.ffi_call(target, results)(*args, **attrs)


# -- High-Throughput -----------------------------------------------------------------------------------------------
class Dispatched(NamedTuple):
    """High-Throughput dispatch's outputs (FLAT: one row per (token, this rank), grouped by source rank). tokens
    [rows, H]; local_ids [rows, K] int32 (this rank's expert ids, -1 elsewhere); weights [rows, K] fp32 (0 where
    the expert is elsewhere); expert_counts [L] and rank_counts [R] int32: rows per local expert and per source
    rank; recv_dropped [1] int32: with a receive cap and recv_overflow="drop", the rows for this rank past it (not
    delivered, not counted above; combine leaves them out of their tokens' sums), else 0. Rows past
    sum(rank_counts) are zero (local ids -1)."""

    tokens: jax.Array
    local_ids: jax.Array
    weights: jax.Array
    expert_counts: jax.Array
    rank_counts: jax.Array
    recv_dropped: jax.Array


def _valid(rows: int, rank_counts):
    return jnp.arange(rows, dtype=jnp.int32) < jnp.sum(rank_counts)


def _ht_dispatch_call(spec: HandleSpec, x, idx, w) -> Dispatched:
    rows, k, h = spec.rows, spec.topk, x.shape[1]
    tokens, ids, weights, ec, rc, dropped = _call(
        "nccl_ep_ht_dispatch",
        (_sds((rows, h), x.dtype, x), _sds((rows, k), jnp.int32, x), _sds((rows, k), jnp.float32, x),
         _sds((spec.local_experts,), jnp.int32, x), _sds((spec.ranks,), jnp.int32, x), _sds((1,), jnp.int32, x)),
        x, idx, w, handle_id=spec.id)
    valid = _valid(rows, rc)[:, None]  # (the handler zeroes tokens past the received rows itself, those rows only)
    return Dispatched(tokens, jnp.where(valid, ids, -1), jnp.where(valid, weights, 0.0), ec, rc, dropped)


def _ht_combine_call(spec: HandleSpec, y):
    return _call("nccl_ep_ht_combine", _sds((spec.num_tokens, y.shape[1]), y.dtype, y), y, handle_id=spec.id)


def _ht_redispatch_call(spec: HandleSpec, g, after):
    """`after`: an array computed from the forward dispatch's outputs, an operand the call does not read, so that XLA
    runs it after that dispatch bound the routing (the cotangent g may not depend on the forward at all)."""
    tokens, _ = _call("nccl_ep_ht_redispatch", (_sds((spec.rows, g.shape[1]), g.dtype, g),
                                                _sds((spec.ranks,), jnp.int32, g)), g, after, handle_id=spec.id)
    return tokens  # rows past the received ones zeroed by the handler


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ht_dispatch(spec, x, idx, w):
    return _ht_dispatch_call(spec, x, idx, w)


def _ht_dispatch_fwd(spec, x, idx, w):
    out = _ht_dispatch_call(spec, x, idx, w)
    return out, out.local_ids


def _ht_dispatch_bwd(spec, local_ids, cts):
    ct_tokens, _, ct_weights = cts[:3]
    # Both combines below depend on local_ids, an output of the forward dispatch: they run after it.
    local = local_ids >= 0  # rows past the count are -1 everywhere: their cotangents are dropped with them
    row_valid = jnp.any(local, axis=1, keepdims=True)  # a received row has at least one expert here
    grad_x = _ht_combine_call(spec, jnp.where(row_valid, ct_tokens, jnp.zeros_like(ct_tokens)))
    # Each token's weight k lives on the one rank that hosts its expert: zero elsewhere, so the sum is that one.
    # Rows of a multiple of 16 bytes: K padded with zero columns to a multiple of 4.
    k = spec.topk
    kp = -(-k // 4) * 4
    gw = jnp.where(local, ct_weights.astype(jnp.float32), 0.0)
    if kp != k:
        gw = jnp.pad(gw, ((0, 0), (0, kp - k)))
    grad_w = _ht_combine_call(spec, gw)[:, :k]
    return grad_x, None, grad_w


_ht_dispatch.defvjp(_ht_dispatch_fwd, _ht_dispatch_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ht_combine(spec, y):
    return _ht_combine_call(spec, y)


def _ht_combine_fwd(spec, y):
    # The residual, a corner of y (computed from the forward dispatch's outputs), only orders the backward.
    return _ht_combine_call(spec, y), y[:1, :1]


def _ht_combine_bwd(spec, after, ct):
    # The redispatch sends through the routing the forward dispatch bound, so it must run after that dispatch. A
    # cotangent that does not depend on the forward (a linear loss, a given cotangent) gives XLA no such order: the
    # call takes y's corner as an operand, and y comes from the dispatch. (With an optimization barrier joining ct
    # and that corner instead, a linear loss's gradient came back zero on an H100: no rows redispatched.)
    return (_ht_redispatch_call(spec, ct, after),)


_ht_combine.defvjp(_ht_combine_fwd, _ht_combine_bwd)


def _high_throughput(spec: HandleSpec, what: str) -> None:
    if spec.low_latency:
        raise NcclInvalidUsage("%s: handle %d is a Low-Latency handle; use ll_dispatch / ll_combine" % (what, spec.id))


def dispatch(handle, x, topk_idx, topk_weights) -> Dispatched:
    """High-Throughput dispatch (COLLECTIVE over the group; inside jit/shard_map, this rank's share): sends each
    token x[t] ([T, H]; bf16, fp16 or fp32) to every rank hosting one of its experts topk_idx[t] ([T, K] integer,
    -1: none) with its top-k weights ([T, K] floating, carried as fp32). Binds the routing to the handle (its
    combine and the backward pass use it). Differentiable in x and topk_weights. See Dispatched."""
    spec = _spec(handle)
    _high_throughput(spec, "dispatch")
    _check_rows(spec, x, "x", spec.num_tokens, _HT_DTYPES, "High-Throughput dispatch")
    idx = _routing(spec, topk_idx)
    w = _weights(spec, topk_weights)
    return _ht_dispatch(spec, x, idx, w)


def combine(handle, y):
    """High-Throughput combine (COLLECTIVE): y [rows, H] (dispatch's rows, bf16, fp16 or fp32) back to the tokens'
    owners, each token's rows summed in fp32: [T, H] of y's dtype (weights are the caller's to apply, as in
    DeepEP's FLAT combine). Uses the routing of the handle's last dispatch. Differentiable in y."""
    spec = _spec(handle)
    _high_throughput(spec, "combine")
    _check_rows(spec, y, "y", spec.rows, _HT_DTYPES, "High-Throughput combine")
    return _ht_combine(spec, y)


# -- Low-Latency ---------------------------------------------------------------------------------------------------
class LlDispatched(NamedTuple):
    """Low-Latency dispatch's outputs (N = R * M rows in RANK_MAJOR, L * R * M in EXPERT_MAJOR). tokens [N, H] (bf16,
    rows past the counts zero, or as left with zero_past_counts=False; or float8_e4m3fn with fp8, rows past the
    counts as left); scales [N, H/128] fp32
    (fp8; else [0]); weights (RANK_MAJOR [N, K], EXPERT_MAJOR [N]; [0] without topk_weights); local_ids (RANK_MAJOR
    [N, K] int32, -1 elsewhere; else [0]); src_info [N] int32 (RANK_MAJOR: the token's index at its source;
    EXPERT_MAJOR: source rank * M + token); expert_counts [L] and rank_counts [R] int32 of this dispatch. src_info
    and the fp8 scales of rows past the counts are as left (not masked): read them through the counts."""

    tokens: jax.Array
    scales: jax.Array
    weights: jax.Array
    local_ids: jax.Array
    src_info: jax.Array
    expert_counts: jax.Array
    rank_counts: jax.Array


def _low_latency(spec: HandleSpec, what: str) -> None:
    if not spec.low_latency:
        raise NcclInvalidUsage("%s: handle %d is a High-Throughput handle; use dispatch / combine" % (what, spec.id))


def _ll_valid(spec: HandleSpec, expert_counts, rank_counts):
    """Which rows of a Low-Latency output hold data: RANK_MAJOR row s * M + j, j < rank_counts[s]; EXPERT_MAJOR row
    e * R * M + i, i < expert_counts[e]."""
    m = spec.max_tokens_per_rank
    if spec.layout == "rank_major":
        counts, width = rank_counts, m
    else:
        counts, width = expert_counts, spec.ranks * m
    return (jnp.arange(width, dtype=jnp.int32)[None, :] < counts[:, None]).reshape(-1)


def ll_dispatch(handle, x, topk_idx, topk_weights=None, *, fp8: bool = False, round_scale: bool = False,
                zero_past_counts: bool = True) -> LlDispatched:
    """Low-Latency dispatch (COLLECTIVE; decode): x [T, H] bf16 to the ranks of its experts, in the handle's layout
    (RANK_MAJOR or EXPERT_MAJOR); `fp8`: quantised by the sender to float8_e4m3fn with one fp32 scale per 128
    columns (amax / 448; `round_scale`: powers of 2). topk_weights [T, K] (optional) travel with the rows. The
    binding is local. Not differentiable. See LlDispatched. `zero_past_counts=False` leaves the bf16 tokens' rows
    past the counts as they are (as DeepEP's packed_recv_x) instead of zeroing them every call: in EXPERT_MAJOR
    they are most of the [L x R x M, H] output; combine reads none of them, so a step that only computes row by row
    and combines (a decode loop) needs no zeros there."""
    spec = _spec(handle)
    _low_latency(spec, "ll_dispatch")
    _check_rows(spec, x, "x", spec.num_tokens, (jnp.bfloat16,), "Low-Latency dispatch")
    h = x.shape[1]
    if fp8 and h % _FP8_BLOCK:
        raise NcclInvalidArgument("x: hidden %d is not a multiple of %d (one fp8 scale per %d columns)"
                                  % (h, _FP8_BLOCK, _FP8_BLOCK))
    if round_scale and not fp8:
        raise NcclInvalidArgument("round_scale=True: for the fp8 quantisation (fp8=True)")
    if not isinstance(zero_past_counts, (bool, np.bool_)):
        raise NcclInvalidArgument("zero_past_counts must be a bool; got %r" % (zero_past_counts,))
    idx = _routing(spec, topk_idx)
    with_weights = topk_weights is not None
    w = _weights(spec, topk_weights) if with_weights else jnp.zeros((0,), jnp.float32)
    n, k, rm = spec.rows, spec.topk, spec.layout == "rank_major"
    results = (_sds((n, h), jnp.float8_e4m3fn if fp8 else jnp.bfloat16, x),
               _sds((n, h // _FP8_BLOCK) if fp8 else (0,), jnp.float32, x),
               _sds(((n, k) if rm else (n,)) if with_weights else (0,), jnp.float32, x),
               _sds((n, k) if rm else (0,), jnp.int32, x), _sds((n,), jnp.int32, x),
               _sds((spec.local_experts,), jnp.int32, x), _sds((spec.ranks,), jnp.int32, x))
    tokens, scales, weights, ids, src, ec, rc = _call("nccl_ep_ll_dispatch", results, x, idx, w, handle_id=spec.id,
                                                      with_weights=with_weights, fp8=bool(fp8),
                                                      round_scale=bool(round_scale),
                                                      zero_past_counts=bool(zero_past_counts))
    valid = _ll_valid(spec, ec, rc)  # (the handler zeroes bf16 tokens past the counts itself, those rows only)
    if with_weights:
        weights = jnp.where(valid.reshape((-1,) + (1,) * (weights.ndim - 1)), weights, 0.0)
    if rm:
        ids = jnp.where(valid[:, None], ids, -1)
    return LlDispatched(tokens, scales, weights, ids, src, ec, rc)


def ll_combine(handle, y, topk_weights=None):
    """Low-Latency combine (COLLECTIVE), after a dispatch on the handle: y [N, H] (the dispatch output's layout,
    cast to bf16) back to the owners: [T, H] bf16. RANK_MAJOR: one row per slot (the caller's sum over the row's
    local experts), the owner sums the ranks' rows. EXPERT_MAJOR: each rank weights its experts' rows with the
    dispatched weights (1 where none) and sums them, or, given topk_weights [T, K] (the owner's), every row returns
    as it is and the owner weights and sums them (DeepEP's low_latency_combine). Not differentiable."""
    spec = _spec(handle)
    _low_latency(spec, "ll_combine")
    _aval(y, "y")
    y = y.astype(jnp.bfloat16)
    _check_rows(spec, y, "y", spec.rows, (jnp.bfloat16,), "Low-Latency combine")
    with_weights = topk_weights is not None
    if with_weights and spec.layout != "expert_major":
        raise NcclInvalidUsage("ll_combine: topk_weights (weighted by the owner) are for EXPERT_MAJOR handles; this "
                               "one is %s" % spec.layout.upper())
    w = _weights(spec, topk_weights) if with_weights else jnp.zeros((0,), jnp.float32)
    return _call("nccl_ep_ll_combine", _sds((spec.num_tokens, y.shape[1]), jnp.bfloat16, y), y, w,
                 handle_id=spec.id, with_weights=with_weights)


# -- groups from JAX's world ---------------------------------------------------------------------------------------
def axis_ranks(devices, axis_names, axis: str, device_id: int) -> tuple[list[int], int]:
    """The ids of the devices on the mesh axis `axis` through the device `device_id` (the other coordinates fixed),
    in axis order, and that device's index among them (its rank). `devices`: the mesh's array of device ids."""
    names = tuple(axis_names)
    if axis not in names:
        raise NcclInvalidArgument("axis %r is not an axis of the mesh %s" % (axis, names))
    ids = np.asarray(devices)
    where = np.argwhere(ids == device_id)
    if len(where) != 1:
        raise NcclInvalidArgument("device %d is not in the mesh (or is there twice)" % device_id)
    coord = list(where[0])
    a = names.index(axis)
    coord[a] = slice(None)
    members = [int(v) for v in ids[tuple(coord)]]
    return members, int(where[0][a])


def _kv_client():
    """jax.distributed's key-value store client, or None in a single-process run. jax has no public handle on it
    (jax.distributed offers initialize / is_initialized / shutdown): this is the one place that reaches in."""
    from jax._src import distributed

    return distributed.global_state.client


def share_unique_id(kv, key: str, rank: int, make_id, timeout_s: float) -> bytes:
    """The NCCL unique id of a group through the key-value store `kv` (jax.distributed's client, or anything with
    key_value_set_bytes / blocking_key_value_get_bytes): rank 0 makes it (make_id() -> bytes) and publishes it under
    `key`; the others wait for it up to timeout_s."""
    if rank == 0:
        raw = make_id()
        kv.key_value_set_bytes(key, raw)
        return raw
    return bytes(kv.blocking_key_value_get_bytes(key, int(timeout_s * 1000)))


def _make_unique_id() -> bytes:
    uid = _UniqueId()
    _nccl_call("ncclGetUniqueId", ctypes.byref(uid))
    return id_to_bytes(uid)


def _cudart():
    _loader.load("ep")  # loads libcudart.so.13 first where the process had none
    lib = _loader._already_loaded("libcudart.so.13")
    if lib is None:
        raise NcclInvalidUsage("nccl.ep.jax: libcudart.so.13 is not loaded")
    return lib


def _set_device(index: int) -> None:
    rc = _cudart().cudaSetDevice(ctypes.c_int(index))
    if rc != 0:
        raise NcclInvalidUsage("nccl.ep.jax: cudaSetDevice(%d) failed (CUDA error %d)" % (index, rc))


_groups: dict = {}
_generations: dict = {}


class Group(Closing):
    """A dispatch/combine group over the ranks of one mesh axis (COLLECTIVE over the axis's processes, blocking):
    made by nccl.ep.jax.group(), which caches it. Owns its NCCL communicator. `rank`, `size`, `device` (this
    process's jax device), `local_experts`."""

    def __init__(self, mesh, axis: str, *, num_experts: int, max_tokens_per_rank: int, hidden: int | None = None,
                 dtype=jnp.bfloat16, max_token_bytes: int | None = None, max_topk: int = 8, num_sms: int = 0,
                 timeout_s: float | None = None, algorithm: str = "high_throughput", setup_timeout_s: float = 300.0,
                 max_recv_rows_per_rank: int = 0, recv_overflow: str = "error", _key=None):
        cfg = _config(num_experts=num_experts, max_tokens_per_rank=max_tokens_per_rank, hidden=hidden, dtype=dtype,
                      max_token_bytes=max_token_bytes, max_topk=max_topk, num_sms=num_sms, timeout_s=timeout_s,
                      algorithm=algorithm, max_recv_rows_per_rank=max_recv_rows_per_rank,
                      recv_overflow=recv_overflow)
        mine = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
        if len(mine) != 1:
            raise NcclInvalidUsage("nccl.ep.jax: one device of the mesh per process (one process per GPU); this "
                                   "process has %d of them" % len(mine))
        self.device = mine[0]
        if self.device.platform not in ("gpu", "cuda"):
            raise NcclInvalidUsage("nccl.ep.jax: the mesh's device %s is not a CUDA GPU" % self.device)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh.devices)
        members, self.rank = axis_ranks(ids, mesh.axis_names, axis, self.device.id)
        self.size = len(members)
        if num_experts % self.size:
            raise NcclInvalidArgument("num_experts %d is not a multiple of the axis's %d ranks" % (num_experts,
                                                                                                  self.size))
        self.algorithm, self.low_latency = algorithm, algorithm == "low_latency"
        self.num_experts, self.local_experts = num_experts, num_experts // self.size
        self.max_tokens_per_rank, self.max_topk = max_tokens_per_rank, max_topk
        self.max_token_bytes = cfg.max_token_bytes
        self.host_wait_s = _host_wait_s(timeout_s)
        self._config_key, self._key = _config_key(cfg), _key
        self._handles: list[Handle] = []
        register_targets()
        # The id's key names the members and how often they have set up a group (the same on every member).
        base = "nccl_ep/jax/%08x" % (zlib.crc32(repr(members).encode()) & 0xFFFFFFFF)
        generation = _generations.get(base, 0)
        _generations[base] = generation + 1
        kv = _kv_client() if self.size > 1 else None
        if self.size > 1 and kv is None:
            raise NcclInvalidUsage("nccl.ep.jax: a group of %d ranks needs jax.distributed.initialize() (its key-"
                                   "value store carries the NCCL unique id)" % self.size)
        raw = share_unique_id(kv, "%s/%d" % (base, generation), self.rank, _make_unique_id, setup_timeout_s) \
            if kv is not None else _make_unique_id()
        uid = id_from_bytes(raw)
        self.hardware_id = getattr(self.device, "local_hardware_id", None)
        if self.hardware_id is None:
            raise NcclInvalidUsage("nccl.ep.jax: %s has no local_hardware_id" % self.device)
        _set_device(self.hardware_id)
        self._comm = ctypes.c_void_p()
        _nccl_call("ncclCommInitRank", ctypes.byref(self._comm), self.size, uid, self.rank)
        self._g = ctypes.c_void_p()
        try:
            _ep_call("ncclEpCreateGroup", ctypes.byref(self._g), self._comm, ctypes.byref(cfg))
        except NcclError:
            c, self._comm = self._comm, ctypes.c_void_p()
            _nccl_call("ncclCommAbort", c)
            raise

    def _group(self):
        if not self._g:
            raise NcclInvalidUsage("nccl.ep.jax.Group: used after close()")
        return self._g

    def handle(self, num_tokens: int, topk: int, layout: str | None = None) -> "Handle":
        """COLLECTIVE for High-Throughput groups (every rank, same order), blocking, outside jit: a handle for
        routings [num_tokens, topk] (this rank's tokens), worst-case sized. layout: "flat" (High-Throughput), or
        "expert_major" (the Low-Latency default) / "rank_major"."""
        return Handle(self, num_tokens, topk, layout)

    def check(self) -> None:
        """Raises the error of a device wait of this group that timed out (local, never blocks)."""
        _ep_call("ncclEpGroupGetAsyncError", self._group())

    def close(self) -> None:
        """COLLECTIVE: waits for the GPU, destroys the group's handles, the group and its communicator, and drops
        it from the cache. Idempotent."""
        if not self._g:
            return
        for h in list(self._handles):
            h.close()
        g, self._g = self._g, ctypes.c_void_p()
        with _lock:
            _groups.pop(self._key, None)
        try:
            _ep_call("ncclEpGroupDestroy", g)
        finally:
            c, self._comm = self._comm, ctypes.c_void_p()
            _nccl_call("ncclCommFinalize", c)
            _nccl_call("ncclCommDestroy", c)


class Handle(Closing):
    """A routing slot of a group for jitted calls (made by Group.handle): `spec` (HandleSpec) is what tracing
    reads, its `id` what the compiled program names. close() (local) waits for the GPU and frees it."""

    def __init__(self, group: Group, num_tokens: int, topk: int, layout: str | None):
        layout = layout or ("expert_major" if group.low_latency else "flat")
        if layout not in _LAYOUT:
            raise NcclInvalidArgument("layout=%r: expected one of %s" % (layout, ", ".join(sorted(_LAYOUT))))
        if group.low_latency and layout == "flat":
            raise NcclInvalidUsage("layout='flat': a Low-Latency group's handles are 'rank_major' or 'expert_major'")
        if not group.low_latency and layout != "flat":
            raise NcclInvalidUsage("layout=%r: nccl.ep.jax's High-Throughput calls use 'flat'" % layout)
        num_tokens = c_integer(num_tokens, ctypes.c_int, "num_tokens")
        topk = c_integer(topk, ctypes.c_int, "topk")
        if not 0 <= num_tokens <= group.max_tokens_per_rank:
            raise NcclInvalidArgument("num_tokens %d: 0..max_tokens_per_rank %d" % (num_tokens,
                                                                                     group.max_tokens_per_rank))
        if not 1 <= topk <= group.max_topk:
            raise NcclInvalidArgument("topk %d: 1..max_topk %d" % (topk, group.max_topk))
        fields = (group.low_latency, layout, num_tokens, topk, group.size, group.local_experts,
                  group.max_token_bytes, group.max_tokens_per_rank)
        hid = _new_id(fields)
        rows = ctypes.c_int64(0)
        # The binding is collective on the group: every rank makes it after the same calls, so the computations
        # already dispatched (a step of this group in flight) finish first.
        jax.block_until_ready(jax.live_arrays())
        _lib_call("ncclEpJaxHandleCreate", hid, group._group(), group.hardware_id, int(group.low_latency),
                  _LAYOUT[layout], num_tokens, topk, group.local_experts, group.size, group.host_wait_s,
                  ctypes.byref(rows))
        self.group, self.id = group, hid
        self.spec = HandleSpec(id=hid, low_latency=group.low_latency, layout=layout, num_tokens=num_tokens, topk=topk,
                               rows=rows.value, ranks=group.size, local_experts=group.local_experts,
                               max_token_bytes=group.max_token_bytes, max_tokens_per_rank=group.max_tokens_per_rank)
        group._handles.append(self)

    def close(self) -> None:
        """Local, blocking: waits for the GPU's queued work (at most the group's host_wait_s: past it the handle is
        left allocated and NcclSystemError says so), then frees the handle. Idempotent. JAX dispatches
        asynchronously: wait for the computations that use the handle first (block_until_ready on their outputs);
        a call of a closed handle fails with "no handle registered"."""
        if self.id is not None:
            hid, self.id = self.id, None
            self.group._handles.remove(self)
            _lib_call("ncclEpJaxHandleDestroy", hid)


def _host_wait_s(timeout_s) -> float:
    """The host's deadline for a handle's waits at creation and at close: twice the device-wait budget (the group's
    timeout_s, else NCCL_EXT_TIMEOUT_S's, 100 s by default: the kernels end within it) plus a margin."""
    budget = timeout_s
    if not budget:
        try:
            budget = float(os.environ.get("NCCL_EXT_TIMEOUT_S", "100"))
        except ValueError:
            budget = 100.0
    return 2 * max(float(budget), 1.0) + 10.0


def _config(*, num_experts, max_tokens_per_rank, hidden, dtype, max_token_bytes, max_topk, num_sms, timeout_s,
            algorithm, max_recv_rows_per_rank=0, recv_overflow="error") -> _GroupConfig:
    """The ncclEpGroupConfig_t of group()'s arguments (checked by name first)."""
    if algorithm not in _ALGO:
        raise NcclInvalidArgument("algorithm=%r: expected one of %s" % (algorithm, ", ".join(sorted(_ALGO))))
    if recv_overflow not in _RECV_OVERFLOW:
        raise NcclInvalidArgument("recv_overflow=%r: expected one of %s"
                                  % (recv_overflow, ", ".join(sorted(_RECV_OVERFLOW))))
    num_experts, max_tokens_per_rank, max_topk, num_sms, max_recv_rows_per_rank = (
        c_integer(v, ctypes.c_int, k) for k, v in (("num_experts", num_experts),
                                                    ("max_tokens_per_rank", max_tokens_per_rank),
                                                    ("max_topk", max_topk), ("num_sms", num_sms),
                                                    ("max_recv_rows_per_rank", max_recv_rows_per_rank)))
    if algorithm == "low_latency" and not 1 <= max_tokens_per_rank <= _LL_MAX_TOKENS:
        raise NcclInvalidArgument("max_tokens_per_rank %d: a Low-Latency group takes 1..%d tokens per rank"
                                  % (max_tokens_per_rank, _LL_MAX_TOKENS))
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 <= timeout_s < 2**64 / 1e9):
        raise NcclInvalidArgument("timeout_s=%r: seconds, a finite number >= 0" % (timeout_s,))
    if max_token_bytes is None:
        if hidden is None:
            raise NcclInvalidArgument("give hidden (with dtype, default bfloat16) or max_token_bytes")
        max_token_bytes = c_integer(hidden, ctypes.c_int, "hidden") * jnp.dtype(dtype).itemsize
    max_token_bytes = c_integer(max_token_bytes, ctypes.c_int, "max_token_bytes")
    return _GroupConfig.new(algorithm=_ALGO[algorithm], num_experts=num_experts,
                            max_tokens_per_rank=max_tokens_per_rank, max_token_bytes=max_token_bytes,
                            max_topk=max_topk, num_sms=num_sms,
                            timeout_ns=0 if timeout_s is None else int(timeout_s * 1e9),
                            max_recv_rows_per_rank=max_recv_rows_per_rank,
                            recv_overflow=_RECV_OVERFLOW[recv_overflow])


def _config_key(cfg: _GroupConfig) -> tuple:
    return tuple(getattr(cfg, name) for name in ("algorithm", "num_experts", "max_tokens_per_rank", "max_token_bytes",
                                                 "max_topk", "num_sms", "timeout_ns", "max_recv_rows_per_rank",
                                                 "recv_overflow"))


def group(mesh, axis: str, **config) -> Group:
    """The group of the ranks of mesh axis `axis` that this process's device belongs to (COLLECTIVE over them on
    first use: every process of the axis calls it at the same point), cached per (mesh, axis, algorithm). config:
    num_experts, max_tokens_per_rank, hidden (with dtype, default bfloat16) or max_token_bytes, max_topk (8),
    num_sms (0: the library's), timeout_s (device waits; None: the library's), algorithm ("high_throughput" or
    "low_latency"), setup_timeout_s (the wait for rank 0's unique id, 300), max_recv_rows_per_rank and
    recv_overflow (High-Throughput: the receive cap, as nccl.ep.Group's; the outputs then
    have the cap's rows). A cached group asked for with another
    config: NcclInvalidUsage (close it first)."""
    ids = tuple(int(d.id) for d in mesh.devices.flat)
    key = (ids, tuple(mesh.devices.shape), tuple(mesh.axis_names), axis, config.get("algorithm", "high_throughput"))
    with _lock:
        g = _groups.get(key)
    if g is not None:
        wanted = _config_key(_config(**{k: config.get(k, d) for k, d in _CONFIG_DEFAULTS.items()}))
        if wanted != g._config_key:
            raise NcclInvalidUsage("nccl.ep.jax.group: the group of axis %r has another config; close() it first"
                                   % axis)
        return g
    g = Group(mesh, axis, _key=key, **config)
    with _lock:
        _groups[key] = g
    return g


_CONFIG_DEFAULTS = {"num_experts": None, "max_tokens_per_rank": None, "hidden": None, "dtype": jnp.bfloat16,
                    "max_token_bytes": None, "max_topk": 8, "num_sms": 0, "timeout_s": None,
                    "algorithm": "high_throughput", "max_recv_rows_per_rank": 0, "recv_overflow": "error"}


def close() -> None:
    """COLLECTIVE: closes every cached group (their handles first), in the order they were made."""
    with _lock:
        groups = list(_groups.values())
    for g in groups:
        g.close()
