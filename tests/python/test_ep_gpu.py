"""nccl.ep on a GPU, 1 rank (a single-process torch.distributed group made here when none exists; under torchrun
the launcher's). Against a torch reference on fresh random data, outputs poisoned by the library's own contract
(rows past the receive count untouched); the torch.library ops compiled (fullgraph) against eager with their
gradients, and fp8 rows with their scales forwarded byte-exact. A High-Throughput CUDA graph of handle update +
dispatch + combine: test_ep_ht_ranks.py, at any rank count (1 too). Several ranks: test_ep_ht_ranks.py,
test_ep_ll_ranks.py.

Low-Latency (a group of its own; skipped with a library that does not have the mode): both layouts against the
contract of tests/unit/ep_ll_reference.h, exactly - rows, src_info, counts, the fp8 quantiser reimplemented in
torch (common/numeric.h's recipe), and both combine paths on data whose fp32 sums are exact - a CUDA graph of
update + dispatch + combine replayed with new routings, two send-only dispatches of two handles in flight (the
double-buffered staging), and rank masks on a group made with enable_mask (the only rank, masked by itself, sends
and receives nothing; unmasked and cleaned it gives the plain group's result). At one rank every expert is local."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.ep as ep  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def group(one_rank_world):
    # fp32 rows: the largest the tests send (a group sized for bf16 refuses them, as the C library must).
    g = ep.Group(num_experts=16 * dist.get_world_size(), max_tokens_per_rank=512, hidden=1024, dtype=torch.float32,
                 max_topk=8, num_sms=16, timeout_s=20)
    yield g
    g.close()


def _routing(T, K, E, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    idx[torch.rand(T, K, generator=gen) < 0.1] = -1  # some slots without an expert
    w = torch.rand(T, K, generator=gen)
    return idx.cuda(), w.cuda()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_flat_dispatch_combine_one_rank(group, dtype):
    T, K, H = 300, 8, 1024
    idx, w = _routing(T, K, group.num_experts, 1)
    x = torch.randn(T, H, device="cuda").to(dtype)
    recv = group.dispatch(x, idx, w)
    torch.cuda.synchronize()
    sent = (idx >= 0).any(dim=1)  # a token with no expert goes nowhere
    n = int(sent.sum())
    assert torch.equal(recv.tokens[:n], x[sent])
    assert torch.equal(recv.topk_idx[:n].long(), idx[sent])  # one rank: local ids are the global ids
    assert torch.equal(recv.topk_weights[:n], torch.where(idx[sent] >= 0, w[sent], torch.zeros_like(w[sent])))
    assert int(recv.rank_counts[0]) == n
    counts = torch.bincount(idx[idx >= 0].flatten(), minlength=group.local_experts)
    assert torch.equal(recv.expert_counts.long().cpu(), counts.cpu())
    y = recv.tokens * 3
    out = group.combine(y, recv.handle)
    torch.cuda.synchronize()
    assert torch.equal(out[sent], (x[sent].float() * 3).to(dtype))
    recv.handle.close()


def _stream_of(ptr: int):
    """The stream the caching allocator's segment holding address `ptr` was allocated for (its reuse follows it)."""
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg["stream"]
    return None


@pytest.mark.caching_allocator
def test_outputs_belong_to_the_stream_the_call_names(group):
    # A call on stream= must allocate what it writes for that stream: allocated for the current one, a caller who
    # drops an output would see its memory handed to the current stream's next allocation while the call still
    # writes it on the other. The handle's counters too (zeroed on the binding's stream, not raced by it).
    T, K, H = 96, 4, 1024
    idx, w = _routing(T, K, group.num_experts, 11)
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    h = group.create_handle(idx, stream=side)
    recv = group.dispatch(x, handle=h, topk_weights=w, stream=side)
    out = group.combine(recv.tokens, h, stream=side)
    side.synchronize()
    for name, t in (("tokens", recv.tokens), ("topk_idx", recv.topk_idx), ("topk_weights", recv.topk_weights),
                    ("combined", out), ("expert_counts", h.expert_counts), ("recv_total", h.recv_total)):
        assert _stream_of(t.data_ptr()) == side.cuda_stream, name
    if dist.get_world_size() == 1:  # one rank: every token that goes anywhere comes back as it went
        sent = (idx >= 0).any(dim=1)
        assert torch.equal(out[sent], x[sent])
    h.close()


def test_expert_major_weights_at_combine(group):
    T, K, H = 200, 4, 1024
    idx, w = _routing(T, K, group.num_experts, 2)
    x = torch.randn(T, H, device="cuda")
    recv = group.dispatch(x, idx, w, layout="expert_major", sizing="exact")
    assert recv.tokens.shape[0] == int((idx >= 0).sum())
    out = group.combine(recv.tokens, recv.handle)
    torch.cuda.synchronize()
    ref = x * torch.where(idx >= 0, w, torch.zeros_like(w)).sum(dim=1, keepdim=True)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    recv.handle.close()


