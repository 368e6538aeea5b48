"""A dropless Mixture-of-Experts layer in JAX on nccl.ep.jax, trained for a few SGD steps and compared with the same
layer on one device; then a Low-Latency decode loop inside one jitted fori_loop, compared alike. GPUs only.

    python examples/jax_moe.py --nproc 2               # 2 processes, one GPU each (or, with fewer GPUs, all on GPU 0
                                                       # as one-GPU NCCL nodes)
    python examples/jax_moe.py --nproc 4 --one-gpu nodes   # all on GPU 0 as one-GPU nodes, whatever the GPUs
    python examples/jax_moe.py --nproc 1 --steps 3

Each process is one rank of the mesh axis "ep" (jax.distributed, one GPU per process) and holds E/R experts (a
two-layer MLP each); the router is replicated. Training (High-Throughput, fp32): the router picks top-k experts per
token, nccl.ep.jax.dispatch sends every token to the ranks of its experts (FLAT: one row per (token, rank) with the
local expert ids and weights), each rank runs its experts on the rows that name them with jax.lax.ragged_dot over
(row, expert) pairs sorted by expert (no capacity, nothing dropped), weights their outputs, and nccl.ep.jax.combine
sums each token's rows at its owner; jax.grad runs back through the same handle. The reference computes the whole
layer (all experts, every rank's tokens) on this process's GPU with plain JAX; after each step the loss, and at the
end every parameter, must match. Decode (Low-Latency, bf16, EXPERT_MAJOR): a residual MoE step repeated in a
jax.lax.fori_loop, each expert's zone through its MLP, the owner-weighted combine; each step's routing comes from
its own random logits, not from x, so that a rounding difference between the two paths cannot flip an expert choice
and grow over the steps. Exits 0 when everything matches (or when there is no GPU: it says so; 77 with --json, as
the GPU tests do), 1 otherwise. --json FILE appends one result line (make gpu-check's format).
"""

import argparse
import json
import os
import subprocess
import sys


def experts(rows, ids, weights, w1, w2, round_rows=False):
    """sum_k weights[r, k] * MLP_{ids[r, k]}(rows[r]) for each row (ids -1: no expert here): the (row, k) pairs sorted
    by expert and run as one grouped matmul (jax.lax.ragged_dot), scattered back. round_rows: each MLP output
    rounded to bf16 before it is weighted (what a Low-Latency combine of bf16 rows does)."""
    import jax
    import jax.numpy as jnp

    n, k = ids.shape
    num = w1.shape[0]
    key = jnp.where(ids >= 0, ids, num).reshape(-1)
    order = jnp.argsort(key, stable=True)
    src = order // k
    sizes = jnp.bincount(key, length=num + 1)[:num].astype(jnp.int32)
    h = jax.nn.relu(jax.lax.ragged_dot(rows[src], w1, sizes))
    y = jax.lax.ragged_dot(h, w2, sizes)
    if round_rows:
        y = y.astype(jnp.bfloat16).astype(jnp.float32)
    keep = (key[order] < num)[:, None]  # pairs past the groups: no expert, nothing added
    y = jnp.where(keep, weights.reshape(-1)[order][:, None] * y, 0.0)
    return jnp.zeros(rows.shape, jnp.float32).at[src].add(y).astype(rows.dtype)


def route(router, x, k):
    import jax
    import jax.numpy as jnp

    logits = x.astype(jnp.float32) @ router
    top, idx = jax.lax.top_k(logits, k)
    return idx.astype(jnp.int32), jax.nn.softmax(top, axis=-1)


def reference_layer(p, x, k, round_rows=False):
    idx, w = route(p["router"], x, k)
    return experts(x, idx, w, p["w1"], p["w2"], round_rows)


