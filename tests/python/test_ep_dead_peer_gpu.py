"""A rank of an nccl.ep group SIGKILLed in the middle of a loop of dispatch + combine, High-Throughput and
Low-Latency, its peers processes on the one GPU as one-GPU nodes (a NCCL_HOSTID each: every row goes over the rail
exchange): every survivor gets ep.NcclRemoteError (or NcclSystemError) from the loop within its budget plus the host
margin of the last call that succeeded, closes its handle and group within a bound, and exits with status 0
(_dead_peer.py: the processes and the common checks). GPU only."""

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

import _dead_peer  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, K = 64, 256, 2  # tokens per rank, hidden, top-k
BUDGET_S = 3.0        # the group's device-wait budget
DIE_AT, ITERS = 3, 50


def _rank_main(rank, world, port, results, algorithm):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_HOSTID="ncclext-dead-peer-%d" % rank,
                      NCCL_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0")
    import torch.distributed as dist

    import nccl.ep as ep

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    victim = world - 1
    g = ep.Group(algorithm=algorithm, num_experts=2 * world, max_tokens_per_rank=M, hidden=H, max_topk=K, num_sms=4,
                 timeout_s=BUDGET_S)
    gen = torch.Generator().manual_seed(rank)
    idx = torch.stack([torch.randperm(2 * world, generator=gen)[:K] for _ in range(M)]).cuda()
    x = torch.ones(M, H, dtype=torch.bfloat16, device="cuda")
    h = g.create_handle(idx, layout="rank_major" if algorithm == "low_latency" else "flat")
    _dead_peer.drain(time.monotonic() + 60)

    def call(it):
        recv = g.dispatch(x, handle=h)
        if rank == victim and it == DIE_AT:  # a dispatch in flight, then the process is gone
            os.kill(os.getpid(), signal.SIGKILL)
        g.combine(recv.tokens, h)

    error, hung, noticed = _dead_peer.loop(ITERS, BUDGET_S, ep.NcclError, call, lambda it: g.check())
    t0 = time.monotonic()
    closed = "closed"
    for obj in (h, g):  # the group's destruction meets a broken domain: an error, and freed all the same
        try:
            obj.close()
        except ep.NcclError as e:
            closed = "%s: %s" % (type(e).__name__, e)
    teardown = time.monotonic() - t0
    results[rank] = dict(error=type(error).__name__ if error else None, message=str(error), noticed=noticed,
                         teardown=teardown, hung=hung, closed=closed)
    dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["high_throughput", "low_latency"])
def test_survivors_of_a_killed_rank_get_an_error_and_exit_cleanly(algorithm):
    procs, got = _dead_peer.run_world(_rank_main, algorithm)
    _dead_peer.check_survivors(procs, got, BUDGET_S)
