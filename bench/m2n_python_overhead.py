"""Python overhead of nccl.m2n.Plan.execute over the C ncclM2nExecute, on a whole Qwen3-32B-like model
(bench/configs/qwen3-32b.json: 707 bf16 tensors, 64 GB) at 1 rank on one GPU: every tensor a local copy.

    python bench/m2n_python_overhead.py [--config bench/configs/qwen3-32b.json] [--iters 15] [--json FILE]

Times, each the median of --iters CUDA-synchronised calls after 2 warm-ups:
  c         ncclM2nExecute through ctypes with pointer arrays built once (the floor any binding pays);
  python    Plan.execute(src_dict, dst_dict) with the same tensors every call (its repeat path skips the checks);
  checked   Plan.execute with new list objects of new tensor views every call (every shape, stride and dtype
            checked again);
  torch_copy the baseline: dst.copy_(src) for every tensor (torch's device copies);
and the host time of enqueueing each call on an idle GPU (bench/_timing.py). Overhead = (python - c) / c. The result
checked (every tensor, bit-exact) is one execute's into NaN-poisoned destinations. Then the one-call reshard of the
model's largest tensor (m2n.reshard, asynchronous, its plan cached by layout pair): the host time of its first call
(which makes the default group's communicator and plans), and wall and enqueue of later calls beside Plan.execute
of a plan of that tensor alone (the cached plan should cost what an execute costs); its result checked the same
way. `--scale k`
divides every dimension above 1024 by k (a smaller GPU). Bytes: each tensor's bytes once (read once, written once).
"""

import argparse
import ctypes
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from _launch import append_json, start  # noqa: E402
from _timing import host_and_wall  # noqa: E402


def expand(config, scale):
    out = []
    for t in config["tensors"]:
        shape = [d // scale if d > 1024 else d for d in t["shape"]]
        layers = range(*t["layers"]) if "layers" in t else [None]
        for layer in layers:
            out.append((t["name"].format(layer=layer) if layer is not None else t["name"], tuple(shape)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "bench", "configs", "qwen3-32b.json"))
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    start(False, backend="gloo")  # one process, GPU 0
    import torch
    import torch.distributed as dist

    import nccl.m2n as m2n

    config = json.load(open(a.config))
    tensors = expand(config, a.scale)
    src, dst, batch = {}, {}, []
    for name, shape in tensors:
        lay = m2n.Layout(shape, torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE])
        batch.append((name, lay, lay))
        src[name] = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        dst[name] = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    total = sum(t.numel() * t.element_size() for t in src.values())
    with m2n.Plan(batch) as plan:
        lib = m2n._lib()
        n = len(batch)
        s_arr = (ctypes.c_void_p * n)(*[src[name].data_ptr() for name, _, _ in batch])
        d_arr = (ctypes.c_void_p * n)(*[dst[name].data_ptr() for name, _, _ in batch])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def c_call():
            rc = lib.ncclM2nExecute(plan._h, s_arr, d_arr, stream)
            if rc != 0:
                raise RuntimeError("ncclM2nExecute: %s" % lib.ncclM2nGetLastError().decode())

        names = [name for name, _, _ in batch]

        def checked_call():  # new containers of new views: no repeat path
            plan.execute([src[k][...] for k in names], [dst[k][...] for k in names])

        def torch_copy():  # the baseline: torch's own device copy of every tensor (one cudaMemcpyAsync each)
            for k in names:
                dst[k].copy_(src[k])

        rows = {}
        for what, fn in (("c", c_call), ("python", lambda: plan.execute(src, dst)), ("checked", checked_call),
                         ("torch_copy", torch_copy)):
            wall, host = host_and_wall(fn, a.iters)
            rows[what] = {"wall_us": wall, "enqueue_us": host}
        for k in names:  # poison, then one execute: the result checked is the executor's, not torch's copy
            dst[k].fill_(float("nan"))
        plan.execute(src, dst)
        torch.cuda.synchronize()
        ok = all(torch.equal(src[k], dst[k]) for k in names)
    # The one-call reshard of the largest tensor: its first call plans, the later ones find the plan cached.
    big = max(names, key=lambda k: src[k].numel())
    lay = next(s_lay for name, s_lay, _ in batch if name == big)
    x, y = src[big], dst[big]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    m2n.reshard(x, lay, src_layout=lay, out=y)
    first_us = (time.perf_counter() - t0) * 1e6
    with m2n.Plan([(big, lay, lay)]) as one:
        for what, fn in (("reshard", lambda: m2n.reshard(x, lay, src_layout=lay, out=y)),
                         ("plan_execute_one", lambda: one.execute([x], [y]))):
            wall, host = host_and_wall(fn, a.iters)
            rows[what] = {"wall_us": wall, "enqueue_us": host}
    y.fill_(float("nan"))
    m2n.reshard(x, lay, src_layout=lay, out=y)
    torch.cuda.synchronize()
    ok = ok and torch.equal(x, y)
    m2n.release_communicators()
    c, py, ck = rows["c"]["wall_us"], rows["python"]["wall_us"], rows["checked"]["wall_us"]
    result = {"test": "m2n_python_overhead", "pass": ok, "gpu": torch.cuda.get_device_name(0), "ranks": 1,
              "model": config["name"], "tensors": n, "bytes": total, "scale": a.scale, "iters": a.iters,
              "rows": rows, "overhead_python": (py - c) / c, "overhead_checked": (ck - c) / c,
              "copy_GBps": total / (c * 1e-6) / 1e9,
              "torch_copy_GBps": total / (rows["torch_copy"]["wall_us"] * 1e-6) / 1e9,
              "reshard_tensor": big, "reshard_first_call_us": first_us,
              "reshard_overhead_enqueue_us": rows["reshard"]["enqueue_us"] - rows["plan_execute_one"]["enqueue_us"],
              "byte_convention": "each tensor's bytes once"}
    print("m2n_python_overhead: %s, %d tensors, %.1f GB, 1 rank on %s" % (config["name"], n, total / 1e9,
                                                                       result["gpu"]))
    for what in ("c", "python", "checked", "torch_copy", "reshard", "plan_execute_one"):
        print("  %-16s %10.1f us a call (enqueue %8.1f us)" % (what, rows[what]["wall_us"], rows[what]["enqueue_us"]))
    print("  reshard of %s: first call %.1f us (communicator and plan); later calls enqueue %+.1f us beside "
          "Plan.execute" % (big, first_us, result["reshard_overhead_enqueue_us"]))
    print("  overhead: python %+.2f%%, checked %+.2f%%; copy %.0f GB/s (torch's copy_ %.0f GB/s); results %s" % (
        100 * result["overhead_python"], 100 * result["overhead_checked"], result["copy_GBps"],
        result["torch_copy_GBps"], "equal" if ok else "DIFFER"))
    append_json(a.json, result)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
