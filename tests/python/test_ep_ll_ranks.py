"""nccl.ep Low-Latency on any number of ranks: 1, or several under torchrun (on one GPU with --one-gpu nodes: every
rank an NVLink domain of its own, so every row between ranks goes over the rail exchange of docs/ARCHITECTURE.md,
"Low-Latency across NVLink domains"). Every rank derives every rank's inputs from the seed and the rank, so each
checks its own outputs against a torch reference without any exchange: RANK_MAJOR rows from every source in source
order, EXPERT_MAJOR zones, the counts, and combine by rank, with the dispatched weights and with the owner's weights.
Values are multiples of 1/8 small enough that every product and sum is exact in fp32, so outputs compare exactly."""

import pytest

torch = pytest.importorskip("torch")

import nccl.ep as ep  # noqa: E402
from _seeded import check_flat_rail_traffic, on_rank, routed_tokens  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, LOCAL, K = 24, 512, 2, 3  # tokens per rank at most, hidden, experts per rank, top-k


def _inputs(s, R):
    """Source s's tokens: (T_s, the routing [T_s, K] over R * LOCAL experts with some -1, x [T_s, H] bf16, dispatch
    weights and owner weights [T_s, K])."""
    idx, x, w, w_owner = routed_tokens(s, R, max_tokens=M, hidden=H, local=LOCAL, topk=K, seed=9000, n_weights=2)
    return idx.shape[0], idx, x, w, w_owner


def _mine(idx, d):
    return on_rank(idx, d, LOCAL)


@pytest.fixture(scope="module")
def ll(world):
    rank, R = world
    g = ep.Group(algorithm="low_latency", num_experts=LOCAL * R, max_tokens_per_rank=M, hidden=H, max_topk=K,
                 num_sms=8, timeout_s=30)
    yield g, rank, R
    g.close()


def _dispatched(g, me, R, layout):
    """This rank's inputs, its handle of `layout` and what its dispatch (with the dispatch weights) received."""
    T, idx, x, w, w_owner = _inputs(me, R)
    h = g.create_handle(idx.cuda(), layout=layout)
    recv = g.dispatch(x.cuda(), topk_weights=w.cuda(), handle=h)
    torch.cuda.synchronize()
    return idx, x, w, w_owner, h, recv


def test_rank_major_topk_idx_in_global_expert_ids(ll):
    # global_expert_ids=True: source s's rows s * M + j carry the routing's own ids where the expert is here, -1
    # elsewhere.
    g, me, R = ll
    T, idx, x, w, _ = _inputs(me, R)
    h = g.create_handle(idx.cuda(), layout="rank_major")
    recv = g.dispatch(x.cuda(), topk_weights=w.cuda(), handle=h, global_expert_ids=True)
    torch.cuda.synchronize()
    for s in range(R):
        _, idx_s, _, _, _ = _inputs(s, R)
        hit = _mine(idx_s, me)
        sent = hit.any(dim=1)
        n = int(sent.sum())
        want = torch.where(hit, idx_s, torch.full_like(idx_s, -1))[sent]
        assert torch.equal(recv.topk_idx[s * M:s * M + n].long().cpu(), want), s
    h.close()


