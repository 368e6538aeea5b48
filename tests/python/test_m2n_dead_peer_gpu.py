"""A rank of an nccl.m2n plan SIGKILLed in the middle of a loop of executes, its peers processes on the one GPU as
one-GPU nodes (a NCCL_HOSTID each: every piece between ranks goes by ncclSend / ncclRecv on the plan's exchange
communicator): every survivor gets m2n.NcclRemoteError (or NcclSystemError: NCCL's sockets may fail first) from
Plan.check() or Plan.execute() within the plan's budget plus the host margin of the last execute that finished, then
closes the plan and aborts its communicator within a bound, and exits with status 0. The plan reshards Shard(0) -> Shard(1) over the three ranks, so that every rank
exchanges with every other; the executes before the kill are checked against the global tensor. The processes are
this test's own (torchrun would stop the survivors as soon as the victim dies). GPU only."""

import multiprocessing
import os
import signal
import socket
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

N = 48             # the [N, N] fp32 tensor
BUDGET_S = 3.0     # the plan's timeout
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


def _part(t, box):
    off, shp = box
    return t[tuple(slice(o, o + n) for o, n in zip(off, shp))]


def _rank_main(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_HOSTID="ncclext-m2n-dead-peer-%d" % rank,
                      NCCL_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0")
    import torch.distributed as dist

    import nccl.m2n as m2n

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    victim = world - 1
    ranks = list(range(world))
    src_layout = m2n.Layout((N, N), torch.float32, mesh=ranks, placements=[m2n.shard(0)])
    dst_layout = m2n.Layout((N, N), torch.float32, mesh=ranks, placements=[m2n.shard(1)])
    full = torch.arange(N * N, dtype=torch.float32).view(N, N)  # every rank knows the global tensor
    src = _part(full, src_layout.local_box(rank)).contiguous().cuda()
    want = _part(full, dst_layout.local_box(rank)).contiguous()
    dst = torch.full(want.shape, float("nan"), device="cuda")
    comm = m2n.Communicator()
    plan = m2n.Plan([("w", src_layout, dst_layout)], group=comm, timeout_s=BUDGET_S)
    last_ok, error, hung, wrong = time.monotonic(), None, False, 0
    for it in range(ITERS):
        try:
            dst.fill_(float("nan"))
            plan.execute([src], [dst])
            if rank == victim and it == DIE_AT:  # an execute in flight, then the process is gone
                os.kill(os.getpid(), signal.SIGKILL)
            if not _drain(time.monotonic() + BUDGET_S + MARGIN_S):
                hung = True
                break
            plan.check()
            if it < DIE_AT and not torch.equal(dst.cpu(), want):
                wrong += 1
        except m2n.NcclError as e:
            error = e
            break
        last_ok = time.monotonic()
    noticed = time.monotonic() - last_ok
    t0 = time.monotonic()
    closed = "closed"
    try:  # the plan is local; the communicator, whose peer is gone, is aborted (local), not closed (collective)
        plan.close()
    except m2n.NcclError as e:
        closed = "%s: %s" % (type(e).__name__, e)
    comm.abort()
    teardown = time.monotonic() - t0
    results[rank] = dict(error=type(error).__name__ if error else None, message=str(error), noticed=noticed,
                         teardown=teardown, hung=hung, closed=closed, wrong=wrong)
    dist.destroy_process_group()


def test_survivors_of_a_killed_rank_get_an_error_and_exit_cleanly():
    world = 3
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = _free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, world, port, results)) for r in range(world)]
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
        assert res["wrong"] == 0, (r, res)
        assert not res["hung"], (r, res)
        assert res["error"] in ("NcclRemoteError", "NcclSystemError"), (r, res)
        assert res["closed"] == "closed", (r, res)
        assert res["noticed"] <= BUDGET_S + MARGIN_S, (r, res)
        assert res["teardown"] <= 2 * (BUDGET_S + MARGIN_S) + 5, (r, res)
