"""nccl.ep: MoE dispatch and combine (libnccl_ep) on torch tensors and process groups.

    import torch, torch.distributed as dist
    import nccl.ep as ep

    group = ep.Group(num_experts=256, max_tokens_per_rank=4096, hidden=7168)   # collective; default process group
    recv = group.dispatch(x, topk_idx, topk_weights)          # x [T, H] bf16, topk_idx [T, K] int64/int32
    y = experts(recv.tokens, recv.topk_idx, recv.topk_weights)  # rows grouped by source rank (FLAT layout)
    out = group.combine(y, recv.handle)                       # [T, H], each token's rows summed in fp32
    recv.handle.close(); group.close()                        # collective

Every call runs on the current torch CUDA stream (or `stream=`), asynchronously, like a torch collective. Failures
raise nccl.ep.NcclError subclasses carrying the library's text; a device wait that timed out (a peer gone) is raised
by the next call or by Group.check(). Two modes, inside one NVLink domain or across several (rows for another
domain's ranks go over NCCL send/recv between a call's halves): High-Throughput (the default; FLAT and EXPERT_MAJOR
layouts) and Low-Latency (`algorithm="low_latency"`, decode: sized once for at most 1024 tokens per
rank, fixed worst-case outputs in RANK_MAJOR or EXPERT_MAJOR layout, the receive counts produced by each dispatch,
fp8 quantisation on the way, and with `enable_mask=True` a mask of active ranks for fault tolerance: see
Group.dispatch and Group.mask_update). nccl.ep.autograd has differentiable dispatch/combine (FLAT),
nccl.ep.ops the same as torch.library custom ops (torch.compile), nccl.ep.deepep DeepEP's Buffer API.
"""

from __future__ import annotations

import contextlib
import ctypes
import types
import weakref
from dataclasses import dataclass

from .._ext import _loader
from .._ext.closing import Closing
from .._ext.cvalues import c_integer, set_fields
from .._ext.comm import Communicator
from .._ext.errors import (NcclError, NcclInProgress, NcclInternalError, NcclInvalidArgument, NcclInvalidUsage,
                           NcclRemoteError, NcclSystemError, NcclUnhandledCudaError)
from .._ext.tensor import CTensor, absent, describe, descriptor, nccl_dtype

__all__ = ["Group", "Handle", "DispatchResult", "Communicator", "query_group_info", "version", "NcclError",
           "NcclUnhandledCudaError", "NcclSystemError", "NcclInternalError", "NcclInvalidArgument", "NcclInvalidUsage",
           "NcclRemoteError", "NcclInProgress"]

_MAGIC = 0x65703031  # NCCL_EP_MAGIC
_ALGO = {"low_latency": 0, "high_throughput": 1}
_LAYOUT = {"expert_major": 1, "rank_major": 2, "flat": 3}
_SIZING = {"worst_case": 0, "exact": 1}
_RECV_OVERFLOW = {"error": 0, "drop": 1}
_LL_MAX_TOKENS = 1024  # ncclEpGroupConfig_t.max_tokens_per_rank of a Low-Latency group
_FP8_BLOCK = 128       # columns per fp8 scale


class _Header(ctypes.Structure):
    """The {size, magic} start of every C struct passed by pointer; new() fills it as the *_INIT macros do."""

    @classmethod
    def new(cls, **fields):
        s = cls()
        s.size = ctypes.sizeof(cls)
        s.magic = _MAGIC
        for name, ctype in cls._fields_:
            if ctype is CTensor:
                setattr(s, name, absent())
        set_fields(s, cls.__name__.lstrip("_"), **fields)
        return s


class _AllocConfig(ctypes.Structure):
    _fields_ = [("alloc_fn", ctypes.c_void_p), ("free_fn", ctypes.c_void_p), ("context", ctypes.c_void_p)]


class _GroupConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("algorithm", ctypes.c_int),
                ("num_experts", ctypes.c_int), ("max_tokens_per_rank", ctypes.c_int),
                ("max_token_bytes", ctypes.c_int), ("max_topk", ctypes.c_int), ("num_sms", ctypes.c_int),
                ("timeout_ns", ctypes.c_uint64), ("zero_copy", ctypes.c_int), ("alloc", _AllocConfig),
                ("lsa_domain_size", ctypes.c_int), ("enable_mask", ctypes.c_int), ("rail_round_tokens", ctypes.c_int),
                ("rail_staging_bytes_max", ctypes.c_size_t), ("ht_hierarchical", ctypes.c_int),
                ("rail_overlap", ctypes.c_int), ("max_recv_rows_per_rank", ctypes.c_int),
                ("recv_overflow", ctypes.c_int)]


class _HandleConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint),
                ("dispatch_output_per_expert_alignment", ctypes.c_int), ("sizing", ctypes.c_int)]


class _LayoutInfo(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("expert_counters", CTensor),
                ("src_rank_counters", CTensor), ("expert_offsets", CTensor), ("recv_total_counter", CTensor),
                ("recv_dropped_counter", CTensor)]


class _DispatchInputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("topk_weights", CTensor),
                ("scales", CTensor), ("global_scale", CTensor)]


class _DispatchOutputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("topk_weights", CTensor),
                ("topk_idx", CTensor), ("scales", CTensor), ("src_info", CTensor), ("recv_wait_cycles", CTensor)]


class _DispatchConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("num_sms", ctypes.c_int),
                ("round_scale", ctypes.c_int), ("send_only", ctypes.c_int), ("global_expert_ids", ctypes.c_int)]


class _CombineInputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("topk_weights", CTensor),
                ("bias", CTensor)]


class _CombineOutputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("missing_experts", CTensor),
                ("recv_wait_cycles", CTensor)]


class _CombineConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("num_sms", ctypes.c_int),
                ("send_only", ctypes.c_int)]


class _GroupInfo(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("n_domains", ctypes.c_int),
                ("domain_size", ctypes.c_int), ("window_bytes", ctypes.c_size_t),
                ("rail_dispatch_bytes", ctypes.c_size_t), ("rail_combine_bytes", ctypes.c_size_t),
                ("rail_combine_owner_bytes", ctypes.c_size_t), ("rail_messages_per_domain", ctypes.c_int),
                ("rail_dispatch_domain_bytes", ctypes.c_size_t), ("rail_combine_domain_bytes", ctypes.c_size_t),
                ("rail_relayed", ctypes.c_int), ("rail_staging_bytes", ctypes.c_size_t),
                ("rail_round_tokens", ctypes.c_int), ("rail_hierarchical", ctypes.c_int),
                ("rail_overlapped", ctypes.c_int)]


_P = ctypes.c_void_p
_SIGNATURES = {
    "ncclEpGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "ncclEpCreateGroup": [ctypes.POINTER(_P), _P, ctypes.POINTER(_GroupConfig)],
    "ncclEpGroupDestroy": [_P],
    "ncclEpGroupGetAsyncError": [_P],
    "ncclEpGroupGetInfo": [_P, ctypes.POINTER(_GroupInfo)],
    "ncclEpGroupInfoQuery": [ctypes.POINTER(_GroupConfig), ctypes.c_int, ctypes.c_int, ctypes.POINTER(_GroupInfo)],
    "ncclEpCreateHandle": [ctypes.POINTER(_P), _P, ctypes.c_int, ctypes.POINTER(CTensor),
                           ctypes.POINTER(_LayoutInfo), ctypes.POINTER(_HandleConfig), _P],
    "ncclEpUpdateHandle": [_P, ctypes.POINTER(CTensor), ctypes.POINTER(_LayoutInfo), _P],
    "ncclEpHandleDestroy": [_P],
    "ncclEpHandleGetRecvRows": [_P, ctypes.POINTER(ctypes.c_int64)],
    "ncclEpHandleGetMaxRecvRows": [_P, ctypes.POINTER(ctypes.c_int64)],
    "ncclEpGroupGetDispatchWindow": [_P, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(CTensor)],
    "ncclEpDispatch": [_P, ctypes.POINTER(_DispatchInputs), ctypes.POINTER(_DispatchOutputs),
                       ctypes.POINTER(_LayoutInfo), ctypes.POINTER(_DispatchConfig), _P],
    "ncclEpCombine": [_P, ctypes.POINTER(_CombineInputs), ctypes.POINTER(_CombineOutputs),
                      ctypes.POINTER(_CombineConfig), _P],
    "ncclEpComplete": [_P, _P, _P],
    "ncclEpMaskQuery": [_P, _P, _P],
    "ncclEpMaskUpdate": [_P, ctypes.POINTER(ctypes.c_int), _P],
    "ncclEpMaskClean": [_P, _P],
}


