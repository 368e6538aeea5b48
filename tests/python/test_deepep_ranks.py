"""nccl.ep.deepep on any number of ranks, driven as code for deep_ep drives DeepEP's intranode Buffer: 1 rank, or
several under torchrun (on one GPU with --one-gpu nodes: every rank an NVLink domain of its own, so the group goes
over nccl.ep's rail exchange). Every rank derives every rank's inputs from the seed and the rank (tests/python/
_seeded.py) and checks its own outputs against torch: get_dispatch_layout's counts and token-in-rank map, dispatch's
rows by source rank in token order with local expert ids, weights and the per-expert list, a cached dispatch, and
combine's sums of rows and weights over the ranks, exactly."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import _deepep_reference as ref  # noqa: E402
import nccl.ep.deepep as deep_ep  # noqa: E402
from _seeded import on_rank, routed_tokens  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, LOCAL, K = 40, 512, 4, 6  # tokens per rank at most, hidden, experts per rank, top-k


def _inputs(s, R):
    return routed_tokens(s, R, max_tokens=M, hidden=H, local=LOCAL, topk=K, seed=5000)


@pytest.fixture(scope="module")
def buffer(world):
    rank, R = world
    saved = deep_ep.Buffer.max_tokens_per_rank
    deep_ep.Buffer.max_tokens_per_rank = M  # the group's slices (and, across domains, its rail messages) stay small
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e8), 0, explicitly_destroy=True)
    yield buf, rank, R
    buf.destroy()
    deep_ep.Buffer.max_tokens_per_rank = saved


def test_layout_dispatch_cached_dispatch_and_combine(buffer):
    buf, me, R = buffer
    E = LOCAL * R
    idx, x, w = _inputs(me, R)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx.cuda(), E)
    hit = torch.stack([on_rank(idx, d, LOCAL).any(dim=1) for d in range(R)], dim=1)  # [T, R]
    assert torch.equal(in_rank.cpu(), hit)
    assert torch.equal(per_rank.long().cpu(), hit.sum(dim=0))
    assert torch.equal(per_expert.long().cpu(), torch.bincount(idx[idx >= 0], minlength=E))
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x.cuda(), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx.cuda(), topk_weights=w.float().cuda())
    rows, ids, ws, want_counts = [], [], [], torch.zeros(LOCAL, dtype=torch.int64)
    for s in range(R):  # source by source, each source's tokens with an expert here in token order
        idx_s, x_s, w_s = _inputs(s, R)
        mine = on_rank(idx_s, me, LOCAL)
        sent = mine.any(dim=1)
        rows.append(x_s[sent])
        ids.append(torch.where(mine, idx_s - me * LOCAL, -1)[sent])
        ws.append(torch.where(mine, w_s, 0.0)[sent])
        want_counts += torch.bincount(idx_s[mine] - me * LOCAL, minlength=LOCAL)
    assert torch.equal(recv_x.cpu(), torch.cat(rows))
    assert torch.equal(recv_idx.cpu(), torch.cat(ids))
    assert torch.equal(recv_w.cpu(), torch.cat(ws).float())
    assert counts == want_counts.tolist()
    # Combine sums each token's rows and weights over the ranks it went to: x times that count, and its weights.
    out, out_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
    sent = hit.any(dim=1)
    assert torch.equal(out.cpu()[sent], (x.float() * hit.sum(dim=1, keepdim=True)).to(torch.bfloat16)[sent])
    assert torch.equal(out_w.cpu()[sent], torch.where(idx >= 0, w, 0.0).float()[sent])
    # A cached dispatch (the handle given) moves new rows along the same routing.
    cached_x, *rest, _ = buf.dispatch(x.cuda() * 2, handle=handle)
    assert torch.equal(cached_x.cpu(), torch.cat(rows) * 2) and rest == [None, None, None, None]


@pytest.mark.parametrize("worst", [False, True])
def test_handle_entries_are_deepeps(buffer, worst):
    """The dispatch handle's six entries against DeepEP's definitions (tests/python/_deepep_reference.py) computed
    from every rank's routing, with exact and worst-case rows; the rows of recv_x from source s end at
    rank_prefix_matrix[s][me] (as DeepEP's test_intranode.py reads it) and are source s's tokens recv_src_idx."""
    buf, me, R = buffer
    E, channels = LOCAL * R, 12
    hits = [torch.stack([on_rank(_inputs(s, R)[0], d, LOCAL).any(dim=1) for d in range(R)], dim=1) for s in range(R)]
    idx, x, w = _inputs(me, R)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx.cuda(), E)
    recv_x, _, _, _, handle, _ = buf.dispatch(
        x.cuda(), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx.cuda(), topk_weights=w.float().cuda(), num_worst_tokens=R * M if worst else 0,
        config=deep_ep.Config(2 * channels, 8, 256))
    rows = recv_x.shape[0]
    want = ref.handle([h.tolist() for h in hits], me, channels, rows)
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head = handle
    for got, expected in zip((rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, send_head), want):
        assert got.is_cuda and got.dtype == torch.int32 and got.tolist() == expected
    assert is_token_in_rank is in_rank
    total = int(rank_prefix[R - 1][me])
    assert total == sum(int(h[:, me].sum()) for h in hits) and (worst or rows == total)
    start = 0
    for s in range(R):
        end = int(rank_prefix[s][me])
        src = recv_src_idx[start:end].long().cpu()
        assert torch.equal(recv_x[start:end].cpu(), _inputs(s, R)[1][src]), s
        start = end
    out, _, _ = buf.combine(recv_x, handle)  # the handle still serves combine
    sent = hits[me].any(dim=1)
    assert torch.equal(out.cpu()[sent], (x.float() * hits[me].sum(dim=1, keepdim=True)).to(torch.bfloat16)[sent])
