"""nccl.m2n: resharding tensors between layouts and groups of GPUs (libnccl_m2n).

    import nccl.m2n as m2n
    src = m2n.Layout.from_device_mesh(mesh, [Shard(0)], (16384, 16384), torch.bfloat16)   # DTensor placements
    dst = m2n.Layout((16384, 16384), torch.bfloat16, mesh=[0, 1], placements=[m2n.shard(1)])
    src.local_box(rank)                        # (offset, shape) this rank holds, or None
    plan = m2n.HostPlan([("w", src, dst)], rank=rank, n_ranks=2)   # the host planner: what this rank moves
    plan.info, plan.transfers("sends")
    with m2n.Plan([("w", src, dst)]) as p:     # collective (the default group); reusable, graph-capturable
        p.execute([x_local], [y_local])        # this rank's local tensors (None where it holds no part)

Layouts come from torch (a DeviceMesh and DTensor placements: Shard, Replicate) or are given directly (a mesh of
ranks, placements or explicit boxes, local strides). The host planner runs on the CPU; Plan runs the C executor.
reshard (one tensor, one call) and WeightSync (a trainer's named weights to inference ranks, planned once and
synced every step) are in nccl.m2n.sync.
"""

from __future__ import annotations

import ctypes

from .._ext import _loader
from .._ext.closing import Closing
from .._ext.cvalues import c_integer, c_integers, set_fields
from .._ext.comm import Communicator
from .._ext.errors import (NcclError, NcclInProgress, NcclInternalError, NcclInvalidArgument, NcclInvalidUsage,
                           NcclRemoteError, NcclSystemError, NcclUnhandledCudaError)
from .._ext.tensor import nccl_dtype

__all__ = ["Layout", "HostPlan", "Plan", "Communicator", "WeightSync", "reshard", "release_communicators", "retain",
           "release", "register", "Registration", "shard", "REPLICATE", "version", "NcclError",
           "NcclUnhandledCudaError", "NcclSystemError", "NcclInternalError", "NcclInvalidArgument", "NcclInvalidUsage",
           "NcclRemoteError", "NcclInProgress"]

_MAGIC = 0x6d326e31  # NCCL_M2N_MAGIC
MAX_DIMS = 8
REPLICATE = -1


def shard(dim: int) -> int:
    """The placement that shards tensor dim `dim` over a mesh axis (NCCL_M2N_SHARD)."""
    return dim


_I64P = ctypes.POINTER(ctypes.c_int64)
_IP = ctypes.POINTER(ctypes.c_int)


class _Mesh(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("ndims", ctypes.c_int), ("dims", _IP),
                ("ranks", _IP)]


class _Box(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_int64 * MAX_DIMS), ("shape", ctypes.c_int64 * MAX_DIMS)]


class _Layout(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("ndims", ctypes.c_int),
                ("globalShape", _I64P), ("dtype", ctypes.c_int), ("mesh", ctypes.POINTER(_Mesh)),
                ("placements", _IP), ("boxes", ctypes.POINTER(_Box)), ("localStrides", _I64P)]


class _TensorSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("src", ctypes.POINTER(_Layout)), ("dst", ctypes.POINTER(_Layout))]


class _PlanConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("nRanks", ctypes.c_int),
                ("ranksPerDomain", ctypes.c_int), ("domainOfRank", _IP), ("fp8BlockRows", ctypes.c_int)]


class _Transfer(ctypes.Structure):
    _fields_ = [("tensor", ctypes.c_int), ("srcRank", ctypes.c_int), ("dstRank", ctypes.c_int),
                ("srcOffset", ctypes.c_int64), ("dstOffset", ctypes.c_int64), ("ndims", ctypes.c_int),
                ("extent", ctypes.c_int64 * MAX_DIMS), ("srcStride", ctypes.c_int64 * MAX_DIMS),
                ("dstStride", ctypes.c_int64 * MAX_DIMS)]


class _ExecConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("stagingBytes", ctypes.c_size_t),
                ("timeoutSeconds", ctypes.c_double), ("fp8BlockRows", ctypes.c_int), ("lsa", ctypes.c_int),
                ("zeroCopy", ctypes.c_int)]