def train(a, mesh, rank, ranks, epjax):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    T, H, F, K, E = a.tokens, a.hidden, a.ffn, a.topk, a.experts_per_rank * ranks
    L = a.experts_per_rank
    rng = np.random.default_rng(1)
    full = {"router": rng.standard_normal((H, E), np.float32) / H ** 0.5,
            "w1": rng.standard_normal((E, H, F), np.float32) / H ** 0.5,
            "w2": rng.standard_normal((E, F, H), np.float32) / F ** 0.5}
    x_all = rng.standard_normal((ranks * T, H), np.float32)
    t_all = rng.standard_normal((ranks * T, H), np.float32)
    specs = {"router": P(), "w1": P("ep"), "w2": P("ep")}

    def put(arr, spec):
        return jax.make_array_from_callback(arr.shape, NamedSharding(mesh, spec), lambda i: arr[i])

    params = {n: put(v, specs[n]) for n, v in full.items()}
    x, target = put(x_all, P("ep")), put(t_all, P("ep"))

    group = epjax.group(mesh, "ep", num_experts=E, max_tokens_per_rank=T, hidden=H, dtype=jnp.float32, max_topk=K)
    handle = group.handle(num_tokens=T, topk=K)

    def local_loss(p, x, target):  # this rank's tokens and experts
        idx, w = route(p["router"], x, K)
        recv = epjax.dispatch(handle, x, idx, w)
        y = experts(recv.tokens, recv.local_ids, recv.weights, p["w1"], p["w2"])
        out = epjax.combine(handle, y)
        return jax.lax.psum(jnp.sum((out - target) ** 2), "ep") / (ranks * T * H)

    loss_fn = jax.shard_map(local_loss, mesh=mesh, in_specs=(specs, P("ep"), P("ep")), out_specs=P())

    @jax.jit
    def step(p, x, target):
        loss, g = jax.value_and_grad(loss_fn)(p, x, target)
        return loss, jax.tree.map(lambda v, d: v - a.lr * d, p, g)

    dev = jax.local_devices()[0]
    ref = {n: jax.device_put(v, dev) for n, v in full.items()}
    xr, tr = jax.device_put(x_all, dev), jax.device_put(t_all, dev)

    @jax.jit
    def ref_step(p, x, target):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((reference_layer(p, x, K) - target) ** 2))(p)
        return loss, jax.tree.map(lambda v, d: v - a.lr * d, p, g)

    ok = True
    for s in range(a.steps):
        loss, params = step(params, x, target)
        rloss, ref = ref_step(ref, xr, tr)
        lv, rv = float(loss.addressable_data(0)), float(rloss)
        good = abs(lv - rv) <= 1e-4 * max(1.0, abs(rv))
        ok &= good
        if rank == 0:
            print("step %d: loss %.6f, reference %.6f%s" % (s, lv, rv, "" if good else "  MISMATCH"))
    for n in ("router", "w1", "w2"):
        mine = np.asarray(params[n].addressable_data(0))
        want = np.asarray(ref[n])
        if n != "router":
            want = want[rank * L:(rank + 1) * L]
        err = float(np.max(np.abs(mine - want)))
        if err > 1e-4:
            ok = False
            print("rank %d: %s differs from the reference by %.3g" % (rank, n, err))
    handle.close()
    return ok