def test_a_group_closes_its_handles_first_and_frees_dropped_ones():
    """The C library refuses to destroy a group whose handles are alive; Group.close closes them (an explicit
    handle, and the implicit handles of dispatches whose results were dropped), and handles dropped in a loop are
    destroyed once their work is done instead of piling up until close."""
    import gc

    g = ep.Group(num_experts=16 * dist.get_world_size(), max_tokens_per_rank=64, hidden=256, dtype=torch.bfloat16,
                 max_topk=4, num_sms=8, timeout_s=20)
    idx, w = _routing(64, 4, g.num_experts, 7)
    x = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
    kept = g.create_handle(idx)
    for _ in range(6):  # the quick start in a loop: an implicit handle a step, dropped with its results
        recv = g.dispatch(x, idx, w)
        g.combine(recv.tokens, recv.handle)
        del recv
        gc.collect()
    assert len(g._retired) <= 2, len(g._retired)  # reaped a step or two after they were dropped
    raw = g._g
    with pytest.raises(ep.NcclInvalidUsage, match="handle\\(s\\) of this group are alive"):
        ep._call("ncclEpGroupDestroy", raw)  # what close() must not do first: the group is left as it was
    g.check()
    g.close()
    assert not kept._h
    with pytest.raises(ep.NcclInvalidUsage, match="used after close"):
        kept.update(idx)
    with pytest.raises(ep.NcclInvalidArgument, match="not a live group"):
        ep._call("ncclEpGroupGetAsyncError", raw)  # the C library knows the group is gone
    kept.close()  # idempotent


def test_errors_come_back_as_exceptions(group):
    # A group of its own: the device error it records stays with the group.
    with ep.Group(num_experts=group.num_experts, max_tokens_per_rank=64, hidden=1024, timeout_s=20) as g:
        x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
        bad = torch.full((4, 2), g.num_experts, dtype=torch.int64, device="cuda")  # not an expert id
        with pytest.raises(ep.NcclError) as e:
            g.dispatch(x, bad, sizing="exact")
            g.check()
        assert "expert" in str(e.value)


def test_autograd_matches_a_torch_reference(group):
    import nccl.ep.autograd as epa

    T, K, H = 128, 4, 1024
    idx, w0 = _routing(T, K, group.num_experts, 3)
    x0 = torch.randn(T, H, device="cuda")
    g = torch.randn(T, H, device="cuda")

    def run(x, w):
        recv_x, recv_w, handle = epa.dispatch(group, x, idx, w)
        y = recv_x * recv_w.sum(dim=1, keepdim=True) + recv_x.pow(2)  # weights applied by the caller
        out = epa.combine(group, y, handle)
        (out * g).sum().backward()
        handle.close()
        return out

    def reference(x, w):  # one rank: dispatch keeps the tokens that go anywhere, combine puts them back
        sent = (idx >= 0).any(dim=1)
        rw = torch.where(idx >= 0, w, torch.zeros_like(w))[sent]
        rx = x[sent]
        y = rx * rw.sum(dim=1, keepdim=True) + rx.pow(2)
        out = torch.zeros_like(x).index_put((sent.nonzero().squeeze(1),), y)
        (out * g).sum().backward()
        return out

    xa, wa = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    xb, wb = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out_a, out_b = run(xa, wa), reference(xb, wb)
    assert torch.allclose(out_a, out_b, rtol=1e-5, atol=1e-5)
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(wa.grad, wb.grad, rtol=1e-4, atol=1e-4)


def test_autograd_expert_major_matches_a_torch_reference(group):
    # High-Throughput EXPERT_MAJOR (zones aligned to 8 rows): the combine weights each row with the dispatched
    # weights, which combine is given, and the expert side also uses each row's weight; gradients of x and w.
    import nccl.ep.autograd as epa

    T, K, H = 128, 4, 1024
    idx, w0 = _routing(T, K, group.num_experts, 4)
    x0, g = torch.randn(T, H, device="cuda"), torch.randn(T, H, device="cuda")
    xa, wa = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    handle = group.create_handle(idx, layout="expert_major", sizing="exact", alignment=8)
    recv_x, recv_w, _ = epa.dispatch(group, xa, idx, wa, handle=handle)
    y = recv_x.pow(2) * recv_w.unsqueeze(1)
    out = epa.combine(group, y, handle, topk_weights=wa)
    (out * g).sum().backward()
    handle.close()
    xb, wb = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    routed = idx >= 0
    wm = torch.where(routed, wb, torch.zeros_like(wb))
    ref = (wm * wm).sum(dim=1, keepdim=True) * xb.pow(2)  # each routed slot: w * (x^2 * w)
    (ref * g).sum().backward()
    assert torch.allclose(out, ref.detach(), rtol=1e-4, atol=1e-4)
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-4, atol=1e-4)
    assert torch.allclose(wa.grad, torch.where(routed, wb.grad, torch.zeros_like(wb.grad)), rtol=1e-4, atol=1e-3)