class _PlanInfo(ctypes.Structure):
    _fields_ = [("metadataHash", ctypes.c_uint64), ("planHash", ctypes.c_uint64), ("counts", ctypes.c_int64 * 3),
                ("bytes", ctypes.c_int64 * 3), ("totalBytes", ctypes.c_int64), ("interDomainBytes", ctypes.c_int64),
                ("maxSourceLoad", ctypes.c_double), ("meanSourceLoad", ctypes.c_double)]


_P = ctypes.c_void_p
_SIGNATURES = {
    "ncclM2nGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "ncclM2nLayoutValidate": [ctypes.POINTER(_Layout), ctypes.c_int],
    "ncclM2nLayoutLocalBox": [ctypes.POINTER(_Layout), ctypes.c_int, _I64P, _I64P, _IP],
    "ncclM2nHostPlanCreate": [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int, ctypes.POINTER(_TensorSpec),
                              ctypes.POINTER(_PlanConfig)],
    "ncclM2nHostPlanGetInfo": [_P, ctypes.POINTER(_PlanInfo)],
    "ncclM2nHostPlanGetTransfers": [_P, ctypes.c_int, ctypes.POINTER(ctypes.POINTER(_Transfer)),
                                    ctypes.POINTER(ctypes.c_int64)],
    "ncclM2nHostPlanDestroy": [_P],
    "ncclM2nPlanCreate": [ctypes.POINTER(_P), _P, ctypes.c_int, ctypes.POINTER(_TensorSpec),
                          ctypes.POINTER(_ExecConfig)],
    "ncclM2nExecute": [_P, ctypes.POINTER(_P), ctypes.POINTER(_P), _P],
    "ncclM2nPlanDestroy": [_P],
    "ncclM2nPlanGetAsyncError": [_P],
    "ncclM2nCommRetain": [_P, ctypes.POINTER(_ExecConfig)],
    "ncclM2nCommRelease": [_P],
    "ncclM2nReshard": [_P, ctypes.POINTER(_TensorSpec), _P, _P, ctypes.POINTER(_ExecConfig), _P],
    "ncclM2nRegister": [_P, _P, ctypes.c_size_t, ctypes.POINTER(_P)],
    "ncclM2nDeregister": [_P],
}
_ZERO_COPY = {None: 0, "pull": 1, "push": 2}  # NCCL_M2N_ZERO_COPY_*


def _lib() -> ctypes.CDLL:
    return _loader.bind("m2n", "M2n", _SIGNATURES)


def _call(name: str, *args) -> None:
    _loader.call(_lib(), "M2n", name, *args)


def version() -> tuple[int, int, int]:
    """libnccl_m2n's (major, minor, patch)."""
    return _loader.version(_lib(), "M2n")


def _nested_shape_and_flat(mesh):
    """(dims, flat ranks) of a nested list / tuple / tensor of ranks."""
    if hasattr(mesh, "tolist"):
        mesh = mesh.tolist()
    if isinstance(mesh, int):
        return [1], [mesh]
    dims, level = [], mesh
    while isinstance(level, (list, tuple)):
        dims.append(len(level))
        level = level[0] if level else 0
    flat = []

    def walk(x, depth):
        if depth == len(dims):
            flat.append(c_integer(x, ctypes.c_int, "mesh: rank"))
            return
        if not isinstance(x, (list, tuple)) or len(x) != dims[depth]:
            raise NcclInvalidArgument("mesh: a ragged nesting (expected %d entries at depth %d)" % (dims[depth], depth))
        for y in x:
            walk(y, depth + 1)

    walk(mesh, 0)
    return dims, flat


def _positions_like(mesh):
    """The mesh positions 0..n-1 in the mesh's shape (a tensor)."""
    import torch

    return torch.arange(mesh.numel()).view(tuple(mesh.shape))


