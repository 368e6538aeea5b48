"""nccl.m2n.Plan on a GPU. Any rank count (1; several under torchrun, on one GPU with --one-gpu nodes): random
batches between random layouts (meshes of any ranks, 1-D and 2-D, Shard and Replicate, column-major destinations)
against slices of the global tensor, destinations poisoned first; a captured execute replayed on new data; metadata
that differs on one rank refused on every rank; DTensor.redistribute on a CPU mesh. 1 rank only: a transposing local
reshard and a batch by name with a wrongly shaped tensor refused."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.m2n as m2n  # noqa: E402

pytestmark = pytest.mark.gpu


def test_transposing_local_reshard(one_rank_world):
    R, C = 37, 53
    src = m2n.Layout((R, C), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE])
    dst = m2n.Layout((R, C), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE], local_strides=[(1, R)])
    x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
    y = torch.full((C, R), float("nan"), device="cuda", dtype=torch.bfloat16)  # column-major storage of [R, C]
    with m2n.Plan([("w", src, dst)]) as plan:
        plan.execute([x], [y.t()])
        torch.cuda.synchronize()
    assert torch.equal(y.t(), x)


def test_a_batch_by_name(one_rank_world):
    shapes = {"a": (64, 32), "b": (7,), "c": (5, 3, 2)}
    tensors = [(n, m2n.Layout(s, torch.float32, mesh=[0], placements=[m2n.REPLICATE]),
                m2n.Layout(s, torch.float32, mesh=[0], placements=[m2n.REPLICATE])) for n, s in shapes.items()]
    src = {n: torch.randn(s, device="cuda") for n, s in shapes.items()}
    dst = {n: torch.full(s, float("nan"), device="cuda") for n, s in shapes.items()}
    with m2n.Plan(tensors) as plan:
        for _ in range(3):  # a plan is reused
            for t in dst.values():
                t.fill_(float("nan"))
            plan.execute(src, dst)
            torch.cuda.synchronize()
            assert all(torch.equal(src[n], dst[n]) for n in shapes)
        with pytest.raises(m2n.NcclError, match="has shape"):
            plan.execute(src, {**dst, "a": torch.empty(3, 3, device="cuda")})
        # New tensors on a used plan (the repeat path must not keep the old pointers).
        src2 = {n: torch.randn(s, device="cuda") for n, s in shapes.items()}
        dst2 = {n: torch.full(s, float("nan"), device="cuda") for n, s in shapes.items()}
        plan.execute(src2, dst2)
        torch.cuda.synchronize()
        assert all(torch.equal(src2[n], dst2[n]) for n in shapes)
        assert all(torch.equal(src[n], dst[n]) for n in shapes)  # the old destinations untouched


# -- any rank count ---------------------------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.uint8]


def _shared_seed(rank):
    box = [int(torch.randint(0, 2**31, (1,))) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _poison(shape, dtype):
    return torch.full(shape, float("nan") if dtype.is_floating_point else 123, dtype=dtype, device="cuda")


def _random_layout(gen, shape, dtype, size, column_major=False):
    """A mesh of a random subset of the ranks (1-D, or 2-D when it has an even count of at least 4) and one random
    placement per mesh axis."""
    k = int(torch.randint(1, size + 1, (1,), generator=gen))
    ranks = torch.randperm(size, generator=gen)[:k].tolist()
    mesh = [ranks[:k // 2], ranks[k // 2:]] if k >= 4 and k % 2 == 0 and bool(torch.rand(1, generator=gen) < 0.5) \
        else ranks
    axes = 2 if isinstance(mesh[0], list) else 1
    placements = [m2n.REPLICATE if bool(torch.rand(1, generator=gen) < 0.3)
                  else m2n.shard(int(torch.randint(0, len(shape), (1,), generator=gen))) for _ in range(axes)]
    lay = m2n.Layout(shape, dtype, mesh=mesh, placements=placements)
    if not column_major or len(shape) != 2:
        return lay
    strides = []
    for r in lay.mesh_ranks:  # each position's local shape (a, b) stored column-major: strides (1, a)
        _, (a, _) = lay.local_box(r)
        strides.append((1, max(1, a)))
    return m2n.Layout(shape, dtype, mesh=mesh, placements=placements, local_strides=strides)


def _local(t, box):
    off, shp = box
    return t[tuple(slice(o, o + n) for o, n in zip(off, shp))]


def _draw_batch(gen, size, n_tensors):
    batch = []
    for i in range(n_tensors):
        nd = int(torch.randint(1, 4, (1,), generator=gen))
        shape = tuple(int(torch.randint(1, 24, (1,), generator=gen)) for _ in range(nd))
        dtype = DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=gen))]
        src = _random_layout(gen, shape, dtype, size)
        dst = _random_layout(gen, shape, dtype, size, column_major=bool(torch.rand(1, generator=gen) < 0.3))
        batch.append(("t%d" % i, src, dst, shape, dtype))
    return batch


def _globals(gen, batch):
    out = []
    for _, _, _, shape, dtype in batch:
        g = torch.randn(shape, generator=gen) * 100
        out.append(g.to(dtype) if dtype.is_floating_point else g.abs().to(dtype))
    return out


def _sides(rank, batch, globals_):
    """This rank's source tensors (slices of the globals) and poisoned destinations (with the layout's strides)."""
    srcs, dsts = [], []
    for (_, s, d, _, dtype), g in zip(batch, globals_):
        sb, db = s.local_box(rank), d.local_box(rank)
        srcs.append(None if sb is None else _local(g, sb).contiguous().cuda())
        if db is None:
            dsts.append(None)
        elif d.local_strides is not None:  # column-major: the transpose of a row-major [b, a]
            a, b = db[1]
            dsts.append(_poison((b, a), dtype).t())
        else:
            dsts.append(_poison(db[1], dtype))
    return srcs, dsts


def _everywhere(bad):
    """Asserts on every rank that no rank found anything `bad` (a rank failing alone would leave the others in the
    next collective)."""
    n = torch.tensor([len(bad)])
    dist.all_reduce(n)
    assert int(n) == 0, "%d mismatches on all ranks; here: %s" % (int(n), bad[:5])


def _check(rank, batch, globals_, dsts):
    bad = [name for (name, _, d, _, _), g, y in zip(batch, globals_, dsts)
           if y is not None and not torch.equal(y.cpu(), _local(g, d.local_box(rank)))]
    _everywhere(bad)


@pytest.fixture(scope="module")
def comm(world):
    """One communicator for the many plans of a test (a Plan given a torch group makes its own)."""
    with m2n.Communicator() as c:
        yield c


def test_random_batches_against_the_global_tensor(world, comm):
    rank, size = world
    gen = torch.Generator().manual_seed(_shared_seed(rank))
    moved = 0
    for _ in range(25):
        batch = _draw_batch(gen, size, int(torch.randint(1, 5, (1,), generator=gen)))
        globals_ = _globals(gen, batch)
        srcs, dsts = _sides(rank, batch, globals_)
        with m2n.Plan([(n, s, d) for n, s, d, _, _ in batch], comm, timeout_s=20) as plan:
            plan.execute(srcs, dsts)
            torch.cuda.synchronize()
        _check(rank, batch, globals_, dsts)
        moved += sum(y.numel() for y in dsts if y is not None)
    assert moved > 0


def test_a_captured_execute_replays_on_new_data(world, comm):
    rank, size = world
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 1)
    batch = _draw_batch(gen, size, 3)
    with m2n.Plan([(n, s, d) for n, s, d, _, _ in batch], comm, timeout_s=20) as plan:
        globals_ = _globals(gen, batch)
        srcs, dsts = _sides(rank, batch, globals_)
        plan.execute(srcs, dsts)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.execute(srcs, dsts)
        for _ in range(3):
            globals_ = _globals(gen, batch)
            fresh, _ = _sides(rank, batch, globals_)
            for x, f in zip(srcs, fresh):
                if x is not None:
                    x.copy_(f)
            for y, (_, _, _, _, dtype) in zip(dsts, batch):
                if y is not None:
                    y.fill_(float("nan") if dtype.is_floating_point else 123)
            graph.replay()
            torch.cuda.synchronize()
            _check(rank, batch, globals_, dsts)


def test_metadata_differing_on_one_rank_is_refused_everywhere(world):
    rank, size = world
    if size == 1:
        pytest.skip("one rank cannot differ from another")
    lay = m2n.Layout((8, 8), torch.float32, mesh=list(range(size)), placements=[m2n.shard(0)])
    name = "w_other" if rank == size - 1 else "w"
    with pytest.raises(m2n.NcclError, match="disagree"):
        m2n.Plan([(name, lay, lay)], timeout_s=20)


@pytest.mark.parametrize("src_p,dst_p", [("S0", "S1"), ("S0", "R"), ("R", "S0"), ("S1", "S0")])
def test_dtensor_redistribute_agrees(world, src_p, dst_p):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    rank, size = world
    place = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}
    mesh = init_device_mesh("cpu", (size,))
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 2)
    full = torch.randn(37, 53, generator=gen).to(torch.bfloat16)
    a = distribute_tensor(full, mesh, [place[src_p]])
    b = a.redistribute(mesh, [place[dst_p]])
    src, dst = m2n.Layout.from_dtensor(a), m2n.Layout.from_dtensor(b)
    y = _poison(tuple(b.to_local().shape), torch.bfloat16)
    with m2n.Plan([("w", src, dst)], timeout_s=20) as plan:
        plan.execute([a.to_local().contiguous().cuda()], [y])
        torch.cuda.synchronize()
    _everywhere([] if torch.equal(y.cpu(), b.to_local()) else [(src_p, dst_p)])


def test_reshard_one_tensor_and_a_dtensor(world, comm):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    rank, size = world
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 3)
    full = (torch.randn(29, 19, generator=gen) * 10).to(torch.bfloat16)
    src = m2n.Layout(full.shape, torch.bfloat16, mesh=list(range(size)), placements=[m2n.shard(0)])
    dst = m2n.Layout(full.shape, torch.bfloat16, mesh=list(reversed(range(size))), placements=[m2n.shard(1)])
    y = m2n.reshard(_local(full, src.local_box(rank)).contiguous().cuda(), dst, src_layout=src, group=comm)
    _everywhere([] if torch.equal(y.cpu(), _local(full, dst.local_box(rank))) else ["reshard"])
    # A DTensor in, (DeviceMesh, placements) out: a DTensor back, on this rank's part of the new placement.
    mesh = DeviceMesh("cuda", list(range(size)))
    dt = DTensor.from_local(_local(full, src.local_box(rank)).contiguous().cuda(), mesh, [Shard(0)], run_check=False,
                            shape=full.shape, stride=full.stride())
    out = m2n.reshard(dt, (mesh, [Shard(1)]), group=comm)
    assert isinstance(out, DTensor) and out.placements == (Shard(1),) and tuple(out.shape) == tuple(full.shape)
    want = m2n.Layout(full.shape, torch.bfloat16, mesh=list(range(size)), placements=[m2n.shard(1)])
    _everywhere([] if torch.equal(out.to_local().cpu(), _local(full, want.local_box(rank))) else ["dtensor"])


def test_reshards_on_a_group_share_one_communicator(world, comm):
    """reshard on a torch group makes its communicator once (retained); on a Communicator, retain() spares each
    call a split. Results against slices of the global tensor either way."""
    from nccl.m2n import sync

    rank, size = world
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 5)
    src = m2n.Layout((24, 40), torch.float32, mesh=list(range(size)), placements=[m2n.shard(0)])
    dst = m2n.Layout((24, 40), torch.float32, mesh=list(range(size)), placements=[m2n.shard(1)])
    bad, made = [], []
    m2n.retain(comm)
    try:
        for i in range(3):
            full = torch.randn(24, 40, generator=gen)
            x = _local(full, src.local_box(rank)).contiguous().cuda()
            y = m2n.reshard(x, dst, src_layout=src, group=None if i < 2 else comm)
            if not torch.equal(y.cpu(), _local(full, dst.local_box(rank))):
                bad.append(i)
            made.append(dict(sync._COMMUNICATORS))
    finally:
        m2n.release(comm)
    _everywhere(bad)
    assert len(made[0]) == 1 and made[0] == made[1] == made[2]  # the torch group's, made once
    m2n.release_communicators()
    assert not sync._COMMUNICATORS


def _fp8_reference(full, block_rows=1):
    """[R, C] -> e4m3 values and fp32 scales, one per block_rows x 128, as torch computes them (blocks at the ends:
    their own elements)."""
    R, C = full.shape
    rb, cb = -(-R // block_rows), -(-C // 128)
    pad = torch.nn.functional.pad(full.float(), (0, cb * 128 - C, 0, rb * block_rows - R))
    blocks = pad.view(rb, block_rows, cb, 128)
    scales = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-4) / 448.0
    q = (blocks / scales[:, None, :, None]).view(rb * block_rows, cb * 128)[:R, :C].to(torch.float8_e4m3fn)
    return q, scales


@pytest.mark.parametrize("block_rows", [1, 128])
def test_fp8_with_block_scales_from_bf16(world, comm, block_rows):
    """bf16 (rows over every rank; for 128 x 128 blocks, on rank 0) -> e4m3 replicated everywhere with its scales
    (the entry after it, no layouts), against torch's own quantisation of the global tensor; destinations poisoned
    first."""
    rank, size = world
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 6)
    R, C = (6, 300) if block_rows == 1 else (200, 300)
    full = (torch.randn(R, C, generator=gen) * 3).to(torch.bfloat16)
    full[0, :5] *= 100  # an outlier block
    src = m2n.Layout((R, C), torch.bfloat16, mesh=list(range(size)) if block_rows == 1 else [0],
                     placements=[m2n.shard(0) if block_rows == 1 else m2n.REPLICATE])
    dst = m2n.Layout((R, C), torch.float8_e4m3fn, mesh=list(range(size)), placements=[m2n.REPLICATE])
    want_q, want_s = _fp8_reference(full, block_rows)
    y = torch.full((R, C), 0xff, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    s = torch.full(tuple(want_s.shape), float("nan"), device="cuda")
    box = src.local_box(rank)
    x = _local(full, box).contiguous().cuda() if box is not None and box[1][0] > 0 else None
    with m2n.Plan([("w", src, dst), ("w.scales", None, None)], comm, timeout_s=20, fp8_block_rows=block_rows) as plan:
        plan.execute([x, None], [y, s])
        torch.cuda.synchronize()
    ok = torch.equal(y.cpu().view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s.cpu(), want_s)
    _everywhere([] if ok else ["fp8"])


@pytest.mark.parametrize("colocated,convert", [(False, False), (True, False), (False, True), (True, True)])
def test_weight_sync_from_trainer_to_inference_ranks(world, comm, colocated, convert):
    """fp32 trainer weights; inference tensors fp32, or bf16 (convert: converted on the way, as torch rounds)."""
    rank, size = world
    if size == 1 and not colocated:
        pytest.skip("disjoint trainer and inference ranks need two ranks")
    half = max(1, size // 2)
    trainer_ranks = list(range(size)) if colocated else list(range(half))
    infer_ranks = list(range(size)) if colocated else list(range(half, size))
    shapes = {"embed": (50, 16), "layers.0.qkv": (48, 16), "layers.0.o": (16, 16), "layers.0.norm": (16,)}
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 4)
    fulls = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    trainer, inference = {}, {}
    for n, full in fulls.items():
        src = m2n.Layout(full.shape, torch.float32, mesh=trainer_ranks, placements=[m2n.shard(0)])
        p = m2n.REPLICATE if full.dim() == 1 else m2n.shard(1 if n.endswith(".o") else 0)  # vLLM-style TP
        idt = torch.bfloat16 if convert else torch.float32
        dst = m2n.Layout(full.shape, idt, mesh=infer_ranks, placements=[p])
        if rank in trainer_ranks:
            trainer["model." + n] = (_local(full, src.local_box(rank)).contiguous().cuda(), src)
        if rank in infer_ranks:
            inference[n] = (_poison(dst.local_box(rank)[1], idt), dst)
    with m2n.WeightSync(comm, timeout_s=20) as ws:
        ws.plan(trainer=trainer, inference=inference, name_map=lambda n: "model." + n)
        assert ws.names == sorted(shapes)
        for step in range(2):
            ws.sync()
            torch.cuda.synchronize()
            _everywhere([(n, step) for n, (y, dst) in inference.items()
                         if not torch.equal(y.cpu(), _local(fulls[n] + step, dst.local_box(rank)).to(y.dtype))])
            for n, (x, _) in trainer.items():  # a training step: the trainer's weights change in place
                x.add_(1)


def test_weight_sync_into_fp8_inference_weights(world, comm):
    """bf16 trainer rows -> fp8 e4m3 inference weights (rows over the inference ranks) with their scales, a layer's
    norm kept bf16; against torch's quantisation of the global weights, two steps."""
    rank, size = world
    shapes = {"layers.0.mlp": (16, 384), "layers.0.norm": (384,)}
    gen = torch.Generator().manual_seed(_shared_seed(rank) + 7)
    fulls = {n: (torch.randn(s, generator=gen) * 2).to(torch.bfloat16) for n, s in shapes.items()}
    trainer, inference = {}, {}
    for n, full in fulls.items():
        src = m2n.Layout(full.shape, torch.bfloat16, mesh=list(range(size)), placements=[m2n.shard(0)])
        trainer[n] = (_local(full, src.local_box(rank)).contiguous().cuda(), src)
        if full.dim() == 1:
            dst = m2n.Layout(full.shape, torch.bfloat16, mesh=list(reversed(range(size))), placements=[m2n.REPLICATE])
            inference[n] = (_poison(dst.local_box(rank)[1], torch.bfloat16), dst)
            continue
        dst = m2n.Layout(full.shape, torch.float8_e4m3fn, mesh=list(reversed(range(size))), placements=[m2n.shard(0)])
        shape = dst.local_box(rank)[1]
        values = torch.full(shape, 0xff, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        scales = torch.full(dst.fp8_scales().local_box(rank)[1], float("nan"), device="cuda")
        inference[n] = (values, dst, scales)
    with m2n.WeightSync(comm, timeout_s=20) as ws:
        ws.plan(trainer=trainer, inference=inference)
        for step in range(2):
            ws.sync()
            torch.cuda.synchronize()
            bad = []
            for n, entry in inference.items():
                if len(entry) == 2:
                    y, dst = entry
                    if not torch.equal(y.cpu(), _local(fulls[n] + step, dst.local_box(rank))):
                        bad.append(n)
                    continue
                values, dst, scales = entry
                want_q, want_s = _fp8_reference(fulls[n] + step)
                box = dst.local_box(rank)
                if not (torch.equal(values.cpu().view(torch.uint8), _local(want_q, box).view(torch.uint8))
                        and torch.equal(scales.cpu(), _local(want_s, dst.fp8_scales().local_box(rank)))):
                    bad.append(n)
            _everywhere([(n, step) for n in bad])
            for x, _ in trainer.values():
                x.add_(1)