def test_custom_ops_compile_fullgraph_and_differentiate(group):
    import nccl.ep.ops as epops

    T, K, H = 64, 4, 1024
    idx, w = _routing(T, K, group.num_experts, 30)
    h = group.create_handle(idx, layout="flat", sizing="worst_case")
    hid = epops.register(h)
    try:
        def layer(x, idx, w):
            tokens, ids, rw, counts = torch.ops.nccl_ep.dispatch(hid, x, idx, w)
            return torch.ops.nccl_ep.combine(hid, tokens * 3), counts

        x = torch.randn(T, H, device="cuda")
        eager, counts = layer(x, idx, w)
        compiled, _ = torch.compile(layer, fullgraph=True)(x, idx, w)
        torch.cuda.synchronize()
        sent = (idx >= 0).any(dim=1)
        assert torch.equal(eager[sent], x[sent] * 3) and torch.equal(compiled[sent], eager[sent])
        assert torch.equal(counts.long(), torch.bincount(idx[idx >= 0].flatten(), minlength=group.local_experts))
        # Gradients through the ops: d out / d x = 3 on every sent token (one row each at one rank).
        xg = x.clone().requires_grad_()
        out, _ = layer(xg, idx, w)
        out.sum().backward()
        assert torch.equal(xg.grad[sent], torch.full_like(xg.grad[sent], 3.0))
        torch.library.opcheck(torch.ops.nccl_ep.combine.default,
                              (hid, torch.randn(h.output_rows(), H, device="cuda")))
    finally:
        epops.unregister(hid)
        h.close()


