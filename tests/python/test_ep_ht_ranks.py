"""nccl.ep High-Throughput on any number of ranks: 1, or several under torchrun (on one GPU with --one-gpu nodes: every
rank an NVLink domain of its own, so every row between ranks goes over the rail exchange of docs/ARCHITECTURE.md,
"High-Throughput across NVLink domains"). Every rank derives every rank's inputs from the seed and the rank, so each
checks its own outputs against a torch reference without any exchange: FLAT rows by source in token order with their
local expert ids and weights, EXPERT_MAJOR zones by (source, token), the counts, and both combines; autograd
(FLAT) against a torch model of the same layer; and a CUDA graph of handle update + dispatch + combine replayed with
new routings; and the torch.library ops compiled (fullgraph) against eager and torch, with their gradient. Values are
multiples of 1/8 small enough that every product and sum is exact in fp32, so outputs compare exactly (autograd: to
fp32 rounding). The compile test has a group of its own with a long device-wait budget: each rank compiles before
its first collective, and one rank's compile can outlast the usual budget of a peer that finished first."""

import pytest

torch = pytest.importorskip("torch")

import nccl.ep as ep  # noqa: E402
from _seeded import check_flat_rail_traffic, on_rank, routed_tokens  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, LOCAL, K = 48, 256, 3, 4  # tokens per rank at most, hidden, experts per rank, top-k


def _inputs(s, R):
    """Source s's tokens: (the routing [T_s, K] over R * LOCAL experts with some -1, x [T_s, H] bf16, weights)."""
    return routed_tokens(s, R, max_tokens=M, hidden=H, local=LOCAL, topk=K, seed=7000)


def _mine(idx, d):
    return on_rank(idx, d, LOCAL)


@pytest.fixture(scope="module")
def ht(world):
    rank, R = world
    # fp32 rows (the autograd test's) are the widest the tests send.
    g = ep.Group(num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, dtype=torch.float32, max_topk=K, num_sms=8,
                 timeout_s=30)
    yield g, rank, R
    g.close()


@pytest.mark.parametrize("sizing", ["exact", "worst_case"])
def test_flat_rows_from_every_source_and_combine(ht, sizing):
    _check_flat(*ht, sizing)


def test_a_staging_budget_shrinks_the_rounds_and_keeps_the_results(ht):
    # rail_staging_bytes_max a quarter of the default group's staging: across domains the rounds shrink (to about a
    # quarter of M rows a peer) and the staging fits; the same FLAT rows and combine as without it.
    g0, me, R = ht
    budget = g0.info()["rail_staging_bytes"] // 4
    g = ep.Group(num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, dtype=torch.float32, max_topk=K, num_sms=8,
                 timeout_s=30, rail_staging_bytes_max=budget)
    try:
        info = g.info()
        if info["n_domains"] > 1:
            assert info["rail_staging_bytes"] <= budget and info["rail_round_tokens"] < M, info
        for sizing in ("exact", "worst_case"):
            _check_flat(g, me, R, sizing)
    finally:
        g.close()