def _right_to_left(placements, sizes):
    """(mesh axis order, placements) with FSDP2 + TP's _StridedShard rewritten: _StridedShard(d, split_factor=s) on
    axis a, with Shard(d) on a later axis b of size s, means that DTensor shards d on b first and then on a (right to
    left). Moving axis a just after b, with Shard(d) on both, gives the same box to every rank (checked against
    DTensor's compute_local_shape_and_global_offset in tests/python/test_m2n_cpu.py). Any other _StridedShard raises
    NotImplementedError."""
    from torch.distributed.tensor import Shard

    strided = [i for i, p in enumerate(placements) if type(p).__name__ == "_StridedShard"]
    order = list(range(len(placements)))
    if not strided:
        return order, placements
    if len(strided) > 1:
        raise NotImplementedError("nccl.m2n: more than one _StridedShard placement (%s)" % (placements,))
    a = strided[0]
    d, s = placements[a].dim, placements[a].split_factor
    later = [b for b in range(a + 1, len(placements)) if type(placements[b]) is Shard and placements[b].dim == d]
    if len(later) != 1 or sizes[later[0]] != s or any(
            getattr(placements[i], "dim", None) == d for i in range(a + 1, later[0])):
        raise NotImplementedError("nccl.m2n: a _StridedShard placement other than FSDP2 + TP's (a later mesh axis "
                                  "of size split_factor sharding the same dim): %s on mesh sizes %s"
                                  % (placements, sizes))
    b = later[0]
    order.remove(a)
    order.insert(order.index(b) + 1, a)
    out = list(placements)
    out[a] = Shard(d)
    return order, [out[i] for i in order]


def _nested(flat, dims):
    """Flat row-major mesh ranks nested back into lists of the mesh's shape, innermost axis first."""
    mesh = list(flat)
    for n in reversed(list(dims)[1:]):
        mesh = [mesh[i:i + n] for i in range(0, len(mesh), n)]
    return mesh


def _seconds(timeout_s, what: str) -> float:
    """A timeout in seconds for the C config (0: the library's default)."""
    if not (isinstance(timeout_s, (int, float)) and 0 <= timeout_s < float("inf")):
        raise NcclInvalidArgument("%s: timeout_s=%r: seconds, a finite number >= 0 (0: the default)"
                                  % (what, timeout_s))
    return float(timeout_s)


def _dtype_code(dtype) -> int:
    return dtype if isinstance(dtype, int) else nccl_dtype(dtype)


