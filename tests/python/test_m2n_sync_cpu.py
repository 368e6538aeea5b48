"""nccl.m2n on the CPU, what reshard and WeightSync stand on: layouts as plain data (round trips over random
layouts), rank translation, WeightSync's batch matching and its refusals, and a bad entry on one rank reaching the
others (a single-process gloo group)."""

import pytest

torch = pytest.importorskip("torch")

import nccl.m2n as m2n  # noqa: E402
from nccl.m2n import sync  # noqa: E402


def _random_layout(gen, world=8):
    nd = int(torch.randint(1, 4, (1,), generator=gen))
    shape = [int(torch.randint(1, 30, (1,), generator=gen)) for _ in range(nd)]
    k = int(torch.randint(1, world + 1, (1,), generator=gen))
    ranks = torch.randperm(world, generator=gen)[:k].tolist()
    mesh = [ranks[:k // 2], ranks[k // 2:]] if k >= 2 and k % 2 == 0 else ranks
    axes = 2 if isinstance(mesh[0], list) else 1
    pick = int(torch.randint(0, 3, (1,), generator=gen))
    if pick == 0:  # explicit boxes: each position a copy of the whole tensor
        n = k
        return m2n.Layout(shape, torch.float32, mesh, boxes=[([0] * nd, shape)] * n)
    placements = [m2n.REPLICATE if bool(torch.rand(1, generator=gen) < 0.3)
                  else m2n.shard(int(torch.randint(0, nd, (1,), generator=gen))) for _ in range(axes)]
    strides = None
    if pick == 2:
        strides = [tuple(int(torch.randint(1, 9, (1,), generator=gen)) for _ in range(nd)) for _ in range(k)]
    return m2n.Layout(shape, torch.bfloat16, mesh, placements=placements, local_strides=strides)


def test_layouts_round_trip_as_plain_data():
    gen = torch.Generator().manual_seed(5)
    for _ in range(300):
        lay = _random_layout(gen)
        again = m2n.Layout.from_dict(lay.to_dict())
        assert again == lay and again.mesh_dims == lay.mesh_dims
        for r in range(8):
            assert again.local_box(r) == lay.local_box(r)


def test_with_ranks_moves_every_position():
    lay = m2n.Layout((8, 4), torch.float32, mesh=[[0, 1], [2, 3]], placements=[m2n.shard(0), m2n.shard(1)])
    moved = lay.with_ranks(lambda r: r + 4)
    assert moved.mesh_ranks == [4, 5, 6, 7] and moved.mesh_dims == [2, 2]
    for r in range(4):
        assert moved.local_box(r + 4) == lay.local_box(r) and moved.local_box(r) is None


def _lay(shape, ranks, p, dtype=torch.bfloat16):
    return m2n.Layout(shape, dtype, mesh=ranks, placements=[p]).to_dict()


def _rank(src=None, dst=None):
    return {"src": src or {}, "dst": dst or {}, "error": None}


def test_match_by_name_with_a_map():
    trainer = {"model.w": _lay((8, 4), [0, 1], m2n.shard(0)), "model.b": _lay((4,), [0, 1], m2n.REPLICATE),
               "optimizer.only": _lay((3,), [0, 1], m2n.REPLICATE)}
    inference = {"w": _lay((8, 4), [2, 3], m2n.shard(1)), "b": _lay((4,), [2, 3], m2n.REPLICATE)}
    everyone = [_rank(src=trainer), _rank(src=trainer), _rank(dst=inference), _rank(dst=inference)]
    got = sync.match(everyone, lambda n: "model." + n)
    assert [(n, t) for n, t, _, _ in got] == [("b", "model.b"), ("w", "model.w")]  # sorted; unrequested dropped
    assert got[1][2] == m2n.Layout.from_dict(trainer["model.w"]) and got[1][3].placements == [1]
    assert [n for n, *_ in sync.match(everyone, {"w": "model.w", "b": "model.b"})] == ["b", "w"]


def test_match_takes_the_conversions_the_executor_does():
    for a, b in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
        everyone = [_rank(src={"w": _lay((4, 2), [0], m2n.REPLICATE, a)}),
                    _rank(dst={"w": _lay((4, 2), [1], m2n.shard(0), b)})]
        (name, _, s, d), = sync.match(everyone)
        assert name == "w" and s.dtype != d.dtype


def test_match_takes_fp8_and_adds_its_scales_entry():
    for a in (torch.float32, torch.bfloat16):
        everyone = [_rank(src={"w": _lay((4, 256), [0], m2n.REPLICATE, a), "b": _lay((4,), [0], m2n.REPLICATE)}),
                    _rank(dst={"w": _lay((4, 256), [1], m2n.shard(0), torch.float8_e4m3fn),
                               "b": _lay((4,), [1], m2n.REPLICATE)})]
        entries = sync.batch(sync.match(everyone))
        assert [(n, s is None, d is None) for n, s, d in entries] == [("b", False, False), ("w", False, False),
                                                                         ("w.scales", True, True)]
        # The host planner takes that batch: values and scales both reach rank 1.
        with m2n.HostPlan(entries, rank=1, n_ranks=2) as plan:
            assert {t["tensor"] for t in plan.transfers("recvs")} == {0, 1, 2}


@pytest.mark.parametrize("everyone,message", [
    ([_rank(src={"a": _lay((4,), [0], m2n.REPLICATE)}), _rank(dst={"b": _lay((4,), [1], m2n.REPLICATE)})],
     "inference tensor 'b' has no trainer tensor 'b'"),
    ([_rank(src={"a": _lay((4,), [0], m2n.REPLICATE)}), _rank(dst={"a": _lay((5,), [1], m2n.REPLICATE)})],
     r"'a': trainer \(4,\) type 9, inference \(5,\) type 9"),
    ([_rank(src={"a": _lay((4,), [0], m2n.REPLICATE, torch.int32)}),
      _rank(dst={"a": _lay((4,), [1], m2n.REPLICATE)})], "trainer .* type 2, inference .* type 9"),
    ([_rank(src={"a": _lay((4,), [0, 1], m2n.shard(0))}), _rank(src={"a": _lay((4,), [0, 1], m2n.REPLICATE)})],
     "ranks describe trainer tensor 'a' differently"),
])
def test_match_refusals(everyone, message):
    with pytest.raises(m2n.NcclError, match=message):
        sync.match(everyone)


def test_a_bad_entry_is_raised_after_the_exchange(one_process_gloo):
    with pytest.raises(m2n.NcclError, match=r"rank 0: trainer 'w': give a DTensor or \(tensor, Layout\)"):
        m2n.WeightSync().plan(trainer={"w": torch.zeros(3)})


def test_sync_before_plan_is_refused():
    with pytest.raises(m2n.NcclError, match="plan"):
        m2n.WeightSync().sync()


def test_reshard_needs_a_layout_for_a_plain_tensor():
    with pytest.raises(m2n.NcclError, match="needs its Layout"):
        m2n.reshard(torch.zeros(3), m2n.Layout((3,), torch.float32, mesh=[0], placements=[m2n.REPLICATE]))


def test_reshard_plans_are_released_before_their_communicator_goes(monkeypatch):
    # No NCCL here: a Communicator whose NCCL calls are recorded (its handle a stand-in) and m2n's C calls too.
    from nccl._ext import comm as ext_comm

    calls = []
    monkeypatch.setattr(ext_comm, "_nccl_call", lambda name, *a: calls.append(name))
    monkeypatch.setattr(sync, "_call", lambda name, *a: calls.append(name))
    for end in ("close", "abort"):
        calls.clear()
        c = object.__new__(m2n.Communicator)
        c._comm, c.before_close = ext_comm.ctypes.c_void_p(1), []
        sync._release_on_close(c)
        sync._release_on_close(c)  # once per communicator
        getattr(c, end)()
        getattr(c, end)()  # idempotent
        assert calls == ["ncclM2nCommRelease"] + (["ncclCommFinalize", "ncclCommDestroy"] if end == "close"
                                                  else ["ncclCommAbort"])
