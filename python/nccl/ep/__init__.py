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
by the next call or by Group.check(). The High-Throughput mode (inside one NVLink domain) is what the C library has
today. nccl.ep.autograd has differentiable dispatch/combine (FLAT), nccl.ep.ops the same as torch.library custom
ops (torch.compile), nccl.ep.deepep DeepEP's Buffer API; the Low-Latency mode is not here yet.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from .._ext import _loader
from .._ext.comm import Communicator
from .._ext.errors import (NcclError, NcclInProgress, NcclInternalError, NcclInvalidArgument, NcclInvalidUsage,
                           NcclRemoteError, NcclSystemError, NcclUnhandledCudaError)
from .._ext.tensor import CTensor, absent, describe, descriptor

__all__ = ["Group", "Handle", "DispatchResult", "Communicator", "version", "NcclError", "NcclUnhandledCudaError",
           "NcclSystemError", "NcclInternalError", "NcclInvalidArgument", "NcclInvalidUsage", "NcclRemoteError",
           "NcclInProgress"]

_MAGIC = 0x65703031  # NCCL_EP_MAGIC
_ALGO = {"low_latency": 0, "high_throughput": 1}
_LAYOUT = {"expert_major": 1, "rank_major": 2, "flat": 3}
_SIZING = {"worst_case": 0, "exact": 1}


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
        for k, v in fields.items():
            setattr(s, k, v)
        return s


class _AllocConfig(ctypes.Structure):
    _fields_ = [("alloc_fn", ctypes.c_void_p), ("free_fn", ctypes.c_void_p), ("context", ctypes.c_void_p)]


class _GroupConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("algorithm", ctypes.c_int),
                ("num_experts", ctypes.c_int), ("max_tokens_per_rank", ctypes.c_int),
                ("max_token_bytes", ctypes.c_int), ("max_topk", ctypes.c_int), ("num_sms", ctypes.c_int),
                ("timeout_ns", ctypes.c_uint64), ("zero_copy", ctypes.c_int), ("alloc", _AllocConfig),
                ("lsa_domain_size", ctypes.c_int), ("virtual_domain", ctypes.c_void_p), ("virtual_rank", ctypes.c_int)]


class _HandleConfig(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint),
                ("dispatch_output_per_expert_alignment", ctypes.c_int), ("sizing", ctypes.c_int)]


class _LayoutInfo(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("expert_counters", CTensor),
                ("src_rank_counters", CTensor), ("expert_offsets", CTensor), ("recv_total_counter", CTensor)]


class _DispatchInputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("topk_weights", CTensor),
                ("scales", CTensor)]


class _DispatchOutputs(_Header):
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor), ("topk_weights", CTensor),
                ("topk_idx", CTensor), ("scales", CTensor)]


class _CallConfig(_Header):  # ncclEpDispatchConfig_t and ncclEpCombineConfig_t
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("num_sms", ctypes.c_int)]


class _CombineTensors(_Header):  # ncclEpCombineInputs_t and ncclEpCombineOutputs_t
    _fields_ = [("size", ctypes.c_uint), ("magic", ctypes.c_uint), ("tokens", CTensor)]


