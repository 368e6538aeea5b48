"""A whole model from rank 0 to rank 1 with nccl.m2n, beside NCCL's per-tensor broadcast in the same run.

    torchrun --nproc_per_node 2 bench/m2n_model_bench.py [--config bench/configs/qwen3-32b.json] [--iters 5]
    torchrun --nproc_per_node 2 bench/m2n_model_bench.py --one-gpu nodes --scale 8   # both ranks on one GPU

Rank 0 holds every tensor of the config (Replicate on [0]); rank 1 receives all of them (Replicate on [1]); more
ranks take part holding nothing. Each
tensor is one contiguous run, so the executor sends it directly (one ncclSend / ncclRecv per tensor in one group).
The baseline is what RL frameworks do today: torch.distributed.broadcast of each tensor from rank 0 (NCCL backend),
one call per tensor. A second one, torch.distributed.batch_isend_irecv of every tensor in one batch (one NCCL group
of point-to-point sends, the operations the executor issues, on torch's communicator), tells the executor's own
cost from the transport's cost of point-to-point against a collective. Times are medians of --iters
CUDA-synchronised repetitions after one warm-up, the three taking turns call by call (loopback sockets drift within a
run); bytes: each tensor's bytes once. `--scale k` divides every
dimension above 1024 by k (the model must fit twice in the GPUs' memory; one GPU holds both sides). With --one-gpu
nodes the ranks talk over loopback sockets: that measures the transport, not NVLink (the 2-GPU issue owns the NVLink
numbers). Rank 0 prints one line and appends a JSON line to --json (with the median host time of each call until it
returned; append_json adds the NCCL_* variables the environment sets).
"""

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from _launch import append_json, start  # noqa: E402
from _timing import interleaved  # noqa: E402
from m2n_python_overhead import expand  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "bench", "configs", "qwen3-32b.json"))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--one-gpu", choices=["nodes"], default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rank, world, device = start(a.one_gpu == "nodes", backend="cpu:gloo,cuda:nccl")
    import torch
    import torch.distributed as dist

    import nccl.m2n as m2n

    if world < 2:
        print("m2n_model_bench: needs 2 ranks (more take part and hold nothing), got %d" % world)
        return 2
    pair = dist.new_group([0, 1])  # the baseline's broadcasts: rank 0 to rank 1 only
    config = json.load(open(a.config))
    tensors = expand(config, a.scale)
    gen = torch.Generator(device=device).manual_seed(5)
    local = {}
    for name, shape in tensors:
        if rank == 0:
            local[name] = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
        elif rank == 1:
            local[name] = torch.full(shape, float("nan"), device=device, dtype=torch.bfloat16)
    total = sum(torch.Size(shape).numel() * 2 for _, shape in tensors)

    def broadcast_all():
        if rank < 2:
            for t in local.values():
                dist.broadcast(t, src=0, group=pair)

    def p2p_all():
        if rank < 2:
            op = dist.isend if rank == 0 else dist.irecv
            for req in dist.batch_isend_irecv([dist.P2POp(op, t, 1 - rank, group=pair) for t in local.values()]):
                req.wait()

    batch = [(name, m2n.Layout(shape, torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE]),
              m2n.Layout(shape, torch.bfloat16, mesh=[1], placements=[m2n.REPLICATE])) for name, shape in tensors]
    with m2n.Plan(batch, timeout_s=120) as plan:
        src = local if rank == 0 else {}
        dst = local if rank == 1 else {}
        # Seconds, medians; the two take turns call by call, every rank starting each call together.
        turns = interleaved({"ours": lambda: plan.execute(src, dst), "theirs": broadcast_all, "p2p": p2p_all},
                            a.iters, warmup=1, between=dist.barrier)
        ours, theirs, p2p = (statistics.median(w for w, _ in turns[k]) / 1e6 for k in ("ours", "theirs", "p2p"))
        enqueue = {k: statistics.median(h for _, h in turns[k]) / 1e6 for k in ("ours", "theirs", "p2p")}
        # Check once, on fresh poison: every element rank 1 received equals rank 0's, which comes again by broadcast
        # (the baseline's path) into a scratch tensor, one tensor at a time.
        if rank == 1:
            for t in local.values():
                t.fill_(float("nan"))
        plan.execute(src, dst)
        torch.cuda.synchronize()
        ok = True
        if rank < 2:
            for t in local.values():
                ref = t if rank == 0 else torch.empty_like(t)
                dist.broadcast(ref, src=0, group=pair)
                if rank == 1 and not torch.equal(ref.view(torch.int16), t.view(torch.int16)):
                    ok = False
        flag = torch.tensor([0 if ok else 1], device=device)
        dist.all_reduce(flag)
        ok = int(flag) == 0

    if rank == 0:
        mode = "one-GPU nodes (loopback sockets)" if a.one_gpu else "real GPUs"
        line = {"test": "m2n_model_bench", "pass": ok, "ranks": world, "mode": mode, "model": config["name"],
                "tensors": len(tensors), "bytes": total, "scale": a.scale, "iters": a.iters,
                "gpu": torch.cuda.get_device_name(device), "nccl_m2n_s": ours, "nccl_broadcast_per_tensor_s": theirs,
                "nccl_m2n_GBps": total / ours / 1e9, "broadcast_GBps": total / theirs / 1e9,
                "nccl_m2n_enqueue_s": enqueue["ours"], "broadcast_enqueue_s": enqueue["theirs"],
                "nccl_p2p_batch_s": p2p, "p2p_batch_GBps": total / p2p / 1e9, "p2p_batch_enqueue_s": enqueue["p2p"],
                "byte_convention": "each tensor's bytes once"}
        print("m2n_model_bench: %s, %d tensors, %.2f GB, rank 0 -> rank 1 (%s): nccl.m2n %.3f s (%.1f GB/s), "
              "per-tensor broadcast %.3f s (%.1f GB/s), one batch of sends %.3f s (%.1f GB/s); results %s" % (
                  config["name"], len(tensors), total / 1e9, mode, ours, line["nccl_m2n_GBps"], theirs,
                  line["broadcast_GBps"], p2p, line["p2p_batch_GBps"], "equal" if ok else "DIFFER"))
        append_json(a.json, line)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
