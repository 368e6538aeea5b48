"""CPU checks of nccl.ep.autograd's pieces that need no GPU: the exact three-part bf16 split of fp32 weight
gradients (Low-Latency combine moves bf16 only) and the refusals of what is not differentiable yet."""

import types

import pytest

torch = pytest.importorskip("torch")
import nccl.ep.autograd as epa  # noqa: E402


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


def test_what_is_not_differentiable_yet_is_refused():
    x = torch.zeros(4, 8)
    w = torch.ones(4, 2, requires_grad=True)
    group, handle = _fake("expert_major")
    with pytest.raises(NotImplementedError, match="weights' gradient through EXPERT_MAJOR"):
        epa.dispatch(group, x, None, w, handle=handle)
    with pytest.raises(NotImplementedError, match="owner's topk_weights"):
        epa.combine(group, x, handle)
    with pytest.raises(NotImplementedError, match="gradient through EXPERT_MAJOR"):
        epa.combine(group, x, handle, topk_weights=w)
    group, handle = _fake("expert_major", low_latency=False)
    with pytest.raises(NotImplementedError, match="High-Throughput EXPERT_MAJOR"):
        epa.dispatch(group, x, None, w.detach(), handle=handle)
    group, handle = _fake("rank_major")
    with pytest.raises(NotImplementedError, match="topk_weights are for EXPERT_MAJOR"):
        epa.combine(group, x, handle, topk_weights=w.detach())