def _lib() -> ctypes.CDLL:
    return _loader.bind("ep", "Ep", _SIGNATURES)


def _call(name: str, *args) -> None:
    _loader.call(_lib(), "Ep", name, *args)


def version() -> tuple[int, int, int]:
    """libnccl_ep's (major, minor, patch)."""
    return _loader.version(_lib(), "Ep")


def _stream(stream):
    """The cudaStream_t of `stream` (None: the current device's current stream)."""
    import torch

    return _raw_stream(stream, torch.cuda.current_device())


def _raw_stream(stream, device_index: int):
    """The cudaStream_t of `stream` (None: the current stream of device `device_index`), as an int."""
    if stream is not None:
        return stream.cuda_stream
    import torch

    return torch.cuda.current_stream(device_index).cuda_stream


def _record_on(stream, *tensors) -> None:
    """Marks each tensor (None: skipped) as used by `stream` (torch's record_stream): the caching allocator then
    hands its memory to nobody else until the work `stream` has queued so far is done, so a caller may drop a tensor
    right after a call that runs on another stream than the one it was made for."""
    stream = _torch_stream(stream)
    for t in tensors:
        if t is not None:
            t.record_stream(stream)


def _torch_stream(stream):
    """`stream` (a torch CUDA stream, or anything with .cuda_stream) as a torch CUDA stream."""
    import torch

    return stream if isinstance(stream, torch.cuda.Stream) else torch.cuda.ExternalStream(stream.cuda_stream)


def _allocating_on(stream):
    """A context in which torch allocates for `stream` (a torch CUDA stream, or anything with .cuda_stream; None: the
    current stream, nothing to switch): the caching allocator hands a block freed by one stream to later work of that
    stream only, so the outputs of a call on `stream` must be that stream's, or a caller who drops them could see
    their memory reused by the current stream while the call still writes it."""
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(_torch_stream(stream))


def _meta(t):
    """What a cached call's signature holds of an optional tensor: None, or (dtype, shape, device index)."""
    return None if t is None else (t.dtype, t.shape, t.get_device())


class _Prepared:
    """A dispatch or combine of one signature on one handle (the dtypes, shapes and devices of its tensors, and
    num_sms): checked in full once, its C structs built once. A call of a known signature checks only what tensors
    of one signature can still differ in (contiguity), allocates its outputs and sets the data pointers; the
    per-call cost of this layer is what bench/ep_python_overhead.py measures. A Low-Latency dispatch also has a
    layout_info struct (`info`) whose four int32 count descriptors point into one new tensor per call (`counts`:
    its length, per descriptor its offset in elements, and _count_parts' table)."""

    __slots__ = ("fn", "structs", "refs", "given", "made", "names", "counts", "info_ref", "device", "device_index",
                 "empty", "int32")

    def __init__(self, fn_name, inputs, outputs, cfg, given, made, device, names=(), info=None, counts=None):
        import torch

        self.empty, self.int32 = torch.empty, torch.int32  # the per-call path imports nothing
        self.fn = getattr(_lib(), fn_name)
        self.structs = (inputs, outputs, cfg, info)  # kept alive: refs point into them
        self.refs = (ctypes.byref(inputs), ctypes.byref(outputs), ctypes.byref(cfg))
        self.info_ref = None if info is None else ctypes.byref(info)
        self.given = given  # per tensor the caller passes: its descriptor (a view into a struct) or None, non-empty
        self.made = made    # per output this call allocates: (descriptor, shape, dtype)
        self.names = names  # per output of `made`: its DispatchResult field
        self.counts = counts
        self.device, self.device_index = device, device.index or 0

    def fill(self, tensors, reuse=None, stream=None):
        """Points the descriptors at the caller's tensors and at new outputs (returned, in `made` order, then the
        counts tensor if the call has one), or at `reuse`: the outputs an earlier fill of this call returned. New
        outputs are allocated for `stream` when the call names one (else for the current stream)."""
        for (d, nonempty), t in zip(self.given, tensors):
            if d is not None:
                d.data = t.data_ptr() if nonempty else None
        if reuse is not None:
            for (d, _, _), t in zip(self.made, reuse):
                d.data = t.data_ptr() if t.numel() else None
            if self.counts is not None:
                base = reuse[-1].data_ptr()
                for d, offset in self.counts[1]:
                    d.data = base + 4 * offset
            return reuse
        if stream is not None:  # the current stream's calls (the common case) skip the context: a per-call path
            with _allocating_on(stream):
                return self._new_outputs()
        return self._new_outputs()

    def _new_outputs(self):
        outs = []
        empty, device = self.empty, self.device
        for d, shape, dtype in self.made:
            t = empty(*shape, dtype=dtype, device=device)  # ints, not a tuple: half the parsing
            d.data = t.data_ptr() if t.numel() else None
            outs.append(t)
        if self.counts is not None:
            n, parts, _ = self.counts
            t = empty(n, dtype=self.int32, device=device)
            base = t.data_ptr()
            for d, offset in parts:
                d.data = base + 4 * offset
            outs.append(t)
        return outs

    def invoke(self, *args) -> None:
        rc = self.fn(*args)
        if rc:  # the library is bound already: only a failure looks up its last error
            _loader.check(_lib(), "Ep", self.fn.__name__, rc)


def _combine_weights(combine, weights, local=None):
    """Top-k weights [rows, k] as fp32 (zero where `local`, if given, is False) through `combine` (a callable of an
    fp32 tensor [rows, kp]): padded with zero columns to rows of a multiple of 16 bytes, which combine moves, and
    cut back to k columns."""
    import torch

    w = weights.float()
    if local is not None:
        w = torch.where(local, w, torch.zeros_like(w))
    k = w.shape[1]
    kp = -(-k // 4) * 4
    if kp != k:
        w = torch.nn.functional.pad(w, (0, kp - k))
    return combine(w.contiguous())[:, :k]


def _count_parts(local: int, ranks: int):
    """Where a Low-Latency dispatch's counts lie in its one int32 tensor: per count, (its DispatchResult / Handle
    attribute, its ncclEpLayoutInfo_t field, offset, length); 2 * local + ranks + 1 elements in all."""
    return (("expert_counts", "expert_counters", 0, local), ("rank_counts", "src_rank_counters", local, ranks),
            ("expert_offsets", "expert_offsets", local + ranks, local),
            ("recv_total", "recv_total_counter", 2 * local + ranks, 1))


def _choice(table: dict, value: str, name: str) -> int:
    if value not in table:
        raise NcclInvalidArgument("%s=%r: expected one of %s" % (name, value, ", ".join(sorted(table))))
    return table[value]


def _group_config(what: str, *, num_experts: int, max_tokens_per_rank: int, hidden: int | None = None, dtype=None,
                  max_token_bytes: int | None = None, max_topk: int = 8, num_sms: int = 0,
                  timeout_s: float | None = None, algorithm: str = "high_throughput", enable_mask: bool = False,
                  rail_round_tokens: int = 0, rail_staging_bytes_max: int = 0, ht_hierarchical: bool | None = None,
                  rail_overlap: bool | None = None, max_recv_rows_per_rank: int = 0,
                  recv_overflow: str = "error") -> "_GroupConfig":
    """The ncclEpGroupConfig_t of Group's arguments (Group, query_group_info), the checks the C API cannot make
    (or makes less clearly) first; `what` names the caller in errors."""
    import torch

    algo = _choice(_ALGO, algorithm, "algorithm")
    # The numbers as the C config holds them, each refused by name when it cannot (cvalues.c_integer).
    num_experts, max_tokens_per_rank, max_topk, num_sms, rail_round_tokens, max_recv_rows_per_rank = (
        c_integer(v, ctypes.c_int, "%s: %s" % (what, k))
        for k, v in (("num_experts", num_experts), ("max_tokens_per_rank", max_tokens_per_rank),
                     ("max_topk", max_topk), ("num_sms", num_sms), ("rail_round_tokens", rail_round_tokens),
                     ("max_recv_rows_per_rank", max_recv_rows_per_rank)))
    overflow = _choice(_RECV_OVERFLOW, recv_overflow, "recv_overflow")
    hidden = None if hidden is None else c_integer(hidden, ctypes.c_int, "%s: hidden" % what)
    if max_token_bytes is not None:
        max_token_bytes = c_integer(max_token_bytes, ctypes.c_int, "%s: max_token_bytes" % what)
    rail_staging_bytes_max = c_integer(rail_staging_bytes_max, ctypes.c_int64, "%s: rail_staging_bytes_max" % what)
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 <= timeout_s < 2**64 / 1e9):
        raise NcclInvalidArgument("%s: timeout_s=%r: seconds, a finite number >= 0 (0: the default)"
                                  % (what, timeout_s))
    if rail_staging_bytes_max < 0:
        raise NcclInvalidArgument("%s: rail_staging_bytes_max %d < 0 (0: no limit)" % (what, rail_staging_bytes_max))
    if enable_mask and algorithm != "low_latency":
        raise NcclInvalidUsage("%s: enable_mask=True: rank masks belong to the Low-Latency mode (algorithm="
                               "'low_latency'); a High-Throughput wait that times out fails the group" % what)
    if algorithm == "low_latency" and not 1 <= max_tokens_per_rank <= _LL_MAX_TOKENS:
        raise NcclInvalidArgument("%s: max_tokens_per_rank %d: a Low-Latency group takes 1..%d tokens per rank"
                                  % (what, max_tokens_per_rank, _LL_MAX_TOKENS))
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise NcclInvalidArgument("%s: dtype=%r: a torch.dtype is expected" % (what, dtype))
    if max_token_bytes is None:
        if hidden is None:
            raise NcclInvalidArgument("%s: give hidden (with dtype, default bfloat16) or max_token_bytes" % what)
        # Rows of `dtype`; a combine of wider rows (fp32 expert outputs) needs max_token_bytes instead.
        max_token_bytes = (dtype or torch.bfloat16).itemsize * hidden
    return _GroupConfig.new(algorithm=algo, num_experts=num_experts, max_tokens_per_rank=max_tokens_per_rank,
                            max_token_bytes=max_token_bytes, max_topk=max_topk, num_sms=num_sms,
                            timeout_ns=0 if timeout_s is None else int(timeout_s * 1e9),
                            enable_mask=1 if enable_mask else 0, rail_round_tokens=rail_round_tokens,
                            rail_staging_bytes_max=rail_staging_bytes_max, ht_hierarchical=_on_off(ht_hierarchical),
                            rail_overlap=_on_off(rail_overlap), max_recv_rows_per_rank=max_recv_rows_per_rank,
                            recv_overflow=overflow)


