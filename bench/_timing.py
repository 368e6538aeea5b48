"""Timing for the Python benchmarks: CUDA-synchronised calls, medians; and the shapes the dispatch + combine pair
benchmarks share."""

import argparse
import statistics
import time


def pair_arguments(argv=None) -> argparse.Namespace:
    """The options of the dispatch + combine pair benchmarks (ep_python_overhead.py, ep_jax_overhead.py, which runs
    the former on its own values): token counts, hidden, top-k, experts, iterations, the JSON file."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def _one_call(fn, between=None):
    """(wall, enqueue) microseconds of one call of fn() started on an idle GPU (synchronised first): enqueue until fn
    returns, wall until the GPU is done. `between` (e.g. a barrier) runs after the synchronisation, untimed."""
    import torch

    torch.cuda.synchronize()
    if between is not None:
        between()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6, (t1 - t0) * 1e6


def host_and_wall(fn, iters: int, warmup: int = 2, between=None):
    """(median wall microseconds, median enqueue microseconds) of `iters` calls of fn() after `warmup` ones, each
    timed as _one_call times it."""
    for _ in range(warmup):
        fn()
    samples = [_one_call(fn, between) for _ in range(iters)]
    return statistics.median(w for w, _ in samples), statistics.median(h for _, h in samples)


def _take_turns(fns: dict, rounds: int, warmup: int, sample):
    """Per name of `fns` (name -> callable), the list of `rounds` samples `sample(fn)` took of it, after `warmup`
    calls of each, in rounds that sample every function once in turn: a slow drift of the machine (clocks, other
    processes) then touches every function alike, and the i-th samples of two functions are a fair pair."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(sample(fn))
    return samples


def interleaved(fns: dict, iters: int, warmup: int = 5, between=None):
    """Per name of `fns` (name -> callable), the list of `iters` (wall, enqueue) microsecond pairs of its calls, each
    timed as _one_call times it, the functions taking turns (_take_turns)."""
    return _take_turns(fns, iters, warmup, lambda fn: _one_call(fn, between))


def paired_difference(a, b):
    """(median, 25th percentile, 75th percentile) of a[i] - b[i] over the rounds of two interleaved() sample lists
    (their wall times)."""
    d = sorted(x[0] - y[0] for x, y in zip(a, b))
    q = statistics.quantiles(d, n=4)
    return statistics.median(d), q[0], q[2]


def back_to_back(fns: dict, calls: int, rounds: int, warmup: int = 5):
    """Per name of `fns`, the median over `rounds` of the wall microseconds per call of `calls` calls enqueued back to
    back (one synchronisation before and one after: the host may run ahead of the GPU, as an eager loop does), the
    functions taking turns round by round (_take_turns)."""
    import torch

    def burst(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / calls

    per = _take_turns(fns, rounds, warmup, burst)
    return {name: statistics.median(v) for name, v in per.items()}
