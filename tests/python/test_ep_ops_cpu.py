"""nccl.ep.ops on the CPU: the custom ops' schemas, the handle registry's refusals, and tracing through the fake
implementations (shapes from the registered handle), forward and backward, as torch.compile would see them."""

import pytest

torch = pytest.importorskip("torch")
import nccl.ep as ep  # noqa: E402
import nccl.ep.ops as epops  # noqa: E402
from ep_mock import MockLowLatency, MockLowLatencyHandle  # noqa: E402


class _FakeGroup:
    local_experts = 4


class _FakeHandle:
    """What the ops read of a Handle when tracing: layout, sizing, token count, top-k and the worst-case rows."""

    def __init__(self, layout="flat", sizing="worst_case", num_tokens=8, topk=2, rows=24):
        self.layout, self.sizing, self.num_tokens, self.topk, self.rows = layout, sizing, num_tokens, topk, rows
        self.group = _FakeGroup()

    def output_rows(self):
        return self.rows


def test_schemas():
    assert "handle_id, Tensor x, Tensor topk_idx, Tensor topk_weights) -> (Tensor, Tensor, Tensor, Tensor)" in str(
        torch.ops.nccl_ep.dispatch.default._schema)
    assert "handle_id, Tensor y) -> Tensor" in str(torch.ops.nccl_ep.combine.default._schema)
    assert "handle_id, Tensor x) -> Tensor" in str(torch.ops.nccl_ep.redispatch.default._schema)


@pytest.mark.parametrize("layout,sizing", [("expert_major", "worst_case"), ("flat", "exact")])
def test_register_wants_static_flat_handles(layout, sizing):
    with pytest.raises(ep.NcclInvalidArgument, match="'flat' and sizing 'worst_case'"):
        epops.register(_FakeHandle(layout, sizing))


def test_ids_name_the_handles_shapes():
    # A compiled graph carries the id as a constant: handles of other shapes (another world size) must never share
    # one across processes, or torch's on-disk graph cache would hand one the other's graph (seen on a GPU: a
    # 2-rank run loaded a graph compiled at 4 ranks). Same shapes: the same high bits, so the cache still hits.
    a, b, c = _FakeHandle(rows=24), _FakeHandle(rows=48), _FakeHandle(rows=24)
    ids = [epops.register(h) for h in (a, b, c)]
    try:
        assert len(set(ids)) == 3
        assert ids[0] >> 24 != ids[1] >> 24 and ids[0] >> 24 == ids[2] >> 24
        assert all(0 < i < 2**63 for i in ids)
        assert epops._handle(ids[1]) is b
    finally:
        for i in ids:
            epops.unregister(i)


def test_an_unknown_id_is_refused():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ep.NcclInvalidUsage, match="no handle registered as 12345"):
        torch.ops.nccl_ep.combine(12345, torch.empty(4, 8))


@pytest.fixture
def hid():
    """A registered stand-in handle's id (8 tokens, top-2, 24 worst-case rows, 4 local experts)."""
    handle_id = epops.register(_FakeHandle())
    yield handle_id
    epops.unregister(handle_id)


def test_tracing_through_the_fake_implementations(hid):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, idx, w):
        tokens, ids, rw, counts = torch.ops.nccl_ep.dispatch(hid, x, idx, w)
        return torch.ops.nccl_ep.combine(hid, tokens * rw.sum(dim=1, keepdim=True)), tokens, ids, counts

    x, idx, w = torch.randn(8, 16), torch.zeros(8, 2, dtype=torch.int64), torch.rand(8, 2)
    gm = make_fx(layer, tracing_mode="fake")(x, idx, w)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "nccl_ep.dispatch.default" in targets and "nccl_ep.combine.default" in targets
    with FakeTensorMode() as mode:
        out, tokens, ids, counts = layer(mode.from_tensor(x), mode.from_tensor(idx), mode.from_tensor(w))
    assert tuple(out.shape) == (8, 16) and tuple(tokens.shape) == (24, 16)
    assert ids.dtype == torch.int32 and tuple(ids.shape) == (24, 2) and tuple(counts.shape) == (4,)
    with FakeTensorMode() as mode, pytest.raises(ep.NcclInvalidArgument, match="5 tokens for a handle of 8"):
        torch.ops.nccl_ep.dispatch(hid, mode.from_tensor(torch.randn(5, 16)),
                                   mode.from_tensor(torch.zeros(5, 2, dtype=torch.int64)),
                                   mode.from_tensor(torch.rand(5, 2)))


def test_the_backward_graph_is_a_combine_and_a_dispatch(hid):
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, idx, w):
        tokens, _, rw, _ = torch.ops.nccl_ep.dispatch(hid, x, idx, w)
        out = torch.ops.nccl_ep.combine(hid, tokens * 2)
        gx, gw = torch.autograd.grad((out.sum() + rw.sum()), (x, w))
        return gx, gw

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.rand(8, 2, requires_grad=True)
    gm = make_fx(step, tracing_mode="fake")(x, torch.zeros(8, 2, dtype=torch.int64), w)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("nccl_ep.dispatch.default") == 1
    assert targets.count("nccl_ep.redispatch.default") == 1  # combine's backward
    assert targets.count("nccl_ep.combine.default") == 3  # forward, and dispatch's backward (rows, weights)