def _check_flat(g, me, R, sizing):
    """FLAT dispatch of my tokens: the rows of every source in order with their local ids and weights; then combine
    of the doubled rows."""
    idx, x, w = _inputs(me, R)
    recv = g.dispatch(x.cuda(), idx.cuda(), w.float().cuda(), layout="flat", sizing=sizing)
    torch.cuda.synchronize()
    want, want_idx, want_w = [], [], []
    for s in range(R):  # source by source, each source's tokens with an expert here in token order
        idx_s, x_s, w_s = _inputs(s, R)
        hit = _mine(idx_s, me)
        sent = hit.any(dim=1)
        assert int(recv.rank_counts[s]) == int(sent.sum()), s
        want.append(x_s[sent])
        want_idx.append(torch.where(hit, idx_s - me * LOCAL, torch.full_like(idx_s, -1))[sent])
        want_w.append(torch.where(hit, w_s, 0.0)[sent])
    rows = torch.cat(want)
    n = rows.shape[0]
    if sizing == "exact":
        assert recv.tokens.shape[0] == n
    assert torch.equal(recv.tokens[:n].cpu(), rows)
    assert torch.equal(recv.topk_idx[:n].long().cpu(), torch.cat(want_idx))
    assert torch.equal(recv.topk_weights[:n].cpu(), torch.cat(want_w).float())
    # Every rank doubles the rows it got: my token t comes back once from each rank it was sent to.
    out = g.combine(recv.tokens * 2, recv.handle)
    torch.cuda.synchronize()
    ranks_hit = torch.stack([_mine(idx, d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
    assert torch.equal(out.cpu(), (x.float() * 2 * ranks_hit.unsqueeze(1)).to(torch.bfloat16))
    recv.handle.close()


def test_a_receive_cap_keeps_each_ranks_first_rows(ht):
    # max_recv_rows_per_rank = M * R / 2 with recv_overflow="drop": a rank keeps its first FLAT rows (source by source,
    # tokens in order) up to the cap; the rest are not delivered (the handle's recv_dropped counts them), and combine
    # sums only the rows delivered, missing_experts counting each token's experts left out. The same across NVLink
    # domains (one-GPU nodes: the flat exchange's rounds land in inboxes, and a scatter places their rows).
    g0, me, R = ht
    cap = M * R // 2
    args = dict(num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, dtype=torch.float32, max_topk=K, num_sms=8,
                timeout_s=30, max_recv_rows_per_rank=cap, recv_overflow="drop")
    g = ep.Group(**args)
    try:
        assert g.info()["window_bytes"] < g0.info()["window_bytes"]

        def kept(d):  # rank d's rows: (source, token) in FLAT order, the first `cap` of them, and how many did not fit
            rows = [(s, t) for s in range(R) for t in _mine(_inputs(s, R)[0], d).any(dim=1).nonzero()[:, 0].tolist()]
            return rows[:cap], max(0, len(rows) - cap)

        idx, x, w = _inputs(me, R)
        for sizing in ("exact", "worst_case"):
            recv = g.dispatch(x.cuda(), idx.cuda(), w.float().cuda(), layout="flat", sizing=sizing)
            torch.cuda.synchronize()
            rows, dropped = kept(me)
            want = torch.stack([_inputs(s, R)[1][t] for s, t in rows]) if rows else x[:0]
            assert int(recv.handle.recv_dropped) == dropped
            assert int(recv.recv_total) == len(rows)
            assert torch.equal(recv.tokens[:len(rows)].cpu(), want)
            missing = torch.full((idx.shape[0],), -1, dtype=torch.int32, device="cuda")
            out = g.combine(recv.tokens * 2, recv.handle, missing_experts=missing)
            torch.cuda.synchronize()
            reached = torch.zeros(idx.shape[0], R, dtype=torch.bool)  # my token t's row fit at rank d
            for d in range(R):
                for s, t in kept(d)[0]:
                    if s == me:
                        reached[t, d] = True
            want_out = (x.float() * 2 * reached.sum(dim=1, keepdim=True)).to(torch.bfloat16)
            assert torch.equal(out.cpu(), want_out)
            owner = torch.where(idx >= 0, idx // LOCAL, torch.zeros_like(idx))
            lost = (idx >= 0) & ~reached.gather(1, owner)
            assert torch.equal(missing.cpu(), lost.sum(dim=1).int())
            recv.handle.close()
    finally:
        g.close()


def test_zero_copy_rows_land_in_the_dispatch_window(ht):
    # A group with a receive cap of the worst case (nothing dropped), rows of max_token_bytes: dispatch into
    # dispatch_window() returns the window's tensor, whose first rows are every source's rows in FLAT order (as the
    # copying path's), and combine of them sums as usual; across domains too (each round's scatter writes them).
    g0, me, R = ht
    g = ep.Group(num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, max_topk=K, num_sms=8, timeout_s=30,
                 max_recv_rows_per_rank=M * R)
    try:
        win = g.dispatch_window()
        assert win.shape == (M * R, H) and win.dtype == torch.bfloat16 and win.is_cuda
        idx, x, w = _inputs(me, R)
        for sizing in ("exact", "worst_case"):
            recv = g.dispatch(x.cuda(), idx.cuda(), w.float().cuda(), layout="flat", sizing=sizing, tokens_out=win)
            torch.cuda.synchronize()
            assert recv.tokens is win
            want = torch.cat([_inputs(s, R)[1][_mine(_inputs(s, R)[0], me).any(dim=1)] for s in range(R)])
            n = want.shape[0]
            assert int(recv.recv_total) == n and torch.equal(win[:n].cpu(), want)
            out = g.combine(win[:recv.topk_idx.shape[0]] * 2, recv.handle)
            torch.cuda.synchronize()
            ranks_hit = torch.stack([_mine(idx, d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
            assert torch.equal(out.cpu(), (x.float() * 2 * ranks_hit.unsqueeze(1)).to(torch.bfloat16))
            recv.handle.close()
    finally:
        g.close()


def test_flat_topk_idx_in_global_expert_ids(ht):
    # global_expert_ids=True: each source's rows carry the routing's own ids where the expert is here, -1 elsewhere.
    g, me, R = ht
    idx, x, w = _inputs(me, R)
    recv = g.dispatch(x.cuda(), idx.cuda(), w.float().cuda(), layout="flat", sizing="exact", global_expert_ids=True)
    torch.cuda.synchronize()
    want = []
    for s in range(R):
        idx_s, _, _ = _inputs(s, R)
        hit = _mine(idx_s, me)
        want.append(torch.where(hit, idx_s, torch.full_like(idx_s, -1))[hit.any(dim=1)])
    want = torch.cat(want)
    assert recv.tokens.shape[0] == want.shape[0]
    assert torch.equal(recv.topk_idx.long().cpu(), want)
    recv.handle.close()


@pytest.mark.parametrize("form", ["fp8_fp32_per_token", "fp8_int32_ue8m0", "fp4_opaque_int32"])
def test_flat_forwards_quantised_rows_and_their_scales_bit_for_bit(ht, form):
    # Scales as the caller lays them out: one fp32 a token, one int32 word of packed exponents (H = 256: DeepEP's
    # UE8M0 has H / 512 words, at least one), and packed fp4 rows (two values a byte, uint8) with their e4m3 block
    # scales four to an int32 word (H / 16 bytes); random bits everywhere (NaN patterns included): each received
    # row and its scales must be the source's, byte for byte.
    g, me, R = ht

    def payload(s, n):
        gen = torch.Generator().manual_seed(7100 + 31 * s)
        width = H // 2 if form.startswith("fp4") else H
        rows = torch.randint(0, 256, (n, width), dtype=torch.uint8, generator=gen)
        words = {"fp8_fp32_per_token": 1, "fp8_int32_ue8m0": 1, "fp4_opaque_int32": H // 16 // 4}[form]
        scales = torch.randint(-2 ** 31, 2 ** 31 - 1, (n, words), dtype=torch.int32, generator=gen)
        return rows, (scales.view(torch.float32) if form == "fp8_fp32_per_token" else scales)

    idx, _, _ = _inputs(me, R)
    rows, scales = payload(me, idx.shape[0])
    x = rows.cuda() if form.startswith("fp4") else rows.cuda().view(torch.float8_e4m3fn)
    recv = g.dispatch(x, idx.cuda(), layout="flat", sizing="exact", scales=scales.cuda())
    torch.cuda.synchronize()
    want_rows, want_scales = [], []
    for s in range(R):
        idx_s, _, _ = _inputs(s, R)
        rows_s, scales_s = payload(s, idx_s.shape[0])
        sent = _mine(idx_s, me).any(dim=1)
        want_rows.append(rows_s[sent])
        want_scales.append(scales_s[sent])
    got_rows = recv.tokens.cpu().view(torch.uint8)
    assert recv.scales.dtype == scales.dtype and recv.tokens.dtype == x.dtype
    assert torch.equal(got_rows, torch.cat(want_rows))
    assert torch.equal(recv.scales.cpu().view(torch.int32), torch.cat(want_scales).view(torch.int32))
    recv.handle.close()


def test_expert_major_zones_and_weighted_combine(ht):
    g, me, R = ht
    idx, x, w = _inputs(me, R)
    recv = g.dispatch(x.cuda(), idx.cuda(), w.float().cuda(), layout="expert_major", sizing="exact")
    torch.cuda.synchronize()
    offsets = recv.expert_offsets.long().cpu()
    for l in range(LOCAL):
        e = me * LOCAL + l
        want, want_w = [], []
        for s in range(R):  # zone l: source by source, each source's tokens naming e in token order
            idx_s, x_s, w_s = _inputs(s, R)
            t, k = (idx_s == e).nonzero(as_tuple=True)
            want.append(x_s[t])
            want_w.append(w_s[t, k])
        rows = torch.cat(want)
        c, o = rows.shape[0], int(offsets[l])
        assert int(recv.expert_counts[l]) == c, l
        assert torch.equal(recv.tokens[o:o + c].cpu(), rows), l
        assert torch.equal(recv.topk_weights[o:o + c].cpu(), torch.cat(want_w).float()), l
    # Expert e multiplies by (e % 3 + 1); combine weighs each expert's row by its dispatched weight: every rank, the
    # owner too, sums its experts' rows (exact in fp32) into its part rounded to bf16; the owner sums the parts
    # (exact in fp32) and rounds once.
    factor = torch.zeros(recv.tokens.shape[0])
    for l in range(LOCAL):
        o, c = int(offsets[l]), int(recv.expert_counts[l])
        factor[o:o + c] = (me * LOCAL + l) % 3 + 1
    y = (recv.tokens.float() * factor.cuda().unsqueeze(1)).to(torch.bfloat16)
    out = g.combine(y, recv.handle)
    torch.cuda.synchronize()
    c_of = torch.where(idx >= 0, (idx.clamp(min=0) % 3 + 1).float(), 0.0)
    parts = [(x.double() * (w * c_of * _mine(idx, d)).double().sum(dim=1, keepdim=True)).float() for d in range(R)]
    ref = torch.stack([p.to(torch.bfloat16).float() for p in parts]).sum(dim=0)
    ref = ref.to(torch.bfloat16)
    assert torch.equal(out.cpu(), ref)
    recv.handle.close()


def test_group_info_says_what_crosses_domains(ht):
    g, me, R = ht
    info = g.info()
    assert info["n_domains"] * info["domain_size"] == R
    across = info["n_domains"] > 1
    assert (info["rail_dispatch_bytes"] > 0) == across and (info["rail_combine_bytes"] > 0) == across
    assert info["rail_combine_owner_bytes"] == 0  # no owner-weighted combine in High-Throughput
    if across:  # a dispatch slice holds M rows of H bf16 columns and their metadata
        assert info["rail_dispatch_bytes"] > M * H * 2 and info["rail_combine_bytes"] >= M * H * 2
    check_flat_rail_traffic(info, high_throughput=True)


def test_autograd_flat_matches_a_torch_model(ht):
    import nccl.ep.autograd as epa

    g, me, R = ht
    idx, x0, w0 = _inputs(me, R)
    x0, w0 = x0.float().cuda(), w0.float().cuda()
    grad = torch.linspace(-1, 1, x0.numel(), device="cuda").view_as(x0)
    xa, wa = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    recv_x, recv_w, handle = epa.dispatch(g, xa, idx.cuda(), wa)
    y = recv_x * recv_w.sum(dim=1, keepdim=True) + recv_x.pow(2)  # each rank: its columns' weights, then x^2
    out = epa.combine(g, y, handle)
    (out * grad).sum().backward()
    handle.close()
    # The same layer in torch: every rank the token went to adds x * (its columns' weights) + x^2.
    xb, wb = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    routed = (idx >= 0).cuda()
    hits = torch.stack([_mine(idx, d).any(dim=1) for d in range(R)], dim=1).sum(dim=1).cuda().float()
    ref = xb * torch.where(routed, wb, torch.zeros_like(wb)).sum(dim=1, keepdim=True) + hits.unsqueeze(1) * xb.pow(2)
    (ref * grad).sum().backward()
    assert torch.allclose(out, ref.detach(), rtol=1e-5, atol=1e-5)
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(wa.grad, torch.where(routed, wb.grad, torch.zeros_like(wb.grad)), rtol=1e-4, atol=1e-4)


def _fixed_routing(s, R, T, seed):
    """Source s's routing of T tokens for replay `seed` (the captured graph's inputs keep their shape)."""
    gen = torch.Generator().manual_seed(100 * seed + 13 * s + R)
    idx = torch.stack([torch.randperm(LOCAL * R, generator=gen)[:min(K, LOCAL * R)] for _ in range(T)])
    idx = torch.cat([idx, torch.full((T, K - idx.shape[1]), -1)], dim=1)
    idx[torch.rand(T, K, generator=gen) < 0.15] = -1
    return idx


@pytest.mark.caching_allocator
def test_a_captured_update_dispatch_combine_replays_with_new_routings(ht):
    g, me, R = ht
    T = 17 + 3 * me
    idx_buf = _fixed_routing(me, R, T, 0).cuda()
    x_buf = (torch.randint(-32, 33, (T, H)) * 0.125).to(torch.bfloat16).cuda()
    h = g.create_handle(idx_buf, layout="flat", sizing="worst_case")
    recv = g.dispatch(x_buf, handle=h)  # warm-up outside the capture
    g.combine(recv.tokens * 2, h)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h.update(idx_buf)
        recv = g.dispatch(x_buf, handle=h)
        out = g.combine(recv.tokens * 2, h)
    for seed in range(1, 4):
        idx = _fixed_routing(me, R, T, seed)
        idx_buf.copy_(idx)
        x_buf.copy_((torch.randint(-32, 33, (T, H)) * 0.125).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        hits = torch.stack([_mine(idx, d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
        ref = (x_buf.float().cpu() * 2 * hits.unsqueeze(1)).to(torch.bfloat16)
        assert torch.equal(out.cpu(), ref), seed  # tokens routed nowhere come back as zeros
        counts = torch.zeros(LOCAL, dtype=torch.int64)
        for s in range(R):
            idx_s = _fixed_routing(s, R, 17 + 3 * s, seed)
            counts += torch.bincount(idx_s[_mine(idx_s, me)] - me * LOCAL, minlength=LOCAL)
        assert torch.equal(h.expert_counts.long().cpu(), counts), seed
    h.close()


def test_custom_ops_compile_fullgraph_at_any_rank_count(world):
    import torch.distributed as dist

    import nccl.ep.ops as epops

    me, R = world
    idx, x, _ = _inputs(me, R)
    idx, x = idx.cuda(), x.float().cuda()
    w = torch.ones(idx.shape, device="cuda")
    g = ep.Group(num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, dtype=torch.float32, max_topk=K, num_sms=8,
                 timeout_s=300)
    h = g.create_handle(idx, layout="flat", sizing="worst_case")
    hid = epops.register(h)
    try:
        def layer(x, idx, w):
            tokens, _, _, counts = torch.ops.nccl_ep.dispatch(hid, x, idx, w)
            return torch.ops.nccl_ep.combine(hid, tokens * 3), counts

        hits = torch.stack([_mine(idx.cpu(), d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
        want = x.cpu() * 3 * hits.unsqueeze(1).float()  # token t comes back tripled from every rank it went to
        eager, counts = layer(x, idx, w)
        dist.barrier()  # the ranks start compiling together
        compiled, _ = torch.compile(layer, fullgraph=True)(x, idx, w)
        torch.cuda.synchronize()
        assert torch.equal(eager.cpu(), want) and torch.equal(compiled.cpu(), want)
        mine = torch.zeros(LOCAL, dtype=torch.int64)
        for s in range(R):
            idx_s = _inputs(s, R)[0]
            mine += torch.bincount(idx_s[_mine(idx_s, me)] - me * LOCAL, minlength=LOCAL)
        assert torch.equal(counts.long().cpu(), mine)
        xg = x.clone().requires_grad_()
        out, _ = layer(xg, idx, w)
        out.sum().backward()  # d out / d x = 3 for each rank the token went to
        assert torch.equal(xg.grad.cpu(), (3 * hits.float()).unsqueeze(1).expand_as(xg).contiguous())
    finally:
        epops.unregister(hid)
        h.close()
        g.close()
