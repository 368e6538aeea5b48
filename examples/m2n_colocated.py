"""Co-located resharding with nccl.m2n beside DTensor.redistribute: a [N, N] bf16 weight sharded by rows over
every rank (TP Shard(0)) becomes sharded by columns (Shard(1)) on the same ranks, and Replicate.

    torchrun --nproc_per_node 2 examples/m2n_colocated.py [--size 16384] [--iters 20] [--json FILE]
    torchrun --nproc_per_node 2 examples/m2n_colocated.py --one-gpu nodes     # both ranks on one GPU

Both paths start from the same DTensor and must give bit-identical local shards (checked on every rank); then each is
timed, the two calls alternating (CUDA-event medians; nccl.m2n: Plan.execute of a plan made once, DTensor:
redistribute). With --one-gpu nodes the ranks talk over loopback sockets: the times measure that transport, not
NVLink. Exits 0 when every result matches, 1 otherwise.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

import nccl.m2n as m2n  # noqa: E402
from _launch import append_json, median_us, start  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=16384, help="the weight is [size, size] bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--one-gpu", choices=["nodes"], default=None, help="every rank on GPU 0, each its own NCCL node")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rank, world, device = start(a.one_gpu == "nodes")
    mesh = init_device_mesh("cuda", (world,))
    torch.manual_seed(7)  # the same global tensor on every rank
    full = torch.randn(a.size, a.size, device=device).to(torch.bfloat16)
    src = distribute_tensor(full, mesh, [Shard(0)])
    del full
    ok, rows = True, []
    with m2n.Communicator() as comm:
        for name, target in (("Shard(0)->Shard(1)", [Shard(1)]), ("Shard(0)->Replicate", [Replicate()])):
            ref = src.redistribute(mesh, target)
            dst = m2n.Layout.from_device_mesh(mesh, target, src.shape, torch.bfloat16)
            y = torch.full(tuple(ref.to_local().shape), float("nan"), device=device, dtype=torch.bfloat16)
            with m2n.Plan([("w", m2n.Layout.from_dtensor(src), dst)], comm) as plan:
                plan.execute([src], [y])
                torch.cuda.synchronize()
                same = torch.equal(y, ref.to_local())
                flag = torch.tensor([0 if same else 1], device=device)
                dist.all_reduce(flag)
                ok = ok and int(flag) == 0
                ours, theirs = median_us(lambda: plan.execute([src], [y]), lambda: src.redistribute(mesh, target),
                                         iters=a.iters)
            rows.append({"case": name, "nccl_m2n_us": ours, "dtensor_redistribute_us": theirs,
                         "equal_on_every_rank": int(flag) == 0})
            del ref
    if rank == 0:
        mode = "one-GPU nodes (loopback sockets)" if a.one_gpu else "real GPUs"
        for r in rows:
            print("m2n_colocated: %s, %d ranks (%s), [%d, %d] bf16: nccl.m2n %.1f us, DTensor.redistribute %.1f us, "
                  "results %s" % (r["case"], world, mode, a.size, a.size, r["nccl_m2n_us"], r["dtensor_redistribute_us"],
                                  "equal" if r["equal_on_every_rank"] else "DIFFER"))
        print("m2n_colocated: %s" % ("PASS" if ok else "FAIL"))
        append_json(a.json, {"test": "m2n_colocated", "pass": ok, "ranks": world, "mode": mode, "n": a.size,
                             "iters": a.iters, "gpu": torch.cuda.get_device_name(device), "rows": rows})
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
