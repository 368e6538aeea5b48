"""nccl.ep.deepep (the DeepEP drop-in) on the CPU: the layout against brute force, and every refusal with its
message, on torch's fake process group (4 ranks in one process, no communication). The Low-Latency methods'
translation into nccl.ep calls, the shrink-mode masks included (DeepEP's 1 = masked against nccl.ep's 1 = active),
runs against a stand-in Group that records them. Needs torch."""

import os
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.ep.deepep as deep_ep  # noqa: E402
import nccl.ep as ep  # noqa: E402
from nccl.ep import NcclInvalidArgument, NcclInvalidUsage  # noqa: E402

R, E = 4, 32


@pytest.fixture(scope="module")
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=R)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def buffer(fake_world):
    return deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)


def test_surface():
    assert set(deep_ep.__all__) == {"Buffer", "Config", "EventOverlap", "topk_idx_t"}
    assert deep_ep.topk_idx_t is torch.int64


@pytest.mark.parametrize("seed", range(20))
def test_dispatch_layout_matches_brute_force(buffer, seed):
    gen = torch.Generator().manual_seed(seed)
    T, K = int(torch.randint(0, 300, (1,), generator=gen)), 6
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]) if T else torch.zeros(0, K)
    idx = idx.long()
    idx[torch.rand(idx.shape, generator=gen) < 0.2] = -1
    per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(idx, E)
    want_in_rank = torch.zeros(T, R, dtype=torch.bool)
    want_expert = torch.zeros(E, dtype=torch.int32)
    for t in range(T):
        for e in idx[t].tolist():
            if e >= 0:
                want_in_rank[t, e // (E // R)] = True
                want_expert[e] += 1
    assert per_rdma is None and event.event is None
    assert per_rank.dtype == torch.int32 and per_expert.dtype == torch.int32 and in_rank.dtype == torch.bool
    assert torch.equal(in_rank, want_in_rank)
    assert torch.equal(per_rank, want_in_rank.sum(0).int())
    assert torch.equal(per_expert, want_expert)


def test_num_rdma_bytes_is_the_high_throughput_rail_budget(fake_world, monkeypatch):
    # DeepEP's RDMA buffer size becomes the High-Throughput group's rail_staging_bytes_max (its rounds shrink to fit
    # it across NVLink domains; inside one domain the library ignores it); 0 is no limit.
    made = []

    class _Recorder:
        def __init__(self, group, **kwargs):
            made.append(kwargs)

    monkeypatch.setattr(deep_ep, "Group", _Recorder)
    x, idx = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    for rdma, want in ((int(1e9), int(1e9)), (0, 0)):
        deep_ep.Buffer(dist.group.WORLD, int(1e9), rdma)._group_for(x, idx, E)
        assert made[-1]["rail_staging_bytes_max"] == want


def test_tokens_per_rdma_rank_follows_deepeps_nodes_of_eight():
    from nccl.ep.deepep import _tokens_per_rdma_rank

    assert _tokens_per_rdma_rank(torch.ones(5, 8, dtype=torch.bool)) is None  # intranode: up to 8 ranks
    gen = torch.Generator().manual_seed(3)
    hit = torch.rand(50, 24, generator=gen) < 0.1
    got = _tokens_per_rdma_rank(hit)
    want = [int(hit[:, 8 * n:8 * n + 8].any(dim=1).sum()) for n in range(3)]
    assert got.dtype == torch.int32 and got.tolist() == want
    with pytest.raises(NcclInvalidArgument, match="multiple of 8"):
        _tokens_per_rdma_rank(torch.zeros(2, 12, dtype=torch.bool))


class _FakeMpi:
    """mpi4py's surface the Buffer uses (Get_rank, Get_size, bcast, allgather, alltoall), one process standing for
    rank 1 of R: the other ranks pass values of their own (allgather: this rank's plus the rank number; alltoall:
    each rank's block for me is its own block for me plus its rank number); calls recorded."""

    def __init__(self):
        self.calls = []

    def Get_rank(self):
        return 1

    def Get_size(self):
        return R

    def bcast(self, obj, root=0):
        self.calls.append(("bcast", root))
        return obj

    def allgather(self, obj):
        self.calls.append(("allgather", len(obj)))
        return [[v + r for v in obj] for r in range(R)]

    def alltoall(self, blocks):
        self.calls.append(("alltoall", len(blocks)))
        return [[v + r for v in blocks[1]] for r in range(R)]


def test_an_mpi4py_communicator_carries_the_buffers_collectives(monkeypatch):
    # Buffer(None, comm=<mpi4py communicator>) (TensorRT-LLM's): rank and size from it, the Buffer's own collectives
    # on the host through it (the first dispatch's sizes: a MAX of int64), and one NCCL communicator of the Buffer's
    # (Communicator.from_mpi), shared by its nccl.ep groups and closed by destroy() after them.
    import sys
    import types

    mpi = _FakeMpi()
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    made, events = [], []

    class _Comm:
        @classmethod
        def from_mpi(cls, comm):
            events.append(("from_mpi", comm))
            return cls()

        def close(self):
            events.append(("close", self))

    class _Recorder:
        def __init__(self, group, **kwargs):
            made.append((group, kwargs))

        def close(self):
            events.append(("group close", self))

    monkeypatch.setattr(deep_ep, "Communicator", _Comm)
    monkeypatch.setattr(deep_ep, "Group", _Recorder)
    buf = deep_ep.Buffer(None, int(1e9), 0, explicitly_destroy=True, comm=mpi)
    assert (buf.rank, buf.group_size, buf.group) == (1, R, None)
    x, idx = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    buf._group_for(x, idx, E)
    buf._group_for(x, idx, 2 * E)
    assert ("allgather", 3) in mpi.calls
    assert buf._caps[:3] == (max(deep_ep.Buffer.max_tokens_per_rank, 4 + R - 1), max(128 + R - 1, 16), 8)
    assert len(made) == 2 and made[0][0] is made[1][0] and isinstance(made[0][0], _Comm)
    assert [e[0] for e in events] == ["from_mpi"]
    buf.destroy()
    assert [e[0] for e in events] == ["from_mpi", "group close", "group close", "close"]
    with pytest.raises(NcclInvalidArgument, match="give a torch ProcessGroup, or group=None and comm="):
        deep_ep.Buffer(None)


def test_the_mpi_collectives_reduce_and_exchange_as_torchs(monkeypatch):
    import sys
    import types

    from nccl.ep.deepep import _MpiRanks

    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=object()))
    ranks = _MpiRanks(_FakeMpi())
    t = torch.tensor([[3, -1], [0, 7]], dtype=torch.int64)
    ranks.all_reduce(t, "max")
    assert t.tolist() == [[3 + R - 1, -1 + R - 1], [R - 1, 7 + R - 1]]
    s = torch.tensor([1, 2], dtype=torch.int32)
    ranks.all_reduce(s)
    assert s.dtype == torch.int32 and s.tolist() == [R + sum(range(R)), 2 * R + sum(range(R))]
    inp = torch.arange(R * 3, dtype=torch.int32).reshape(R, 3)  # block i for rank i
    out = torch.empty_like(inp)
    ranks.all_to_all(out, inp)
    assert out.tolist() == [[v + r for v in inp[1].tolist()] for r in range(R)]  # rank r's block for me (rank 1)


