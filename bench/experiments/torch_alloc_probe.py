"""Host time of the ways Python can allocate a CUDA tensor of a given shape (nccl.ep's per-call outputs), interleaved
in rounds so that drift touches each alike; medians of --iters calls a way, after warm-ups. Run by hand on a GPU:

    python bench/experiments/torch_alloc_probe.py [--iters 20000] [--rounds 5]
"""

import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    idx = dev.index
    bf16, i32 = torch.bfloat16, torch.int32
    x = torch.empty(128, 7168, dtype=bf16, device=dev)
    rows, h, k = 4096, 7168, 8
    ways = {
        "empty(*ints, dtype, device=torch.device)": lambda: (torch.empty(rows, h, dtype=bf16, device=dev),
                                                             torch.empty(rows, k, dtype=i32, device=dev)),
        "empty(*ints, dtype, device=int)": lambda: (torch.empty(rows, h, dtype=bf16, device=idx),
                                                    torch.empty(rows, k, dtype=i32, device=idx)),
        "empty(tuple, dtype, device=torch.device)": lambda: (torch.empty((rows, h), dtype=bf16, device=dev),
                                                             torch.empty((rows, k), dtype=i32, device=dev)),
        "x.new_empty(tuple[, dtype])": lambda: (x.new_empty((rows, h)), x.new_empty((rows, k), dtype=i32)),
        "empty_strided": lambda: (torch.empty_strided((rows, h), (h, 1), dtype=bf16, device=dev),
                                  torch.empty_strided((rows, k), (k, 1), dtype=i32, device=dev)),
    }
    times = {name: [] for name in ways}
    for fn in ways.values():
        for _ in range(1000):
            fn()
    for _ in range(a.rounds):
        for name, fn in ways.items():
            t0 = time.perf_counter()
            for _ in range(a.iters):
                fn()
            times[name].append((time.perf_counter() - t0) / a.iters * 1e6)
    for name, ts in times.items():
        print("torch_alloc_probe: %-44s two tensors %.2f us (median of %d rounds; min %.2f, max %.2f)"
              % (name, statistics.median(ts), a.rounds, min(ts), max(ts)))


if __name__ == "__main__":
    main()
