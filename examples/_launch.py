"""What the examples share: start torch.distributed from torchrun's environment (or as one process), optionally as
one-GPU nodes (every rank on GPU 0, each its own NCCL host: how one GPU runs several ranks), and time CUDA work."""

import os


def start(one_gpu_nodes: bool, backend: str = "cpu:gloo,cuda:nccl"):
    """(rank, world size, device). Call before any NCCL use."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29600 + os.getpid() % 300))
    if one_gpu_nodes:  # before NCCL reads its environment
        os.environ["NCCL_HOSTID"] = "ncclext-node-%s" % os.environ["RANK"]
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    device = torch.device("cuda", 0 if one_gpu_nodes else int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if "nccl" in backend else None)
    return dist.get_rank(), dist.get_world_size(), device


def median_us(*fns, iters: int, warmup: int = 3) -> list:
    """Medians of `iters` CUDA-event timings of each of fns on the current stream, in microseconds, after `warmup`
    calls of each. The calls alternate (fns[0], fns[1], ..., fns[0], ...), so that every function sees the same
    conditions (loopback sockets' speed drifts within a run)."""
    import torch

    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, t in zip(fns, times):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            t.append(a.elapsed_time(b) * 1e3)
    return [sorted(t)[len(t) // 2] for t in times]


# What a JSON line records of the environment: every NCCL_* variable set (over loopback sockets the transport's
# settings change the times of both sides severalfold: docs/PERFORMANCE.md, section 6), as tools/gpu_check_report.py
# does; not NCCL_VERSION (a container's label that NCCL does not read) nor NCCL_EXT_GIT_COMMIT (the source's).
NOT_RECORDED = ("NCCL_VERSION", "NCCL_EXT_GIT_COMMIT")


def append_json(path, line: dict) -> None:
    """Appends `line` to the file `path` (none: nothing), with the NCCL_* variables the environment sets (env)."""
    if path:
        line = dict(line, env={k: v for k, v in sorted(os.environ.items())
                               if k.startswith("NCCL_") and k not in NOT_RECORDED})
        import json

        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