def _nvfp4_reference(x, g):
    """NVFP4 of bf16 rows x [n, H] under global scale g, computed here in torch (not by the library's numeric.h):
    per 16 columns the e4m3 scale of amax / 6 x g, then each value times g / scale to the nearest e2m1 magnitude,
    ties to the even code, saturating at 6; two codes a byte, the first in the low nibble. Returns (bytes [n, H/2]
    uint8, scales [n, H/16] uint8)."""
    g = torch.tensor(g, dtype=torch.float32)  # as the kernel reads it: every step in fp32
    v = x.float().reshape(x.shape[0], -1, 16)
    amax = v.abs().amax(dim=2)
    scale = (amax / 6.0 * g).to(torch.float8_e4m3fn)
    s = scale.float()
    f = torch.where(s != 0, g / torch.where(s != 0, s, torch.ones_like(s)), torch.zeros_like(s))
    a = (v * f.unsqueeze(2)).abs()
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    dist = (a.unsqueeze(3) - mags).abs()
    best = dist.min(dim=3, keepdim=True).values
    ties = (dist == best) & (torch.arange(8) % 2 == 0)  # a tie goes to the even code
    code = torch.where((dist == best).sum(dim=3) > 1, ties.int().argmax(dim=3), dist.argmin(dim=3))
    code = torch.where(a > 6.0, torch.full_like(code, 7), code)
    code = code | ((v * f.unsqueeze(2) < 0) | ((v * f.unsqueeze(2) == 0) & torch.signbit(v))).int() * 8
    code = code.reshape(x.shape[0], -1).to(torch.uint8)
    return code[:, 0::2] | (code[:, 1::2] << 4), scale.view(torch.uint8)


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
def test_nvfp4_quantised_rows_match_a_torch_reference(ll, layout):
    # bf16 x dispatched with out_dtype=float4_e2m1fn_x2 and a global scale: every received row's packed bytes and
    # e4m3 scales are the torch reference's of the source's row (RANK_MAJOR rows s * M + j; EXPERT_MAJOR: each
    # zone's rows, by src_info).
    g, me, R = ll
    T, idx, x, w, _ = _inputs(me, R)
    gscale = 448.0 * 6.0 / max(float(_inputs(s, R)[2].float().abs().max()) for s in range(R))
    h = g.create_handle(idx.cuda(), layout=layout)
    recv = g.dispatch(x.cuda(), handle=h, out_dtype=torch.float4_e2m1fn_x2,
                      global_scale=torch.tensor([gscale], device="cuda"))
    torch.cuda.synchronize()
    assert recv.tokens.dtype == torch.float4_e2m1fn_x2 and recv.tokens.shape[1] == H // 2
    assert recv.scales.dtype == torch.float8_e4m3fn and recv.scales.shape[1] == H // 16
    got, got_s = recv.tokens.view(torch.uint8).cpu(), recv.scales.view(torch.uint8).cpu()
    src = recv.src_info.cpu()
    rows = []
    if layout == "rank_major":
        for s in range(R):
            for j in range(int(recv.rank_counts[s])):
                rows.append((s * M + j, s, int(src[s * M + j])))
    else:
        for e in range(LOCAL):
            for i in range(int(recv.expert_counts[e])):
                r = e * R * M + i
                rows.append((r, int(src[r]) // M, int(src[r]) % M))
    assert rows
    for r, s, t in rows:
        want, want_s = _nvfp4_reference(_inputs(s, R)[2][t:t + 1], gscale)
        assert torch.equal(got[r], want[0]), (r, s, t)
        assert torch.equal(got_s[r], want_s[0]), (r, s, t)
    h.close()


def test_rank_major_rows_from_every_source_and_combine_by_rank(ll):
    g, me, R = ll
    idx, x, w, _, h, recv = _dispatched(g, me, R, "rank_major")
    assert recv.tokens.shape == (R * M, H)
    total = 0
    for s in range(R):
        _, idx_s, x_s, w_s, _ = _inputs(s, R)
        hit = _mine(idx_s, me)
        sent = hit.any(dim=1)
        n = int(sent.sum())
        total += n
        assert int(recv.rank_counts[s]) == n, s
        rows = recv.tokens[s * M:s * M + n].cpu()
        assert torch.equal(rows, x_s[sent]), s
        assert torch.equal(recv.src_info[s * M:s * M + n].long().cpu(), sent.nonzero().squeeze(1)), s
        local_ids = torch.where(hit, idx_s - me * LOCAL, torch.full_like(idx_s, -1))[sent]
        assert torch.equal(recv.topk_idx[s * M:s * M + n].long().cpu(), local_ids), s
        assert torch.equal(recv.topk_weights[s * M:s * M + n].cpu(), torch.where(hit, w_s, 0.0)[sent]), s
    assert int(recv.recv_total[0]) == total
    # Every destination doubles the rows it got: my token t comes back once from each rank it was sent to.
    out = g.combine(recv.tokens * 2, h)
    torch.cuda.synchronize()
    ranks_hit = torch.stack([_mine(idx, d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
    ref = (x.float() * 2 * ranks_hit.unsqueeze(1)).to(torch.bfloat16)
    assert torch.equal(out.cpu(), ref)
    h.close()


def test_expert_major_zones_and_both_weightings(ll):
    g, me, R = ll
    idx, x, w, w_owner, h, recv = _dispatched(g, me, R, "expert_major")
    zone = R * M
    assert recv.tokens.shape == (LOCAL * zone, H)
    for l in range(LOCAL):
        e = me * LOCAL + l
        want, want_w = [], []
        for s in range(R):  # zone l: source by source, each source's (token, column) pairs naming e in token order
            _, idx_s, x_s, w_s, _ = _inputs(s, R)
            t, k = (idx_s == e).nonzero(as_tuple=True)
            want.append(x_s[t])
            want_w.append(w_s[t, k])
        rows = torch.cat(want)
        c = rows.shape[0]
        assert int(recv.expert_counts[l]) == c, l
        assert torch.equal(recv.tokens[l * zone:l * zone + c].cpu(), rows), l
        assert torch.equal(recv.topk_weights[l * zone:l * zone + c].cpu(), torch.cat(want_w)), l
    # Expert e multiplies by (e % 3 + 1); combine weights by the dispatched weights, then by the owner's.
    factor = (torch.arange(LOCAL) + me * LOCAL) % 3 + 1
    y = (recv.tokens.float() * factor.cuda().float().repeat_interleave(zone).unsqueeze(1)).to(torch.bfloat16)
    c_of = torch.where(idx >= 0, (idx.clamp(min=0) % 3 + 1).float(), 0.0)
    # With the dispatched weights each rank sums its experts' rows (exact in fp32) and sends that row rounded to
    # bf16; the owner sums the ranks' rows (exact) and rounds once more.
    parts = [(x.double() * (w * c_of * _mine(idx, d)).double().sum(dim=1, keepdim=True)).float().to(torch.bfloat16)
             for d in range(R)]
    ref_dispatch = torch.stack([p.float() for p in parts]).sum(dim=0).to(torch.bfloat16)
    # With the owner's weights every (token, expert) row comes back as is and the owner weighs and sums once.
    ref_owner = (x.double() * (w_owner * c_of).double().sum(dim=1, keepdim=True)).float().to(torch.bfloat16)
    for ref, kwargs in ((ref_dispatch, {}), (ref_owner, {"topk_weights": w_owner.float().cuda()})):
        out = g.combine(y, h, **kwargs)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), ref), list(kwargs)
    h.close()


def test_group_info_says_what_crosses_domains(ll):
    g, me, R = ll
    info = g.info()
    assert info["n_domains"] * info["domain_size"] == R and info["window_bytes"] > 0
    across = info["n_domains"] > 1
    for key in ("rail_dispatch_bytes", "rail_combine_bytes", "rail_combine_owner_bytes"):
        assert (info[key] > 0) == across, (key, info)
    if across:  # a dispatch slice holds M rows of H bf16 columns at least; the owner-weighted combine's more
        assert info["rail_dispatch_bytes"] >= M * H * 2
        assert info["rail_combine_owner_bytes"] >= info["rail_combine_bytes"] >= M * H * 2
    check_flat_rail_traffic(info, high_throughput=False)
