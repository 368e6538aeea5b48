"""One-call resharding (reshard) and the RL weight-sync helper (WeightSync), on nccl.m2n.Plan.

Layouts on a communicator are numbered by the communicator's ranks: the ranks of the torch group it was made
from. DTensor meshes hold global ranks; both helpers translate them to the group's.
"""

from __future__ import annotations

import ctypes
import pickle

from .._ext.closing import Closing
from .._ext.objects import all_gather_bytes
from .._ext.tensor import NCCL_BFLOAT16, NCCL_FLOAT32, NCCL_FLOAT8E4M3
from . import (_MAGIC, Communicator, Layout, NcclInvalidArgument, Plan, _call, _ExecConfig, _local_of, _pointers,
               _seconds, _Side, _specs, release, retain)

# reshard's communicators: torch group (the default group's object for None) -> Communicator, retained.
_COMMUNICATORS: dict = {}


def _communicator_for(group) -> Communicator:
    """The Communicator reshard uses on a torch group: made, its exchange communicator retained, at the group's
    first reshard; the same one after (like the NCCL communicator torch keeps for a group)."""
    import torch.distributed as dist

    key = dist.group.WORLD if group is None else group
    comm = _COMMUNICATORS.get(key)
    if comm is None:
        comm = Communicator(group)
        retain(comm)
        _COMMUNICATORS[key] = comm
    return comm


def release_communicators() -> None:
    """COLLECTIVE over each group reshard has used: closes the communicators it keeps (before destroying those
    torch groups, or to free their memory)."""
    while _COMMUNICATORS:
        _, comm = _COMMUNICATORS.popitem()
        release(comm)
        comm.close()


def _group_rank(group):
    """global rank -> rank in `group` (None: the default group, where they are equal)."""
    import torch.distributed as dist

    if group is None or group is dist.group.WORLD:
        return lambda r: r
    return lambda r: dist.get_group_rank(group, r)


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def _layout_of(t, given, group, what):
    if given is not None:
        return given
    if _is_dtensor(t):
        return Layout.from_dtensor(t).with_ranks(_group_rank(group))
    raise NcclInvalidArgument("%s: a plain tensor (or None) needs its Layout" % what)


def reshard(src, dst, *, src_layout: Layout | None = None, out=None, dtype=None, group=None, timeout_s: float = 0):
    """COLLECTIVE over `group` (a torch ProcessGroup, None for the default, or a Communicator): moves one tensor
    from its layout to `dst` and returns this rank's destination part (None where it holds none).

    `src` is a DTensor (its layout is read from it) or this rank's local tensor / None with `src_layout`. `dst` is a
    Layout, or (DeviceMesh, placements): then a rank of that mesh gets a DTensor, of `dtype` (default the
    source's; fp32 <-> bf16 is converted on the way). `out` is an optional destination tensor (else one is
    allocated). Every rank passes the same layouts, in the same order of calls. Asynchronous on the current stream
    (ncclM2nReshard): the first call with a pair of layouts plans it (collective, on the host), later ones find the
    plan cached (the 8 most recent pairs per communicator) and only enqueue. On a torch group, the first call makes a
    communicator that later calls on the group reuse (release_communicators() closes it and frees the plans); on a
    Communicator, its plans go with release(comm) or comm.close()."""
    import torch

    comm_group = group.group if isinstance(group, Communicator) else group
    s_lay = _layout_of(src, src_layout, comm_group, "reshard")
    mesh = placements = None
    if isinstance(dst, tuple):
        mesh, placements = dst
        dst = Layout.from_device_mesh(mesh, placements, s_lay.global_shape,
                                      s_lay.dtype if dtype is None else dtype).with_ranks(_group_rank(comm_group))
    if not isinstance(dst, Layout):
        raise NcclInvalidArgument("reshard: dst must be a Layout or (DeviceMesh, placements)")
    comm = group if isinstance(group, Communicator) else _communicator_for(group)
    tensors = [("reshard", s_lay, dst)]
    specs, _names = _specs(tensors)
    box = dst.local_box(comm.rank)
    if box is not None and out is None:
        out = torch.empty(box[1], dtype=_torch_dtype(dst.dtype), device=comm.device)
    index = {"reshard": 0}
    s = _pointers(tensors, index, [src], _Side(tensors, 1, comm.rank))
    d = _pointers(tensors, index, [out if box is not None else None], _Side(tensors, 2, comm.rank))
    cfg = _ExecConfig(ctypes.sizeof(_ExecConfig), _MAGIC, 0, _seconds(timeout_s, "reshard"))
    _release_on_close(comm)
    stream = torch.cuda.current_stream(comm.device)
    _call("ncclM2nReshard", comm.handle, specs, s[0], d[0], ctypes.byref(cfg), ctypes.c_void_p(stream.cuda_stream))
    for t in (src, out):  # the reshard reads / writes them after this returns: their memory waits for it
        if t is not None:
            _local_of(t).record_stream(stream)
    if box is None:
        return None
    if mesh is not None:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(out, mesh, placements, run_check=False, shape=torch.Size(s_lay.global_shape),
                                  stride=torch.empty(s_lay.global_shape, device="meta").stride())
    return out