def decode(a, mesh, rank, ranks, epjax):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    T, H, F, K, L = a.decode_tokens, a.hidden, a.ffn, a.topk, a.experts_per_rank
    E = L * ranks
    rng = np.random.default_rng(2)
    full = {"router": rng.standard_normal((H, E), np.float32) / H ** 0.5,
            "w1": (rng.standard_normal((E, H, F), np.float32) / H ** 0.5),
            "w2": (rng.standard_normal((E, F, H), np.float32) / F ** 0.5 / 4)}
    x_all = rng.standard_normal((ranks * T, H), np.float32).astype(jnp.bfloat16)
    specs = {"router": P(), "w1": P("ep"), "w2": P("ep")}

    def put(arr, spec):
        return jax.make_array_from_callback(arr.shape, NamedSharding(mesh, spec), lambda i: arr[i])

    params = {n: put(v, specs[n]) for n, v in full.items()}
    x = put(x_all, P("ep"))
    group = epjax.group(mesh, "ep", num_experts=E, max_tokens_per_rank=T, hidden=H, max_topk=K,
                        algorithm="low_latency")
    handle = group.handle(num_tokens=T, topk=K, layout="expert_major")
    key = jax.random.key(3)

    def step_routing(i):
        """Every rank's tokens' routing [R * T, K] at step i, the same in both paths."""
        top, idx = jax.lax.top_k(jax.random.normal(jax.random.fold_in(key, i), (ranks * T, E), jnp.float32), K)
        return idx.astype(jnp.int32), jax.nn.softmax(top, axis=-1)

    def local_decode(p, x):
        def body(i, x):
            idx_all, w_all = step_routing(i)
            me = jax.lax.axis_index("ep") * T
            idx, w = jax.lax.dynamic_slice_in_dim(idx_all, me, T), jax.lax.dynamic_slice_in_dim(w_all, me, T)
            # zone e: rows [e * R * M, (e + 1) * R * M), those past its count left as they are (nothing below mixes
            # rows, and combine reads none of them)
            recv = epjax.ll_dispatch(handle, x, idx, zero_past_counts=False)
            zones = recv.tokens.reshape(L, ranks * T, H).astype(jnp.float32)
            y = jnp.einsum("lrf,lfh->lrh", jax.nn.relu(jnp.einsum("lrh,lhf->lrf", zones, p["w1"])), p["w2"])
            out = epjax.ll_combine(handle, y.reshape(L * ranks * T, H), w)  # owner-weighted, bf16
            return (x.astype(jnp.float32) + out.astype(jnp.float32)).astype(jnp.bfloat16)

        return jax.lax.fori_loop(0, a.decode_steps, body, x)

    run = jax.jit(jax.shard_map(local_decode, mesh=mesh, in_specs=(specs, P("ep")), out_specs=P("ep")))
    out = np.asarray(run(params, x).addressable_data(0)).astype(np.float32)

    dev = jax.local_devices()[0]
    ref = {n: jax.device_put(v, dev) for n, v in full.items()}

    @jax.jit
    def ref_decode(p, x):
        def body(i, x):
            idx, w = step_routing(i)
            y = experts(x.astype(jnp.float32), idx, w, p["w1"], p["w2"], round_rows=True)
            return (x.astype(jnp.float32) + y.astype(jnp.bfloat16).astype(jnp.float32)).astype(jnp.bfloat16)

        return jax.lax.fori_loop(0, a.decode_steps, body, x)

    want = np.asarray(ref_decode(ref, jax.device_put(x_all, dev))).astype(np.float32)[rank * T:(rank + 1) * T]
    err = float(np.max(np.abs(out - want)) / max(1e-6, float(np.max(np.abs(want)))))
    good = err <= a.decode_rtol
    if rank == 0 or not good:
        print("rank %d: decode, %d steps in one fori_loop: largest difference %.3g of the largest value%s"
              % (rank, a.decode_steps, err, "" if good else "  MISMATCH"))
    handle.close()
    return good


def child(a):
    import jax

    jax.distributed.initialize(coordinator_address="127.0.0.1:%d" % a.port, num_processes=a.nproc,
                               process_id=a.process_id, local_device_ids=[a.gpu])
    import nccl.ep.jax as epjax

    import numpy as np

    # One device per process, in process order: the axis rank is the process index.
    mesh = jax.sharding.Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("ep",))
    rank, ranks = jax.process_index(), a.nproc
    ok = train(a, mesh, rank, ranks, epjax)
    ok = decode(a, mesh, rank, ranks, epjax) and ok
    epjax.close()
    jax.distributed.shutdown()
    return 0 if ok else 1


def gpu_count() -> int:
    """GPUs JAX sees, asked in a process of its own (this one must not hold a GPU context while the ranks run)."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    code = "import jax\ntry:\n    print(len(jax.devices('gpu')))\nexcept RuntimeError:\n    print(0)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    try:
        return int(r.stdout.split()[-1])
    except (ValueError, IndexError):
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--experts-per-rank", type=int, default=4)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=4)
    ap.add_argument("--decode-rtol", type=float, default=3e-2)
    ap.add_argument("--port", type=int, default=29700 + os.getpid() % 200)
    ap.add_argument("--one-gpu", choices=["nodes"], default=None,
                    help="every process on GPU 0, each its own NCCL node (so anyway where GPUs are fewer than --nproc)")
    ap.add_argument("--json", default=None, help="append one result line to this file")
    ap.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.process_id is not None:
        return child(a)
    gpus = gpu_count()
    if gpus == 0:
        print("jax_moe: no GPU visible to JAX (nccl.ep.jax runs on CUDA GPUs); nothing to do")
        return 77 if a.json else 0
    one_gpu = a.one_gpu == "nodes" or gpus < a.nproc  # every rank on GPU 0, each its own NCCL node
    procs = []
    for i in range(a.nproc):
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", NCCL_NVLS_ENABLE="0")
        if one_gpu:
            env.update(NCCL_HOSTID="jax-moe-node-%d" % i)
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--process-id", str(i), "--gpu", str(0 if one_gpu else i), "--port", str(a.port)]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    ok = all(c == 0 for c in codes)
    print("jax_moe: %d rank(s)%s: %s" % (a.nproc, " on one GPU" if one_gpu else "", "PASS" if ok else "FAIL"))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"test": "jax_moe", "ranks": a.nproc, "one_gpu": one_gpu, "pass": ok,
                                "exit_codes": codes}) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
