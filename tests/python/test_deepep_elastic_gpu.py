"""nccl.ep.deepep_elastic (DeepEP V2's ElasticBuffer) on the GPU, driven as DeepEP V2 code drives it: 1 rank, or
several under torchrun (on one GPU with --one-gpu nodes: every rank an NVLink domain of its own, the group's rows to
other ranks over nccl.ep's rail exchange). Every rank derives every rank's inputs from the seed (tests/python/
_seeded.py) and checks its own outputs against tests/python/_elastic_reference.py: dispatch of bf16 and fp8 rows,
not expanded and expanded (aligned zones), with and without a CPU sync, the EPHandle's fields, a cached dispatch,
combine (weights back to their columns; expanded rows summed per rank with and without multiple reduction; one and
two biases; bit for bit in DeepEP V2's order and roundings), previous events and async events on the current stream,
and the size hint against the group."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import _elastic_reference as ref  # noqa: E402
import nccl.ep.deepep as deep_ep  # noqa: E402
from _seeded import routed_tokens  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, LOCAL, K = 40, 512, 4, 6  # tokens a rank at most, hidden, experts a rank, top-k
ALIGN = 6  # the expanded zones' alignment, no power of two (not expanded: the counts' only)


def _inputs(s, R, seed=9000):
    idx, x, w = routed_tokens(s, R, max_tokens=M, hidden=H, local=LOCAL, topk=K, seed=seed)
    return idx, x, w.float()


@pytest.fixture(scope="module")
def buffer(world):
    rank, R = world
    buf = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=M, hidden=H, num_topk=K,
                                explicitly_destroy=True)
    yield buf, rank, R
    buf.destroy()


def _received(R, me, expand, seed=9000):
    inputs = [_inputs(s, R, seed) for s in range(R)]
    return inputs, ref.Received([i[0] for i in inputs], me, LOCAL, M, ALIGN if expand else 1)


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize("fp8", [False, "fp32", "ue8m0"])
def test_dispatch_cached_dispatch_and_combine(buffer, expand, sync, fp8):
    buf, me, R = buffer
    E = LOCAL * R
    inputs, rec = _received(R, me, expand)
    idx, x, w = inputs[me]
    x_in = tuple(t.cuda() for t in ref.fp8_tokens(x, fp8 == "ue8m0")) if fp8 else x.cuda()
    stats = torch.zeros(LOCAL, dtype=torch.int32, device="cuda")
    recv_x, recv_idx, recv_w, h, _ = buf.dispatch(
        x_in, topk_idx=idx.cuda(), topk_weights=w.cuda(), cumulative_local_expert_recv_stats=stats, num_experts=E,
        expert_alignment=ALIGN, do_cpu_sync=sync, do_expand=expand)
    n = rec.expanded_rows if expand else rec.n
    layout = rec.expanded if expand else rec.rows
    rows = (recv_x[0] if fp8 else recv_x).shape[0]
    assert rows == n if sync else rows >= n
    if fp8:
        want = [ref.fp8_tokens(i[1], fp8 == "ue8m0") for i in inputs]
        assert recv_x[1].dtype == want[0][1].dtype
        assert torch.equal(recv_x[0][:n].view(torch.uint8).cpu(), layout([q.view(torch.uint8) for q, _ in want]))
        assert torch.equal(recv_x[1][:n].cpu(), layout([s for _, s in want]))
    else:
        assert torch.equal(recv_x[:n].cpu(), layout([i[1] for i in inputs]))
    if expand:
        assert recv_idx is None and torch.equal(recv_w[:n].cpu(), rec.expanded_weights([i[2] for i in inputs]))
    else:
        assert recv_idx.dtype == torch.int64 and torch.equal(recv_idx[:n].cpu(), rec.local_ids)
        assert torch.equal(recv_w[:n].cpu(), rec.rows([i[2] for i in inputs]))
        assert bool((recv_idx[n:] == -1).all())
    assert stats.tolist() == rec.counts
    # The handle, as DeepEP's test reads it.
    aligned = [ref.align(c, ALIGN) for c in rec.counts]
    assert h.num_recv_tokens_per_expert_list == (aligned if sync else [])
    psum = [0] + h.psum_num_recv_tokens_per_expert.tolist()
    for e in range(LOCAL):
        if expand:
            assert psum[e + 1] - ref.align(psum[e], ALIGN) == rec.counts[e]
        else:
            assert psum[e + 1] - psum[e] == aligned[e]
    total = int(h.psum_num_recv_tokens_per_scaleup_rank[-1])
    assert total == rec.n and h.num_recv_tokens == (rec.n if sync else R * M)
    assert torch.equal(h.recv_src_metadata[:rec.n].cpu(), rec.metadata(expand))
    assert torch.equal(h.dst_buffer_slot_idx.cpu(), ref.dst_slots(idx, LOCAL, R))
    # A cached dispatch moves the same rows (and weights) along the handle's routing.
    cached_x, cached_idx, cached_w, cached_h, _ = buf.dispatch(x_in, handle=h, topk_weights=w.cuda(),
                                                               do_expand=expand)
    assert cached_h is h and torch.equal(cached_w[:n], recv_w[:n])
    if fp8:
        assert torch.equal(cached_x[0][:n].view(torch.uint8), recv_x[0][:n].view(torch.uint8))
    else:
        assert torch.equal(cached_x[:n], recv_x[:n])
    assert expand or torch.equal(cached_idx, recv_idx)
    # combine: each rank's parts back to their owners, summed; the weights back to their columns.
    y = torch.zeros(rows, H, dtype=torch.bfloat16, device="cuda")
    y[:n] = ref.combine_inputs(rec, H, expand).cuda()
    out, out_w, _ = buf.combine(y, h, topk_weights=recv_w)
    assert torch.equal(out.cpu(), ref.combined(idx, me, LOCAL, M, H, expand))
    assert torch.equal(out_w.cpu(), torch.where(idx >= 0, w, 0.0))


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("num_bias", [1, 2])
def test_combine_starts_from_the_biases(buffer, expand, num_bias):
    buf, me, R = buffer
    inputs, rec = _received(R, me, expand, seed=9100)
    idx, x, _ = inputs[me]
    h = buf.dispatch(x.cuda(), topk_idx=idx.cuda(), num_experts=LOCAL * R, expert_alignment=ALIGN,
                     do_expand=expand)[3]
    gen = torch.Generator().manual_seed(me)
    biases = tuple(torch.randn((idx.shape[0], H), generator=gen).to(torch.bfloat16) for _ in range(num_bias))
    bias = tuple(b.cuda() for b in biases) if num_bias == 2 else biases[0].cuda()
    out, _, _ = buf.combine(ref.combine_inputs(rec, H, expand).cuda(), h, bias=bias)
    assert torch.equal(out.cpu(), ref.combined(idx, me, LOCAL, M, H, expand, True, biases))


def test_expanded_combine_without_multiple_reduction(world):
    me, R = world
    buf = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=M, hidden=H, num_topk=K,
                                allow_multiple_reduction=False, explicitly_destroy=True)
    try:
        inputs, rec = _received(R, me, True, seed=9200)
        idx, x, _ = inputs[me]
        h = buf.dispatch(x.cuda(), topk_idx=idx.cuda(), num_experts=LOCAL * R, expert_alignment=ALIGN,
                         do_expand=True)[3]
        out, _, _ = buf.combine(ref.combine_inputs(rec, H, True).cuda(), h)
        assert torch.equal(out.cpu(), ref.combined(idx, me, LOCAL, M, H, True, multiple_reduction=False))
    finally:
        buf.destroy()


def test_events_on_the_current_stream(buffer):
    buf, me, R = buffer
    inputs, rec = _received(R, me, False, seed=9300)
    idx, x, w = inputs[me]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # work the dispatch must wait for, on another stream
        xs = x.cuda() * 1
        done = buf.capture()
    recv_x, _, _, h, event = buf.dispatch(xs, topk_idx=idx.cuda(), topk_weights=w.cuda(), num_experts=LOCAL * R,
                                          previous_event=done, async_with_compute_stream=True,
                                          allocate_on_comm_stream=True)
    event.current_stream_wait()
    assert torch.equal(recv_x.cpu(), rec.rows([i[1] for i in inputs]))
    out, _, event = buf.combine(ref.combine_inputs(rec, H, False).cuda(), h, previous_event=buf.capture(),
                                async_with_compute_stream=True)
    with event:
        pass
    assert torch.equal(out.cpu(), ref.combined(idx, me, LOCAL, M, H, False))
    buf.barrier()


def test_domains_and_size_hint_describe_the_group(buffer):
    buf, me, R = buffer
    idx, x, _ = _inputs(me, R)
    buf.dispatch(x.cuda(), topk_idx=idx.cuda(), num_experts=LOCAL * R)  # the group exists from here on
    group = buf._core._groups[LOCAL * R]
    info = group.info()
    assert buf.get_physical_domain_size() == (info["n_domains"], info["domain_size"])
    hint = deep_ep.ElasticBuffer.get_buffer_size_hint(dist.group.WORLD, M, H, K)
    assert info["window_bytes"] + info["rail_staging_bytes"] <= hint
