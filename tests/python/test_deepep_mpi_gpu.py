"""The DeepEP drop-in over an mpi4py communicator (`Buffer(None, ..., comm=MPI.COMM_WORLD)`, TensorRT-LLM's way), under
mpirun (make gpu-check's `python_deepep_mpi`: one-GPU nodes, every rank on GPU 0 with its own NCCL_HOSTID). The NCCL
communicator's id and the Buffer's own collectives go over MPI; the calls are the usual ones. Each rank derives every
rank's inputs from the seed, so it checks its own results with no exchange: the Low-Latency round trip (identity
experts, owner weights in 1/8 steps: exact in bf16) and the High-Throughput dispatch (rows by source, the handle's
rank_prefix_matrix, built by an MPI all-to-all) and combine. Skipped without mpi4py or outside mpirun."""

import os

import pytest

if not any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")):  # before MPI starts in this process
    pytest.skip("not under mpirun (make gpu-check's python_deepep_mpi runs it)", allow_module_level=True)
torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import nccl.ep.deepep as deep_ep  # noqa: E402

pytestmark = pytest.mark.gpu

T, H, LOCAL, K = 32, 512, 4, 4  # tokens per rank, hidden, experts per rank, top-k


@pytest.fixture(scope="module")
def mpi_world():
    comm = MPI.COMM_WORLD
    one_gpu = os.environ.get("NCCL_EXT_TEST_ONE_GPU") == "nodes"
    torch.cuda.set_device(0 if one_gpu else comm.Get_rank() % torch.cuda.device_count())
    return comm


def _inputs(s, R):
    """Rank s's (topk_idx [T, K] int64 over R * LOCAL experts, distinct per token, some -1; x [T, H] bf16 in 1/8
    steps; weights [T, K] in 1/8 steps)."""
    gen = torch.Generator().manual_seed(4242 + s)
    idx = torch.stack([torch.randperm(R * LOCAL, generator=gen)[:K] for _ in range(T)])
    idx[torch.rand(T, K, generator=gen) < 0.15] = -1
    x = (torch.randint(-16, 17, (T, H), generator=gen).float() / 8).to(torch.bfloat16)
    w = torch.randint(1, 5, (T, K), generator=gen).float() / 8
    return idx, x, w


def test_low_latency_round_trip_over_mpi(mpi_world):
    comm = mpi_world
    me, R = comm.Get_rank(), comm.Get_size()
    buf = deep_ep.Buffer(None, 0, 0, low_latency_mode=True, explicitly_destroy=True, comm=comm)
    try:
        idx, x, w = _inputs(me, R)
        recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(x.cuda(), idx.cuda(), T, R * LOCAL,
                                                                    use_fp8=False)
        out, _, _ = buf.low_latency_combine(recv_x, idx.cuda(), w.cuda(), handle)
        torch.cuda.synchronize()
        want = (x.float() * torch.where(idx >= 0, w, torch.zeros_like(w)).sum(dim=1, keepdim=True)).to(torch.bfloat16)
        assert torch.equal(out.cpu(), want)
        for l in range(LOCAL):  # every source's tokens naming my expert l
            e = me * LOCAL + l
            assert int(recv_count[l]) == sum(int((_inputs(s, R)[0] == e).sum()) for s in range(R)), l
    finally:
        buf.destroy()


def test_high_throughput_dispatch_and_combine_over_mpi(mpi_world):
    comm = mpi_world
    me, R = comm.Get_rank(), comm.Get_size()
    buf = deep_ep.Buffer(None, int(1e9), 0, explicitly_destroy=True, comm=comm)
    try:
        idx, x, w = _inputs(me, R)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx.cuda(), R * LOCAL)
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            x.cuda(), topk_idx=idx.cuda(), topk_weights=w.cuda(), num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        torch.cuda.synchronize()
        rows, sent = [], []
        for s in range(R):
            idx_s, x_s, _ = _inputs(s, R)
            hit = ((idx_s >= 0) & (idx_s // LOCAL == me)).any(dim=1)
            rows.append(x_s[hit])
            sent.append([int(((idx_s >= 0) & (idx_s // LOCAL == d)).any(dim=1).sum()) for d in range(R)])
        assert torch.equal(recv_x.cpu(), torch.cat(rows))
        want_prefix = torch.tensor(sent, dtype=torch.int32).cumsum(dim=0)  # [i][j]: sent to j by ranks 0..i
        assert torch.equal(handle[0].cpu(), want_prefix.int())
        out, _, _ = buf.combine(recv_x, handle)
        torch.cuda.synchronize()
        ranks_hit = torch.stack([((idx >= 0) & (idx // LOCAL == d)).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
        assert torch.equal(out.cpu(), (x.float() * ranks_hit.unsqueeze(1)).to(torch.bfloat16))
    finally:
        buf.destroy()