def _release_on_close(comm: Communicator) -> None:
    """The reshard plans cached on `comm` are freed (ncclM2nCommRelease) before it is closed or aborted."""
    if not getattr(comm, "_m2n_release_hooked", False):
        comm.before_close.append(lambda handle: _call("ncclM2nCommRelease", handle))
        comm._m2n_release_hooked = True


def _torch_dtype(code: int):
    from .._ext.tensor import torch_dtype

    d = torch_dtype(code)
    if d is None:
        raise NcclInvalidArgument("reshard: NCCL type %d has no torch dtype here" % code)
    return d


# (source, destination) NCCL types the executor takes: the same type, or a conversion it does in flight
# (fp32 -> bf16, bf16 -> fp32, and fp32 / bf16 -> fp8 e4m3 with block scales; libnccl_m2n decides, and refuses the
# rest at plan time).
_FP8 = NCCL_FLOAT8E4M3
_CONVERTIBLE = {(c, c) for c in range(16)} | {(NCCL_FLOAT32, NCCL_BFLOAT16), (NCCL_BFLOAT16, NCCL_FLOAT32),
                                             (NCCL_FLOAT32, _FP8), (NCCL_BFLOAT16, _FP8)}


def _quantised(s: Layout, d: Layout) -> bool:
    return d.dtype == _FP8 and s.dtype != _FP8


def batch(tensors) -> list:
    """Plan entries of match()'s tensors: (name, source, destination), and after each tensor quantised to fp8 its
    scales entry (name + ".scales", None, None)."""
    out = []
    for name, _, s, d in tensors:
        out.append((name, s, d))
        if _quantised(s, d):
            out.append((name + ".scales", None, None))
    return out


def _merge(everyone, side):
    out = {}
    for r, m in enumerate(everyone):
        for name, d in m[side].items():
            if name in out and out[name] != d:
                raise NcclInvalidArgument("WeightSync.plan: ranks describe %s tensor %r differently (rank %d)"
                                          % ("trainer" if side == "src" else "inference", name, r))
            out[name] = d
    return out


def match(everyone, name_map=None) -> list:
    """The batch of WeightSync.plan from every rank's {"src": {name: layout dict}, "dst": {...}} (in rank order):
    (inference name, trainer name, source Layout, destination Layout), sorted by inference name. Raises naming
    what does not match (the same on every rank, as every rank has the same input)."""
    src, dst = _merge(everyone, "src"), _merge(everyone, "dst")
    mapped = name_map if callable(name_map) else (lambda n: (name_map or {}).get(n, n))
    tensors, problems = [], []
    for name in sorted(dst):
        tname = mapped(name)
        if tname not in src:
            problems.append("inference tensor %r has no trainer tensor %r" % (name, tname))
            continue
        s, d = src[tname], dst[name]
        if s["global_shape"] != d["global_shape"] or (s["dtype"], d["dtype"]) not in _CONVERTIBLE:
            problems.append("%r: trainer %s type %d, inference %s type %d" % (
                name, tuple(s["global_shape"]), s["dtype"], tuple(d["global_shape"]), d["dtype"]))
            continue
        tensors.append((name, tname, Layout.from_dict(s), Layout.from_dict(d)))
    if problems:
        raise NcclInvalidArgument("WeightSync.plan: %d problem(s): %s" % (len(problems), "; ".join(problems[:5])))
    return tensors


