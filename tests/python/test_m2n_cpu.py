"""nccl.m2n on the CPU: layouts from DTensor placements against DTensor's own local shapes and offsets (torch's
fake process group, every rank of every mesh), explicit layouts, the host planner through Python, refusals."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: E402

import nccl.m2n as m2n  # noqa: E402

WORLD = 8
MESHES = [[0, 1, 2, 3, 4, 5, 6, 7], [[0, 1, 2, 3], [4, 5, 6, 7]], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
          [[7, 3], [5, 1]], [2, 6, 4]]
SHAPES = [(7, 5), (16, 3, 4), (1, 9), (13,)]


def _placement_sets(mesh_ndim, nd):
    opts = [Replicate()] + [Shard(d) for d in range(nd)]
    sets = [[]]
    for _ in range(mesh_ndim):
        sets = [s + [o] for s in sets for o in opts]
    return sets


def _as_rank(rank):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)


@pytest.fixture(scope="module")
def fake_world():
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised (torchrun)")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_local_boxes_match_dtensor(fake_world):
    checked = 0
    for rank in range(WORLD):
        _as_rank(rank)
        for mesh in MESHES:
            dm = DeviceMesh("cpu", torch.tensor(mesh))
            for shape in SHAPES:
                for placements in _placement_sets(dm.ndim, len(shape)):
                    layout = m2n.Layout.from_device_mesh(dm, placements, shape, torch.bfloat16).validate(WORLD)
                    box = layout.local_box(rank)
                    if dm.get_coordinate() is None:  # not in this mesh
                        assert box is None, (mesh, shape, placements, rank)
                        continue
                    local_shape, offset = compute_local_shape_and_global_offset(shape, dm, placements)
                    assert box is not None
                    assert box[1] == tuple(local_shape), (mesh, shape, placements, rank, box, local_shape)
                    if all(s > 0 for s in local_shape):
                        assert box[0] == tuple(offset), (mesh, shape, placements, rank, box, offset)
                    checked += 1
    assert checked > 1500  # (rank, mesh, shape, placements) combinations where the rank is in the mesh


def test_unsupported_placements_are_named(fake_world):
    from torch.distributed.tensor.placement_types import _StridedShard

    _as_rank(0)
    dm = DeviceMesh("cpu", torch.arange(WORLD))
    with pytest.raises(NotImplementedError, match="Partial placement"):
        m2n.Layout.from_device_mesh(dm, [Partial()], (8, 8), torch.float32)
    dm2 = DeviceMesh("cpu", torch.arange(WORLD).view(2, 4))
    for placements in ([_StridedShard(0, split_factor=2), Shard(0)],  # split factor is not the later axis' size
                       [_StridedShard(0, split_factor=4), Shard(1)],  # the later axis shards another dim
                       [Shard(0), _StridedShard(0, split_factor=4)]):  # no later axis completes it
        with pytest.raises(NotImplementedError, match="_StridedShard"):
            m2n.Layout.from_device_mesh(dm2, placements, (8, 8), torch.float32)


def test_fsdp2_tp_strided_shards_match_dtensor(fake_world):
    """FSDP2 + TP (and HSDP + TP) write dim-0 sharding as _StridedShard(0, split_factor=tp) on the FSDP axis and
    Shard(0) on the TP axis: every rank's box against DTensor's own, even and uneven sizes."""
    from torch.distributed.tensor.placement_types import _StridedShard

    cases = [((2, 4), [_StridedShard(0, split_factor=4), Shard(0)]),
             ((4, 2), [_StridedShard(0, split_factor=2), Shard(0)]),
             ((2, 4), [_StridedShard(1, split_factor=4), Shard(1)]),
             ((2, 2, 2), [Replicate(), _StridedShard(0, split_factor=2), Shard(0)]),
             ((2, 2, 2), [_StridedShard(0, split_factor=2), Replicate(), Shard(0)]),
             ((2, 2, 2), [_StridedShard(0, split_factor=2), Shard(0), Shard(1)])]
    checked = 0
    for rank in range(WORLD):
        _as_rank(rank)
        for sizes, placements in cases:
            dm = DeviceMesh("cpu", torch.arange(WORLD).view(sizes))
            for shape in [(16, 8), (13, 7), (5, 11), (3, 3)]:
                lay = m2n.Layout.from_device_mesh(dm, placements, shape, torch.float32)
                local_shape, offset = compute_local_shape_and_global_offset(shape, dm, placements)
                box = lay.local_box(rank)
                assert box is not None and box[1] == tuple(local_shape), (sizes, placements, shape, rank, box)
                if all(n > 0 for n in local_shape):
                    assert box[0] == tuple(offset), (sizes, placements, shape, rank, box, offset)
                checked += 1
    assert checked == WORLD * len(cases) * 4
    # Local strides are given per position of the DeviceMesh; they follow the ranks through the reordering.
    dm = DeviceMesh("cpu", torch.arange(WORLD).view(2, 4))
    strides = [(r + 1, 1) for r in range(WORLD)]
    lay = m2n.Layout.from_device_mesh(dm, [_StridedShard(0, split_factor=4), Shard(0)], (16, 8), torch.float32,
                                      local_strides=strides)
    assert lay.mesh_ranks != list(range(WORLD))  # reordered
    for r in range(WORLD):
        assert lay.local_strides[lay.mesh_ranks.index(r)] == (r + 1, 1)


def test_explicit_layouts_and_refusals():
    boxes = [((0, 0), (4, 6)), ((4, 0), (4, 6))]
    lay = m2n.Layout((8, 6), torch.float32, mesh=[5, 2], boxes=boxes)
    assert lay.local_box(2) == ((4, 0), (4, 6)) and lay.local_box(0) is None
    with pytest.raises(m2n.NcclError):
        m2n.Layout((8, 6), torch.float32, mesh=[0, 0], placements=[m2n.shard(0)]).validate()  # a rank twice
    with pytest.raises(m2n.NcclError, match="placements or boxes"):
        m2n.Layout((8, 6), torch.float32, mesh=[0, 1])
    with pytest.raises(m2n.NcclError, match="ragged"):
        m2n.Layout((8, 6), torch.float32, mesh=[[0, 1], [2]], placements=[0, 1])


def test_host_plan_through_python():
    # TP2 rows -> TP2 columns on ranks 0 and 1, 8 x 6 bf16: each rank keeps a quarter, sends and receives one.
    src = m2n.Layout((8, 6), torch.bfloat16, mesh=[0, 1], placements=[m2n.shard(0)])
    dst = m2n.Layout((8, 6), torch.bfloat16, mesh=[0, 1], placements=[m2n.shard(1)])
    for rank in (0, 1):
        with m2n.HostPlan([("w", src, dst)], rank=rank, n_ranks=2) as plan:
            elems = {k: sum(_n(t["extent"]) for t in plan.transfers(k)) for k in ("sends", "recvs", "copies")}
            assert elems == {"sends": 12, "recvs": 12, "copies": 12}, (rank, elems)
            assert plan.info["bytes"] == {"sends": 24, "recvs": 24, "copies": 24}
            assert plan.info["total_bytes"] == 8 * 6 * 2
            for t in plan.transfers("sends"):
                assert (t["src_rank"], t["dst_rank"]) == (rank, 1 - rank)
    with pytest.raises(m2n.NcclError, match="kind"):
        m2n.HostPlan([("w", src, dst)], rank=0, n_ranks=2).transfers("everything")


def test_host_plan_refuses_a_gap():
    src = m2n.Layout((8,), torch.float32, mesh=[0, 1], boxes=[((0,), (3,)), ((5,), (3,))])
    dst = m2n.Layout((8,), torch.float32, mesh=[2], placements=[m2n.REPLICATE])
    with pytest.raises(m2n.NcclError, match="w"):
        m2n.HostPlan([("w", src, dst)], rank=2, n_ranks=3)


def _n(extent):
    p = 1
    for e in extent:
        p *= e
    return p


def test_execute_argument_checks_without_a_gpu():
    """Plan.execute's Python checks (the C plan is not needed for them): every refusal names the tensor."""
    import unittest.mock as um

    from nccl.m2n import Plan, _Side

    lay = m2n.Layout((4, 6), torch.float32, mesh=[0], placements=[m2n.REPLICATE])
    strided = m2n.Layout((4, 6), torch.float32, mesh=[0], placements=[m2n.REPLICATE], local_strides=[(1, 4)])
    batch = [("a", lay, lay), ("b", lay, strided)]
    plan = Plan.__new__(Plan)  # the checks only: no communicator, no C plan
    plan.tensors, plan._index = batch, {"a": 0, "b": 1}
    src, dst = _Side(batch, 1, 0), _Side(batch, 2, 0)
    good = torch.zeros(4, 6)
    with pytest.raises(m2n.NcclError, match="source tensor 'a' must be a CUDA tensor"):
        plan._pointers([good, good], src)  # a CPU tensor
    with um.patch.object(torch.Tensor, "is_cuda", new=property(lambda self: True)):
        assert len(plan._pointers([good, good], src)) == 2
        cases = [
            ([[1, 2], good], src, "source tensor 'a' must be a CUDA tensor"),
            ([torch.zeros(4, 5), good], src, r"source tensor 'a' has shape \(4, 5\); this rank holds \(4, 6\)"),
            ([good.t().contiguous().t(), good], src, "source tensor 'a' is not contiguous"),
            ([torch.zeros(4, 6, dtype=torch.bfloat16), good], src, "source tensor 'a' has dtype torch.bfloat16"),
            ([good, good], dst, r"destination tensor 'b' has strides \(6, 1\); its layout says \(1, 4\)"),
            ([good], src, "1 source tensors for a plan of 2"),
            ({"a": good, "c": good}, src, "source tensor 'c' is not in the plan"),
        ]
        for tensors, side, message in cases:
            with pytest.raises(m2n.NcclError, match=message):
                plan._pointers(tensors, side)
        ok = plan._pointers([good, torch.zeros(6, 4).t()], dst)  # column-major storage, as the layout says
        assert ok[1] is not None