def test_an_mpi_buffer_without_mpi4py_says_so(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails
    with pytest.raises(NcclInvalidArgument, match="mpi4py is not importable"):
        deep_ep.Buffer(None, comm=_FakeMpi())


def test_the_comm_stream_is_the_callers(buffer, monkeypatch):
    current = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    assert buffer.get_comm_stream() is current


def test_combine_buffer_needs_low_latency_mode(buffer):
    with pytest.raises(NcclInvalidUsage, match="get_next_low_latency_combine_buffer: this Buffer was made without"):
        buffer.get_next_low_latency_combine_buffer((None,) * 5)


@pytest.mark.parametrize("env,domain", [({"NCCL_EXT_LSA_DOMAIN_SIZE": "4", "LOCAL_WORLD_SIZE": "8"}, 4),
                                        ({"LOCAL_WORLD_SIZE": "8"}, 8), ({"LOCAL_WORLD_SIZE": "6"}, 4),
                                        ({"LOCAL_WORLD_SIZE": "32"}, 16), ({"LOCAL_WORLD_SIZE": "x"}, 16)])
def test_domain_size_guess(monkeypatch, env, domain):
    # NCCL_EXT_LSA_DOMAIN_SIZE, else the launcher's local ranks, else the GPUs (none here: the rank count); then the
    # largest divisor of the rank count not above it.
    for name in ("NCCL_EXT_LSA_DOMAIN_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(deep_ep.torch.cuda, "is_available", lambda: False)
    assert deep_ep._domain_size_guess(16) == domain


@pytest.mark.skipif("NCCL_EXT_LSA_DOMAIN_SIZE" in os.environ, reason="the library reads it once, at its first use")
@pytest.mark.parametrize("local,domain", [("8", 8), ("16", 16)])
def test_low_latency_size_hint_is_the_memory_the_group_holds(monkeypatch, local, domain):
    # The Low-Latency group's window and rail staging for those sizes (top-k Buffer.max_topk) in NVLink domains of
    # the launcher's local ranks; the arguments are checked.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    info = ep.query_group_info(16, domain, num_experts=256, max_tokens_per_rank=128, hidden=7168,
                               max_topk=deep_ep.Buffer.max_topk, algorithm="low_latency")
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 16, 256)
    assert hint == info["window_bytes"] + info["rail_staging_bytes"] > 0
    assert (info["rail_staging_bytes"] > 0) == (domain < 16)
    with pytest.raises(NcclInvalidArgument, match="num_max_dispatch_tokens_per_rank 2048 not in \\[1, 1024\\]"):
        deep_ep.Buffer.get_low_latency_rdma_size_hint(2048, 7168, 8, 256)
    with pytest.raises(NcclInvalidArgument, match="250 experts do not divide among 8 ranks"):
        deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 250)


def test_local_buffer_tensor_is_memory_of_the_buffers_own(fake_world):
    buf = deep_ep.Buffer(dist.group.WORLD, 4096, 1 << 16, explicitly_destroy=True)
    rdma = buf.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    assert rdma.dtype == torch.uint8 and rdma.numel() == 1 << 16
    # The same memory every time, any dtype, from an offset, shaped; the NVLink size is another buffer.
    rdma.fill_(7)
    words = buf.get_local_buffer_tensor(torch.int32, offset=8, use_rdma_buffer=True)
    assert words.numel() == ((1 << 16) - 8) // 4 and bool((words == 0x07070707).all())
    shaped = buf.get_local_buffer_tensor(torch.bfloat16, torch.Size([4, 8]), offset=64, use_rdma_buffer=True)
    shaped.fill_(0)
    assert shaped.shape == (4, 8) and bool((rdma[64:128] == 0).all()) and rdma[128] == 7 and rdma[63] == 7
    nvl = buf.get_local_buffer_tensor(torch.float32)
    assert nvl.numel() == 1024 and nvl.data_ptr() != rdma.data_ptr()
    with pytest.raises(NcclInvalidArgument, match="offset 6 not within the Buffer's num_nvl_bytes \\(4096\\) or not "
                       "a multiple of torch.float32's 4 bytes"):
        buf.get_local_buffer_tensor(torch.float32, offset=6)
    with pytest.raises(NcclInvalidArgument, match="offset 8192 not within"):
        buf.get_local_buffer_tensor(torch.uint8, offset=8192)
    with pytest.raises(NcclInvalidArgument, match="offset 1.0 not within"):
        buf.get_local_buffer_tensor(torch.uint8, offset=1.0)
    with pytest.raises(NcclInvalidArgument, match="dtype must be a torch.dtype; got 'uint8'"):
        buf.get_local_buffer_tensor("uint8")
    with pytest.raises(NcclInvalidArgument, match="size \\(2, 1024\\) needs 2048 elements; num_nvl_bytes from offset 0 "
                       "holds 1024"):
        buf.get_local_buffer_tensor(torch.float32, (2, 1024))
    empty = deep_ep.Buffer(dist.group.WORLD, 0, 0)
    assert empty.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True).numel() == 0
    buf.destroy()
    assert buf._scratch == {}