class WeightSync(Closing):
    """Weights from trainer ranks to inference ranks (disjoint or co-located) in one process group, matched by
    name, once per training step (fp32 trainer weights into bf16 inference tensors are converted on the way):

        sync = WeightSync(group)                          # every rank of the group
        sync.plan(trainer=trainer_params, inference=inference_params)   # COLLECTIVE, once
        sync.sync()                                       # COLLECTIVE, every step (the current stream)

    `trainer` (on trainer ranks; None elsewhere): name -> DTensor, or (local tensor or None, Layout). `inference`
    (on inference ranks): name -> (local tensor, Layout), or DTensor; an fp8 e4m3 Layout (from bf16 or fp32 trainer
    weights, quantised on the way, one fp32 scale per 128 columns, or per 128 x 128 with fp8_block_rows=128) takes
    (local tensor, Layout, local scales tensor): see Layout.fp8_scales() for the scales' shape. A rank on both sides passes both. The layouts
    are exchanged in plan() (one all-gather of their plain-data form), so no rank needs the other side's. `name_map` maps an inference
    name to its trainer name (a dict or a callable; default: the same name). Every inference tensor needs a trainer
    tensor of the same global shape and dtype (else plan() raises on every rank, naming it); trainer tensors no
    inference rank asks for are not moved. sync() reads the tensors given to plan() (or `trainer=` / `inference=`
    dicts of new ones: their local tensors, in place)."""

    def __init__(self, group=None, *, timeout_s: float = 0, staging_bytes: int = 0, fp8_block_rows: int = 1):
        self.group = group
        self.timeout_s, self.staging_bytes, self.fp8_block_rows = timeout_s, staging_bytes, fp8_block_rows
        self._plan = None

    def plan(self, trainer: dict | None = None, inference: dict | None = None, name_map=None) -> None:
        comm_group = self.group.group if isinstance(self.group, Communicator) else self.group
        rank_of = _group_rank(comm_group)
        mine = {"src": {}, "dst": {}, "error": None}
        self._src_local, self._dst_local = {}, {}
        try:  # a bad entry on one rank must reach every rank (they all wait in the all-gather below)
            for side, entries, store in (("src", trainer, self._src_local), ("dst", inference, self._dst_local)):
                for name, v in (entries or {}).items():
                    if _is_dtensor(v):
                        t, lay = v, Layout.from_dtensor(v).with_ranks(rank_of)
                    elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], Layout):
                        t, lay = v
                    elif side == "dst" and isinstance(v, tuple) and len(v) == 3 and isinstance(v[1], Layout) \
                            and v[1].dtype == _FP8:
                        t, lay = (v[0], v[2]), v[1]  # values and scales
                    else:
                        raise NcclInvalidArgument("%s %r: give a DTensor or (tensor, Layout)%s" % (
                            "trainer" if side == "src" else "inference", name,
                            "" if side == "src" else " (fp8: (tensor, Layout, scales))"))
                    mine[side][name] = lay.to_dict()
                    store[name] = t
        except (NcclInvalidArgument, NotImplementedError) as e:
            mine = {"src": {}, "dst": {}, "error": str(e)}
        everyone = [pickle.loads(b) for b in all_gather_bytes(pickle.dumps(mine), comm_group)]
        bad = [(r, m["error"]) for r, m in enumerate(everyone) if m["error"]]
        if bad:
            raise NcclInvalidArgument("WeightSync.plan: rank %d: %s" % bad[0])
        tensors = match(everyone, name_map)
        self.close()
        self._tensors = tensors
        self._plan = Plan(batch(tensors), self.group, staging_bytes=self.staging_bytes, timeout_s=self.timeout_s,
                          fp8_block_rows=self.fp8_block_rows)

    def sync(self, trainer: dict | None = None, inference: dict | None = None, stream=None) -> None:
        """COLLECTIVE, stream-ordered: one execute of the planned batch."""
        if self._plan is None:
            raise NcclInvalidArgument("WeightSync.sync: plan() first")
        src_local = self._src_local if trainer is None else trainer
        dst_local = self._dst_local if inference is None else inference
        src, dst = [], []
        for name, tname, s, d in self._tensors:
            src.append(src_local.get(tname))
            if not _quantised(s, d):
                dst.append(dst_local.get(name))
                continue
            values = dst_local.get(name)  # (values, scales) on a rank that holds a part, else None
            if values is not None and not (isinstance(values, tuple) and len(values) == 2):
                raise NcclInvalidArgument("WeightSync.sync: inference %r is fp8: give (values, scales)" % name)
            src.append(None)
            dst.extend(values if values is not None else (None, None))
        self._plan.execute(src, dst, stream=stream)

    @property
    def names(self) -> list:
        """The inference names the plan moves, in its order."""
        return [n for n, _, _, _ in self._tensors] if self._plan is not None else []

    def close(self) -> None:
        if self._plan is not None:
            p, self._plan = self._plan, None
            p.close()
