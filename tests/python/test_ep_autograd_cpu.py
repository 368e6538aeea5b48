"""CPU checks of nccl.ep.autograd's pieces that need no GPU: the exact three-part bf16 split of fp32 weight
gradients (Low-Latency combine moves bf16 only), the refusals of what is not differentiable yet, and the
EXPERT_MAJOR weights' gradients through a one-rank Low-Latency group written in torch (its documented semantics)."""

import types

import pytest

torch = pytest.importorskip("torch")
import nccl.ep.autograd as epa  # noqa: E402
from ep_mock import MockHighThroughput, MockHighThroughputHandle, MockLowLatency, MockLowLatencyHandle  # noqa: E402,E501


def test_three_bf16_parts_give_fp32_back_exactly():
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(64, 7, generator=gen) * torch.logspace(-6, 6, 7)).float()
    w[0, :] = 0.0
    parts = epa._bf16_parts(w)
    assert parts.dtype == torch.bfloat16 and parts.shape == (64, 24)  # 21 parts padded to rows of 16 bytes
    assert torch.equal(epa._from_bf16_parts(parts, 7), w)
    # A sum with zeros (what combine does where the other ranks send nothing) leaves every part as it was.
    assert torch.equal(epa._from_bf16_parts((parts.float() + 0.0).to(torch.bfloat16), 7), w)


def _fake(layout, low_latency=True):
    group = types.SimpleNamespace(low_latency=low_latency)
    return group, types.SimpleNamespace(layout=layout, topk_idx=None)


def test_combines_without_the_weights_they_need_are_refused():
    x = torch.zeros(4, 8)
    w = torch.ones(4, 2, requires_grad=True)
    group, handle = _fake("expert_major")
    with pytest.raises(NotImplementedError, match="top-k weights it applies"):
        epa.combine(group, x, handle)
    group, handle = _fake("rank_major")
    with pytest.raises(NotImplementedError, match="topk_weights are for EXPERT_MAJOR"):
        epa.combine(group, x, handle, topk_weights=w.detach())


def _routing(tokens, k, experts, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])


def _mock(tokens=6, k=3, experts=5, max_tokens=8, seed=3):
    group = MockLowLatency(experts, max_tokens)
    idx = _routing(tokens, k, experts, seed)
    return group, MockLowLatencyHandle(group, idx), idx


def test_expert_major_row_scalars_reach_their_owner_column_exactly():
    group, handle, idx = _mock()
    k = idx.shape[1]
    cols = epa._em_columns(group, handle, k, "cpu")
    group.dispatch(torch.zeros(6, 8), handle)  # the rows as a real dispatch lays them out
    want = torch.full((6, k), 0.0)
    s = torch.zeros(len(cols))
    gen = torch.Generator().manual_seed(9)
    for r, t, col in handle.rows:
        assert cols[r] == col  # every row learns its top-k column
        s[r] = torch.randn(1, generator=gen) * 10 ** float(torch.randint(-5, 6, (1,), generator=gen))
        want[t, col] = s[r]
    assert int((cols >= 0).sum()) == len(handle.rows)  # rows past the counts: -1
    s[cols < 0] = float("nan")  # never read
    assert torch.equal(epa._em_to_owner(group, handle, s, cols, k), want)