# -- Low-Latency ops ------------------------------------------------------------------------------------------------
def test_low_latency_ops_schemas_shapes_and_refusals():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert ("handle_id, Tensor x, Tensor topk_idx, Tensor? topk_weights, bool fp8, bool round_scale) -> (Tensor, "
            "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)") in str(torch.ops.nccl_ep.ll_dispatch.default._schema)
    assert "handle_id, Tensor y, Tensor? topk_weights) -> Tensor" in str(torch.ops.nccl_ep.ll_combine.default._schema)
    group = MockLowLatency(5, 8)
    idx = torch.stack([torch.randperm(5)[:3] for _ in range(6)])
    hid = epops.register(MockLowLatencyHandle(group, idx))
    ht = epops.register(_FakeHandle())
    few = idx[:5].clone()
    try:
        with FakeTensorMode() as mode:
            x, i, w = (mode.from_tensor(t) for t in (torch.randn(6, 256).bfloat16(), idx, torch.rand(6, 3)))
            outs = torch.ops.nccl_ep.ll_dispatch(hid, x, i, w, True, False)
            shapes = [(tuple(o.shape), o.dtype) for o in outs]
            assert shapes == [((40, 256), torch.float8_e4m3fn), ((40, 2), torch.float32), ((40,), torch.float32),
                              ((0,), torch.int32), ((40,), torch.int32), ((5,), torch.int32), ((1,), torch.int32)]
            out = torch.ops.nccl_ep.ll_combine(hid, mode.from_tensor(torch.randn(40, 256).bfloat16()), w)
            assert tuple(out.shape) == (6, 256) and out.dtype == torch.bfloat16
            with pytest.raises(ep.NcclInvalidArgument, match="5 tokens for a handle of 6"):
                torch.ops.nccl_ep.ll_dispatch(hid, mode.from_tensor(torch.randn(5, 256).bfloat16()),
                                              mode.from_tensor(few), None, False, False)
            with pytest.raises(ep.NcclInvalidUsage, match="Low-Latency handle; use the ll_dispatch"):
                torch.ops.nccl_ep.combine(hid, mode.from_tensor(torch.randn(40, 8)))
            with pytest.raises(ep.NcclInvalidUsage, match="High-Throughput handle; use the dispatch"):
                torch.ops.nccl_ep.ll_combine(ht, mode.from_tensor(torch.randn(24, 8)), None)
    finally:
        epops.unregister(hid)
        epops.unregister(ht)


def test_low_latency_ops_gradients_match_a_dense_reference():
    # Through the ops on the one-rank torch model: dispatch(x, w) -> rows times their expert's matrix and their
    # dispatched weight -> owner-weighted combine (v); gradients of x, w and v against the dense computation.
    tokens, k, experts, hidden = 6, 3, 5, 32
    gen = torch.Generator().manual_seed(21)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    group = MockLowLatency(experts, 8)
    hid = epops.register(MockLowLatencyHandle(group, idx))
    try:
        mats = torch.randn(experts, hidden, hidden, generator=gen) / hidden ** 0.5
        x0, probe = torch.randn(tokens, hidden, generator=gen), torch.randn(tokens, hidden, generator=gen)
        w0, v0 = torch.rand(tokens, k, generator=gen) + 0.5, torch.rand(tokens, k, generator=gen) + 0.5

        x, w, v = (t.clone().requires_grad_() for t in (x0, w0, v0))
        recv, _, rw, _, _, counts, _ = torch.ops.nccl_ep.ll_dispatch(hid, x.to(torch.bfloat16), idx, w, False, False)
        assert torch.isfinite(recv).all() and int(counts.sum()) == tokens * k  # rows past the counts zeroed
        expert = torch.arange(recv.shape[0]) // 8
        y = torch.einsum("rh,rhg->rg", recv.float(), mats[expert]) * rw.unsqueeze(1)
        out = torch.ops.nccl_ep.ll_combine(hid, y, v)
        (out.float() * probe).sum().backward()

        xr, wr, vr = (t.clone().requires_grad_() for t in (x0, w0, v0))
        rows = torch.einsum("th,tkhg->tkg", xr.to(torch.bfloat16).float(), mats[idx]) * wr.unsqueeze(2)
        ((vr.unsqueeze(2) * rows.to(torch.bfloat16).float()).sum(dim=1) * probe).sum().backward()
        for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (v.grad, vr.grad)):
            torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
    finally:
        epops.unregister(hid)


def test_low_latency_backward_graph_traces_through_the_fake_implementations():
    from torch.fx.experimental.proxy_tensor import make_fx

    group = MockLowLatency(5, 8)
    idx = torch.stack([torch.randperm(5)[:3] for _ in range(6)])
    hid = epops.register(MockLowLatencyHandle(group, idx))
    try:
        def step(x, idx, w, v):
            recv, _, rw, _, _, _, _ = torch.ops.nccl_ep.ll_dispatch(hid, x, idx, w, False, False)
            out = torch.ops.nccl_ep.ll_combine(hid, recv.float() * rw.unsqueeze(1), v)
            return torch.autograd.grad(out.float().sum(), (x, w, v))

        args = (torch.randn(6, 32, requires_grad=True), idx, torch.rand(6, 3, requires_grad=True),
                torch.rand(6, 3, requires_grad=True))
        gm = make_fx(step, tracing_mode="fake")(*args)
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        assert targets.count("nccl_ep.ll_dispatch.default") == 1
        # combine's backward: the output gradient and the columns; dispatch's: the columns again.
        assert targets.count("nccl_ep.ll_redispatch.default") == 3
        # forward; the owner weights' parts; x's gradient; the dispatched weights' parts.
        assert targets.count("nccl_ep.ll_combine.default") == 4
        assert group.calls == []  # nothing ran: tracing only
    finally:
        epops.unregister(hid)
