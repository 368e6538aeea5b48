"""What the Python dead-peer tests share (test_ep_dead_peer_gpu.py, test_m2n_dead_peer_gpu.py): WORLD processes of
their own on the one GPU as one-GPU nodes (torchrun would stop the survivors as soon as the victim dies), the last
one SIGKILLing itself in the middle of a loop; every survivor reports what it saw in a shared dict."""

import multiprocessing
import signal
import socket
import time

WORLD = 3
JOIN_S = 180  # every process ends within this, or the test fails naming the ranks still running
MARGIN_S = 5.0 + 2.0  # the libraries' host margin (common/device_status.h) and the loop's own slack


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain(deadline):
    """Waits for the current stream without an unbounded host wait: False past `deadline` (a hang)."""
    import torch

    ev = torch.cuda.Event()
    ev.record()
    while not ev.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def loop(iters, budget_s, error_type, call, check):
    """A rank's loop: call(it) enqueues a step (the victim dies inside it), its stream drains within budget_s +
    MARGIN_S (else a hang), then check(it) raises a late error. Returns (the error_type raised or None, hung, seconds
    from the last step that finished to the error)."""
    last_ok, error, hung = time.monotonic(), None, False
    for it in range(iters):
        try:
            call(it)
            if not drain(time.monotonic() + budget_s + MARGIN_S):
                hung = True
                break
            check(it)
        except error_type as e:
            error = e
            break
        last_ok = time.monotonic()
    return error, hung, time.monotonic() - last_ok


def run_world(rank_main, *args):
    """Runs rank_main(rank, WORLD, port, results, *args) in WORLD spawned processes; returns (processes, results)
    once all ended (those still running after JOIN_S are killed, and the test fails)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, WORLD, port, results) + args) for r in range(WORLD)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + JOIN_S
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        got = dict(results)
    assert not alive, "ranks %s still running after %d s: %s" % (alive, JOIN_S, got)
    return procs, got


def check_survivors(procs, got, budget_s):
    """The victim (the last rank) was SIGKILLed; every survivor exited 0, did not hang, got NcclRemoteError (or
    NcclSystemError: NCCL's sockets may fail first) within budget_s + MARGIN_S of its last good call, and tore down
    within a bound. Returns the survivors' reports."""
    assert procs[-1].exitcode == -signal.SIGKILL
    for r in range(len(procs) - 1):
        assert procs[r].exitcode == 0, (r, procs[r].exitcode, got.get(r))
        res = got[r]
        assert not res["hung"], (r, res)
        assert res["error"] in ("NcclRemoteError", "NcclSystemError"), (r, res)
        assert res["noticed"] <= budget_s + MARGIN_S, (r, res)
        assert res["teardown"] <= 2 * (budget_s + MARGIN_S) + 5, (r, res)
    return [got[r] for r in range(len(procs) - 1)]