def test_expert_major_gradients_match_a_dense_reference():
    # dispatch(x, w) -> each row times its expert's matrix and its dispatched weight -> owner-weighted combine (w2):
    # gradients of x, w and w2 through the mock against the same computation written densely.
    tokens, k, experts, hidden = 6, 3, 5, 32
    group, handle, idx = _mock(tokens, k, experts)
    gen = torch.Generator().manual_seed(11)
    mats = torch.randn(experts, hidden, hidden, generator=gen) / hidden ** 0.5
    x0 = torch.randn(tokens, hidden, generator=gen)
    w0 = torch.rand(tokens, k, generator=gen) + 0.5
    v0 = torch.rand(tokens, k, generator=gen) + 0.5
    probe = torch.randn(tokens, hidden, generator=gen)

    x, w, v = (t.clone().requires_grad_() for t in (x0, w0, v0))
    recv_x, recv_w, _ = epa.dispatch(group, x, idx, w, handle=handle)
    expert = torch.arange(recv_x.shape[0]) // group.max_tokens_per_rank
    y = torch.einsum("rh,rhg->rg", recv_x.float(), mats[expert]) * recv_w.unsqueeze(1)
    out = epa.combine(group, y, handle, topk_weights=v)
    (out.float() * probe).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (x, w, v))

    xr, wr, vr = (t.clone().requires_grad_() for t in (x0, w0, v0))
    xb = xr.to(torch.bfloat16).float()  # what the Low-Latency dispatch moves
    rows = torch.einsum("th,tkhg->tkg", xb, mats[idx]) * wr.unsqueeze(2)
    ref = (vr.unsqueeze(2) * rows.to(torch.bfloat16).float()).sum(dim=1)
    (ref * probe).sum().backward()
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (v.grad, vr.grad)):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
    # The calls, in order: the forward pair; combine's backward (the output gradient dispatched, then the columns
    # and the weights' parts, 3 x 3 columns padded to 16); dispatch's backward (x's combine, the columns, the parts).
    assert group.calls == [("dispatch", hidden), ("combine", hidden),
                           ("dispatch", hidden), ("dispatch", 8), ("combine", 16),
                           ("combine", hidden), ("dispatch", 8), ("combine", 16)], group.calls


def test_high_throughput_expert_major_gradients_match_a_dense_reference():
    # dispatch(x, w) -> each row times its expert's matrix -> combine, which weights the rows with the dispatched
    # weights (so combine gets that tensor): gradients of x and w against the dense computation; zone pads (NaN in
    # the model) must not reach them.
    tokens, k, experts, hidden = 7, 3, 5, 32
    group = MockHighThroughput(experts, alignment=4)
    idx = _routing(tokens, k, experts, 13)
    handle = MockHighThroughputHandle(group, idx)
    gen = torch.Generator().manual_seed(17)
    mats = torch.randn(experts, hidden, hidden, generator=gen) / hidden ** 0.5
    x0, probe = torch.randn(tokens, hidden, generator=gen), torch.randn(tokens, hidden, generator=gen)
    w0 = torch.rand(tokens, k, generator=gen) + 0.5

    x, w, m = x0.clone().requires_grad_(), w0.clone().requires_grad_(), mats.clone().requires_grad_()
    recv_x, recv_w, _ = epa.dispatch(group, x, idx, w, handle=handle)
    zone = torch.searchsorted(handle.expert_offsets.long(), torch.arange(recv_x.shape[0]), right=True) - 1
    y = torch.einsum("rh,rhg->rg", recv_x, m[zone]) * recv_w.unsqueeze(1)  # the expert also uses its weight
    out = epa.combine(group, y, handle, topk_weights=w)
    (out * probe).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (x, w, m))  # the pads' NaN reached nothing

    xr, wr, mr = x0.clone().requires_grad_(), w0.clone().requires_grad_(), mats.clone().requires_grad_()
    rows = torch.einsum("th,tkhg->tkg", xr, mr[idx]) * wr.unsqueeze(2)
    ((wr.unsqueeze(2) * rows).sum(dim=1) * probe).sum().backward()
    torch.testing.assert_close(out, (wr.unsqueeze(2) * rows).sum(dim=1).detach(), rtol=1e-5, atol=1e-5)
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (m.grad, mr.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(NotImplementedError, match="top-k weights it applies"):
        epa.combine(group, y, handle)


def test_high_throughput_expert_major_data_rows_with_empty_zones_and_trailing_rows():
    # Zones of 4-row alignment: expert 0 has 3 rows, 1 none, 2 has 5, 3 none (at the end), then 4 rows past the last
    # zone (worst-case sizing): only the 8 rows inside the counts hold data.
    group = types.SimpleNamespace(low_latency=False)
    handle = types.SimpleNamespace(layout="expert_major", expert_offsets=torch.tensor([0, 4, 4, 12]),
                                   expert_counts=torch.tensor([3, 0, 5, 0]))
    recv = types.SimpleNamespace(tokens=torch.zeros(16, 8))
    want = torch.zeros(16, dtype=torch.bool)
    want[0:3] = True
    want[4:9] = True
    assert torch.equal(epa._data_rows(group, handle, recv), want)
    assert epa._data_rows(group, types.SimpleNamespace(layout="flat"), recv) is None
