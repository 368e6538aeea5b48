"""A rank of an nccl.ep group SIGKILLed in the middle of a loop of dispatch + combine, High-Throughput and
Low-Latency, its peers processes on the one GPU as one-GPU nodes (a NCCL_HOSTID each: every row goes over the rail
exchange): every survivor gets ep.NcclRemoteError (or NcclSystemError) from the loop within its budget plus the host
margin of the last call that succeeded, closes its handle and group within a bound, and exits with status 0. The
processes are this test's own (torchrun would stop the survivors as soon as the victim dies). GPU only."""

import multiprocessing
import os
import signal
import socket
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

M, H, K = 64, 256, 2  # tokens per rank, hidden, top-k
BUDGET_S = 3.0        # the group's device-wait budget
MARGIN_S = 5.0 + 2.0  # the libraries' host margin (common/device_status.h) and the loop's own slack
DIE_AT, ITERS = 3, 50


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drain(deadline):
    """Waits for the current stream without an unbounded host wait: False past `deadline` (a hang)."""
    ev = torch.cuda.Event()
    ev.record()
    while not ev.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _rank_main(rank, world, port, algorithm, results):
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
    _drain(time.monotonic() + 60)
    last_ok, error, hung = time.monotonic(), None, False
    for it in range(ITERS):
        try:
            recv = g.dispatch(x, handle=h)
            if rank == victim and it == DIE_AT:  # a dispatch in flight, then the process is gone
                os.kill(os.getpid(), signal.SIGKILL)
            g.combine(recv.tokens, h)
            if not _drain(time.monotonic() + BUDGET_S + MARGIN_S):
                hung = True
                break
            g.check()
        except ep.NcclError as e:
            error = e
            break
        last_ok = time.monotonic()
    noticed = time.monotonic() - last_ok
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
    world = 3
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = _free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, world, port, algorithm, results)) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 180
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        got = dict(results)
    assert not alive, "ranks %s still running after 180 s: %s" % (alive, got)
    assert procs[-1].exitcode == -signal.SIGKILL
    for r in range(world - 1):
        assert procs[r].exitcode == 0, (r, procs[r].exitcode, got.get(r))
        res = got[r]
        assert not res["hung"], (r, res)
        assert res["error"] in ("NcclRemoteError", "NcclSystemError"), (r, res)
        assert res["noticed"] <= BUDGET_S + MARGIN_S, (r, res)
        assert res["teardown"] <= 2 * (BUDGET_S + MARGIN_S) + 5, (r, res)
