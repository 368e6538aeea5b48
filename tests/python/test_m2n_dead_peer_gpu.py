"""A rank of an nccl.m2n plan SIGKILLed in the middle of a loop of executes, its peers processes on the one GPU as
one-GPU nodes (a NCCL_HOSTID each: every piece between ranks goes by ncclSend / ncclRecv on the plan's exchange
communicator): every survivor gets m2n.NcclRemoteError (or NcclSystemError: NCCL's sockets may fail first) from
Plan.check() or Plan.execute() within the plan's budget plus the host margin of the last execute that finished, then
closes the plan and aborts its communicator within a bound, and exits with status 0. The plan reshards Shard(0) ->
Shard(1) over the three ranks, so that every rank exchanges with every other; the executes before the kill are
checked against the global tensor (_dead_peer.py: the processes and the common checks). GPU only."""

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

import _dead_peer  # noqa: E402

pytestmark = pytest.mark.gpu

N = 48             # the [N, N] fp32 tensor
BUDGET_S = 3.0     # the plan's timeout
DIE_AT, ITERS = 3, 50


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
    wrong = 0

    def call(it):
        dst.fill_(float("nan"))
        plan.execute([src], [dst])
        if rank == victim and it == DIE_AT:  # an execute in flight, then the process is gone
            os.kill(os.getpid(), signal.SIGKILL)

    def check(it):
        nonlocal wrong
        plan.check()
        if it < DIE_AT and not torch.equal(dst.cpu(), want):
            wrong += 1

    error, hung, noticed = _dead_peer.loop(ITERS, BUDGET_S, m2n.NcclError, call, check)
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
    procs, got = _dead_peer.run_world(_rank_main)
    for res in _dead_peer.check_survivors(procs, got, BUDGET_S):
        assert res["wrong"] == 0, res
        assert res["closed"] == "closed", res
