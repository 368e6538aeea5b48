"""A DeepEP-style intranode test of nccl.ep.deepep, written as code for deep_ep is (High-Throughput: 1 rank here;
several ranks: test_deepep_ranks.py): layout, dispatch (plain, cached, worst-case), combine, events, against torch on
fresh random data.

Low-Latency (at any rank count: under torchrun on one GPU, as one-GPU nodes across NVLink domains; shrink mode at one
rank only: it masks itself alone, which across domains would leave the others' rail messages unmatched), as DeepEP's
tests/test_low_latency.py drives it (skipped with a library without the mode): for each input (a pattern carrying rank
and token index, and random data), bf16 and fp8 (with and without power-of-two scales), with async_finish or the receive
hook: per local expert the count against the routing, the cumulative statistics (and the wait statistics: added to),
layout_range's counts, src_info and the rows (fp8: the bytes of torch's quantisation of the input); combine of the
dequantised rows with the owner's weights against x * sum(weights) (DeepEP's relative-difference bound). Also two
dispatches in flight before their combines (DeepEP's double buffering), a CUDA graph of dispatch + combine replayed on
new data, and shrink mode (enable_shrink): the mask methods in DeepEP's convention (1 = masked), before and after the
group exists, a round trip while the rank masks itself, and clean_low_latency_buffer (collective there) before a normal
round trip again."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import nccl.ep as ep  # noqa: E402
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


# -- Low-Latency ---------------------------------------------------------------------------------------------------
LL_M, LL_H, LL_K = 128, 2048, 8


@pytest.fixture(scope="module")
def ll_buffer(world):
    R = dist.get_world_size()
    E = 32 * R
    rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(LL_M, LL_H, R, E)
    buf = deep_ep.Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=E // R,
                         explicitly_destroy=True)
    yield buf, E
    buf.destroy()


def _ll_or_skip(call):
    """The first Low-Latency call makes the group: skip if this libnccl_ep has no Low-Latency mode yet."""
    try:
        return call()
    except ep.NcclInvalidUsage as e:
        if "Low-Latency mode is not implemented" in str(e):
            pytest.skip("this libnccl_ep has no Low-Latency mode yet: " + str(e))
        raise


def _calc_diff(x, y):  # DeepEP's tests' measure: 1 - cosine similarity of the flattened tensors
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def _cast_back(q, scales):  # fp8 rows [N, H] and their scales [N, H / 128] -> bf16
    n, h = q.shape
    return (q.float().view(n, h // 128, 128) * scales.unsqueeze(-1)).view(n, h).to(torch.bfloat16)


def _quantise(x, pow2):  # common/numeric.h's recipe in torch (see test_ep_gpu.py's _quantise)
    n, h = x.shape
    xf = x.float().cpu().view(n, h // 128, 128)
    s = xf.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    if pow2:
        bits = s.view(torch.int32)
        s = (((bits >> 23) + ((bits & 0x7fffff) != 0).to(torch.int32)) << 23).view(torch.float32)
    return (xf / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(n, h).cuda(), s.cuda()


def _ll_inputs(T, E, seed, rank):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.ones((T, LL_H), dtype=torch.bfloat16, device="cuda") * (rank - 128)
    x[:, -128:] = torch.arange(T, device="cuda").to(torch.bfloat16).view(-1, 1)
    x_rand = torch.randn((T, LL_H), dtype=torch.bfloat16, device="cuda", generator=gen) * 0.1
    scores = torch.randn((T, E), device="cuda", generator=gen).abs() + 1
    topk_idx = torch.topk(scores, LL_K, dim=-1).indices
    topk_idx[torch.rand(T, LL_K, device="cuda", generator=gen) < 0.05] = -1
    topk_w = torch.randn((T, LL_K), device="cuda", generator=gen).abs()
    return x, x_rand, topk_idx, topk_w


@pytest.mark.parametrize("hook", [False, True])
@pytest.mark.parametrize("use_fp8,round_scale", [(False, False), (True, False), (True, True)])
def test_low_latency_round_trip(ll_buffer, use_fp8, round_scale, hook):
    buf, E = ll_buffer
    R, rank, T = buf.group_size, buf.rank, 100
    local = E // R
    x, x_rand, topk_idx, topk_w = _ll_inputs(T, E, 7, rank)
    all_idx = torch.empty((R * T, LL_K), dtype=topk_idx.dtype)  # flat, on the host: gloo wants it so
    dist.all_gather_into_tensor(all_idx, topk_idx.cpu())
    all_idx = all_idx.view(R, T, LL_K).cuda()
    for current_x in (x, x_rand):
        stats = torch.zeros(local, dtype=torch.int32, device="cuda")
        # The wait statistics are added to (cycles, from 2^40 here; tests/gpu/ep_ll_test.cu's straggler checks values).
        waits = torch.full((2, R), 1 << 40, dtype=torch.int64, device="cuda")
        recv_x, recv_count, handle, event, hook_fn = _ll_or_skip(lambda: buf.low_latency_dispatch(
            current_x, topk_idx, LL_M, E, cumulative_local_expert_recv_stats=stats, use_fp8=use_fp8,
            round_scale=round_scale, async_finish=not hook, return_recv_hook=hook,
            dispatch_wait_recv_cost_stats=waits[0]))
        hook_fn() if hook else event.current_stream_wait()
        if use_fp8:
            q, scales = recv_x
            assert q.shape == (local, R * LL_M, LL_H) and scales.shape == (local, R * LL_M, LL_H // 128)
            gemm_x = _cast_back(q.view(-1, LL_H), scales.view(-1, LL_H // 128)).view(q.shape)
            q_ref, s_ref = _quantise(current_x, round_scale)
        else:
            assert recv_x.shape == (local, R * LL_M, LL_H) and recv_x.dtype == torch.bfloat16
            gemm_x = recv_x.clone()
        src_info, layout_range, m, hidden, experts = handle
        assert (m, hidden, experts) == (LL_M, LL_H, E) and recv_count.dtype == torch.int32
        for i in range(local):
            expert = rank * local + i
            n = int(recv_count[i])
            assert n == int(stats[i]) == int((all_idx == expert).sum()), i
            assert n == int((layout_range[i] & 0xffffffff).sum()), i
            if R == 1:  # one source: its rows are its tokens naming the expert, in token order
                t = (topk_idx == expert).any(dim=1).nonzero()[:, 0]
                assert int(layout_range[i, 0]) >> 32 == 0
                assert torch.equal(src_info[i, :n].long(), t), i
                if use_fp8:
                    assert torch.equal(q[i, :n].view(torch.uint8), q_ref[t].view(torch.uint8)), i
                    assert torch.equal(scales[i, :n], s_ref[t]), i
                else:
                    assert torch.equal(recv_x[i, :n], current_x[t]), i
            if current_x is x:  # the pattern: source rank - 128 in the body, token index in the tail
                rows = gemm_x[i, :n]
                assert torch.equal(rows[:, :-128].amin(dim=-1), rows[:, :-128].amax(dim=-1))
                for j in range(R):
                    begin, count = int(layout_range[i, j]) >> 32, int(layout_range[i, j]) & 0xffffffff
                    want = float(j - 128)
                    if use_fp8:  # what e4m3 keeps of it (with power-of-2 scales, -127 comes back as -128)
                        body = torch.full((1, LL_H), want, dtype=torch.bfloat16, device="cuda")
                        want = float(_cast_back(*_quantise(body, round_scale))[0, 0])
                    assert bool((rows[begin:begin + count, 0] == want).all()), (i, j, want)
                if not use_fp8:  # e4m3 keeps 3 mantissa bits: token indices above 16 do not survive
                    assert torch.equal(rows[:, -1].long(), src_info[i, :n].long())
        out = torch.empty((T, LL_H), dtype=torch.bfloat16, device="cuda")
        combined, event, hook_fn = buf.low_latency_combine(gemm_x, topk_idx, topk_w, handle, out=out,
                                                           async_finish=not hook, return_recv_hook=hook,
                                                           combine_wait_recv_cost_stats=waits[1])
        hook_fn() if hook else event.current_stream_wait()
        assert combined is out and not bool(torch.isnan(combined).any())
        assert bool(((waits >= 1 << 40) & (waits < 1 << 41)).all()), waits.cpu()
        ref = current_x * topk_w.masked_fill(topk_idx == -1, 0).sum(dim=1).view(-1, 1)
        assert _calc_diff(ref, combined) < (7e-4 if use_fp8 else 1e-5)


@pytest.mark.parametrize("hook", [False, True])
def test_low_latency_ue8m0_scales(ll_buffer, hook):
    """use_ue8m0=True: DeepEP's packed int32 scales ([L, R * M, H / 512], column-major in the last two dims), read
    back by DeepEP's rule (the contiguous copy's bytes shifted into a float's exponent field), equal the fp32
    power-of-two scales of the same dispatch without it; the e4m3 rows are the same bytes."""
    buf, E = ll_buffer
    R, T = buf.group_size, 100
    local, rows = E // R, R * LL_M
    _, x_rand, topk_idx, _ = _ll_inputs(T, E, 11, buf.rank)
    (q0, s0), count0, _, _, _ = _ll_or_skip(lambda: buf.low_latency_dispatch(x_rand, topk_idx, LL_M, E, use_fp8=True,
                                                                             round_scale=True))
    (q1, packed), count1, _, _, hook_fn = buf.low_latency_dispatch(x_rand, topk_idx, LL_M, E, use_fp8=True,
                                                                   round_scale=True, use_ue8m0=True,
                                                                   return_recv_hook=hook)
    if hook:
        hook_fn()
    assert packed.dtype == torch.int32 and packed.shape == (local, rows, LL_H // 512)
    assert packed.stride() == (LL_H // 512 * rows, 1, rows)
    unpacked = (packed.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    assert torch.equal(count0, count1)
    for i in range(local):
        n = int(count0[i])
        assert torch.equal(unpacked[i, :n], s0[i, :n]), i
        assert torch.equal(q1[i, :n].view(torch.uint8), q0[i, :n].view(torch.uint8)), i


def test_low_latency_zero_copy_combine(ll_buffer):
    # The experts write into get_next_low_latency_combine_buffer(handle); combine(zero_copy=True) reads it, giving
    # bit for bit what a combine of the same rows passed as x gives.
    buf, E = ll_buffer
    _, x, topk_idx, topk_w = _ll_inputs(64, E, 21, buf.rank)
    recv_x, _, handle, _, _ = _ll_or_skip(lambda: buf.low_latency_dispatch(x, topk_idx, LL_M, E, use_fp8=False))
    plain, _, _ = buf.low_latency_combine(recv_x, topk_idx, topk_w, handle)
    target = buf.get_next_low_latency_combine_buffer(handle)
    assert target.shape == recv_x.shape and target.dtype == torch.bfloat16
    target.copy_(recv_x)
    zero_copy, _, _ = buf.low_latency_combine(None, topk_idx, topk_w, handle, zero_copy=True)
    torch.cuda.synchronize()
    assert torch.equal(zero_copy, plain)


def test_low_latency_size_hint_is_what_the_group_holds(ll_buffer):
    # The hint is the made group's window and rail staging, where its domain guess is right: one GPU per process (the
    # one-GPU nodes) or every visible GPU in one NVLink domain, and no launcher's LOCAL_WORLD_SIZE saying otherwise.
    buf, E = ll_buffer
    R = dist.get_world_size()
    _, x, topk_idx, _ = _ll_inputs(64, E, 22, buf.rank)
    _ll_or_skip(lambda: buf.low_latency_dispatch(x, topk_idx, LL_M, E, use_fp8=False))
    info = buf._ll.group.info()
    if info["domain_size"] != deep_ep._domain_size_guess(R):
        pytest.skip("the NVLink domain (%d ranks) is not the hint's guess" % info["domain_size"])
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(LL_M, LL_H, R, E)
    assert hint == info["window_bytes"] + info["rail_staging_bytes"]
    scratch = buf.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    assert scratch.is_cuda and scratch.numel() == buf.num_rdma_bytes == hint


def test_low_latency_two_dispatches_in_flight(ll_buffer):
    # DeepEP holds two Low-Latency results at once (two micro-batches): dispatch A, dispatch B, combine A, combine B.
    buf, E = ll_buffer
    runs = []
    for seed in (11, 12):
        _, x, topk_idx, topk_w = _ll_inputs(64, E, seed, buf.rank)
        recv_x, _, handle, _, _ = _ll_or_skip(lambda: buf.low_latency_dispatch(x, topk_idx, LL_M, E, use_fp8=False))
        runs.append((x, topk_idx, topk_w, recv_x, handle))
    for x, topk_idx, topk_w, recv_x, handle in runs:
        combined, _, _ = buf.low_latency_combine(recv_x, topk_idx, topk_w, handle)
        ref = x * topk_w.masked_fill(topk_idx == -1, 0).sum(dim=1).view(-1, 1)
        assert _calc_diff(ref, combined) < 1e-5


@pytest.mark.caching_allocator
def test_low_latency_graph_of_dispatch_and_combine(ll_buffer):
    # Decode as serving engines run it: dispatch (fp8) + dequantise + combine captured once, replayed on new data.
    buf, E = ll_buffer
    T = 96
    _, x_buf, idx_buf, w_buf = _ll_inputs(T, E, 20, buf.rank)

    def step():
        (q, scales), _, handle, _, _ = buf.low_latency_dispatch(x_buf, idx_buf, LL_M, E, use_fp8=True)
        gemm_x = _cast_back(q.view(-1, LL_H), scales.view(-1, LL_H // 128)).view(q.shape)
        return buf.low_latency_combine(gemm_x, idx_buf, w_buf, handle)[0]

    _ll_or_skip(step)  # warm-up: makes the group and both handles of the ring
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):
        _, x, idx, w = _ll_inputs(T, E, 30 + seed, buf.rank)
        x_buf.copy_(x)
        idx_buf.copy_(idx)
        w_buf.copy_(w)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = x * w.masked_fill(idx == -1, 0).sum(dim=1).view(-1, 1)
        assert _calc_diff(ref, out) < 7e-4, seed


@pytest.fixture(scope="module")
def shrink_buffer(one_rank_world):
    R = dist.get_world_size()
    E = 32 * R
    buf = deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True, num_qps_per_rank=E // R,
                         explicitly_destroy=True, enable_shrink=True)
    yield buf, E
    buf.destroy()


def test_low_latency_shrink_mode_masks(shrink_buffer):
    buf, E = shrink_buffer
    R, rank, T = buf.group_size, buf.rank, 64
    status = torch.full((R,), -1, dtype=torch.int32, device="cuda")

    def masked():
        status.fill_(-1)
        buf.low_latency_query_mask_buffer(status)
        return status.tolist()

    def round_trip(seed):
        _, x, topk_idx, topk_w = _ll_inputs(T, E, seed, rank)
        recv_x, recv_count, handle, _, _ = _ll_or_skip(
            lambda: buf.low_latency_dispatch(x, topk_idx, LL_M, E, use_fp8=False))
        combined, _, _ = buf.low_latency_combine(recv_x, topk_idx, topk_w, handle)
        torch.cuda.synchronize()
        return x, topk_idx, topk_w, recv_count, combined

    assert masked() == [0] * R  # before the group exists: none masked
    x, idx, w, _, combined = round_trip(41)  # makes the group (with its mask)
    assert _calc_diff(x * w.masked_fill(idx == -1, 0).sum(dim=1).view(-1, 1), combined) < 1e-5
    assert masked() == [0] * R
    buf.low_latency_update_mask_buffer(rank, True)
    assert masked() == [1 if r == rank else 0 for r in range(R)]
    _, _, _, recv_count, combined = round_trip(42)  # masked by itself: nothing sent, nothing received
    assert recv_count.tolist() == [0] * (E // R) and bool((combined == 0).all())
    buf.low_latency_clean_mask_buffer()
    assert masked() == [0] * R
    buf.clean_low_latency_buffer(LL_M, LL_H, E)  # collective in shrink mode: the group's flags reset
    x, idx, w, recv_count, combined = round_trip(43)
    assert int(recv_count.sum()) == int((idx >= 0).sum())  # one rank: every routed (token, expert) arrives
    assert _calc_diff(x * w.masked_fill(idx == -1, 0).sum(dim=1).view(-1, 1), combined) < 1e-5