def test_config_checks_and_hints():
    with pytest.raises(ValueError):
        deep_ep.Config(20, 256, 256)
    with pytest.raises(ValueError):
        deep_ep.Config(20, 6, 256, 100, 128)
    c = deep_ep.Config(24, 8, 256, 6, 130)
    assert c.num_sms == 24 and c.num_max_rdma_chunked_recv_tokens == 132
    assert c.get_rdma_buffer_size_hint(7168 * 2, 8) == 0
    assert c.get_nvl_buffer_size_hint(7168 * 2, 8) == deep_ep.Buffer.max_tokens_per_rank * 8 * 7168 * 2
    assert deep_ep.Buffer.get_dispatch_config(8).num_sms == deep_ep.Buffer.num_sms
    with pytest.raises(ValueError):
        deep_ep.Buffer.get_combine_config(3)


def test_set_num_sms_wants_even():
    old = deep_ep.Buffer.num_sms
    try:
        deep_ep.Buffer.set_num_sms(24)
        assert deep_ep.Buffer.num_sms == 24
        with pytest.raises(ValueError):
            deep_ep.Buffer.set_num_sms(23)
    finally:
        deep_ep.Buffer.num_sms = old


def test_event_overlap_without_event():
    ev = deep_ep.EventOverlap()
    with ev:
        pass
    with pytest.raises(ValueError):
        ev.current_stream_wait()


@pytest.mark.parametrize("kwargs,text", [
    ({}, "num_tokens_per_rank, is_token_in_rank and num_tokens_per_expert are required"),
    ({"num_tokens_per_rank": 1, "is_token_in_rank": 1, "num_tokens_per_expert": 1, "topk_idx": 1},
     "give topk_idx and topk_weights together"),
    ({"handle": object(), "topk_idx": 1}, "cached dispatch (handle given) takes no topk_idx"),
    ({"handle": object()}, "handle must come from this module's dispatch"),
])
def test_dispatch_refusals(buffer, kwargs, text):
    with pytest.raises(NcclInvalidArgument, match=text.replace("(", r"\(").replace(")", r"\)")):
        buffer.dispatch(torch.zeros(2, 16, dtype=torch.bfloat16), **kwargs)


def test_combine_refuses_a_foreign_handle(buffer):
    with pytest.raises(NcclInvalidArgument, match="handle must come from this module's dispatch"):
        buffer.combine(torch.zeros(2, 16), (1, 2, 3, 4, 5, 6))


def test_destroy_only_when_explicit(buffer):
    with pytest.raises(ValueError):
        buffer.destroy()


# -- Low-Latency ---------------------------------------------------------------------------------------------------
LM, LH, LK = 3, 256, 2  # num_max_dispatch_tokens_per_rank, hidden, top-k of these tests; E experts, R ranks


class _EpHandle:
    def __init__(self, topk_idx, layout):
        self.layout, self.updates, self.closed = layout, 0, False
        self._bind(topk_idx)

    def _bind(self, topk_idx):
        self.topk_idx, (self.num_tokens, self.topk) = topk_idx, topk_idx.shape

    def update(self, topk_idx):
        assert not self.closed and topk_idx.shape[1] == self.topk, "ncclEpUpdateHandle: top-k differs"  # as the library
        self._bind(topk_idx)
        self.updates += 1

    def close(self):
        self.closed = True