def test_fp8_scales_entries_plan_on_the_host():
    """An e4m3 destination of a bf16 tensor, followed by its scales entry (no layouts): the host plan moves values
    and scales (the scales' boxes the blocks of each part's columns); a part off the 128-column grid is refused."""
    src = m2n.Layout((4, 640), torch.bfloat16, mesh=[0, 1], placements=[m2n.shard(0)])
    dst = m2n.Layout((4, 640), torch.float8_e4m3fn, mesh=[2, 3], placements=[m2n.shard(1)])  # 320 columns each
    with pytest.raises(m2n.NcclError, match=r"holds columns \[0, 320\): every part must hold whole blocks"):
        m2n.HostPlan([("w", src, dst), ("w.scales", None, None)], rank=0, n_ranks=4)
    src = m2n.Layout((4, 700), torch.bfloat16, mesh=[0, 1], placements=[m2n.shard(0)])
    dst = m2n.Layout((4, 700), torch.float8_e4m3fn, mesh=[[2, 3], [0, 1]],
                     boxes=[((0, 0), (2, 640)), ((0, 640), (2, 60)), ((2, 0), (2, 640)), ((2, 640), (2, 60))])
    scales = dst.fp8_scales()
    assert scales.global_shape == (4, 6) and scales.local_box(3) == ((0, 5), (2, 1))  # columns [640, 700)
    assert scales.local_box(0) == ((2, 0), (2, 5))
    with m2n.HostPlan([("w", src, dst), ("w.scales", None, None)], rank=0, n_ranks=4) as plan:
        sent = plan.transfers("sends") + plan.transfers("copies")
    assert {t["tensor"] for t in sent} == {0, 1}  # rank 0 holds source rows 0-1: values and scales leave it
    with pytest.raises(m2n.NcclError, match="the next entry must be its scales"):
        m2n.HostPlan([("w", src, dst)], rank=0, n_ranks=4)
    # 128 x 128 blocks: rows too (200 rows: blocks [0, 128) and [128, 200)).
    src = m2n.Layout((200, 700), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE])
    dst = m2n.Layout((200, 700), torch.float8_e4m3fn, mesh=[[2], [3]], placements=[m2n.REPLICATE, m2n.REPLICATE])
    assert dst.fp8_scales(128).global_shape == (2, 6) and dst.fp8_scales(128).local_box(3) == ((0, 0), (2, 6))
    rows = m2n.Layout((256, 700), torch.float8_e4m3fn, mesh=[2, 3], placements=[m2n.shard(0)])
    assert rows.fp8_scales(128).local_box(3) == ((1, 0), (1, 6))
    with m2n.HostPlan([("w", src, dst), ("w.scales", None, None)], rank=3, n_ranks=4, fp8_block_rows=128) as plan:
        assert {t["tensor"] for t in plan.transfers("recvs")} == {0, 1}
    with pytest.raises(m2n.NcclError, match=r"holds rows \[0, 100\)"):
        m2n.HostPlan([("w", m2n.Layout((200, 256), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE]),
                       m2n.Layout((200, 256), torch.float8_e4m3fn, mesh=[2, 3], placements=[m2n.shard(0)])),
                      ("w.scales", None, None)], rank=0, n_ranks=4, fp8_block_rows=128)


def test_zero_copy_arguments_are_checked_without_a_gpu():
    from nccl.m2n import Plan
    from nccl._ext.errors import NcclInvalidArgument

    with pytest.raises(NcclInvalidArgument, match="zero_copy 'sideways': None, 'pull' or 'push'"):
        Plan([], group=None, zero_copy="sideways")  # refused before any communicator is made
    with pytest.raises(NcclInvalidArgument, match="register: a contiguous CUDA tensor"):
        m2n.register(None, torch.zeros(4))
    assert ctypes_field_names(m2n._ExecConfig)[-1] == "zeroCopy"


def ctypes_field_names(cls):
    return [name for name, _ in cls._fields_]
