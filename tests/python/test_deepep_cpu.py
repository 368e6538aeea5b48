"""nccl.ep.deepep (the DeepEP drop-in) on the CPU: the layout against brute force, and every refusal with its
message, on torch's fake process group (4 ranks in one process, no communication). Needs torch."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.ep.deepep as deep_ep  # noqa: E402
from nccl.ep import NcclInvalidArgument  # noqa: E402

R, E = 4, 32


@pytest.fixture(scope="module")
def buffer():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=R)
    try:
        yield deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    finally:
        dist.destroy_process_group()


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


@pytest.mark.parametrize("kwargs,what", [
    ({"low_latency_mode": True}, "low_latency_mode=True"),
    ({"allow_mnnvl": True}, "allow_mnnvl=True"),
    ({"enable_shrink": True}, "enable_shrink=True"),
])
def test_buffer_options_not_implemented(buffer, kwargs, what):
    with pytest.raises(NotImplementedError, match=what.replace("(", r"\(")):
        deep_ep.Buffer(dist.group.WORLD, 0, 0, **kwargs)


def test_mpi_communicator_not_implemented():
    with pytest.raises(NotImplementedError, match="mpi4py"):
        deep_ep.Buffer(None, comm=object())


@pytest.mark.parametrize("method", ["low_latency_dispatch", "low_latency_combine", "clean_low_latency_buffer",
                                    "get_next_low_latency_combine_buffer", "get_local_buffer_tensor",
                                    "get_comm_stream"])
def test_methods_not_implemented_name_themselves(buffer, method):
    with pytest.raises(NotImplementedError, match="Buffer." + method):
        getattr(buffer, method)()


def test_low_latency_size_hint_not_implemented():
    with pytest.raises(NotImplementedError, match="get_low_latency_rdma_size_hint"):
        deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256)


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