class _LowLatencyGroup:
    """Stands in for nccl.ep.Group(algorithm="low_latency"): records what the drop-in asks of it; dispatch returns
    the src_info / counts the test sets (otherwise zeros, and counts 1..L: nonzero, so that adding them shows)."""

    made = []

    def __init__(self, group, **kwargs):
        self.kwargs, self.calls, self.closed = kwargs, [], False
        self.size, self.local_experts = R, kwargs["num_experts"] // R
        self.src_info = self.counts = self.scales = self.on_complete = None
        self.mask = [1] * R  # nccl.ep's convention: 1 = active
        _LowLatencyGroup.made.append(self)

    def create_handle(self, topk_idx, layout):
        self.calls.append(("create_handle", layout))
        return _EpHandle(topk_idx, layout)

    def dispatch(self, x, handle, out_dtype=None, round_scale=False, send_only=False, recv_wait_cycles=None):
        self.calls.append(("dispatch", handle, out_dtype, round_scale) + (("send_only",) if send_only else ())
                          + (() if recv_wait_cycles is None else (recv_wait_cycles,)))
        n = self.local_experts * R * self.kwargs["max_tokens_per_rank"]
        src = self.src_info if self.src_info is not None else torch.zeros(n, dtype=torch.int32)
        counts = self.counts if self.counts is not None else torch.arange(1, self.local_experts + 1, dtype=torch.int32)
        return SimpleNamespace(tokens=torch.zeros(n, x.shape[1], dtype=out_dtype or x.dtype), handle=handle,
                               scales=(self.scales if self.scales is not None else torch.ones(n, x.shape[1] // 128))
                               if out_dtype is not None else None,
                               src_info=src, expert_counts=counts)

    def combine(self, y, handle, topk_weights=None, out=None, send_only=False, recv_wait_cycles=None):
        self.calls.append(("combine", tuple(y.shape), handle, topk_weights, out) + (("send_only",) if send_only else ())
                          + (() if recv_wait_cycles is None else (recv_wait_cycles,)))
        return out if out is not None else torch.zeros(handle.num_tokens, y.shape[1], dtype=y.dtype)

    def complete(self, handle):
        self.calls.append(("complete", handle))
        if self.on_complete is not None:  # the receive half writes the outputs
            self.on_complete()

    def mask_query(self):
        self.calls.append(("mask_query",))
        return torch.tensor(self.mask, dtype=torch.int32)

    def mask_update(self, mask):
        self.mask = list(mask)
        self.calls.append(("mask_update", list(mask)))

    def mask_clean(self):
        self.calls.append(("mask_clean",))

    def close(self):
        self.closed = True


@pytest.fixture
def ll(fake_world, monkeypatch):
    """A low_latency_mode Buffer whose nccl.ep groups are _LowLatencyGroups."""
    monkeypatch.setattr(deep_ep, "Group", _LowLatencyGroup)
    _LowLatencyGroup.made = []
    return deep_ep.Buffer(dist.group.WORLD, 0, int(1e9), low_latency_mode=True, num_qps_per_rank=E // R,
                          explicitly_destroy=True)


def _call(ll, T=LM, m=LM, hidden=LH, k=LK, **kwargs):
    x = torch.zeros(T, hidden, dtype=torch.bfloat16)
    idx = torch.zeros(T, k, dtype=torch.int64)
    return x, idx, ll.low_latency_dispatch(x, idx, m, E, **kwargs)


@pytest.mark.parametrize("use_fp8,round_scale", [(False, False), (False, True), (True, False), (True, True)])
def test_low_latency_dispatch_translation(ll, use_fp8, round_scale):
    local = E // R
    stats = torch.full((local,), 5, dtype=torch.int32)
    x, idx, (recv_x, recv_count, handle, event, hook) = _call(
        ll, use_fp8=use_fp8, round_scale=round_scale, cumulative_local_expert_recv_stats=stats)
    (g,) = _LowLatencyGroup.made
    assert g.kwargs == {"num_experts": E, "max_tokens_per_rank": LM, "hidden": LH, "max_topk": LK,
                        "algorithm": "low_latency", "enable_mask": False}
    # The whole ring is made at the group's first dispatch (none later, inside a capture), bound to its routing.
    assert [c[:2] for c in g.calls[:2]] == [("create_handle", "expert_major")] * 2 and len(g.calls) == 3
    _, ep_handle, out_dtype, rs = g.calls[2]
    assert out_dtype == (torch.float8_e4m3fn if use_fp8 else None) and rs == (round_scale and use_fp8)
    if use_fp8:
        q, scales = recv_x
        assert q.shape == (local, R * LM, LH) and q.dtype == torch.float8_e4m3fn
        assert scales.shape == (local, R * LM, LH // 128) and scales.dtype == torch.float32
    else:
        assert recv_x.shape == (local, R * LM, LH) and recv_x.dtype == torch.bfloat16
    assert recv_count.shape == (local,) and bool((recv_count > 0).all())
    assert torch.equal(stats, recv_count + 5)  # added on the stream
    assert ep_handle.updates == 0  # made for this routing: no second binding
    assert event.event is None and hook is None
    assert len(handle) == 5 and handle[2:] == (LM, LH, E) and handle.ep_handle is ep_handle
    assert "num_max_dispatch_tokens_per_rank=3" in repr(handle)


def test_low_latency_recv_hook_completes_a_send_only_dispatch(ll):
    _, _, (_, _, handle, _, hook) = _call(ll, return_recv_hook=True)
    group = _LowLatencyGroup.made[-1]
    assert group.calls[-1][0] == "dispatch" and group.calls[-1][-1] == "send_only"  # the call only sent
    assert hook() is None and group.calls[-1] == ("complete", handle.ep_handle)  # the hook receives
    with pytest.raises(NcclInvalidUsage, match="already called"):
        hook()


def test_low_latency_handle_has_deepeps_meanings(ll):
    """src_info (token index at the source) and layout_range ((begin << 32) | count per (expert, source rank))
    derived from nccl.ep's src_info (source * M + token) and the counts, against brute force; rows past the counts
    hold garbage that must not count."""
    local, m = E // R, LM
    zones = [[(0, 1), (0, 2), (2, 0), (3, 1)], [], [(1, 0), (1, 1), (1, 2), (3, 0), (3, 2)]]
    zones += [[(s, t) for s in range(R) for t in range(m)]]  # a full zone: every token of every source
    zones += [[]] * (local - len(zones))
    raw = torch.full((local, R * m), 999, dtype=torch.int32)
    raw[0, 4:] = -7
    for e, rows in enumerate(zones):
        for i, (s, t) in enumerate(rows):
            raw[e, i] = s * m + t
    _call(ll)  # makes the group
    g = _LowLatencyGroup.made[0]
    g.src_info, g.counts = raw.flatten(), torch.tensor([len(z) for z in zones], dtype=torch.int32)
    _, _, (_, _, handle, _, _) = _call(ll)
    src_info, layout_range, m_, hidden, experts = handle  # unpacked as DeepEP's tests do
    assert (m_, hidden, experts) == (m, LH, E)
    assert src_info.shape == (local, R * m) and src_info.dtype == torch.int32
    assert layout_range.shape == (local, R) and layout_range.dtype == torch.int64
    for e, rows in enumerate(zones):
        assert src_info[e, :len(rows)].tolist() == [t for _, t in rows]
        begin = 0
        for s in range(R):
            count = sum(1 for r, _ in rows if r == s)
            assert (int(layout_range[e, s]) >> 32, int(layout_range[e, s]) & 0xffffffff) == (begin, count), (e, s)
            begin += count
    assert handle[0] is src_info and handle[1] is layout_range  # computed once


def test_low_latency_handles_alternate_and_expire(ll):
    handles = [_call(ll)[2][2] for _ in range(3)]
    g = _LowLatencyGroup.made[0]
    assert [c[0] for c in g.calls].count("create_handle") == 2  # a ring of two nccl.ep handles
    assert handles[2].ep_handle is handles[0].ep_handle and handles[0].ep_handle is not handles[1].ep_handle
    assert (handles[0].ep_handle.updates, handles[1].ep_handle.updates) == (1, 1)  # rebound by dispatches 2 and 1
    y = torch.zeros(E // R, R * LM, LH, dtype=torch.bfloat16)
    w = torch.rand(LM, LK)
    with pytest.raises(NcclInvalidUsage, match="2 later low_latency_dispatch calls reused its nccl.ep handle"):
        ll.low_latency_combine(y, torch.zeros(LM, LK, dtype=torch.int64), w, handles[0])
    for h in handles[1:]:
        out, event, hook = ll.low_latency_combine(y, torch.zeros(LM, LK, dtype=torch.int64), w, h)
        assert out.shape == (LM, LH) and event.event is None and hook is None
    _, shape, ep_handle, weights, out = g.calls[-1]
    assert shape == (E // R * R * LM, LH) and ep_handle is handles[2].ep_handle and weights is w and out is None


def test_low_latency_combine_translation(ll):
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    w = torch.rand(LM, LK)
    out = torch.empty(LM, LH, dtype=torch.bfloat16)
    combined, _, hook = ll.low_latency_combine(recv_x, idx, w, handle, out=out, return_recv_hook=True)
    group = _LowLatencyGroup.made[-1]
    _, shape, ep_handle, weights, given_out, send_only = group.calls[-1]  # the combine only sent
    assert shape == (recv_x.shape[0] * recv_x.shape[1], LH) and weights is w and given_out is out
    assert send_only == "send_only" and ep_handle is handle.ep_handle
    assert combined is out and hook() is None and group.calls[-1] == ("complete", handle.ep_handle)


def test_low_latency_combine_with_logfmt_is_the_bf16_combine_warned_once(ll):
    from nccl.ep import deepep

    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    w = torch.rand(LM, LK)
    deepep._LOGFMT_WARNED.clear()
    with pytest.warns(UserWarning, match="use_logfmt=True.*bf16"):
        ll.low_latency_combine(recv_x, idx, w, handle, use_logfmt=True)
    plain = _LowLatencyGroup.made[-1].calls[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        ll.low_latency_combine(recv_x, idx, w, handle, use_logfmt=True)
    ll.low_latency_combine(recv_x, idx, w, handle)
    assert _LowLatencyGroup.made[-1].calls[-1][1:] == plain[1:]  # the same call as without LogFMT


def test_low_latency_group_is_made_anew_when_the_sizes_change(ll):
    first = _call(ll)[2][2]
    _call(ll)
    assert len(_LowLatencyGroup.made) == 1
    _call(ll, m=LM + 1)
    old, new = _LowLatencyGroup.made
    assert old.closed and first.ep_handle.closed and not new.closed
    assert new.kwargs["max_tokens_per_rank"] == LM + 1
    y = torch.zeros(E // R, R * LM, LH, dtype=torch.bfloat16)
    with pytest.raises(NcclInvalidUsage, match=r"the Low-Latency group was made anew \(other sizes\) or destroyed"):
        ll.low_latency_combine(y, torch.zeros(LM, LK, dtype=torch.int64), torch.rand(LM, LK), first)
    last = _call(ll, m=LM + 1)[2][2]
    ll.destroy()
    assert new.closed and last.ep_handle.closed
    y = torch.zeros(E // R, R * (LM + 1), LH, dtype=torch.bfloat16)
    with pytest.raises(NcclInvalidUsage, match="made anew .* or destroyed since"):
        ll.low_latency_combine(y, torch.zeros(LM, LK, dtype=torch.int64), torch.rand(LM, LK), last)


def test_low_latency_stale_handle_says_how_many_dispatches_came_after(ll):
    handles = [_call(ll)[2][2] for _ in range(5)]
    y = torch.zeros(E // R, R * LM, LH, dtype=torch.bfloat16)
    with pytest.raises(NcclInvalidUsage, match=r"3 later low_latency_dispatch calls reused .* = 2 dispatches"):
        ll.low_latency_combine(y, torch.zeros(LM, LK, dtype=torch.int64), torch.rand(LM, LK), handles[1])


def test_low_latency_async_finish_and_hook_together_are_refused(ll):
    with pytest.raises(NcclInvalidArgument, match="low_latency_dispatch: async_finish and return_recv_hook together"):
        _call(ll, async_finish=True, return_recv_hook=True)
    assert _LowLatencyGroup.made == []  # refused before anything was made
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    with pytest.raises(NcclInvalidArgument, match="low_latency_combine: async_finish and return_recv_hook together"):
        ll.low_latency_combine(recv_x, idx, torch.rand(LM, LK), handle, async_finish=True, return_recv_hook=True)
    assert [c[0] for c in _LowLatencyGroup.made[0].calls].count("combine") == 0


def test_low_latency_sizes_must_agree_across_ranks(ll, monkeypatch):
    def another_rank_asks_more(t, op=None, group=None):
        t[0] += 1  # the MAX over ranks of M is larger than this rank's

    monkeypatch.setattr(deep_ep.dist, "all_reduce", another_rank_asks_more)
    with pytest.raises(NcclInvalidArgument, match=r"differ between ranks: from \(3, 256, 32, 2\) to \(4, 256, 32, 2\)"):
        _call(ll)
    assert _LowLatencyGroup.made == []


def test_low_latency_wait_recv_cost_stats_reach_the_calls(ll):
    # The caller's [num_ranks] int64 tensors go to nccl.ep's dispatch and combine as recv_wait_cycles, which the
    # receive halves add to (tests/python/test_deepep_gpu.py checks the values on a GPU).
    d, c = torch.zeros(R, dtype=torch.int64), torch.zeros(R, dtype=torch.int64)
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False, dispatch_wait_recv_cost_stats=d)
    g = _LowLatencyGroup.made[-1]
    assert g.calls[-1][0] == "dispatch" and g.calls[-1][-1] is d
    ll.low_latency_combine(recv_x, idx, torch.rand(LM, LK), handle, combine_wait_recv_cost_stats=c)
    assert g.calls[-1][0] == "combine" and g.calls[-1][-1] is c


@pytest.mark.parametrize("stats,got", [(torch.zeros(R, R, dtype=torch.int64), r"\[4, 4\] torch.int64"),
                                       (torch.zeros(R, dtype=torch.int32), r"\[4\] torch.int32"),
                                       (torch.zeros(2 * R, dtype=torch.int64)[::2], r"\[4\] torch.int64 \(strided\)")])
def test_low_latency_wait_recv_cost_stats_refusals(ll, stats, got):
    with pytest.raises(NcclInvalidArgument, match=r"dispatch_wait_recv_cost_stats must be a contiguous \[4\] int64 "
                                                  r"tensor; got " + got):
        _call(ll, dispatch_wait_recv_cost_stats=stats)
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    with pytest.raises(NcclInvalidArgument, match="combine_wait_recv_cost_stats must be a contiguous"):
        ll.low_latency_combine(recv_x, idx, torch.rand(LM, LK), handle, combine_wait_recv_cost_stats=stats)


@pytest.mark.parametrize("make,text", [
    (lambda ll: ll.low_latency_dispatch(torch.zeros(2, LH), torch.zeros(2, LK, dtype=torch.int64), LM, E),
     r"x must be a \[num_tokens, hidden\] bfloat16 tensor; got \[2, 256\] torch.float32"),
    (lambda ll: ll.low_latency_dispatch(torch.zeros(2, LH, dtype=torch.bfloat16), torch.zeros(3, LK), LM, E),
     r"topk_idx must be \[2, num_topk\]"),
    (lambda ll: _call(ll, T=LM + 1), "4 tokens exceed num_max_dispatch_tokens_per_rank 3"),
    (lambda ll: _call(ll, m=1025, T=2), r"num_max_dispatch_tokens_per_rank 1025 not in \[1, 1024\]"),
    (lambda ll: ll.low_latency_dispatch(torch.zeros(2, LH, dtype=torch.bfloat16),
                                        torch.zeros(2, LK, dtype=torch.int64), LM, E + 2),
     "34 experts do not divide among 4 ranks"),
    (lambda ll: _call(ll, cumulative_local_expert_recv_stats=torch.zeros(E // R, dtype=torch.int64)),
     r"cumulative_local_expert_recv_stats must be \[8\] int32; got \[8\] torch.int64"),
    (lambda ll: ll.low_latency_combine(torch.zeros(2, 2), None, None, (1, 2, 3, 4, 5)),
     "handle must come from low_latency_dispatch"),
])
def test_low_latency_refusals(ll, make, text):
    with pytest.raises(NcclInvalidArgument, match=text):
        make(ll)


@pytest.mark.parametrize("change,text", [
    (lambda x, idx, w: (x[:, :-1], idx, w), r"x must be \[8, 12, 256\] bfloat16 \(the dispatch's layout\)"),
    (lambda x, idx, w: (x.float(), idx, w), r"x must be \[8, 12, 256\] bfloat16"),
    (lambda x, idx, w: (x.transpose(0, 1).contiguous().transpose(0, 1), idx, w), "x must be contiguous"),
    (lambda x, idx, w: (x, idx[:, :1], w), r"topk_idx must be \[3, 2\] \(the dispatch's routing\)"),
    (lambda x, idx, w: (x, idx, w[:2]), r"topk_weights must be \[3, 2\]"),
])
def test_low_latency_combine_refusals(ll, change, text):
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    x, idx, w = change(recv_x, idx, torch.rand(LM, LK))
    with pytest.raises(NcclInvalidArgument, match=text):
        ll.low_latency_combine(x, idx, w, handle)


def test_low_latency_handle_of_another_buffer_is_refused(ll):
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    other = deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True)
    with pytest.raises(NcclInvalidUsage, match="comes from another Buffer"):
        other.low_latency_combine(recv_x, idx, torch.rand(LM, LK), handle)


def test_low_latency_methods_need_low_latency_mode(buffer):
    with pytest.raises(NcclInvalidUsage, match="without low_latency_mode=True"):
        buffer.low_latency_dispatch(torch.zeros(2, LH, dtype=torch.bfloat16), torch.zeros(2, LK), LM, E)
    with pytest.raises(NcclInvalidUsage, match="without low_latency_mode=True"):
        buffer.clean_low_latency_buffer(LM, LH, E)


def test_clean_low_latency_buffer_checks_and_does_nothing(ll):
    assert ll.clean_low_latency_buffer(128, 7168, E) is None
    assert _LowLatencyGroup.made == []
    with pytest.raises(NcclInvalidArgument, match="num_max_dispatch_tokens_per_rank 4096 not in"):
        ll.clean_low_latency_buffer(4096, 7168, E)


def test_low_latency_zero_copy_combine_reads_the_slots_buffer(ll):
    _, idx, (recv_x, _, handle, _, _) = _call(ll, use_fp8=False)
    w = torch.rand(LM, LK)
    with pytest.raises(NcclInvalidUsage, match=r"zero_copy=True\): no get_next_low_latency_combine_buffer"):
        ll.low_latency_combine(recv_x, idx, w, handle, zero_copy=True)
    buf = ll.get_next_low_latency_combine_buffer(handle)
    assert buf.shape == recv_x.shape and buf.dtype == torch.bfloat16
    assert ll.get_next_low_latency_combine_buffer(handle) is buf  # one per slot, kept
    ll.low_latency_combine(None, idx, w, handle, zero_copy=True)  # x is not read
    group = _LowLatencyGroup.made[-1]
    _, shape, ep_handle, weights, _ = group.calls[-1]
    assert shape == (buf.shape[0] * buf.shape[1], LH) and ep_handle is handle.ep_handle and weights is w
    _call(ll)
    _call(ll)  # two later dispatches reused the slot: its buffer is refused with the handle
    with pytest.raises(NcclInvalidUsage, match="get_next_low_latency_combine_buffer: the handle's dispatch is no "
                                               "longer bound"):
        ll.get_next_low_latency_combine_buffer(handle)


# -- shrink mode (enable_shrink=True): DeepEP's masks, 1 = masked, over nccl.ep's, 1 = active ---------------------
@pytest.fixture
def shrink(fake_world, monkeypatch):
    """A low_latency_mode Buffer with enable_shrink whose nccl.ep groups are _LowLatencyGroups."""
    monkeypatch.setattr(deep_ep, "Group", _LowLatencyGroup)
    _LowLatencyGroup.made = []
    return deep_ep.Buffer(dist.group.WORLD, 0, int(1e9), low_latency_mode=True, num_qps_per_rank=E // R,
                          explicitly_destroy=True, enable_shrink=True)


def _masked(buf):
    status = torch.full((R,), -1, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    return status.tolist()


def test_enable_shrink_sits_where_deepeps_does(fake_world):
    import inspect

    names = list(inspect.signature(deep_ep.Buffer.__init__).parameters)
    assert names.index("enable_shrink") == names.index("explicitly_destroy") + 1 == names.index("comm") - 1
    # Positionally, as DeepEP code may pass it: group, nvl, rdma, low_latency_mode, qps, nvlink, mnnvl, destroy, shrink.
    assert deep_ep.Buffer(dist.group.WORLD, 0, 0, True, 8, True, False, False, True).enable_shrink


def test_enable_shrink_reaches_the_group_config(shrink):
    _call(shrink)
    (g,) = _LowLatencyGroup.made
    assert g.kwargs["enable_mask"] is True and g.kwargs["algorithm"] == "low_latency"
    assert [c[0] for c in g.calls].count("mask_update") == 0  # every rank active: nothing to set


def test_mask_update_and_query_use_deepeps_convention(shrink):
    _call(shrink)
    g = _LowLatencyGroup.made[0]
    assert _masked(shrink) == [0] * R
    shrink.low_latency_update_mask_buffer(2, True)
    assert g.calls[-1] == ("mask_update", [1, 1, 0, 1])  # read, one entry flipped, set
    assert g.calls[-2] == ("mask_query",)
    assert _masked(shrink) == [0, 0, 1, 0]
    g.mask[3] = 0  # the kernels mask a peer that did not arrive in time: the query shows it, an update keeps it
    assert _masked(shrink) == [0, 0, 1, 1]
    shrink.low_latency_update_mask_buffer(2)  # mask=False: active again
    assert g.calls[-1] == ("mask_update", [1, 1, 1, 0])
    shrink.low_latency_clean_mask_buffer()  # local: every rank active
    assert g.calls[-1] == ("mask_update", [1] * R) and _masked(shrink) == [0] * R
    assert [c[0] for c in g.calls].count("mask_clean") == 0


def test_a_shrink_buffer_after_a_size_hint_makes_its_group_in_the_constructor(fake_world, monkeypatch):
    """DeepEP's shrink test fails a rank at its first low_latency_dispatch: making the group there (collective) would
    hang the others. After get_low_latency_rdma_size_hint, a shrink Buffer for that rank count makes it at once; a
    dispatch of those sizes (top-k up to Buffer.max_topk) then makes no collective call."""
    monkeypatch.setattr(deep_ep, "Group", _LowLatencyGroup)
    monkeypatch.setattr(deep_ep.Buffer, "_low_latency_hint", None)
    _LowLatencyGroup.made = []
    deep_ep.Buffer.get_low_latency_rdma_size_hint(LM, LH, 2 * R, E)  # another rank count
    deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True, enable_shrink=True)
    assert _LowLatencyGroup.made == []
    deep_ep.Buffer.get_low_latency_rdma_size_hint(LM, LH, R, E)
    deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True)  # no shrink: at the first dispatch, as before
    assert _LowLatencyGroup.made == []
    buf = deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True, explicitly_destroy=True, enable_shrink=True)
    (g,) = _LowLatencyGroup.made
    assert {k: g.kwargs[k] for k in ("max_tokens_per_rank", "hidden", "num_experts", "max_topk", "enable_mask")} == {
        "max_tokens_per_rank": LM, "hidden": LH, "num_experts": E, "max_topk": deep_ep.Buffer.max_topk,
        "enable_mask": True}

    def collective(*args, **kwargs):
        raise AssertionError("a collective call at low_latency_dispatch")

    monkeypatch.setattr(deep_ep.dist, "all_reduce", collective)
    _call(buf, k=deep_ep.Buffer.max_topk)
    _call(buf, k=deep_ep.Buffer.max_topk)
    first = [c for c in g.calls if c[0] == "dispatch"][0][1]
    _call(buf)  # a smaller top-k: the same group, its handle ring made anew (handles keep their top-k)
    _call(buf)
    assert len(_LowLatencyGroup.made) == 1 and [c[0] for c in g.calls].count("dispatch") == 4
    assert first.closed and [c[0] for c in g.calls].count("create_handle") == 4
    buf.destroy()


def test_mask_before_the_group_is_kept_and_handed_to_it(shrink):
    shrink.low_latency_update_mask_buffer(1, True)
    assert _LowLatencyGroup.made == [] and _masked(shrink) == [0, 1, 0, 0]
    _call(shrink)
    g = _LowLatencyGroup.made[0]
    assert ("mask_update", [1, 0, 1, 1]) in g.calls
    assert g.calls.index(("mask_update", [1, 0, 1, 1])) < [c[0] for c in g.calls].index("dispatch")
    g.mask[3] = 0
    _call(shrink, m=LM + 1)  # other sizes: a new group, which starts from the old one's mask
    old, new = _LowLatencyGroup.made
    assert old.closed and new.calls[0] == ("mask_update", [1, 0, 1, 0])


def test_clean_low_latency_buffer_in_shrink_mode_cleans_the_group(shrink):
    shrink.clean_low_latency_buffer(LM, LH, E)  # no group yet: nothing to reset
    assert _LowLatencyGroup.made == []
    _call(shrink)
    shrink.clean_low_latency_buffer(LM, LH, E)
    assert _LowLatencyGroup.made[0].calls[-1] == ("mask_clean",)
    with pytest.raises(NcclInvalidArgument, match="num_max_dispatch_tokens_per_rank 4096 not in"):
        shrink.clean_low_latency_buffer(4096, LH, E)


def test_clean_low_latency_buffer_without_shrink_touches_no_mask(ll):
    _call(ll)
    ll.clean_low_latency_buffer(LM, LH, E)
    assert all(c[0] not in ("mask_clean", "mask_update", "mask_query") for c in _LowLatencyGroup.made[0].calls)


@pytest.mark.parametrize("method,args", [
    ("low_latency_update_mask_buffer", (0, True)),
    ("low_latency_query_mask_buffer", (torch.zeros(R, dtype=torch.int32),)),
    ("low_latency_clean_mask_buffer", ()),
])
def test_mask_methods_need_enable_shrink(ll, buffer, method, args):
    with pytest.raises(NcclInvalidUsage, match="Buffer.%s: this Buffer was made without enable_shrink=True "
                                               "\\(DeepEP asserts \"Shrink mode must be enabled\"\\)" % method):
        getattr(ll, method)(*args)
    with pytest.raises(NcclInvalidUsage, match="without low_latency_mode=True"):
        getattr(buffer, method)(*args)


@pytest.mark.parametrize("make,text", [
    (lambda b: b.low_latency_update_mask_buffer(R, True), r"rank_to_mask 4 not in \[0, 4\)"),
    (lambda b: b.low_latency_update_mask_buffer(-1), r"rank_to_mask -1 not in \[0, 4\)"),
    (lambda b: b.low_latency_query_mask_buffer(torch.zeros(R, dtype=torch.int64)),
     r"mask_status must be an int32 tensor of 4 elements \(one per rank\); got \[4\] torch.int64"),
    (lambda b: b.low_latency_query_mask_buffer(torch.zeros(R + 1, dtype=torch.int32)), r"got \[5\] torch.int32"),
    (lambda b: b.low_latency_query_mask_buffer([0] * R), "got list"),
])
def test_mask_refusals(shrink, make, text):
    with pytest.raises(NcclInvalidArgument, match=text):
        make(shrink)


# -- UE8M0-packed scales ---------------------------------------------------------------------------------------------
def _ue8m0_reference(exponent):
    """DeepEP's packing at the bit level: int32 (l, n, p) holds exponent[l, n, 4p + k] in bits 8k .. 8k + 7."""
    return sum(exponent[:, :, k::4].long() << (8 * k) for k in range(4))


@pytest.mark.parametrize("return_recv_hook", [False, True])
def test_low_latency_ue8m0_scales_have_deepeps_packed_layout(ll, return_recv_hook):
    """use_ue8m0=True turns the power-of-two fp32 scales into DeepEP's int32 [L, R * M, H / 512], column-major in the
    last two dims, four exponent bytes an int32; DeepEP's test unpacks them (the contiguous copy's bytes, each shifted
    into a float's exponent field) back into the scales. With a hook the packing waits for the receive half."""
    hidden, local, rows = 1024, E // R, R * LM
    groups = hidden // 128
    _call(ll, hidden=hidden)  # makes the group of this hidden size
    g = _LowLatencyGroup.made[-1]
    exponent = torch.randint(1, 255, (local * rows, groups), generator=torch.Generator().manual_seed(7),
                             dtype=torch.int32)
    final = (exponent << 23).view(torch.float32)  # powers of two 2^-126 .. 2^127
    g.scales = torch.ones(local * rows, groups) if return_recv_hook else final.clone()
    g.on_complete = lambda: g.scales.copy_(final)
    _, _, (recv_x, _, _, _, hook) = _call(ll, hidden=hidden, use_fp8=True, round_scale=True, use_ue8m0=True,
                                          return_recv_hook=return_recv_hook)
    q, packed = recv_x
    assert q.shape == (local, rows, hidden) and q.dtype == torch.float8_e4m3fn
    assert packed.dtype == torch.int32 and packed.shape == (local, rows, hidden // 512)
    assert packed.stride() == (hidden // 512 * rows, 1, rows)  # DeepEP's transposed [L, H / 512, R * M]
    if hook is not None:
        hook()
    assert torch.equal(packed.long() & 0xFFFFFFFF, _ue8m0_reference(exponent.view(local, rows, groups)))
    unpacked = (packed.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    assert torch.equal(unpacked.view(local * rows, groups), final)


def test_low_latency_ue8m0_needs_round_scale_and_whole_int32s(ll):
    with pytest.raises(NcclInvalidArgument, match="use_ue8m0=True needs round_scale=True"):
        _call(ll, hidden=512, use_fp8=True, use_ue8m0=True)
    with pytest.raises(NcclInvalidArgument, match="use_ue8m0=True needs hidden % 512 == 0.*hidden is 256"):
        _call(ll, use_fp8=True, round_scale=True, use_ue8m0=True)
    # Without fp8 there are no scales: bf16 rows as without use_ue8m0 (DeepEP likewise).
    _, _, (recv_x, _, _, _, _) = _call(ll, use_fp8=False, round_scale=True, use_ue8m0=True)
    assert recv_x.dtype == torch.bfloat16