def _on_off(choice: bool | None) -> int:
    """A config switch: None leaves it to the library (NCCL_EP_AUTO: its environment variable, else off)."""
    return 0 if choice is None else 1 if choice else -1


def query_group_info(nranks: int, lsa_size: int, **group_args) -> dict:
    """What Group(**group_args).info() would report on `nranks` ranks whose NVLink (LSA) teams have `lsa_size` ranks
    (NCCL_EXT_LSA_DOMAIN_SIZE splits them as it would at creation), the arguments left at None resolved from this
    process's environment as the group would resolve them: window_bytes, rail_staging_bytes and the rest, for memory
    planning before any group exists (ncclEpGroupInfoQuery: host arithmetic, no GPU, no communicator). group_args
    are Group's keyword arguments (num_experts, max_tokens_per_rank, hidden or max_token_bytes, max_topk, algorithm,
    rail_round_tokens, rail_staging_bytes_max, ht_hierarchical, rail_overlap, max_recv_rows_per_rank, ...)."""
    cfg = _group_config("query_group_info", **group_args)
    raw = _GroupInfo.new()
    _call("ncclEpGroupInfoQuery", ctypes.byref(cfg), c_integer(nranks, ctypes.c_int, "query_group_info: nranks"),
          c_integer(lsa_size, ctypes.c_int, "query_group_info: lsa_size"), ctypes.byref(raw))
    return {name: getattr(raw, name) for name, _ in _GroupInfo._fields_[2:]}


