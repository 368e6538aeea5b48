"""nccl.ep on a GPU, 1 rank (a single-process torch.distributed group made here when none exists; under torchrun
the launcher's). Against a torch reference on fresh random data, outputs poisoned by the library's own contract
(rows past the receive count untouched); a CUDA graph of handle update + dispatch + combine replayed with new
routings, the torch.library ops compiled (fullgraph) against eager with their gradients, and fp8 rows with their
scales forwarded byte-exact. Several ranks on one GPU need EP across NVLink domains (issue 12)."""

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


def test_a_captured_update_dispatch_combine_replays_with_new_routings(group):
    # Worst-case sizing: nothing waits on the host, so handle update + dispatch + combine go into one CUDA graph,
    # replayed with new routings and tokens copied into the captured inputs.
    T, K, H = 128, 4, 1024
    idx0, _ = _routing(T, K, group.num_experts, 10)
    idx_buf, x_buf = idx0.clone(), torch.randn(T, H, device="cuda")
    h = group.create_handle(idx_buf, layout="flat", sizing="worst_case")
    recv = group.dispatch(x_buf, handle=h)  # warm-up outside the capture
    group.combine(recv.tokens * 2, h)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h.update(idx_buf)
        recv = group.dispatch(x_buf, handle=h)
        out = group.combine(recv.tokens * 2, h)
    for seed in range(4):
        idx, _ = _routing(T, K, group.num_experts, 20 + seed)
        idx_buf.copy_(idx)
        x_buf.copy_(torch.randn(T, H, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        sent = (idx_buf >= 0).any(dim=1)
        assert torch.equal(out[sent], x_buf[sent] * 2), seed  # one rank: each sent token's one row, doubled
        counts = torch.bincount(idx_buf[idx_buf >= 0].flatten(), minlength=group.local_experts)
        assert torch.equal(h.expert_counts.long(), counts)
    h.close()


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