class Layout:
    """Which part of a global tensor each rank holds: `mesh` (a nested list, tuple or tensor of communicator ranks),
    and `placements` (one per mesh axis: shard(dim) or REPLICATE, applied in axis order like DTensor's) or `boxes`
    (one (offset, shape) per mesh position, row-major over the mesh). `local_strides`: one stride tuple per mesh
    position (element strides of that rank's local tensor), or None for row-major locals."""

    def __init__(self, global_shape, dtype, mesh, placements=None, boxes=None, local_strides=None):
        i64, i32 = ctypes.c_int64, ctypes.c_int
        self.global_shape = tuple(c_integers(global_shape, i64, "Layout: global_shape"))
        self.dtype = c_integer(_dtype_code(dtype), i32, "Layout: dtype")
        self.mesh_dims, self.mesh_ranks = _nested_shape_and_flat(mesh)
        if (placements is None) == (boxes is None):
            raise NcclInvalidArgument("Layout: give placements or boxes (one of them)")
        self.placements = None if placements is None else c_integers(placements, i32, "Layout: placements")
        self.boxes = None if boxes is None else [(tuple(c_integers(o, i64, "Layout: boxes[%d] offset" % i)),
                                                  tuple(c_integers(s, i64, "Layout: boxes[%d] shape" % i)))
                                                 for i, (o, s) in enumerate(boxes)]
        self.local_strides = None if local_strides is None else [
            tuple(c_integers(st, i64, "Layout: local_strides[%d]" % i)) for i, st in enumerate(local_strides)]
        self._build()

    def _build(self):
        nd, n = len(self.global_shape), len(self.mesh_ranks)
        self._shape = (ctypes.c_int64 * max(1, nd))(*self.global_shape)
        self._dims = (ctypes.c_int * len(self.mesh_dims))(*self.mesh_dims)
        self._ranks = (ctypes.c_int * n)(*self.mesh_ranks)
        self._mesh = _Mesh(ctypes.sizeof(_Mesh), _MAGIC, len(self.mesh_dims), self._dims, self._ranks)
        c = _Layout()
        c.size, c.magic, c.ndims, c.globalShape, c.dtype = ctypes.sizeof(_Layout), _MAGIC, nd, self._shape, self.dtype
        c.mesh = ctypes.pointer(self._mesh)
        if self.placements is not None:
            self._placements = (ctypes.c_int * max(1, len(self.placements)))(*self.placements)
            c.placements = self._placements
        else:
            if len(self.boxes) != n:
                raise NcclInvalidArgument("Layout: %d boxes for %d mesh positions" % (len(self.boxes), n))
            self._boxes = (_Box * n)()
            if nd > MAX_DIMS:
                raise NcclInvalidArgument("Layout: %d dims: at most %d" % (nd, MAX_DIMS))
            for i, (o, s) in enumerate(self.boxes):
                if len(o) != nd or len(s) != nd:
                    raise NcclInvalidArgument("Layout: boxes[%d]: an offset and a shape of %d dims each" % (i, nd))
                for d in range(nd):
                    self._boxes[i].offset[d], self._boxes[i].shape[d] = o[d], s[d]
            c.boxes = self._boxes
        if self.local_strides is not None:
            flat = [int(x) for st in self.local_strides for x in st]
            if len(flat) != n * nd:
                raise NcclInvalidArgument("Layout: local_strides needs %d positions x %d dims" % (n, nd))
            self._strides = (ctypes.c_int64 * len(flat))(*flat)
            c.localStrides = self._strides
        self._c = c

    def fp8_scales(self, block_rows: int = 1) -> "Layout":
        """The layout of this (e4m3) layout's scales tensor: fp32, the last dim in blocks of 128 columns (and the dim
        before it in blocks of `block_rows`: 1 or 128), each position's part the blocks of its part (docs/M2N.md,
        fp8)."""
        import torch

        def in_blocks(off, shp, d, size, n):
            lo, hi = off[d], off[d] + shp[d]
            o, s = list(off), list(shp)
            o[d], s[d] = min(lo // size, n), (-(-hi // size) - lo // size)
            return o, s

        nd = len(self.global_shape)
        shape = list(self.global_shape)
        dims = [(nd - 1, 128)] + ([(nd - 2, block_rows)] if block_rows > 1 else [])
        for d, size in dims:
            shape[d] = -(-shape[d] // size)
        boxes = []
        for r in self.mesh_ranks:
            off, shp = self.local_box(r)
            empty = any(x == 0 for x in shp)
            for d, size in dims:
                off, shp = in_blocks(off, shp, d, size, shape[d])
            if empty:
                off, shp = [min(o, n) for o, n in zip(off, shape)], shp[:-1] + [0]
            boxes.append((tuple(off), tuple(shp)))
        return Layout(tuple(shape), torch.float32, mesh=_nested(self.mesh_ranks, self.mesh_dims), boxes=boxes)

    def validate(self, n_ranks: int = 0) -> "Layout":
        """Raises NcclInvalidArgument naming what is wrong (n_ranks 0: ranks unbounded)."""
        _call("ncclM2nLayoutValidate", ctypes.byref(self._c), n_ranks)
        return self

    def local_box(self, rank: int):
        """(offset, shape) of the part `rank` holds (a shape may hold a 0: an empty shard), or None."""
        nd = len(self.global_shape)
        off, shp, holds = (ctypes.c_int64 * MAX_DIMS)(), (ctypes.c_int64 * MAX_DIMS)(), ctypes.c_int(0)
        _call("ncclM2nLayoutLocalBox", ctypes.byref(self._c), rank, off, shp, ctypes.byref(holds))
        return (tuple(off[:nd]), tuple(shp[:nd])) if holds.value else None

    @classmethod
    def from_device_mesh(cls, device_mesh, placements, global_shape, dtype, local_strides=None) -> "Layout":
        """A DTensor's layout: its DeviceMesh (the global ranks of `device_mesh.mesh`) and placements (Shard,
        Replicate, and FSDP2 + TP's _StridedShard where a later axis' Shard of the same dim completes it). Partial (a
        pending reduction) raises NotImplementedError, and so does any other _StridedShard."""
        from torch.distributed.tensor import Partial, Replicate, Shard

        nd = len(global_shape)
        mesh = device_mesh.mesh
        order, placements = _right_to_left(list(placements), list(mesh.shape))
        if order != list(range(len(order))):
            mesh = mesh.permute(order)
            if local_strides is not None:  # one per position, row-major over the mesh: follow the permutation
                positions = _positions_like(device_mesh.mesh).permute(order).flatten().tolist()
                local_strides = [local_strides[i] for i in positions]
        out = []
        for p in placements:
            if isinstance(p, Partial):
                raise NotImplementedError("nccl.m2n: a Partial placement is a pending reduction, not a layout: "
                                          "redistribute it to Replicate or Shard first")
            if isinstance(p, Shard):
                out.append(shard(p.dim % nd if nd else p.dim))
            elif isinstance(p, Replicate):
                out.append(REPLICATE)
            else:
                raise NotImplementedError("nccl.m2n: placement %r is not supported" % (p,))
        return cls(global_shape, dtype, mesh, placements=out, local_strides=local_strides)

    def to_dict(self) -> dict:
        """Plain data (for torch.distributed's object collectives); Layout.from_dict(d) makes it again."""
        return {"global_shape": list(self.global_shape), "dtype": self.dtype, "mesh_dims": list(self.mesh_dims),
                "mesh_ranks": list(self.mesh_ranks), "placements": self.placements,
                "boxes": None if self.boxes is None else [[list(o), list(sh)] for o, sh in self.boxes],
                "local_strides": None if self.local_strides is None else [list(st) for st in self.local_strides]}

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        return cls(d["global_shape"], d["dtype"], _nested(d["mesh_ranks"], d["mesh_dims"]),
                   placements=d["placements"], boxes=d["boxes"],
                   local_strides=d["local_strides"])

    def with_ranks(self, rank_of) -> "Layout":
        """The same layout with every mesh rank r replaced by rank_of(r) (e.g. global ranks to a group's)."""
        d = self.to_dict()
        d["mesh_ranks"] = [int(rank_of(r)) for r in d["mesh_ranks"]]
        return Layout.from_dict(d)

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        what = "placements=%s" % self.placements if self.placements is not None else "boxes=%s" % self.boxes
        return "Layout(%s, dtype=%d, mesh=%s %s, %s)" % (self.global_shape, self.dtype, self.mesh_dims,
                                                        self.mesh_ranks, what)

    @classmethod
    def from_dtensor(cls, dt) -> "Layout":
        """The layout of a DTensor (row-major locals; a strided local tensor needs from_device_mesh's
        local_strides from every rank)."""
        return cls.from_device_mesh(dt.device_mesh, dt.placements, tuple(dt.shape), dt.dtype)


_KINDS = {"sends": 0, "recvs": 1, "copies": 2}


class HostPlan(Closing):
    """The host planner (ncclM2nHostPlanCreate; local, CPU only): what `rank` sends, receives and copies to move
    every tensor of `tensors` ((name, source Layout, destination Layout) triples) in a communicator of `n_ranks`."""

    def __init__(self, tensors, rank: int, n_ranks: int, ranks_per_domain: int = 0, fp8_block_rows: int = 1):
        self._tensors = list(tensors)  # the layouts' C structs stay alive with them
        specs, self._names = _specs(self._tensors)
        cfg = _PlanConfig(ctypes.sizeof(_PlanConfig), _MAGIC)
        set_fields(cfg, "HostPlan", nRanks=n_ranks, ranksPerDomain=ranks_per_domain, fp8BlockRows=fp8_block_rows)
        self._h = ctypes.c_void_p()
        _call("ncclM2nHostPlanCreate", ctypes.byref(self._h), rank, len(self._tensors), specs, ctypes.byref(cfg))
        info = _PlanInfo()
        _call("ncclM2nHostPlanGetInfo", self._h, ctypes.byref(info))
        self.info = {"metadata_hash": info.metadataHash, "plan_hash": info.planHash,
                     "counts": dict(zip(_KINDS, info.counts)), "bytes": dict(zip(_KINDS, info.bytes)),
                     "total_bytes": info.totalBytes, "inter_domain_bytes": info.interDomainBytes,
                     "max_source_load": info.maxSourceLoad, "mean_source_load": info.meanSourceLoad}

    def transfers(self, kind: str):
        """This rank's list of `kind` ("sends", "recvs", "copies"): dicts of tensor, src_rank, dst_rank, offsets
        (elements of each side's local tensor) and the box's extents and strides."""
        if kind not in _KINDS:
            raise NcclInvalidArgument("HostPlan.transfers: kind %r: expected sends, recvs or copies" % (kind,))
        arr, n = ctypes.POINTER(_Transfer)(), ctypes.c_int64(0)
        _call("ncclM2nHostPlanGetTransfers", self._h, _KINDS[kind], ctypes.byref(arr), ctypes.byref(n))
        out = []
        for i in range(n.value):
            t = arr[i]
            out.append({"tensor": t.tensor, "src_rank": t.srcRank, "dst_rank": t.dstRank,
                        "src_offset": t.srcOffset, "dst_offset": t.dstOffset, "extent": tuple(t.extent[:t.ndims]),
                        "src_stride": tuple(t.srcStride[:t.ndims]), "dst_stride": tuple(t.dstStride[:t.ndims])})
        return out

    def close(self) -> None:
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            _call("ncclM2nHostPlanDestroy", h)


def _specs(tensors):
    specs = (_TensorSpec * max(1, len(tensors)))()
    names = [n.encode() for n, _, _ in tensors]
    for i, (_, s, d) in enumerate(tensors):
        specs[i].name = names[i]
        if s is not None or d is not None:  # both None: the scales of the e4m3 tensor before it
            specs[i].src = ctypes.pointer(s._c)
            specs[i].dst = ctypes.pointer(d._c)
    return specs, names


def _local_of(t):
    """A DTensor's local tensor (the attribute, not to_local(): that is an autograd call, ~10 us a tensor), else t."""
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t


class _Side:
    """What execute checks of one side (source or destination) of every tensor on this rank, precomputed: the
    local shape (None: holds no part) and the strides it must have (None: contiguous)."""

    def __init__(self, tensors, which, rank, block_rows=1):
        import torch

        from .._ext.tensor import torch_dtype

        self.name = "source" if which == 1 else "destination"
        self.shapes, self.strides = [], []
        # An e4m3 tensor's scales entry (no layouts): no source; its destination is the fp8_scales() layout.
        lays = [t[which] if t[which] is not None or which == 1 or i == 0 or tensors[i - 1][2] is None
                else tensors[i - 1][2].fp8_scales(block_rows) for i, t in enumerate(tensors)]
        self.dtypes = [-1 if lay is None else lay.dtype for lay in lays]
        self.torch_dtypes = [None if lay is None else torch_dtype(lay.dtype) for lay in lays]  # None: NCCL type
        for lay in lays:
            box = None if lay is None else lay.local_box(rank)
            self.shapes.append(None if box is None else torch.Size(box[1]))
            st = None
            if box is not None and lay.local_strides is not None:
                st = tuple(lay.local_strides[lay.mesh_ranks.index(rank)])
            self.strides.append(st)
        self.last = None  # (the tensors of the last call, their pointers' array): a repeat skips the checks


def _pointers(plan_tensors, index, tensors, side: _Side):
    """The pointer array of one side's tensors (a list in plan order or a dict by name), each checked against
    what this rank holds of it (`side`); a repeat of the last call's tensors skips the checks."""
    import torch

    n = len(plan_tensors)
    if isinstance(tensors, dict):
        unknown = [k for k in tensors if k not in index]
        if unknown:
            raise NcclInvalidArgument("execute: %s tensor %r is not in the plan" % (side.name, unknown[0]))
        tensors = [tensors.get(name) for name, _, _ in plan_tensors]
    else:
        tensors = list(tensors)
    if len(tensors) != n:
        raise NcclInvalidArgument("execute: %d %s tensors for a plan of %d" % (len(tensors), side.name, n))
    tensors = [None if t is None else _local_of(t) for t in tensors]
    last = side.last
    if last is not None and all(a is b for a, b in zip(last[0], tensors)):
        ptrs = [0 if t is None else t.data_ptr() for t in tensors]
        if ptrs == last[2]:
            return last[1]  # the same tensors at the same addresses: checked last time
    # The checks, cheapest forms first (~1 us a tensor: this runs for every tensor of a model on a new call).
    ptrs = [0] * n
    for i, t in enumerate(tensors):
        if t is None:
            continue
        name, shape, strides = plan_tensors[i][0], side.shapes[i], side.strides[i]
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            raise NcclInvalidArgument("execute: %s tensor %r must be a CUDA tensor" % (side.name, name))
        ptrs[i] = t.data_ptr()
        if shape is None:
            continue  # this rank holds no part: the pointer is not used
        if t.shape != shape:
            raise NcclInvalidArgument("execute: %s tensor %r has shape %s; this rank holds %s" %
                                      (side.name, name, tuple(t.shape), tuple(shape)))
        if strides is None and not t.is_contiguous():
            raise NcclInvalidArgument("execute: %s tensor %r is not contiguous and its layout gives no "
                                      "local_strides (no copy is made)" % (side.name, name))
        if strides is not None and tuple(t.stride()) != strides:
            raise NcclInvalidArgument("execute: %s tensor %r has strides %s; its layout says %s" %
                                      (side.name, name, tuple(t.stride()), strides))
        want = side.torch_dtypes[i]
        if (t.dtype is not want) if want is not None else nccl_dtype(t.dtype) != side.dtypes[i]:
            raise NcclInvalidArgument("execute: %s tensor %r has dtype %s; its layout has NCCL type %d" %
                                      (side.name, name, t.dtype, side.dtypes[i]))
    arr = (ctypes.c_void_p * max(1, n))(*ptrs)
    side.last = (tensors, arr, ptrs)
    return arr


class Plan(Closing):
    """An execution plan (ncclM2nPlanCreate; COLLECTIVE over `group`, a torch ProcessGroup, None for the default,
    or a Communicator, which many plans may share): `tensors` is a list of (name, source Layout, destination
    Layout), the same on every rank. execute() moves them, as often as wanted, and may be captured in a CUDA graph
    (docs/M2N.md says what the executor does not do yet)."""

    def __init__(self, tensors, group=None, staging_bytes: int = 0, timeout_s: float = 0, fp8_block_rows: int = 1,
                 lsa: bool = False, zero_copy=None):
        if not (zero_copy is None or isinstance(zero_copy, str)) or zero_copy not in _ZERO_COPY:
            raise NcclInvalidArgument("Plan: zero_copy %r: None, 'pull' or 'push'" % (zero_copy,))
        self._owns_comm = not isinstance(group, Communicator)
        self.comm = Communicator(group) if self._owns_comm else group
        self.tensors = list(tensors)
        self._specs, self._names = _specs(self.tensors)
        # lsa=True: streams inside an NVLink domain over LSA (docs/M2N.md: not yet validated on GPUs; every rank
        # alike); False: every stream between ranks by ncclSend/ncclRecv. zero_copy ('pull' / 'push', with lsa):
        # those streams move in place, the sources (pull) or destinations (push) in memory register()ed on the
        # plan's communicator.
        cfg = _ExecConfig(ctypes.sizeof(_ExecConfig), _MAGIC, 0, _seconds(timeout_s, "Plan"))
        set_fields(cfg, "Plan", stagingBytes=staging_bytes, fp8BlockRows=fp8_block_rows, lsa=1 if lsa else 0)
        cfg.zeroCopy = _ZERO_COPY[zero_copy]
        self._h = ctypes.c_void_p()
        try:
            _call("ncclM2nPlanCreate", ctypes.byref(self._h), self.comm.handle, len(self.tensors), self._specs,
                  ctypes.byref(cfg))
        except NcclError:
            if self._owns_comm:
                self.comm.abort()
            raise
        self._index = {name: i for i, (name, _, _) in enumerate(self.tensors)}
        self._sides = (_Side(self.tensors, 1, self.comm.rank), _Side(self.tensors, 2, self.comm.rank, fp8_block_rows))

    def _pointers(self, tensors, side: _Side):
        return _pointers(self.tensors, self._index, tensors, side)

    def execute(self, src, dst, stream=None) -> None:
        """COLLECTIVE, stream-ordered (the current stream): src / dst are lists (plan order) or dicts (by name) of
        this rank's local tensors (DTensors: their local tensors), None where it holds no part. A call with the
        very tensors of the previous one skips the Python checks."""
        import torch

        if not self._h:
            raise NcclInvalidArgument("Plan: used after close()")
        s = self._pointers(src, self._sides[0])
        d = self._pointers(dst, self._sides[1])
        st = torch.cuda.current_stream() if stream is None else stream
        _call("ncclM2nExecute", self._h, s, d, ctypes.c_void_p(st.cuda_stream))
        self._alive = (src, dst)

    def check(self) -> None:
        """Raises NcclRemoteError once an execute's exchanges outlived the plan's timeout (a peer that died or never
        executes): the plan's exchange communicator was aborted, destinations may hold partial data. Local, never
        blocks."""
        if not self._h:
            raise NcclInvalidArgument("Plan: used after close()")
        _call("ncclM2nPlanGetAsyncError", self._h)

    def close(self) -> None:
        """Local (after the executes finished), then the communicator this plan made (collective)."""
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            self._sides = None
            _call("ncclM2nPlanDestroy", h)
            if self._owns_comm:
                self.comm.close()


def retain(comm: Communicator, timeout_s: float = 0) -> None:
    """COLLECTIVE over `comm`: keeps the communicator that plans on `comm` exchange over alive between plans
    (ncclM2nCommRetain), so that plans and reshards made one after another on it split nothing. release() it
    before closing `comm`."""
    cfg = _ExecConfig(ctypes.sizeof(_ExecConfig), _MAGIC, 0, _seconds(timeout_s, "retain"))
    _call("ncclM2nCommRetain", comm.handle, ctypes.byref(cfg))


def release(comm: Communicator) -> None:
    """Local: undoes retain() (the exchange communicator goes with the last plan on it) and frees the plans that
    reshard() cached on `comm`, once their executes finished (Communicator.close() calls it)."""
    _call("ncclM2nCommRelease", comm.handle)


class Registration(Closing):
    """Memory registered for zero-copy plans (ncclM2nRegister); close() (or the with block's end) deregisters it,
    COLLECTIVE over the communicator's NVLink domain, once no execute or graph that uses it can run."""

    def __init__(self, handle, tensor):
        self._h = handle
        self.tensor = tensor  # kept alive while registered

    def close(self) -> None:
        if self._h is not None:
            h, self._h = self._h, None
            _call("ncclM2nDeregister", h)


def register(comm: Communicator, tensor) -> Registration:
    """COLLECTIVE over `comm`'s NVLink domain (over `comm` the first time): registers `tensor`'s memory (the same
    number of bytes on every rank of the domain, in memory NCCL can map: ncclMemAlloc or cuMem, e.g. a
    torch.cuda.MemPool on NCCL's allocator) for plans created with zero_copy."""
    if not getattr(tensor, "is_cuda", False) or not tensor.is_contiguous():
        raise NcclInvalidArgument("register: a contiguous CUDA tensor, not %s" % type(tensor).__name__)
    h = ctypes.c_void_p()
    _call("ncclM2nRegister", comm.handle, ctypes.c_void_p(tensor.data_ptr()), tensor.numel() * tensor.element_size(),
          ctypes.byref(h))
    return Registration(h, tensor)


from .sync import WeightSync, release_communicators, reshard  # noqa: E402  (they build on the classes above)

_lib()  # at import, as nccl.ep