_P = ctypes.c_void_p
_SIGNATURES = {
    "ncclEpGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "ncclEpCreateGroup": [ctypes.POINTER(_P), _P, ctypes.POINTER(_GroupConfig)],
    "ncclEpGroupDestroy": [_P],
    "ncclEpGroupGetAsyncError": [_P],
    "ncclEpCreateHandle": [ctypes.POINTER(_P), _P, ctypes.c_int, ctypes.POINTER(CTensor),
                           ctypes.POINTER(_LayoutInfo), ctypes.POINTER(_HandleConfig), _P],
    "ncclEpUpdateHandle": [_P, ctypes.POINTER(CTensor), ctypes.POINTER(_LayoutInfo), _P],
    "ncclEpHandleDestroy": [_P],
    "ncclEpHandleGetRecvRows": [_P, ctypes.POINTER(ctypes.c_int64)],
    "ncclEpHandleGetMaxRecvRows": [_P, ctypes.POINTER(ctypes.c_int64)],
    "ncclEpDispatch": [_P, ctypes.POINTER(_DispatchInputs), ctypes.POINTER(_DispatchOutputs),
                       ctypes.POINTER(_LayoutInfo), ctypes.POINTER(_CallConfig), _P],
    "ncclEpCombine": [_P, ctypes.POINTER(_CombineTensors), ctypes.POINTER(_CombineTensors),
                      ctypes.POINTER(_CallConfig), _P],
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
    import torch

    if stream is not None:
        return stream.cuda_stream
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream


def _meta(t):
    """What a cached call's signature holds of an optional tensor: None, or (dtype, shape, device index)."""
    return None if t is None else (t.dtype, t.shape, t.get_device())


class _Prepared:
    """A dispatch or combine of one signature on one handle (the dtypes, shapes and devices of its tensors, and
    num_sms): checked in full once, its C structs built once. A call of a known signature checks only what tensors
    of one signature can still differ in (contiguity), allocates its outputs and sets the data pointers; the
    per-call cost of this layer is what bench/ep_python_overhead.py measures."""

    __slots__ = ("fn", "structs", "refs", "given", "made", "device", "device_index")

    def __init__(self, fn_name, inputs, outputs, cfg, given, made, device):
        self.fn = getattr(_lib(), fn_name)
        self.structs = (inputs, outputs, cfg)  # kept alive: refs point into them
        self.refs = (ctypes.byref(inputs), ctypes.byref(outputs), ctypes.byref(cfg))
        self.given = given  # per tensor the caller passes: its descriptor (a view into a struct) or None, non-empty
        self.made = made    # per output this call allocates: (descriptor, shape, dtype)
        self.device, self.device_index = device, device.index or 0

    def fill(self, tensors):
        """Points the descriptors at the caller's tensors and at new outputs (returned, in `made` order)."""
        import torch

        for (d, nonempty), t in zip(self.given, tensors):
            if d is not None:
                d.data = t.data_ptr() if nonempty else None
        outs = []
        for d, shape, dtype in self.made:
            t = torch.empty(*shape, dtype=dtype, device=self.device)  # ints, not a tuple: half the parsing
            d.data = t.data_ptr() if t.numel() else None
            outs.append(t)
        return outs

    def invoke(self, *args) -> None:
        _loader.check(_lib(), "Ep", self.fn.__name__, self.fn(*args))


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


def _choice(table: dict, value: str, name: str) -> int:
    if value not in table:
        raise NcclInvalidArgument("%s=%r: expected one of %s" % (name, value, ", ".join(sorted(table))))
    return table[value]


class Group:
    """A dispatch/combine group over the ranks of a process group (COLLECTIVE, blocking): sizes and registers the
    symmetric buffers once, for tokens of up to `max_tokens_per_rank` rows of `hidden` elements of `dtype` (or
    `max_token_bytes`) and up to `max_topk` experts each. `group` is a torch ProcessGroup (None: the default group)
    or a Communicator. The group's calls run one after another, in the same order on every rank."""

    def __init__(self, group=None, *, num_experts: int, max_tokens_per_rank: int, hidden: int | None = None,
                 dtype=None, max_token_bytes: int | None = None, max_topk: int = 8, num_sms: int = 0,
                 timeout_s: float | None = None, algorithm: str = "high_throughput"):
        import torch

        if max_token_bytes is None:
            if hidden is None:
                raise NcclInvalidArgument("Group: give hidden (with dtype, default bfloat16) or max_token_bytes")
            # Rows of `dtype`; a combine of wider rows (fp32 expert outputs) needs max_token_bytes instead.
            max_token_bytes = torch.empty((), dtype=dtype or torch.bfloat16).element_size() * hidden
        self._owns_comm = not isinstance(group, Communicator)
        self.comm = Communicator(group) if self._owns_comm else group
        cfg = _GroupConfig.new(algorithm=_choice(_ALGO, algorithm, "algorithm"), num_experts=num_experts,
                               max_tokens_per_rank=max_tokens_per_rank, max_token_bytes=max_token_bytes,
                               max_topk=max_topk, num_sms=num_sms,
                               timeout_ns=0 if timeout_s is None else int(timeout_s * 1e9))
        self.num_experts, self.rank, self.size = num_experts, self.comm.rank, self.comm.size
        self.local_experts = num_experts // max(1, self.size)
        self._g = ctypes.c_void_p()
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

    def check(self) -> None:
        """Raises the error of a device wait of this group that timed out (local, never blocks)."""
        _call("ncclEpGroupGetAsyncError", self._handle())

    def create_handle(self, topk_idx, layout: str = "flat", sizing: str = "worst_case", alignment: int = 1,
                      stream=None) -> "Handle":
        """COLLECTIVE, stream-ordered: binds the routing topk_idx [T, K] (int32/int64, -1: none). See Handle."""
        return Handle(self, topk_idx, layout, sizing, alignment, stream)

    def dispatch(self, x, topk_idx=None, topk_weights=None, *, handle: "Handle | None" = None, scales=None,
                 layout: str = "flat", sizing: str = "worst_case", num_sms: int = 0, stream=None) -> "DispatchResult":
        """COLLECTIVE, stream-ordered: sends each token x[t] ([T, H]; bf16, fp16, fp32 or fp8 e4m3 with `scales`
        [T, H/128] fp32) to every rank hosting one of its experts. Give topk_idx (a handle is made for it) or a
        handle made for this routing. topk_weights [T, K] fp32 travel with the rows (EXPERT_MAJOR combine needs
        them)."""
        if handle is None:
            if topk_idx is None:
                raise NcclInvalidArgument("dispatch: give topk_idx or handle")
            handle = Handle(self, topk_idx, layout, sizing, 1, stream)
        elif topk_idx is not None and topk_idx is not handle.topk_idx:
            handle.update(topk_idx, stream)
        try:
            key = (x.dtype, x.shape, x.get_device(), _meta(topk_weights), _meta(scales), num_sms)
        except (AttributeError, TypeError):  # not tensors: the full checks say so
            key = None
        prep = handle._prepared.get(key)
        if prep is None or not (x.is_contiguous() and (topk_weights is None or topk_weights.is_contiguous())
                                and (scales is None or scales.is_contiguous())):
            prep = self._prepare_dispatch(handle, key, x, topk_weights, scales, num_sms)
        outs = prep.fill((x, topk_weights, scales))
        prep.invoke(handle._handle(), prep.refs[0], prep.refs[1], None, prep.refs[2],
                    _raw_stream(stream, prep.device_index))
        handle._inputs_alive = (x, topk_weights, scales)  # kept until the next call on the handle
        out = DispatchResult(tokens=outs[0], handle=handle, expert_counts=handle.expert_counts,
                             rank_counts=handle.rank_counts)
        i = 1
        if topk_weights is not None:
            out.topk_weights, i = outs[i], i + 1
        if handle.layout == "flat":
            out.topk_idx, i = outs[i], i + 1
        if scales is not None:
            out.scales = outs[i]
        return out

    def _prepare_dispatch(self, handle, key, x, topk_weights, scales, num_sms) -> _Prepared:
        """Every check of a dispatch, and its structs (cached on the handle by `key`)."""
        import torch

        xin = describe(x, "x", ndim=2)
        if x.shape[0] != handle.num_tokens:
            raise NcclInvalidArgument("x has %d tokens but the routing has %d" % (x.shape[0], handle.num_tokens))
        rows, hdim, k = handle.output_rows(), x.shape[1], handle.topk
        inputs = _DispatchInputs.new(tokens=xin)
        outputs = _DispatchOutputs.new(tokens=descriptor((rows, hdim), x.dtype))
        given = [(inputs.tokens, x.numel() > 0)]
        made = [(outputs.tokens, (rows, hdim), x.dtype)]
        if topk_weights is not None:
            inputs.topk_weights = describe(topk_weights, "topk_weights", dtypes=(torch.float32,), ndim=2)
            shape = (rows, k) if handle.layout == "flat" else (rows,)
            outputs.topk_weights = descriptor(shape, torch.float32)
            given.append((inputs.topk_weights, topk_weights.numel() > 0))
            made.append((outputs.topk_weights, shape, torch.float32))
        else:
            given.append((None, False))
        if handle.layout == "flat":
            outputs.topk_idx = descriptor((rows, k), torch.int32)
            made.append((outputs.topk_idx, (rows, k), torch.int32))
        if scales is not None:
            inputs.scales = describe(scales, "scales", dtypes=(torch.float32,), ndim=2)
            shape = (rows, scales.shape[1])
            outputs.scales = descriptor(shape, torch.float32)
            given.append((inputs.scales, scales.numel() > 0))
            made.append((outputs.scales, shape, torch.float32))
        else:
            given.append((None, False))
        prep = _Prepared("ncclEpDispatch", inputs, outputs, _CallConfig.new(num_sms=num_sms), given, made, x.device)
        handle._prepared[key] = prep
        return prep

    def combine(self, y, handle: "Handle", *, out=None, num_sms: int = 0, stream=None):
        """COLLECTIVE, stream-ordered: returns the rows y (the dispatch output's shape and layout; bf16, fp16 or
        fp32) to their tokens' owners, summed in fp32 (EXPERT_MAJOR: weighted by the dispatched top-k weights).
        Returns [T, H] (`out` if given)."""
        try:
            key = ("combine", y.dtype, y.shape, y.get_device(), _meta(out), num_sms)
        except (AttributeError, TypeError):
            key = None
        prep = handle._prepared.get(key)
        if prep is None or not (y.is_contiguous() and (out is None or out.is_contiguous())):
            prep = self._prepare_combine(handle, key, y, out, num_sms)
        made = prep.fill((y, out))
        prep.invoke(handle._handle(), prep.refs[0], prep.refs[1], prep.refs[2], _raw_stream(stream, prep.device_index))
        handle._inputs_alive = (y,)
        return made[0] if out is None else out

    def _prepare_combine(self, handle, key, y, out, num_sms) -> _Prepared:
        """Every check of a combine, and its structs (cached on the handle by `key`)."""
        yin = describe(y, "y", ndim=2)
        shape = (handle.num_tokens, y.shape[1])
        inputs = _CombineTensors.new(tokens=yin)
        given = [(inputs.tokens, y.numel() > 0)]
        if out is None:
            outputs = _CombineTensors.new(tokens=descriptor(shape, y.dtype))
            given.append((None, False))
            made = [(outputs.tokens, shape, y.dtype)]
        else:
            outputs = _CombineTensors.new(tokens=describe(out, "out", ndim=2))
            given.append((outputs.tokens, out.numel() > 0))
            made = []
        prep = _Prepared("ncclEpCombine", inputs, outputs, _CallConfig.new(num_sms=num_sms), given, made, y.device)
        handle._prepared[key] = prep
        return prep

    def close(self) -> None:
        """COLLECTIVE: waits for the group's work, frees it, and (if the group made it) its communicator."""
        if self._g:
            g, self._g = self._g, ctypes.c_void_p()
            try:
                _call("ncclEpGroupDestroy", g)
            finally:
                if self._owns_comm:
                    self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False


class Handle:
    """A routing bound to a group (COLLECTIVE, stream-ordered; ncclEpCreateHandle): topk_idx [T, K] int32/int64.
    layout "flat" (one row per (token, destination rank), grouped by source rank) or "expert_major" (one row per
    (token, local expert), grouped by expert, zones aligned to `alignment` rows). sizing "worst_case" (outputs hold
    the most rows any routing can produce; nothing waits on the host, so it can be graph-captured) or "exact" (waits
    for the receive count; outputs are that size). expert_counts [local experts] and rank_counts [ranks] (int32,
    device) say how many rows each local expert and each source rank sent."""

    def __init__(self, group: Group, topk_idx, layout: str, sizing: str, alignment: int, stream):
        import torch

        self.group, self.layout, self.sizing = group, layout, sizing
        _choice(_LAYOUT, layout, "layout")
        if layout == "rank_major":
            raise NcclInvalidUsage("layout='rank_major' is the Low-Latency mode's (not implemented yet)")
        dev = topk_idx.device if isinstance(topk_idx, torch.Tensor) else None
        self.expert_counts = torch.zeros(group.local_experts, dtype=torch.int32, device=dev)
        self.rank_counts = torch.zeros(group.size, dtype=torch.int32, device=dev)
        self.expert_offsets = torch.zeros(group.local_experts, dtype=torch.int32, device=dev)
        self.recv_total = torch.zeros(1, dtype=torch.int32, device=dev)
        ti = self._routing(topk_idx)
        cfg = _HandleConfig.new(dispatch_output_per_expert_alignment=alignment,
                                sizing=_choice(_SIZING, sizing, "sizing"))
        self._h = ctypes.c_void_p()
        _call("ncclEpCreateHandle", ctypes.byref(self._h), group._handle(), _LAYOUT[layout], ctypes.byref(ti),
              ctypes.byref(self._layout_info()), ctypes.byref(cfg), _stream(stream))
        self._inputs_alive = None
        self._prepared = {}  # call signature -> _Prepared (Group.dispatch / combine)

    def _routing(self, topk_idx) -> CTensor:
        import torch

        ti = describe(topk_idx, "topk_idx", dtypes=(torch.int32, torch.int64), ndim=2)
        self.topk_idx, self.num_tokens, self.topk = topk_idx, topk_idx.shape[0], topk_idx.shape[1]
        return ti

    def _layout_info(self) -> _LayoutInfo:
        return _LayoutInfo.new(expert_counters=describe(self.expert_counts, "expert_counts"),
                               src_rank_counters=describe(self.rank_counts, "rank_counts"),
                               expert_offsets=describe(self.expert_offsets, "expert_offsets"),
                               recv_total_counter=describe(self.recv_total, "recv_total"))

    def _handle(self):
        if not self._h:
            raise NcclInvalidUsage("Handle: used after close()")
        return self._h

    def update(self, topk_idx, stream=None) -> None:
        """COLLECTIVE, stream-ordered: the same handle with a new routing (same layout, sizing and top-k)."""
        tokens, rows = self.num_tokens, self._prepared and self.sizing == "exact"
        ti = self._routing(topk_idx)
        if rows or self.num_tokens != tokens:  # the prepared calls' token or row counts changed
            self._prepared.clear()
        _call("ncclEpUpdateHandle", self._handle(), ctypes.byref(ti), ctypes.byref(self._layout_info()),
              _stream(stream))

    def output_rows(self) -> int:
        """Rows of a dispatch output: the receive count (exact) or the worst case."""
        rows = ctypes.c_int64(0)
        fn = "ncclEpHandleGetRecvRows" if self.sizing == "exact" else "ncclEpHandleGetMaxRecvRows"
        _call(fn, self._handle(), ctypes.byref(rows))
        return rows.value

    def close(self) -> None:
        """Local: the handle must not be in use by queued work (synchronise its stream first). Idempotent."""
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            _call("ncclEpHandleDestroy", h)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False


@dataclass
class DispatchResult:
    """What dispatch returns. tokens [rows, H]; topk_idx (FLAT: [rows, K] int32 local expert ids, -1 where the
    expert is elsewhere); topk_weights (FLAT: [rows, K]; EXPERT_MAJOR: [rows]) when weights were given; scales with
    fp8 tokens; expert_counts / rank_counts (the handle's, int32, device). With worst-case sizing, rows past the
    received ones are left as they were."""

    tokens: object
    handle: Handle
    expert_counts: object
    rank_counts: object
    topk_idx: object = None
    topk_weights: object = None
    scales: object = None


_lib()  # at import: the libraries load and the NCCL in this process is the release they were built for