def test_fp8_rows_and_their_scales_are_forwarded_byte_exact(group):
    T, K, H = 96, 4, 1024
    idx, w = _routing(T, K, group.num_experts, 40)
    bits = torch.randint(0, 256, (T, H), dtype=torch.uint8, device="cuda")
    bits[bits == 0x7f] = 0  # keep NaN codes out: the comparison is by bytes anyway
    x = bits.view(torch.float8_e4m3fn)
    scales = torch.rand(T, H // 128, device="cuda") + 0.5
    recv = group.dispatch(x, idx, w, scales=scales, sizing="exact")
    torch.cuda.synchronize()
    sent = (idx >= 0).any(dim=1)
    n = int(sent.sum())
    assert recv.tokens.dtype == torch.float8_e4m3fn and recv.tokens.shape[0] == n
    assert torch.equal(recv.tokens.view(torch.uint8), bits[sent])
    assert torch.equal(recv.scales, scales[sent])
    recv.handle.close()


# -- Low-Latency ---------------------------------------------------------------------------------------------------
LL_M, LL_H, LL_LOCAL = 128, 1024, 16


def _low_latency_group(**kwargs):
    try:
        return ep.Group(algorithm="low_latency", **kwargs)
    except ep.NcclInvalidUsage as e:
        if "Low-Latency mode is not implemented" in str(e):
            pytest.skip("this libnccl_ep has no Low-Latency mode yet: " + str(e))
        raise


@pytest.fixture(scope="module")
def ll_group(one_rank_world):
    g = _low_latency_group(num_experts=LL_LOCAL * dist.get_world_size(), max_tokens_per_rank=LL_M, hidden=LL_H,
                           max_topk=8, num_sms=16, timeout_s=20)
    yield g
    g.close()


def _exact_tokens(T, H, seed):
    """bf16 multiples of 1/8 in [-4, 4]: products with _exact_weights and sums of eight of them are exact in fp32."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-32, 33, (T, H), generator=gen) * 0.125).to(torch.bfloat16).cuda()


def _exact_weights(T, K, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 9, (T, K), generator=gen) * 0.125).cuda()


def _zones(idx, local):
    """One rank: per local expert, the (token, top-k column) pairs naming it, in token order."""
    out = []
    for e in range(local):
        t, k = (idx == e).nonzero(as_tuple=True)
        out.append((t, k))
    return out


def _quantise(x, pow2):
    """common/numeric.h's fp8QuantizeRow in torch (on the CPU: IEEE fp32 division): per 128 columns scale =
    max(amax, 1e-4) / 448, rounded up to a power of two with pow2; q = e4m3(x / scale), nearest even, saturating
    (torch's cast does not saturate: clamp first)."""
    T, H = x.shape
    xf = x.float().cpu().view(T, H // 128, 128)
    s = xf.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    if pow2:
        bits = s.view(torch.int32)
        s = (((bits >> 23) + ((bits & 0x7fffff) != 0).to(torch.int32)) << 23).view(torch.float32)
    q = (xf / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    # The reference itself: within e4m3's precision of x (half a step: 2^-4 relative, 2^-10 of the scale at zero).
    err = (q.float() * s.unsqueeze(-1) - xf).abs()
    assert bool((err <= xf.abs() * 2 ** -4 + s.unsqueeze(-1) * 2 ** -10).all())
    return q.view(T, H).cuda(), s.cuda()


@pytest.mark.parametrize("T", [100, LL_M, 0])
def test_low_latency_rank_major(ll_group, T):
    K, R = 4, ll_group.size
    idx, _ = _routing(max(T, 1), K, ll_group.num_experts, 50)
    idx, w, x = idx[:T], _exact_weights(T, K, 51), _exact_tokens(T, LL_H, 52)
    h = ll_group.create_handle(idx, layout="rank_major")
    recv = ll_group.dispatch(x, topk_weights=w, handle=h)
    torch.cuda.synchronize()
    sent = (idx >= 0).any(dim=1)
    n = int(sent.sum())
    assert recv.tokens.shape == (R * LL_M, LL_H) and recv.topk_idx.shape == (R * LL_M, K)
    assert int(recv.rank_counts[0]) == n and int(recv.recv_total[0]) == n
    assert torch.equal(recv.tokens[:n], x[sent])
    assert torch.equal(recv.src_info[:n].long(), sent.nonzero().squeeze(1))
    assert torch.equal(recv.topk_idx[:n].long(), idx[sent])  # one rank: local ids are the global ids
    assert torch.equal(recv.topk_weights[:n], torch.where(idx >= 0, w, 0.0)[sent])
    counts = torch.bincount(idx[idx >= 0], minlength=ll_group.local_experts)
    assert torch.equal(recv.expert_counts.long(), counts)
    assert torch.equal(recv.expert_offsets.long(), torch.arange(ll_group.local_experts, device="cuda") * R * LL_M)
    y = recv.tokens * 2  # one row per slot: the caller's reduction over the slot's experts
    out = ll_group.combine(y, h)
    torch.cuda.synchronize()
    assert out.shape == (T, LL_H)
    assert torch.equal(out, torch.where(sent.unsqueeze(1), x * 2, torch.zeros_like(x)))  # nowhere: zeros
    h.close()


def test_low_latency_send_only_and_complete(ll_group):
    # A send-only dispatch and combine, each finished by complete(), give what the plain calls give; another call
    # on a handle whose dispatch is open (a dispatch, a combine) and a complete with nothing open are refused with
    # NcclInvalidUsage.
    T, K = 96, 4
    idx, _ = _routing(T, K, ll_group.num_experts, 70)
    w, x = _exact_weights(T, K, 71), _exact_tokens(T, LL_H, 72)
    h = ll_group.create_handle(idx, layout="expert_major")
    plain = ll_group.dispatch(x, topk_weights=w, handle=h)
    plain_tokens = plain.tokens.clone()
    plain_out = ll_group.combine(plain.tokens, h, topk_weights=w)
    torch.cuda.synchronize()
    recv = ll_group.dispatch(x, topk_weights=w, handle=h, send_only=True)
    with pytest.raises(ep.NcclInvalidUsage, match="awaits ncclEpComplete"):
        ll_group.dispatch(x, topk_weights=w, handle=h)
    with pytest.raises(ep.NcclInvalidUsage, match="awaits ncclEpComplete"):
        ll_group.combine(recv.tokens, h, topk_weights=w)
    ll_group.complete(h)
    out = ll_group.combine(recv.tokens, h, topk_weights=w, send_only=True)
    ll_group.complete(h)
    with pytest.raises(ep.NcclInvalidUsage, match="no send-only call"):
        ll_group.complete(h)
    torch.cuda.synchronize()
    for e in range(ll_group.local_experts):
        zone, c = e * ll_group.size * LL_M, int(plain.expert_counts[e])
        assert int(recv.expert_counts[e]) == c
        assert torch.equal(recv.tokens[zone:zone + c], plain_tokens[zone:zone + c]), e
    assert torch.equal(out, plain_out)
    h.close()


def test_low_latency_expert_major_and_both_combines(ll_group):
    T, K, R, local = 120, 6, ll_group.size, ll_group.local_experts
    idx, _ = _routing(T, K, ll_group.num_experts, 60)
    w_dispatch, w_owner, x = _exact_weights(T, K, 61), _exact_weights(T, K, 62), _exact_tokens(T, LL_H, 63)
    h = ll_group.create_handle(idx, layout="expert_major")
    recv = ll_group.dispatch(x, topk_weights=w_dispatch, handle=h)
    torch.cuda.synchronize()
    zone = R * LL_M
    assert recv.tokens.shape == (local * zone, LL_H) and recv.topk_weights.shape == (local * zone,)
    assert recv.topk_idx is None
    for e, (t, k) in enumerate(_zones(idx, local)):
        c = t.numel()
        assert int(recv.expert_counts[e]) == c, e
        assert torch.equal(recv.tokens[e * zone:e * zone + c], x[t]), e
        assert torch.equal(recv.src_info[e * zone:e * zone + c].long(), t), e  # source 0: 0 * M + token
        assert torch.equal(recv.topk_weights[e * zone:e * zone + c], w_dispatch[t, k]), e
    assert int(recv.recv_total[0]) == int((idx >= 0).sum())
    assert torch.equal(recv.expert_offsets.long(), torch.arange(local, device="cuda") * zone)
    # The experts: expert e multiplies by c_e in 1..4 (exact), so that the two weightings differ.
    factor = (torch.arange(local, device="cuda") % 4 + 1).float()
    y = (recv.tokens.float() * factor.repeat_interleave(zone).unsqueeze(1)).to(torch.bfloat16)
    c_of = torch.where(idx >= 0, factor[idx.clamp(min=0)], 0.0)
    for weights, kwargs in ((w_dispatch, {}), (w_owner, {"topk_weights": w_owner})):
        out = ll_group.combine(y, h, **kwargs)
        torch.cuda.synchronize()
        ref = (x.double() * (weights.double() * c_of.double()).sum(dim=1, keepdim=True)).float().to(torch.bfloat16)
        assert torch.equal(out, ref), kwargs.keys()
    h.close()


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
@pytest.mark.parametrize("mode", ["e4m3", "e4m3_pow2", "forwarded"])
def test_low_latency_fp8(ll_group, layout, mode):
    T, K, R, local = 96, 4, ll_group.size, ll_group.local_experts
    idx, _ = _routing(T, K, ll_group.num_experts, 70)
    gen = torch.Generator().manual_seed(71)
    magnitude = 10.0 ** torch.randint(-3, 4, (T, LL_H // 128, 1), generator=gen)  # blocks of many sizes
    x = (torch.randn(T, LL_H // 128, 128, generator=gen) * magnitude).view(T, LL_H).to(torch.bfloat16)
    x[3, :128] = 0  # a block of zeros: the scale of amax 1e-4
    x = x.cuda()
    h = ll_group.create_handle(idx, layout=layout)
    if mode == "forwarded":
        bits = torch.randint(0, 256, (T, LL_H), dtype=torch.uint8, device="cuda")
        bits[(bits & 0x7f) == 0x7f] = 0  # no NaN codes
        q_ref, s_ref = bits.view(torch.float8_e4m3fn), torch.rand(T, LL_H // 128, device="cuda") + 0.5
        recv = ll_group.dispatch(q_ref, handle=h, scales=s_ref)
    else:
        q_ref, s_ref = _quantise(x, mode == "e4m3_pow2")
        recv = ll_group.dispatch(x, handle=h, out_dtype=torch.float8_e4m3fn, round_scale=mode == "e4m3_pow2")
    torch.cuda.synchronize()
    assert recv.tokens.dtype == torch.float8_e4m3fn and recv.scales.shape == (recv.tokens.shape[0], LL_H // 128)
    if layout == "rank_major":  # (output rows, their tokens)
        sent = (idx >= 0).any(dim=1).nonzero()[:, 0]
        rows = [(torch.arange(sent.numel(), device="cuda"), sent)]
    else:
        rows = [(e * R * LL_M + torch.arange(t.numel(), device="cuda"), t)
                for e, (t, _) in enumerate(_zones(idx, local))]
    for at, t in rows:
        assert torch.equal(recv.tokens[at].view(torch.uint8), q_ref[t].view(torch.uint8))
        assert torch.equal(recv.scales[at], s_ref[t])
    if mode == "e4m3_pow2":
        assert bool((torch.frexp(recv.scales[rows[0][0]])[0] == 0.5).all())  # powers of two
    h.close()


@pytest.mark.caching_allocator
@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
def test_low_latency_graph_replays_with_new_routings(ll_group, layout):
    # Handle update + dispatch + combine in one CUDA graph (nothing allocates in the library or waits on the host),
    # replayed with new routings, tokens and owner weights copied into the captured inputs.
    T, K = 100, 4
    idx_buf = _routing(T, K, ll_group.num_experts, 80)[0]
    x_buf, w_buf = _exact_tokens(T, LL_H, 81), _exact_weights(T, K, 82)
    h = ll_group.create_handle(idx_buf, layout=layout)
    owner = {"topk_weights": w_buf} if layout == "expert_major" else {}

    def step():
        h.update(idx_buf)
        recv = ll_group.dispatch(x_buf, handle=h)
        return recv, ll_group.combine(recv.tokens * 2, h, **owner)

    step()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, out = step()
    for seed in range(4):
        idx_buf.copy_(_routing(T, K, ll_group.num_experts, 90 + seed)[0])
        x_buf.copy_(_exact_tokens(T, LL_H, 100 + seed))
        w_buf.copy_(_exact_weights(T, K, 110 + seed))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        sent = (idx_buf >= 0).any(dim=1, keepdim=True)
        if layout == "expert_major":  # every (token, expert) row doubled, weighted by the owner's weights
            scale = torch.where(idx_buf >= 0, w_buf, 0.0).double().sum(dim=1, keepdim=True) * 2
            ref = (x_buf.double() * scale).float().to(torch.bfloat16)
        else:
            ref = torch.where(sent, x_buf * 2, torch.zeros_like(x_buf))
        assert torch.equal(out, ref), seed
        counts = torch.bincount(idx_buf[idx_buf >= 0], minlength=ll_group.local_experts)
        assert torch.equal(recv.expert_counts.long(), counts), seed
    h.close()


def test_low_latency_refuses_what_it_cannot_do(ll_group):
    idx, _ = _routing(8, 2, ll_group.num_experts, 120)
    with pytest.raises(ep.NcclInvalidUsage, match="'rank_major' or 'expert_major'"):
        ll_group.create_handle(idx, layout="flat")
    with ll_group.create_handle(idx, layout="rank_major") as h:
        with pytest.raises(ep.NcclInvalidArgument, match="Low-Latency dispatch takes bfloat16"):
            ll_group.dispatch(torch.zeros(8, LL_H, device="cuda"), handle=h)
        ll_group.dispatch(torch.zeros(8, LL_H, device="cuda", dtype=torch.bfloat16), handle=h)
        with pytest.raises(ep.NcclInvalidUsage, match="this one is Low-Latency RANK_MAJOR"):
            ll_group.combine(torch.zeros(h.output_rows(), LL_H, device="cuda", dtype=torch.bfloat16), h,
                             topk_weights=torch.ones(8, 2, device="cuda"))
        torch.cuda.synchronize()


def test_low_latency_two_send_only_dispatches_in_flight(ll_group):
    # The staging is double-buffered: send-only dispatches of handles A and B, then complete A, complete B; each
    # gives what its plain dispatch gives, and so does its combine. Completing B before A is refused.
    T, K = 80, 4
    runs = []
    for seed in (140, 150):
        idx, _ = _routing(T, K, ll_group.num_experts, seed)
        w, x = _exact_weights(T, K, seed + 1), _exact_tokens(T, LL_H, seed + 2)
        h = ll_group.create_handle(idx, layout="expert_major")
        plain = ll_group.dispatch(x, topk_weights=w, handle=h)
        plain_tokens, plain_counts = plain.tokens.clone(), plain.expert_counts.clone()
        plain_out = ll_group.combine(plain.tokens, h, topk_weights=w)
        runs.append((h, x, w, plain_tokens, plain_counts, plain_out))
    torch.cuda.synchronize()
    (ha, xa, wa, *_), (hb, xb, wb, *_) = runs
    recv = [ll_group.dispatch(xa, topk_weights=wa, handle=ha, send_only=True),
            ll_group.dispatch(xb, topk_weights=wb, handle=hb, send_only=True)]
    with pytest.raises(ep.NcclInvalidUsage, match="in the order they were issued"):
        ll_group.complete(hb)
    ll_group.complete(ha)
    ll_group.complete(hb)
    outs = [ll_group.combine(r.tokens, h, topk_weights=w) for r, (h, _, w, *_) in zip(recv, runs)]
    torch.cuda.synchronize()
    zone = ll_group.size * LL_M
    for name, r, out, (h, _, _, plain_tokens, plain_counts, plain_out) in zip("AB", recv, outs, runs):
        assert torch.equal(r.expert_counts, plain_counts), name
        for e in range(ll_group.local_experts):
            c = int(plain_counts[e])
            assert torch.equal(r.tokens[e * zone:e * zone + c], plain_tokens[e * zone:e * zone + c]), (name, e)
        assert torch.equal(out, plain_out), name
        h.close()


# -- rank masks (enable_mask) ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def masked_group(one_rank_world):
    g = _low_latency_group(num_experts=LL_LOCAL * dist.get_world_size(), max_tokens_per_rank=LL_M, hidden=LL_H,
                           max_topk=8, num_sms=16, timeout_s=20, enable_mask=True)
    yield g
    g.close()


def _owner_weighted(x, idx, w):
    """EXPERT_MAJOR combine of the dispatched rows as they are, weighted by the owner (exact data: exact sums)."""
    return (x.double() * torch.where(idx >= 0, w, 0.0).double().sum(dim=1, keepdim=True)).float().to(torch.bfloat16)


def test_masked_group_starts_with_every_rank_active(masked_group, ll_group):
    mask = masked_group.mask_query()
    assert mask.dtype == torch.int32 and mask.device.type == "cuda"
    assert mask.tolist() == [1] * masked_group.size
    with pytest.raises(ep.NcclInvalidUsage, match="without enable_mask"):
        ll_group.mask_query()


def test_a_rank_masked_by_itself_sends_and_receives_nothing(masked_group):
    T, K = 64, 4
    idx, _ = _routing(T, K, masked_group.num_experts, 160)
    w, x = _exact_weights(T, K, 161), _exact_tokens(T, LL_H, 162)
    h = masked_group.create_handle(idx, layout="expert_major")
    masked_group.mask_update([0])
    try:
        assert masked_group.mask_query().tolist() == [0]
        recv = masked_group.dispatch(x, topk_weights=w, handle=h)
        missing = torch.full((T,), -1, dtype=torch.int32, device="cuda")
        out = masked_group.combine(recv.tokens, h, topk_weights=w, missing_experts=missing)
        torch.cuda.synchronize()
        assert recv.expert_counts.tolist() == [0] * masked_group.local_experts
        assert bool((out == 0).all())
        assert torch.equal(missing, (idx >= 0).sum(dim=1).int())  # every expert of every token sits on a masked rank
    finally:
        masked_group.mask_update([1])
        masked_group.mask_clean()
        torch.cuda.synchronize()
        h.close()


def test_unmasked_and_cleaned_group_gives_the_plain_result(masked_group, ll_group):
    T, K = 96, 4
    idx, _ = _routing(T, K, masked_group.num_experts, 170)
    w, x = _exact_weights(T, K, 171), _exact_tokens(T, LL_H, 172)
    h = masked_group.create_handle(idx, layout="expert_major")
    masked_group.mask_update([0])  # a call while masked, then active again and cleaned
    masked = masked_group.dispatch(x, topk_weights=w, handle=h)
    masked_group.combine(masked.tokens, h, topk_weights=w)
    masked_group.mask_update([1])
    masked_group.mask_clean()
    assert masked_group.mask_query().tolist() == [1]
    recv = masked_group.dispatch(x, topk_weights=w, handle=h)
    missing = torch.full((T,), -1, dtype=torch.int32, device="cuda")
    out = masked_group.combine(recv.tokens, h, topk_weights=w, missing_experts=missing)
    with ll_group.create_handle(idx, layout="expert_major") as plain_h:
        plain = ll_group.dispatch(x, topk_weights=w, handle=plain_h)
        plain_out = ll_group.combine(plain.tokens, plain_h, topk_weights=w)
        torch.cuda.synchronize()
    assert torch.equal(recv.expert_counts, plain.expert_counts)
    assert torch.equal(out, plain_out) and torch.equal(out, _owner_weighted(x, idx, w))
    assert bool((missing == 0).all())
    masked_group.check()  # nothing to report: the rank masked itself, no peer was lost
    h.close()


def test_low_latency_autograd_rank_major_matches_a_torch_reference(ll_group):
    # RANK_MAJOR: differentiable in x and topk_weights (their gradient returned exactly as three bf16 parts); exact
    # data, so the weights' gradient compares exactly and the rest within bf16 rounding.
    import nccl.ep.autograd as epa

    T, K = 96, 6
    idx, _ = _routing(T, K, ll_group.num_experts, 180)
    x0, w0, g = _exact_tokens(T, LL_H, 181).float(), _exact_weights(T, K, 182), _exact_tokens(T, LL_H, 183).float()

    def run(x, w):
        recv_x, recv_w, handle = epa.dispatch(ll_group, x, idx, w, layout="rank_major")
        y = recv_x.float() * recv_w.sum(dim=1, keepdim=True)  # weights applied by the caller
        out = epa.combine(ll_group, y, handle)
        (out.float() * g).sum().backward()
        handle.close()
        return out.float()

    def reference(x, w):  # one rank: slot j holds the j-th token with an expert anywhere
        sent = (idx >= 0).any(dim=1)
        y = x[sent] * torch.where(idx >= 0, w, torch.zeros_like(w))[sent].sum(dim=1, keepdim=True)
        out = torch.zeros_like(x).index_put((sent.nonzero().squeeze(1),), y)
        (out * g).sum().backward()
        return out

    xa, wa = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    xb, wb = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out_a, out_b = run(xa, wa), reference(xb, wb)
    assert torch.allclose(out_a, out_b, rtol=1e-2, atol=1e-2)
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-2, atol=1e-2)
    assert torch.equal(wa.grad, wb.grad)


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
def test_low_latency_custom_ops_compile_fullgraph_and_differentiate(ll_group, layout):
    # nccl_ep::ll_dispatch / ll_combine: eager and torch.compile(fullgraph) agree with the one-rank reference
    # (RANK_MAJOR: each sent token's one row; EXPERT_MAJOR with the owner's weights: the routed slots' weights), and
    # gradients flow to x and (EXPERT_MAJOR) the owner's weights.
    import nccl.ep.ops as epops

    T, K = 64, 4
    idx, _ = _routing(T, K, ll_group.num_experts, 200)
    x0, w = _exact_tokens(T, LL_H, 201), _exact_weights(T, K, 202)
    routed = idx >= 0
    h = ll_group.create_handle(idx, layout=layout)
    hid = epops.register(h)
    try:
        def layer(x, idx, owner):
            recv, _, _, _, _, _, _ = torch.ops.nccl_ep.ll_dispatch(hid, x, idx, None, False, False)
            return torch.ops.nccl_ep.ll_combine(hid, recv * 2, owner)

        owner = w if layout == "expert_major" else None
        eager = layer(x0, idx, owner).float()
        compiled = torch.compile(layer, fullgraph=True)(x0, idx, owner).float()
        torch.cuda.synchronize()
        scale = (torch.where(routed, w, torch.zeros_like(w)).sum(dim=1, keepdim=True) if owner is not None
                 else routed.any(dim=1, keepdim=True).float())
        want = (x0.float() * 2 * scale).to(torch.bfloat16).float()  # summed in fp32 (exact here), rounded once
        assert torch.equal(eager, want) and torch.equal(compiled, eager)
        xg = x0.float().clone().requires_grad_()
        wg = None if owner is None else w.clone().requires_grad_()
        layer(xg.to(torch.bfloat16), idx, wg).float().sum().backward()
        assert torch.allclose(xg.grad, (2 * scale).expand(T, LL_H), rtol=1e-2, atol=1e-2)
        if wg is not None:  # d out / d w[t, k] = sum over columns of 2 x[t], on routed slots
            want = torch.where(routed, (2 * x0.float()).sum(dim=1, keepdim=True).expand(T, K), torch.zeros_like(w))
            assert torch.allclose(wg.grad, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    finally:
        epops.unregister(hid)
        h.close()


def test_low_latency_autograd_expert_major_matches_a_torch_reference(ll_group):
    # EXPERT_MAJOR with the owner's weights at combine (DeepEP's API): differentiable in x and y, and in both
    # weight tensors (the dispatched ones, which the expert side applies, and the owner's at combine).
    import nccl.ep.autograd as epa

    T, K = 80, 4
    idx, _ = _routing(T, K, ll_group.num_experts, 190)
    x0, w, g = _exact_tokens(T, LL_H, 191).float(), _exact_weights(T, K, 192), _exact_tokens(T, LL_H, 193).float()
    xa = x0.clone().requires_grad_()
    recv_x, _, handle = epa.dispatch(ll_group, xa, idx, w, layout="expert_major")
    y = recv_x.float().pow(2) * 0.5
    with pytest.raises(NotImplementedError, match="top-k weights it applies"):
        epa.combine(ll_group, y, handle)
    out = epa.combine(ll_group, y, handle, topk_weights=w)
    (out.float() * g).sum().backward()
    handle.close()
    ws = torch.where(idx >= 0, w, torch.zeros_like(w)).sum(dim=1, keepdim=True)
    xb = x0.clone().requires_grad_()
    ((xb.pow(2) * 0.5 * ws) * g).sum().backward()
    assert torch.allclose(out.float(), x0.pow(2) * 0.5 * ws, rtol=1e-2, atol=1e-2)
    assert torch.allclose(xa.grad, xb.grad, rtol=2e-2, atol=2e-2)

    # Both weight tensors differentiated: each row scaled by its dispatched weight on the expert side, the rows
    # weighted by the owner's at combine; the gradients come back to their top-k columns (0 where idx is -1).
    xc, wd, wo = x0.clone().requires_grad_(), w.clone().requires_grad_(), w.clone().requires_grad_()
    recv_x, recv_w, handle = epa.dispatch(ll_group, xc, idx, wd, layout="expert_major")
    out = epa.combine(ll_group, recv_x.float().pow(2) * 0.5 * recv_w.unsqueeze(1), handle, topk_weights=wo)
    (out.float() * g).sum().backward()
    handle.close()
    xr, wdr, wor = x0.clone().requires_grad_(), w.clone().requires_grad_(), w.clone().requires_grad_()
    routed = idx >= 0
    rows = (xr.pow(2) * 0.5).unsqueeze(1) * wdr.unsqueeze(2)  # [T, K, H]: row (t, k)
    ref = (torch.where(routed, wor, torch.zeros_like(wor)).unsqueeze(2) * rows).sum(dim=1)
    (ref * g).sum().backward()
    assert torch.allclose(out.float(), ref.detach(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(xc.grad, xr.grad, rtol=2e-2, atol=2e-2)
    for got, want in ((wd.grad, wdr.grad), (wo.grad, wor.grad)):
        want = torch.where(routed, want, torch.zeros_like(want))
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