class Group(Closing):
    """A dispatch/combine group over the ranks of a process group (COLLECTIVE, blocking): sizes and registers the
    symmetric buffers once, for tokens of up to `max_tokens_per_rank` rows of `hidden` elements of `dtype` (or
    `max_token_bytes`) and up to `max_topk` experts each. `group` is a torch ProcessGroup (None: the default group)
    or a Communicator. The group's calls run one after another, in the same order on every rank.

    `algorithm="low_latency"` makes a Low-Latency (decode) group: everything is sized here for max_tokens_per_rank
    M <= 1024; its handles are RANK_MAJOR or EXPERT_MAJOR with worst-case sizing, and handle update, dispatch and
    combine then never allocate in the library nor wait on the host (all of them may be graph-captured; handle
    creation allocates the handle's device memory: make handles before a capture). Size it for the rows combine
    carries (bf16: hidden * 2 bytes, the default with `hidden`).

    `enable_mask=True` (Low-Latency only) gives the group a mask of active ranks (ncclEpMask*, fault tolerance):
    dispatch and combine skip masked ranks, and a peer that does not arrive within the timeout is masked instead of
    failing the group; one that stopped in the middle of a call is masked too, and the next call (or check())
    raises NcclRemoteError once, naming it. See mask_query, mask_update, mask_clean and combine's
    missing_experts.

    `rail_round_tokens` (High-Throughput across NVLink domains): a call moves its rows to each rank of another domain
    in rounds of this many, which bounds the rail's staging to that many rows a peer (0: NCCL_EXT_RAIL_ROUND_TOKENS,
    else 1024). `rail_staging_bytes_max` (across domains; 0: no limit): the most device memory the rail's staging may
    hold, as DeepEP's num_rdma_bytes: High-Throughput's rounds shrink to fit it (info()'s rail_round_tokens and
    rail_staging_bytes say what they became); NcclInvalidArgument when even one row a peer (Low-Latency: its fixed
    staging) does not fit. `ht_hierarchical` (High-Throughput across domains of several ranks: one rail row per
    token and destination domain, relayed there; experimental) and `rail_overlap` (its NVLink part beside the rail
    rounds): True or False, or None for NCCL_EXT_HT_HIERARCHICAL / NCCL_EXT_RAIL_OVERLAP (else off).

    `max_recv_rows_per_rank` (High-Throughput; across NVLink domains not with ht_hierarchical; 0: no cap) bounds the
    rows a dispatch delivers to a rank, one per (token, rank): the window's dispatch staging and a handle's "flat"
    output hold that many rows instead of size * max_tokens_per_rank, and the combine staging max_tokens_per_rank *
    min(size, max_topk) (info()'s window_bytes; query_group_info before; across domains the rail staging grows 1.5x:
    an inbox beside each outbox). The rows past it (the last source ranks' last tokens) are never delivered;
    `recv_overflow="error"` (default) makes every rank's next call raise NcclInvalidArgument naming them (and the
    rank), "drop" counts them (the handle's recv_dropped) and combine leaves them out of the sum (its missing_experts
    says how many of each token's experts)."""

    max_recv_rows_per_rank = 0  # the receive cap (set by __init__)

    def __init__(self, group=None, *, num_experts: int, max_tokens_per_rank: int, hidden: int | None = None,
                 dtype=None, max_token_bytes: int | None = None, max_topk: int = 8, num_sms: int = 0,
                 timeout_s: float | None = None, algorithm: str = "high_throughput", enable_mask: bool = False,
                 rail_round_tokens: int = 0, rail_staging_bytes_max: int = 0, ht_hierarchical: bool | None = None,
                 rail_overlap: bool | None = None, max_recv_rows_per_rank: int = 0, recv_overflow: str = "error"):
        cfg = _group_config("Group", num_experts=num_experts, max_tokens_per_rank=max_tokens_per_rank, hidden=hidden,
                            dtype=dtype, max_token_bytes=max_token_bytes, max_topk=max_topk, num_sms=num_sms,
                            timeout_s=timeout_s, algorithm=algorithm, enable_mask=enable_mask,
                            rail_round_tokens=rail_round_tokens, rail_staging_bytes_max=rail_staging_bytes_max,
                            ht_hierarchical=ht_hierarchical, rail_overlap=rail_overlap,
                            max_recv_rows_per_rank=max_recv_rows_per_rank, recv_overflow=recv_overflow)
        self.max_recv_rows_per_rank, self.max_token_bytes = cfg.max_recv_rows_per_rank, cfg.max_token_bytes
        self._owns_comm = not isinstance(group, Communicator)
        self.comm = Communicator(group) if self._owns_comm else group
        self.algorithm, self.low_latency, self.enable_mask = algorithm, algorithm == "low_latency", bool(enable_mask)
        self.num_experts, self.rank, self.size = num_experts, self.comm.rank, self.comm.size
        self.local_experts = num_experts // max(1, self.size)
        self.max_tokens_per_rank, self.max_topk = max_tokens_per_rank, max_topk
        self._g = ctypes.c_void_p()
        self._handles = weakref.WeakSet()  # its open Handles: close() closes them before the group (the C rule)
        self._retired = []  # _HandleLife of Handles dropped without close(): destroyed by _reap or close()
        try:
            _call("ncclEpCreateGroup", ctypes.byref(self._g), self.comm.handle, ctypes.byref(cfg))
        except NcclError:
            if self._owns_comm:
                self.comm.abort()
            raise

    def _handle(self):
        if not self._g:
            raise NcclInvalidUsage("Group: used after close()")
        return self._g

    def _same_device(self, *named) -> None:
        """Refuses any of the (name, tensor) pairs that is not on the group's device (None, or not a tensor: left to
        the full checks)."""
        dev = self.comm.device
        for name, t in named:
            if getattr(t, "device", dev) != dev:
                raise NcclInvalidArgument("%s is on %s; the group's device is %s (a call's tensors must be on it)"
                                          % (name, t.device, dev))

    def _layout(self, layout: str | None) -> str:
        """`layout`, or the mode's default: "flat" (High-Throughput), "expert_major" (Low-Latency, as DeepEP's)."""
        if layout is not None:
            return layout
        return "expert_major" if self.low_latency else "flat"

    def check(self) -> None:
        """Raises the error of a device wait of this group that timed out (local, never blocks); with enable_mask,
        NcclRemoteError once for a peer masked in the middle of a call."""
        _call("ncclEpGroupGetAsyncError", self._handle())

    # -- rank masks (Low-Latency groups made with enable_mask=True; else NcclInvalidUsage) -------------------------
    def mask_query(self, stream=None):
        """Local, stream-ordered: this rank's mask as a new int32 [size] tensor on the group's device, 1 = active,
        0 = masked (by mask_update, or by the kernels: a peer that did not arrive in time)."""
        import torch

        with _allocating_on(stream):
            mask = torch.empty(self.size, dtype=torch.int32, device=self.comm.device)
        _call("ncclEpMaskQuery", self._handle(), mask.data_ptr(), _raw_stream(stream, self.comm.device.index))
        return mask

    def mask_update(self, mask, stream=None) -> None:
        """Local, stream-ordered: sets this rank's mask from `mask`, one entry per rank (a sequence of bools or
        ints, or a 1-D tensor; nonzero = active). A CUDA tensor is read on the host (waits for its stream). Change
        the mask only between a combine and the next dispatch; a rank made active again after it missed calls
        needs mask_clean() before the group's next call."""
        import torch

        if isinstance(mask, torch.Tensor):
            if mask.dim() != 1:
                raise NcclInvalidArgument("mask_update: mask must be 1-D (one entry per rank); got shape %s"
                                          % (tuple(mask.shape),))
            mask = mask.tolist()
        values = [1 if v else 0 for v in mask]
        if len(values) != self.size:
            raise NcclInvalidArgument("mask_update: %d entries for a group of %d ranks; give one per rank "
                                      "(nonzero = active)" % (len(values), self.size))
        host = (ctypes.c_int * self.size)(*values)
        _call("ncclEpMaskUpdate", self._handle(), host, _raw_stream(stream, self.comm.device.index))

    def mask_clean(self, stream=None) -> None:
        """COLLECTIVE over the ranks active in this rank's mask, stream-ordered: resets every Low-Latency flag and
        call number of the group, so that ranks whose calls diverged (one masked for a while, made active again by
        every rank's mask_update) continue in step. No send-only call may be open; ranks outside the mask must not
        be running calls of the group."""
        _call("ncclEpMaskClean", self._handle(), _raw_stream(stream, self.comm.device.index))

    def create_handle(self, topk_idx, layout: str | None = None, sizing: str = "worst_case", alignment: int = 1,
                      stream=None) -> "Handle":
        """COLLECTIVE, stream-ordered: binds the routing topk_idx [T, K] (int32/int64, -1: none). See Handle.
        Low-Latency: local (no exchange; the counts travel with each dispatch)."""
        return Handle(self, topk_idx, self._layout(layout), sizing, alignment, stream)

    def dispatch(self, x, topk_idx=None, topk_weights=None, *, handle: "Handle | None" = None, scales=None,
                 layout: str | None = None, sizing: str = "worst_case", out_dtype=None, round_scale: bool = False,
                 send_only: bool = False, num_sms: int = 0, out: "DispatchResult | None" = None,
                 global_expert_ids: bool = False, global_scale=None, tokens_out=None, ue8m0: bool = False,
                 recv_wait_cycles=None, stream=None) -> "DispatchResult":
        """COLLECTIVE, stream-ordered: sends each token x[t] ([T, H]; bf16, fp16, fp32 or fp8 e4m3 with `scales`
        [T, H/128] fp32) to every rank hosting one of its experts. High-Throughput groups forward any scales as the
        caller lays them out, bit for bit: [T, S] fp32 or int32 (per token, per block, DeepEP's packed UE8M0), with
        fp8 x, with uint8 x (opaque bytes: packed fp4 with its block scales), or as side words of x of any dtype (S
        up to max_token_bytes / 128); recv.scales has their dtype. Give
        topk_idx (a handle is made for it, of `layout`: "flat" for High-Throughput groups and "expert_major" for
        Low-Latency ones by default) or a handle made for this routing. topk_weights [T, K] fp32 travel with the rows (EXPERT_MAJOR combine without owner
        weights needs them). The FLAT and RANK_MAJOR outputs' topk_idx hold this rank's local expert ids (-1 where
        the expert is elsewhere), or with `global_expert_ids=True` the global ones (rank * local_experts + local).

        Low-Latency groups: x is bf16, or fp8 e4m3 with `scales` [T, S] fp32 or int32 of the caller's layout, any S
        from 1 to max_token_bytes / 128 (per block, packed UE8M0, per token: forwarded bit for bit). `out_dtype=
        torch.float8_e4m3fn` with bf16 x quantises on the sender: tokens arrive as e4m3 with `scales` [N, H/128]
        fp32 (amax / 448 per 128 columns; `round_scale=True`: rounded up to powers of 2; `ue8m0=True`: powers of 2
        as their exponent bytes, four an int32, [N, H/512], H a multiple of 512: DeepEP's packed UE8M0, row-major).
        `out_dtype=torch.float4_e2m1fn_x2` (or torch.uint8) with bf16 x and `global_scale` (a [1] fp32 CUDA tensor
        g, as vLLM's and TensorRT-LLM's NVFP4 quantisers take it) quantises to NVFP4: tokens [N, H/2] of out_dtype
        (two e2m1 a byte, the first in the low nibble) with `scales` [N, H/16] float8_e4m3fn, one per 16 columns
        (e4m3(amax / 6 x g); x ~ q x scale / g; linear, not the swizzled layout grouped GEMMs read); x of
        float4_e2m1fn_x2 or uint8 [T, H/2] with such scales is forwarded. Outputs have the fixed
        worst-case shape, N = R * M (RANK_MAJOR: rows s * M + j, j < rank_counts[s], hold source s's tokens in source
        order) or L * R * M (EXPERT_MAJOR, viewable as [L, R * M, H]: rows e * R * M + i, i < expert_counts[e], by
        (source rank, token)); rows past the counts are not written. src_info [N] int32 (RANK_MAJOR: the token's
        index at its source; EXPERT_MAJOR: source rank * M + token). The counts (expert_counts, rank_counts,
        expert_offsets, recv_total) are new tensors of each dispatch, written by it on the device. A dispatch given
        topk_idx without a handle makes one, which allocates: inside a CUDA graph capture pass a handle.
        `send_only=True` (Low-Latency): issues the sends and returns; the outputs are written by
        `complete(handle)`, which must come before the handle's next call. The staging is double-buffered: up to
        two send-only calls of each kind may be open at once, on different handles (e.g. two micro-batches'
        dispatches), completed in the order they were issued (completing the later one first raises
        NcclInvalidUsage); a plain call of a kind while one of that kind is open is refused.

        `tokens_out`: the tensor the received tokens go to (its dtype and width the output's, at least the output's
        rows), instead of a new one: e.g. `dispatch_window()`'s, whose rows land in place (zero-copy, FLAT).

        `recv_wait_cycles` (Low-Latency): a caller's int64 [group size] CUDA tensor to which the receive half adds,
        per source rank, the clock64 cycles its threads spun waiting for that source's header and rows (summed over
        the waiting threads; nothing for what had arrived): straggler diagnosis, DeepEP's
        dispatch_wait_recv_cost_stats.

        `out`: a result of an earlier dispatch of the same signature (tensor shapes and dtypes, options) on this
        handle, whose tensors this call writes again instead of allocating new ones (and returns, updated): for
        loops that are done with the previous outputs, as DeepEP's buffer views are reused by its next calls."""
        if handle is None:
            if topk_idx is None:
                raise NcclInvalidArgument("dispatch: give topk_idx or handle")
            handle = Handle(self, topk_idx, self._layout(layout), sizing, 1, stream)
        elif topk_idx is not None and topk_idx is not handle.topk_idx:
            handle.update(topk_idx, stream)
        try:
            key = (x.dtype, x.shape, x.get_device(), None if topk_weights is None else _meta(topk_weights),
                   None if scales is None else _meta(scales), out_dtype, bool(round_scale), bool(send_only), num_sms,
                   bool(global_expert_ids), None if global_scale is None else _meta(global_scale),
                   None if tokens_out is None else (_meta(tokens_out), tokens_out.data_ptr()), bool(ue8m0),
                   _meta(recv_wait_cycles))
        except (AttributeError, TypeError):  # not tensors: the full checks say so
            key = None
        prep = handle._prepared.get(key)
        if prep is None or not (x.is_contiguous() and (topk_weights is None or topk_weights.is_contiguous())
                                and (scales is None or scales.is_contiguous())
                                and (tokens_out is None or tokens_out.is_contiguous())
                                and (recv_wait_cycles is None or recv_wait_cycles.is_contiguous())):
            prep = self._prepare_dispatch(handle, key, x, topk_weights, scales, num_sms, out_dtype, round_scale,
                                          send_only, global_expert_ids, global_scale, tokens_out, ue8m0,
                                          recv_wait_cycles)
        if out is not None and (key is None or out.handle is not handle or getattr(out, "_key", None) != key):
            raise NcclInvalidArgument("dispatch: out must be the result of an earlier dispatch of this signature "
                                      "(shapes, dtypes, options) on this handle")
        outs = prep.fill((x, topk_weights, scales, global_scale, tokens_out, recv_wait_cycles),
                         None if out is None else out._outs, stream)
        prep.invoke(handle._handle(), prep.refs[0], prep.refs[1], prep.info_ref, prep.refs[2],
                    handle._on(_raw_stream(stream, prep.device_index)))
        if stream is not None:  # the inputs were made for another stream, most likely (the current one)
            _record_on(stream, x, topk_weights, scales, global_scale, recv_wait_cycles)
        # A send-only call's outputs, written by complete() (on its stream, maybe another): kept until then.
        handle._open_outputs = (outs + [recv_wait_cycles], stream) if send_only else None
        if out is None:
            out = DispatchResult(tokens=tokens_out, handle=handle, expert_counts=handle.expert_counts,
                                 rank_counts=handle.rank_counts, expert_offsets=handle.expert_offsets,
                                 recv_total=handle.recv_total)
            out._key, out._outs = key, outs
        for name, t in zip(prep.names, outs):
            setattr(out, name, t)
        if prep.counts is not None:  # Low-Latency: this dispatch's counts, also the handle's until the next one
            c = outs[-1]
            for name, _, offset, n in prep.counts[2]:
                t = c[offset:offset + n]
                setattr(handle, name, t)
                setattr(out, name, t)
        return out

    def _prepare_dispatch(self, handle, key, x, topk_weights, scales, num_sms, out_dtype=None,
                          round_scale=False, send_only=False, global_expert_ids=False, global_scale=None,
                          tokens_out=None, ue8m0=False, recv_wait_cycles=None) -> _Prepared:
        """Every check of a dispatch, and its structs (cached on the handle by `key`)."""
        import torch

        self._same_device(("x", x), ("topk_weights", topk_weights), ("scales", scales),
                          ("global_scale", global_scale), ("recv_wait_cycles", recv_wait_cycles))
        xin = describe(x, "x", ndim=2)
        if x.shape[0] != handle.num_tokens:
            raise NcclInvalidArgument("x has %d tokens but the routing has %d" % (x.shape[0], handle.num_tokens))
        rows, hdim, k = handle.output_rows(), x.shape[1], handle.topk
        fp8 = getattr(torch, "float8_e4m3fn", None)
        fp4_types = tuple(t for t in (getattr(torch, "float4_e2m1fn_x2", None), torch.uint8) if t is not None)
        ll = handle.group.low_latency
        quantise = ll and x.dtype == torch.bfloat16 and out_dtype is not None and out_dtype == fp8
        quantise4 = ll and x.dtype == torch.bfloat16 and out_dtype is not None and out_dtype in fp4_types
        forward4 = ll and x.dtype in fp4_types
        if ll:
            hdim = 2 * x.shape[1] if forward4 else hdim  # columns: NVFP4 x holds two a byte
            if x.dtype not in (torch.bfloat16, fp8) + fp4_types:
                raise NcclInvalidArgument("x has dtype %s; Low-Latency dispatch takes bfloat16, or float8_e4m3fn or "
                                          "NVFP4 (float4_e2m1fn_x2, uint8) with scales" % x.dtype)
            if out_dtype is not None and out_dtype != x.dtype and not (quantise or quantise4):
                raise NcclInvalidArgument("out_dtype=%s for x of %s: Low-Latency dispatch converts bfloat16 to "
                                          "float8_e4m3fn or NVFP4 (float4_e2m1fn_x2, uint8) only"
                                          % (out_dtype, x.dtype))
            if round_scale and not quantise:
                raise NcclInvalidArgument("round_scale=True: for bf16 x quantised to fp8 on the way "
                                          "(out_dtype=torch.float8_e4m3fn)")
            if ue8m0 and not quantise:
                raise NcclInvalidArgument("ue8m0=True: for bf16 x quantised to fp8 on the way "
                                          "(out_dtype=torch.float8_e4m3fn); forwarded fp8 keeps its scales' dtype")
            if ue8m0 and hdim % 512:
                raise NcclInvalidArgument("ue8m0=True needs hidden %% 512 == 0 (four scales of 128 columns an int32); "
                                          "it is %d" % hdim)
            if (quantise or quantise4) and scales is not None:
                raise NcclInvalidArgument("scales: the sender computes them when it quantises bf16 x; pass none")
            if scales is not None and x.dtype == torch.bfloat16:
                raise NcclInvalidArgument("scales: for float8_e4m3fn or NVFP4 x only (forwarded with it); x is %s"
                                          % x.dtype)
            if quantise4 != (global_scale is not None):
                raise NcclInvalidArgument("global_scale: a [1] fp32 CUDA tensor for NVFP4 quantisation (bf16 x, "
                                          "out_dtype=torch.float4_e2m1fn_x2 or torch.uint8), and only then")
            if (quantise or quantise4 or forward4) and hdim % _FP8_BLOCK:
                raise NcclInvalidArgument("x: hidden %d is not a multiple of %d" % (hdim, _FP8_BLOCK))
            if forward4 and scales is None:
                raise NcclInvalidArgument("x is NVFP4 (%s): give its scales [T, H/16] float8_e4m3fn or uint8"
                                          % x.dtype)
        else:
            if out_dtype is not None and out_dtype != x.dtype:
                raise NcclInvalidUsage("out_dtype=%s for x of %s: High-Throughput dispatch moves tokens as they are; "
                                       "quantising on the way is the Low-Latency mode's" % (out_dtype, x.dtype))
            if round_scale or ue8m0:
                raise NcclInvalidUsage("%s=True: for the Low-Latency mode's fp8 quantisation (High-Throughput forwards "
                                       "the scales of fp8 x as given)" % ("ue8m0" if ue8m0 else "round_scale"))
            if global_scale is not None:
                raise NcclInvalidUsage("global_scale: for the Low-Latency mode's NVFP4 quantisation (High-Throughput "
                                       "forwards NVFP4 rows as uint8 with their scales)")
        if x.dtype == fp8 and scales is None:
            raise NcclInvalidArgument("x is float8_e4m3fn: give its scales [T, S] fp32 or int32 (any S of the "
                                      "caller's layout: per block, packed UE8M0, per token; forwarded bit for bit)")
        out_dt = fp8 if quantise else out_dtype if quantise4 else x.dtype
        out_cols = hdim // 2 if quantise4 or forward4 else hdim
        per_row_k = handle.layout in ("flat", "rank_major")  # rows of one token with all its top-k slots
        inputs = _DispatchInputs.new(tokens=xin)
        given = [(inputs.tokens, x.numel() > 0)]
        if tokens_out is None:
            outputs = _DispatchOutputs.new(tokens=descriptor((rows, out_cols), out_dt))
            made = [(outputs.tokens, (rows, out_cols), out_dt)]
            names = ["tokens"]
        else:  # the caller's tensor (dispatch_window()'s: rows in place)
            self._same_device(("tokens_out", tokens_out))
            if tokens_out.ndim != 2 or tokens_out.shape[1] != out_cols or tokens_out.shape[0] < rows:
                raise NcclInvalidArgument("tokens_out has shape %s; the output is [%d (or more), %d]"
                                          % (tuple(tokens_out.shape), rows, out_cols))
            # Its first `rows` rows, as the other outputs have (the same start: the window stays the window).
            outputs = _DispatchOutputs.new(tokens=describe(tokens_out[:rows], "tokens_out", dtypes=(out_dt,), ndim=2))
            made, names = [], []
        if topk_weights is not None:
            inputs.topk_weights = describe(topk_weights, "topk_weights", dtypes=(torch.float32,), ndim=2)
            shape = (rows, k) if per_row_k else (rows,)
            outputs.topk_weights = descriptor(shape, torch.float32)
            given.append((inputs.topk_weights, topk_weights.numel() > 0))
            made.append((outputs.topk_weights, shape, torch.float32))
            names.append("topk_weights")
        else:
            given.append((None, False))
        if per_row_k:
            outputs.topk_idx = descriptor((rows, k), torch.int32)
            made.append((outputs.topk_idx, (rows, k), torch.int32))
            names.append("topk_idx")
        if scales is not None or quantise or quantise4:
            if scales is not None:
                # Forwarded bit for bit, as the caller lays them out: fp32 or int32, S a row (Low-Latency: S up to
                # max_token_bytes / 128).
                scale_types = (fp8, torch.uint8) if forward4 else (torch.float32, torch.int32)
                inputs.scales = describe(scales, "scales", dtypes=scale_types, ndim=2)
                given.append((inputs.scales, scales.numel() > 0))
            else:
                given.append((None, False))
            per = 16 if quantise4 else 4 * _FP8_BLOCK if ue8m0 else _FP8_BLOCK
            shape = (rows, scales.shape[1] if scales is not None else hdim // per)
            if quantise4:
                scale_dt = fp8
            else:
                scale_dt = (torch.int32 if ue8m0 else torch.float32) if scales is None else scales.dtype
            outputs.scales = descriptor(shape, scale_dt)
            made.append((outputs.scales, shape, scale_dt))
            names.append("scales")
        else:
            given.append((None, False))
        if global_scale is not None:
            inputs.global_scale = describe(global_scale, "global_scale", dtypes=(torch.float32,), ndim=1)
            given.append((inputs.global_scale, True))
        else:
            given.append((None, False))
        given.append((outputs.tokens, tokens_out.numel() > 0) if tokens_out is not None else (None, False))
        given.append(self._wait_cycles(outputs, recv_wait_cycles, ll, "dispatch"))
        info = counts = None
        if ll:
            outputs.src_info = descriptor((rows,), torch.int32)
            made.append((outputs.src_info, (rows,), torch.int32))
            names.append("src_info")
            local, ranks = handle.group.local_experts, handle.group.size
            parts = _count_parts(local, ranks)
            info = _LayoutInfo.new(**{field: descriptor((n,), torch.int32) for _, field, _, n in parts})
            counts = (2 * local + ranks + 1, [(getattr(info, field), offset) for _, field, offset, _ in parts], parts)
        cfg = _DispatchConfig.new(num_sms=num_sms, round_scale=1 if round_scale else 0, send_only=1 if send_only else 0,
                                  global_expert_ids=1 if global_expert_ids else 0)
        prep = _Prepared("ncclEpDispatch", inputs, outputs, cfg, given, made, x.device, tuple(names), info, counts)
        handle._prepared[key] = prep
        return prep

    def _wait_cycles(self, outputs, t, ll: bool, what: str):
        """outputs.recv_wait_cycles for a caller's int64 [size] tensor (Low-Latency only): its `given` entry."""
        import torch

        if t is None:
            return (None, False)
        if not ll:
            raise NcclInvalidUsage("%s: recv_wait_cycles is for Low-Latency groups; this one is High-Throughput"
                                   % what)
        outputs.recv_wait_cycles = describe(t, "recv_wait_cycles", dtypes=(torch.int64,), ndim=1)
        if t.shape[0] != self.size:
            raise NcclInvalidArgument("recv_wait_cycles has shape %s; it is [%d] (one per rank)"
                                      % (tuple(t.shape), self.size))
        return (outputs.recv_wait_cycles, True)

    def combine(self, y, handle: "Handle", *, topk_weights=None, out=None, missing_experts=None,
                send_only: bool = False, num_sms: int = 0, stream=None, bias=None, recv_wait_cycles=None):
        """COLLECTIVE, stream-ordered: returns the rows y (the dispatch output's shape and layout; bf16, fp16 or
        fp32) to their tokens' owners, summed in fp32 (EXPERT_MAJOR: weighted by the dispatched top-k weights).
        Returns [T, H] (`out` if given). High-Throughput: each rank's part of a token is rounded to y's dtype
        (EXPERT_MAJOR: its experts' rows summed in top-k column order first) and the owner sums, from `bias`
        ([T, H] of y's dtype or fp32, optional) or 0, the ranks' parts in the order of the last top-k column each
        rank hosts: DeepEP V2's order, so the same bits as its combine.

        Low-Latency (after a dispatch on the handle; y bf16): RANK_MAJOR takes one row per slot (the caller's sum
        over the row's local experts) and the owner sums the ranks' rows; EXPERT_MAJOR weights each expert's rows
        with the dispatched weights (1 where none were dispatched) as High-Throughput does, or, given
        `topk_weights` [T, K] fp32 (the owner's), returns every (token, expert) row as it is and the owner weights
        and sums them in top-k column order (DeepEP's low_latency_combine). `missing_experts` (Low-Latency groups
        made with enable_mask, High-Throughput groups with max_recv_rows_per_rank): a caller's int32 [T] CUDA tensor
        that gets, per token, how many of its top-k experts' rows are not in the sum (on ranks masked when the
        combine began; on ranks where the token's row was past the receive cap). `recv_wait_cycles`: as dispatch's,
        the cycles spent waiting for each rank's returned rows (DeepEP's combine_wait_recv_cost_stats).
        `send_only=True`: as dispatch's; the outputs are written by `complete(handle)`."""
        try:
            key = ("combine", y.dtype, y.shape, y.get_device(), _meta(topk_weights), _meta(out),
                   _meta(missing_experts), bool(send_only), num_sms, _meta(bias), _meta(recv_wait_cycles))
        except (AttributeError, TypeError):
            key = None
        prep = handle._prepared.get(key)
        if prep is None or not (y.is_contiguous() and (out is None or out.is_contiguous())
                                and (topk_weights is None or topk_weights.is_contiguous())
                                and (missing_experts is None or missing_experts.is_contiguous())
                                and (bias is None or bias.is_contiguous())
                                and (recv_wait_cycles is None or recv_wait_cycles.is_contiguous())):
            prep = self._prepare_combine(handle, key, y, out, num_sms, topk_weights, send_only, missing_experts,
                                         bias, recv_wait_cycles)
        made = prep.fill((y, topk_weights, out, missing_experts, bias, recv_wait_cycles), None, stream)
        prep.invoke(handle._handle(), prep.refs[0], prep.refs[1], prep.refs[2],
                    handle._on(_raw_stream(stream, prep.device_index)))
        if stream is not None:
            _record_on(stream, y, topk_weights, bias, recv_wait_cycles)
        result = made[0] if out is None else out
        handle._open_outputs = ((result, missing_experts, recv_wait_cycles), stream) if send_only else None
        return result

    def _prepare_combine(self, handle, key, y, out, num_sms, topk_weights=None, send_only=False,
                         missing_experts=None, bias=None, recv_wait_cycles=None) -> _Prepared:
        """Every check of a combine, and its structs (cached on the handle by `key`)."""
        import torch

        self._same_device(("y", y), ("topk_weights", topk_weights), ("out", out), ("missing_experts", missing_experts),
                          ("bias", bias), ("recv_wait_cycles", recv_wait_cycles))
        yin = describe(y, "y", ndim=2)
        ll = handle.group.low_latency
        if ll and y.dtype != torch.bfloat16:
            raise NcclInvalidArgument("y has dtype %s; Low-Latency combine takes bfloat16" % y.dtype)
        shape = (handle.num_tokens, y.shape[1])
        inputs = _CombineInputs.new(tokens=yin)
        given = [(inputs.tokens, y.numel() > 0)]
        if topk_weights is not None:
            if not (ll and handle.layout == "expert_major"):
                raise NcclInvalidUsage("combine: topk_weights (weighted by the owner) are for Low-Latency "
                                       "EXPERT_MAJOR handles; this one is %s %s"
                                       % ("Low-Latency" if ll else "High-Throughput", handle.layout.upper()))
            inputs.topk_weights = describe(topk_weights, "topk_weights", dtypes=(torch.float32,), ndim=2)
            if tuple(topk_weights.shape) != (handle.num_tokens, handle.topk):
                raise NcclInvalidArgument("topk_weights has shape %s; the routing is [%d, %d]"
                                          % (tuple(topk_weights.shape), handle.num_tokens, handle.topk))
            given.append((inputs.topk_weights, topk_weights.numel() > 0))
        else:
            given.append((None, False))
        if out is None:
            outputs = _CombineOutputs.new(tokens=descriptor(shape, y.dtype))
            given.append((None, False))
            made = [(outputs.tokens, shape, y.dtype)]
        else:
            outputs = _CombineOutputs.new(tokens=describe(out, "out", ndim=2))
            given.append((outputs.tokens, out.numel() > 0))
            made = []
        if missing_experts is not None:
            if not (handle.group.enable_mask if ll else handle.group.max_recv_rows_per_rank > 0):
                raise NcclInvalidUsage("combine: missing_experts is for Low-Latency groups made with "
                                       "enable_mask=True and High-Throughput groups with max_recv_rows_per_rank; "
                                       "this one is %s" % ("Low-Latency without a mask" if ll
                                                           else "High-Throughput without a receive cap"))
            outputs.missing_experts = describe(missing_experts, "missing_experts", dtypes=(torch.int32,), ndim=1)
            if missing_experts.shape[0] != handle.num_tokens:
                raise NcclInvalidArgument("missing_experts has shape %s; the routing has %d tokens"
                                          % (tuple(missing_experts.shape), handle.num_tokens))
            given.append((outputs.missing_experts, missing_experts.numel() > 0))
        else:
            given.append((None, False))
        if bias is not None:
            if ll:
                raise NcclInvalidUsage("combine: bias is for High-Throughput handles; this one is Low-Latency")
            inputs.bias = describe(bias, "bias", dtypes=(y.dtype, torch.float32), ndim=2)
            if tuple(bias.shape) != shape:
                raise NcclInvalidArgument("bias has shape %s; the combine output is %s" % (tuple(bias.shape), shape))
            given.append((inputs.bias, bias.numel() > 0))
        else:
            given.append((None, False))
        given.append(self._wait_cycles(outputs, recv_wait_cycles, ll, "combine"))
        prep = _Prepared("ncclEpCombine", inputs, outputs,
                         _CombineConfig.new(num_sms=num_sms, send_only=1 if send_only else 0), given, made, y.device)
        handle._prepared[key] = prep
        return prep

    def complete(self, handle: "Handle", stream=None) -> None:
        """COLLECTIVE, stream-ordered (Low-Latency): the receive half of the handle's send-only dispatch or combine,
        with that call's outputs (kept alive by the handle until then). Raises NcclInvalidUsage when nothing is
        open on the handle, or when another handle's send-only call of that kind was issued before this one (a
        kind's calls complete in issue order)."""
        raw = _raw_stream(stream, handle.topk_idx.get_device())
        _call("ncclEpComplete", handle._handle(), None, handle._on(raw))
        if handle._open_outputs is not None:
            outputs, sent_on = handle._open_outputs
            handle._open_outputs = None
            # Made for the send-only call's stream; written now by this one: if they differ, the outputs are this
            # stream's too until its queued work is done.
            if raw != _raw_stream(sent_on, handle.topk_idx.get_device()):
                _record_on(types.SimpleNamespace(cuda_stream=raw), *outputs)

    def info(self) -> dict:
        """What the group is (ncclEpGroupGetInfo, local): n_domains, domain_size, window_bytes, and the fixed bytes a
        call moves to each rank of another domain (rail_dispatch_bytes, rail_combine_bytes, rail_combine_owner_bytes:
        0 with one domain; the last is Low-Latency's owner-weighted combine, 0 in High-Throughput), and the rail's
        traffic to each other domain (rail_messages_per_domain, rail_dispatch_domain_bytes,
        rail_combine_domain_bytes, and rail_relayed: 1 when that traffic goes to the rank of this rank's index there,
        which relays it; rail_hierarchical: 1 for High-Throughput's hierarchical exchange), rail_staging_bytes, the
        device memory held for the rail outside the window, rail_round_tokens, the rows a round moves to each peer,
        and rail_overlapped: 1 when the exchange's NVLink part (the flat one's rows to this rank's domain, the
        hierarchical one's send half) runs beside its rail rounds: nccl_ep.h."""
        raw = _GroupInfo.new()
        _call("ncclEpGroupGetInfo", self._g, ctypes.byref(raw))
        return {name: getattr(raw, name) for name, _ in _GroupInfo._fields_[2:]}

    def dispatch_window(self, dtype=None):
        """Local: the group's zero-copy dispatch output (ncclEpGroupGetDispatchWindow; High-Throughput groups made
        with max_recv_rows_per_rank): a [max_recv_rows_per_rank, H] tensor of `dtype` (default bfloat16; H x its size
        = the group's max_token_bytes) in this rank's window, where dispatch's senders write each FLAT row in place.
        Pass it as dispatch's `tokens_out` (FLAT handles): no received row is copied again. It holds a dispatch's rows
        until this rank's next High-Throughput call on the group begins (its combine or its next dispatch; no peer
        writes it before), so it is no combine input (refused: combine the experts' outputs); rows past the receive
        count hold earlier calls' data. It does not keep the window alive: do not use it after close()."""
        import torch

        dtype = torch.bfloat16 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise NcclInvalidArgument("dispatch_window: dtype=%r: a torch.dtype is expected" % (dtype,))
        esize = dtype.itemsize
        row_bytes = self.max_token_bytes
        if row_bytes % esize:
            raise NcclInvalidArgument("dispatch_window: rows of %d bytes are not whole %s elements"
                                      % (row_bytes, dtype))
        d = CTensor()
        _call("ncclEpGroupGetDispatchWindow", self._handle(), ctypes.c_int(nccl_dtype(dtype)),
              ctypes.c_int64(row_bytes // esize), ctypes.byref(d))

        class _Rows:  # the window's rows as bytes (the CUDA array interface has no bfloat16), viewed as `dtype`
            __cuda_array_interface__ = {"shape": (d.sizes[0], row_bytes), "typestr": "|u1", "data": (d.data, False),
                                        "version": 3, "strides": None}

        return torch.as_tensor(_Rows(), device=self.comm.device).view(dtype)

    def _reap(self) -> None:
        """Destroys the handles dropped without close() whose work is done: their calls ran on the device's current
        stream only, and an event recorded there (by an earlier _reap) has completed. Never in a capture; a handle
        used on other streams waits for close()."""
        if not self._retired:
            return
        import torch

        stream = torch.cuda.current_stream(self.comm.device)
        if torch.cuda.is_current_stream_capturing():
            return
        keep = []
        for life in self._retired:
            if life.event is None and life.streams <= {stream.cuda_stream}:
                life.event = torch.cuda.Event()
                life.event.record(stream)
            elif life.event is not None and life.event.query():
                _call("ncclEpHandleDestroy", ctypes.c_void_p(life.h))
                continue
            keep.append(life)
        self._retired[:] = keep

    def close(self) -> None:
        """COLLECTIVE: waits for the group's work, closes its handles (the library refuses to destroy a group whose
        handles are alive), frees it, and (if the group made it) its communicator."""
        if self._g:
            import torch

            handles, retired = list(self._handles), self._retired[:]
            if handles or retired:  # their queued work finishes before their memory goes
                torch.cuda.synchronize(self.comm.device)
            for h in handles:
                h.close()
            self._retired.clear()
            for life in retired:
                _call("ncclEpHandleDestroy", ctypes.c_void_p(life.h))
            g, self._g = self._g, ctypes.c_void_p()
            try:
                _call("ncclEpGroupDestroy", g)
            finally:
                if self._owns_comm:
                    self.comm.close()


class _HandleLife:
    """What a Handle's finalizer hands to its group when the Handle is dropped without close(): the C handle and
    the streams its calls ran on (Group._reap destroys it once they are done)."""

    __slots__ = ("h", "streams", "event")

    def __init__(self, stream: int):
        self.h, self.streams, self.event = None, {stream}, None


class Handle(Closing):
    """A routing bound to a group (COLLECTIVE, stream-ordered; ncclEpCreateHandle): topk_idx [T, K] int32/int64.
    layout "flat" (one row per (token, destination rank), grouped by source rank) or "expert_major" (one row per
    (token, local expert), grouped by expert, zones aligned to `alignment` rows); Low-Latency groups: "rank_major"
    or "expert_major" (fixed zones of M rows per source rank / R * M rows per expert). sizing "worst_case" (outputs
    hold the most rows any routing can produce; nothing waits on the host, so it can be graph-captured) or "exact"
    (High-Throughput only: waits for the receive count; outputs are that size). expert_counts [local experts],
    rank_counts [ranks], expert_offsets [local experts] and recv_total [1] (int32, device) say how many rows each
    local expert and each source rank sent: written at binding (High-Throughput), or the last dispatch's
    (Low-Latency: None before the first). High-Throughput: recv_dropped [1] (int32, device), the rows for this rank
    past the group's max_recv_rows_per_rank (not delivered, not in the counts; 0 without a cap)."""

    def __init__(self, group: Group, topk_idx, layout: str, sizing: str, alignment: int, stream):
        import torch

        self.group, self.layout, self.sizing = group, layout, sizing
        _choice(_LAYOUT, layout, "layout")
        _choice(_SIZING, sizing, "sizing")
        self.low_latency = group.low_latency
        if self.low_latency:
            if layout not in ("rank_major", "expert_major"):
                raise NcclInvalidUsage("layout=%r: a Low-Latency group's handles are 'rank_major' or 'expert_major'"
                                       % layout)
            if sizing != "worst_case":
                raise NcclInvalidUsage("sizing=%r: Low-Latency outputs are always worst-case sized (nothing waits "
                                       "on the host)" % sizing)
            if alignment not in (0, 1):
                raise NcclInvalidArgument("alignment=%d: Low-Latency expert zones are fixed (R * M rows each); "
                                          "give 0 or 1" % alignment)
            self.expert_counts = self.rank_counts = self.expert_offsets = self.recv_total = None
            self.recv_dropped = None
        else:
            if layout == "rank_major":
                raise NcclInvalidUsage("layout='rank_major' belongs to the Low-Latency mode "
                                       "(Group(algorithm='low_latency'))")
            dev = topk_idx.device if isinstance(topk_idx, torch.Tensor) else None
            # Zeroed on the stream the binding runs on: filled on another, the binding could race the fill.
            with _allocating_on(stream):
                self.expert_counts = torch.zeros(group.local_experts, dtype=torch.int32, device=dev)
                self.rank_counts = torch.zeros(group.size, dtype=torch.int32, device=dev)
                self.expert_offsets = torch.zeros(group.local_experts, dtype=torch.int32, device=dev)
                self.recv_total = torch.zeros(1, dtype=torch.int32, device=dev)
                self.recv_dropped = torch.zeros(1, dtype=torch.int32, device=dev)
        ti = self._routing(topk_idx)
        cfg = _HandleConfig.new(dispatch_output_per_expert_alignment=alignment, sizing=_SIZING[sizing])
        self._h = ctypes.c_void_p()
        group._reap()
        raw = _raw_stream(stream, group.comm.device.index)
        _call("ncclEpCreateHandle", ctypes.byref(self._h), group._handle(), _LAYOUT[layout], ctypes.byref(ti),
              self._layout_info(), ctypes.byref(cfg), raw)
        self._life = _HandleLife(raw)
        self._life.h = self._h.value
        group._handles.add(self)
        # Dropped without close(): the group destroys it once its work is done (Group._reap, Group.close).
        self._finalizer = weakref.finalize(self, group._retired.append, self._life)
        self._open_outputs = None  # a send-only call's (outputs, stream) until complete()
        self._prepared = {}  # call signature -> _Prepared (Group.dispatch / combine)

    def _routing(self, topk_idx) -> CTensor:
        import torch

        if isinstance(topk_idx, torch.Tensor):
            self.group._same_device(("topk_idx", topk_idx))
        ti = describe(topk_idx, "topk_idx", dtypes=(torch.int32, torch.int64), ndim=2)
        self.topk_idx, self.num_tokens, self.topk = topk_idx, topk_idx.shape[0], topk_idx.shape[1]
        return ti

    def _layout_info(self):
        """A pointer to the layout_info of handle binding: the handle's counters (High-Throughput), or NULL
        (Low-Latency: each dispatch fills its own)."""
        if self.low_latency:
            return None
        self._info = _LayoutInfo.new(expert_counters=describe(self.expert_counts, "expert_counts"),
                                     src_rank_counters=describe(self.rank_counts, "rank_counts"),
                                     expert_offsets=describe(self.expert_offsets, "expert_offsets"),
                                     recv_total_counter=describe(self.recv_total, "recv_total"),
                                     recv_dropped_counter=describe(self.recv_dropped, "recv_dropped"))
        return ctypes.byref(self._info)

    def _handle(self):
        if not self._h:
            raise NcclInvalidUsage("Handle: used after close()")
        return self._h

    def update(self, topk_idx, stream=None) -> None:
        """COLLECTIVE, stream-ordered: the same handle with a new routing (same layout, sizing and top-k).
        Low-Latency: local."""
        tokens, rows = self.num_tokens, self._prepared and self.sizing == "exact"
        ti = self._routing(topk_idx)
        if rows or self.num_tokens != tokens:  # the prepared calls' token or row counts changed
            self._prepared.clear()
        _call("ncclEpUpdateHandle", self._handle(), ctypes.byref(ti), self._layout_info(), self._on(_stream(stream)))

    def output_rows(self) -> int:
        """Rows of a dispatch output: the receive count (exact) or the worst case (Low-Latency: R * M for
        RANK_MAJOR, L * R * M for EXPERT_MAJOR)."""
        rows = ctypes.c_int64(0)
        fn = "ncclEpHandleGetRecvRows" if self.sizing == "exact" else "ncclEpHandleGetMaxRecvRows"
        _call(fn, self._handle(), ctypes.byref(rows))
        return rows.value

    def _on(self, raw_stream: int) -> int:
        """Notes that a call of this handle runs on raw_stream (see _HandleLife); returns it."""
        self._life.streams.add(raw_stream)
        return raw_stream

    def close(self) -> None:
        """Local: the handle must not be in use by queued work (synchronise its stream first). Idempotent. A handle
        dropped without close() is destroyed by its group, once its work is done or when the group closes."""
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            self._finalizer.detach()
            self.group._handles.discard(self)
            _call("ncclEpHandleDestroy", h)


@dataclass
class DispatchResult:
    """What dispatch returns. tokens [rows, H]; topk_idx (FLAT and RANK_MAJOR: [rows, K] int32 local expert ids, -1
    where the expert is elsewhere); topk_weights (FLAT and RANK_MAJOR: [rows, K]; EXPERT_MAJOR: [rows]) when weights
    were given; scales with fp8 tokens; expert_counts / rank_counts / expert_offsets / recv_total (int32, device:
    the handle's in High-Throughput, this dispatch's own in Low-Latency); src_info [rows] int32 (Low-Latency). With
    worst-case sizing, rows past the received ones are left as they were (unspecified in new outputs)."""

    tokens: object
    handle: Handle
    expert_counts: object
    rank_counts: object
    topk_idx: object = None
    topk_weights: object = None
    scales: object = None
    src_info: object = None
    expert_offsets: object = None
    recv_total: object = None


_lib()  # at import: the libraries load and the NCCL in this process is the release they were built for
