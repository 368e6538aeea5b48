"""nccl.ep.ops on the CPU: the custom ops' schemas, the handle registry's refusals, and tracing through the fake
implementations (shapes from the registered handle), forward and backward, as torch.compile would see them."""

import pytest

torch = pytest.importorskip("torch")
import nccl.ep as ep  # noqa: E402
import nccl.ep.ops as epops  # noqa: E402


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
