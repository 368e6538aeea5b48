"""Timing for the Python benchmarks: CUDA-synchronised calls, medians."""

import statistics
import time


def host_and_wall(fn, iters: int, warmup: int = 2, between=None):
    """(median wall microseconds, median enqueue microseconds) of `iters` calls of fn() after `warmup` ones: each call
    starts on an idle GPU (synchronised first); enqueue is the time until fn returns, wall until the GPU is done.
    `between` (e.g. a barrier) runs after each synchronisation, outside the timing."""
    import torch

    for _ in range(warmup):
        fn()
    walls, hosts = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        if between is not None:
            between()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
        hosts.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(hosts)
