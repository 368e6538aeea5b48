"""A DeepEP-style intranode test of nccl.ep.deepep, written as code for deep_ep is (1 rank here; several ranks on
one GPU need EP across NVLink domains, several GPUs the 2-GPU runs): layout, dispatch (plain, cached, worst-case),
combine, events, against torch on fresh random data."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.ep.deepep as deep_ep  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def buffer(one_rank_world):
    deep_ep.Buffer.max_tokens_per_rank = 1024
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0, explicitly_destroy=True)
    yield buf
    buf.destroy()


@pytest.mark.parametrize("async_finish", [False, True])
def test_intranode_round_trip(buffer, async_finish):
    R = buffer.group_size
    T, H, K, E = 512, 2048, 8, 64 * R
    scores = torch.randn(T, E, device="cuda").abs() + 1
    topk_idx = torch.topk(scores, K, dim=-1).indices  # int64, as DeepEP's tests make it
    topk_idx[torch.rand(T, K, device="cuda") < 0.1] = -1
    topk_w = torch.rand(T, K, device="cuda")
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    per_rank, _, per_expert, in_rank, ev = buffer.get_dispatch_layout(topk_idx, E, previous_event=buffer.capture(),
                                                                      async_finish=async_finish)
    if async_finish:
        ev.current_stream_wait()
    recv_x, recv_idx, recv_w, counts, handle, ev = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=topk_w, async_finish=async_finish)
    if async_finish:
        ev.current_stream_wait()
    sent = in_rank[:, buffer.rank]
    assert recv_x.shape[0] == int(per_rank[buffer.rank])
    assert torch.equal(recv_x, x[sent])
    local = E // R
    lo = buffer.rank * local
    mine = (topk_idx >= lo) & (topk_idx < lo + local)
    assert torch.equal(recv_idx, torch.where(mine, topk_idx - lo, -1)[sent])
    assert torch.equal(recv_w, torch.where(mine, topk_w, 0.0)[sent])
    assert counts == per_expert[lo:lo + local].tolist()
    out, out_w, ev = buffer.combine(recv_x, handle, topk_weights=recv_w, async_finish=async_finish)
    if async_finish:
        ev.current_stream_wait()
    assert torch.equal(out[sent], (x[sent].float() * in_rank.sum(1)[sent].unsqueeze(1)).to(torch.bfloat16))
    assert torch.allclose(out_w[sent], torch.where(topk_idx >= 0, topk_w, 0.0)[sent])
    cached_x, *rest, _ = buffer.dispatch(x * 2, handle=handle)
    assert torch.equal(cached_x, (x * 2)[sent]) and rest == [None, None, None, None]


def test_worst_case_and_no_topk(buffer):
    R = buffer.group_size
    T, H, K, E = 300, 1024, 4, 32 * R
    topk_idx = torch.stack([torch.randperm(E, device="cuda")[:K] for _ in range(T)])
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    worst = T * R
    recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=torch.ones(T, K, device="cuda"), num_worst_tokens=worst)
    n = int(per_rank[buffer.rank])
    assert counts == [] and recv_x.shape[0] == worst and recv_idx.shape[0] == worst
    assert bool((recv_idx[n:] == -1).all())
    assert torch.equal(recv_x[:n], x[in_rank[:, buffer.rank]])
    out, _, _ = buffer.combine(recv_x, handle)
    assert torch.equal(out, (x.float() * in_rank.sum(1, keepdim=True)).to(torch.bfloat16))
    # no top-k: rows by is_token_in_rank alone
    recv_x2, idx2, w2, counts2, handle2, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    assert idx2 is None and w2 is None and torch.equal(recv_x2, x[in_rank[:, buffer.rank]])
    local = E // R
    assert counts2 == per_expert[buffer.rank * local:(buffer.rank + 1) * local].tolist()  # 1 rank: its own counts
