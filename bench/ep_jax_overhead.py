"""nccl.ep.jax's overhead: a High-Throughput dispatch + combine pair through JAX (one jitted step over a 1-device
mesh) against the same pair through the C API and through torch, 1 rank, bf16, FLAT, worst-case sizing.

    python bench/ep_jax_overhead.py [--tokens 128,4096] [--hidden 7168] [--topk 8] [--experts 256] [--iters 200]
                                    [--json FILE]

JAX runs in this process; the C and torch pairs in a child process, bench/ep_python_overhead.py on the same shapes
right after (its `c` path: ncclEpDispatch + ncclEpCombine through ctypes with every struct and output built once;
`python`: Group.dispatch + Group.combine): torch and JAX are not mixed in one process (each brings its own CUDA
allocator). For each token count, JAX:
  step          the median of --iters calls of the jitted step, each waited for (block_until_ready);
  back_to_back  100 steps enqueued, one wait at the end, per step (median of 10 rounds): the host cost per step
                where the host runs ahead of the GPU;
  loop          100 pairs inside one jitted fori_loop, per pair (median of 10 rounds): no host work per step at all,
                the floor a compiled training or decode loop reaches.
Overheads: step - c and step - python (synchronised), back_to_back - c's back to back. The c and python pairs
reuse a handle bound once; the jitted step binds the routing at every dispatch, so the pair doing the same work is
ep_python_overhead's `ops_work` (handle.update, dispatch with weights, combine; and torch's custom-op pair `ops`),
reported beside them (same_work_us, its back to back, and the loop against it). The goal (issue 43): no more
than the torch layer's overhead, and none per step once compiled (loop ~ c). Each token count's result is checked
first: at 1 rank every routed token's row comes back as it went. Then the Low-Latency pair (EXPERT_MAJOR,
owner-weighted combine) at the smallest token count in a jitted loop, as it runs and with a select over its whole
dispatch output added (the JSON's low_latency: loop_us, loop_with_select_us). Exit 77 without a JAX CUDA backend or
without libnccl_ep_jax.so.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from _launch import append_json  # noqa: E402
from _timing import pair_arguments  # noqa: E402


def _median_us(samples):
    return statistics.median(samples) * 1e6


def _jax_rows(counts, H, K, E, iters):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import nccl.ep.jax as epjax

    mesh = jax.make_mesh((1,), ("ep",))
    group = epjax.group(mesh, "ep", num_experts=E, max_tokens_per_rank=max(counts), hidden=H, dtype=jnp.bfloat16,
                        max_topk=K)
    rows, ok = [], True
    for T in counts:
        rng = np.random.default_rng(T)
        idx = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
        x = rng.standard_normal((T, H)).astype(np.float32)
        w = rng.random((T, K)).astype(np.float32)
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P("ep")))  # noqa: E731
        xs, idxs, ws = put(jnp.asarray(x, jnp.bfloat16)), put(idx), put(w)
        h = group.handle(num_tokens=T, topk=K)

        def pair(x, idx, w, h=h):
            recv = epjax.dispatch(h, x, idx, w)
            return epjax.combine(h, recv.tokens)

        layer = jax.shard_map(pair, mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
        step = jax.jit(layer)
        reps = 100
        loop = jax.jit(lambda x, idx, w: jax.lax.fori_loop(0, reps, lambda i, y: layer(y, idx, w), x))
        out = step(xs, idxs, ws).block_until_ready()  # compiles; then the check
        ok = ok and bool(np.array_equal(np.asarray(out, np.float32), np.asarray(xs, np.float32)))
        loop(xs, idxs, ws).block_until_ready()
        sync = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step(xs, idxs, ws).block_until_ready()
            sync.append(time.perf_counter() - t0)
        b2b, looped = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            y = xs
            for _ in range(reps):
                y = step(xs, idxs, ws)
            y.block_until_ready()
            b2b.append((time.perf_counter() - t0) / reps)
            t0 = time.perf_counter()
            loop(xs, idxs, ws).block_until_ready()
            looped.append((time.perf_counter() - t0) / reps)
        rows.append({"tokens": T, "step_us": _median_us(sync), "back_to_back_us": _median_us(b2b),
                     "loop_us": _median_us(looped)})
        h.close()
    group.close()
    return rows, ok, jax.devices()[0].device_kind


def _jax_ll_row(T, H, K, E, iters):
    """The Low-Latency pair (EXPERT_MAJOR dispatch, owner-weighted combine) in a jitted fori_loop, per pair, twice:
    as nccl.ep.jax runs it (the handler zeroes the rows past the counts, those rows only) and with a select over the
    whole dispatch output added in the step (what ll_dispatch did before 00c2b2c), alternately; their results must
    be equal (combine reads no row past the counts)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import nccl.ep.jax as epjax

    mesh = jax.make_mesh((1,), ("ep",))
    group = epjax.group(mesh, "ep", num_experts=E, max_tokens_per_rank=T, hidden=H, max_topk=K,
                        algorithm="low_latency")
    h = group.handle(num_tokens=T, topk=K, layout="expert_major")
    rng = np.random.default_rng(T + 1)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("ep")))  # noqa: E731
    xs = put(jnp.asarray(rng.standard_normal((T, H)).astype(np.float32), jnp.bfloat16))
    idxs = put(np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32))
    ws = put((rng.random((T, K)) / K).astype(np.float32))
    reps = 100

    def make(select):
        def pair(x, idx, w):
            recv = epjax.ll_dispatch(h, x, idx)
            tokens = recv.tokens
            if select:  # every row of [E x T, H] read and written (a zone of R x M rows per local expert)
                width = tokens.shape[0] // recv.expert_counts.shape[0]
                valid = (jnp.arange(width, dtype=jnp.int32)[None, :] < recv.expert_counts[:, None]).reshape(-1)
                tokens = jnp.where(valid[:, None], tokens, jnp.zeros_like(tokens))
            return epjax.ll_combine(h, tokens, w)

        layer = jax.shard_map(pair, mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
        return jax.jit(lambda x, idx, w: jax.lax.fori_loop(0, reps, lambda i, y: layer(y, idx, w), x))

    plain, selected = make(False), make(True)
    ok = bool(np.array_equal(np.asarray(plain(xs, idxs, ws), np.float32),
                             np.asarray(selected(xs, idxs, ws), np.float32)))
    times = {"loop_us": [], "loop_with_select_us": []}
    for _ in range(max(3, iters // 20)):
        for name, f in (("loop_us", plain), ("loop_with_select_us", selected)):
            t0 = time.perf_counter()
            f(xs, idxs, ws).block_until_ready()
            times[name].append((time.perf_counter() - t0) / reps)
    h.close()
    group.close()
    row = {"tokens": T, "layout": "expert_major"}
    row.update({k: _median_us(v) for k, v in times.items()})
    return row, ok


def _torch_rows(counts, a):
    """bench/ep_python_overhead.py on the same shapes, in a process of its own: its rows by token count."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "torch.jsonl")
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, os.path.join(here, "ep_python_overhead.py"), "--tokens", ",".join(map(str, counts)),
               "--hidden", str(a.hidden), "--topk", str(a.topk), "--experts", str(a.experts), "--iters",
               str(a.iters), "--json", out]
        rc = subprocess.run(cmd, timeout=1200).returncode
        if rc != 0 or not os.path.exists(out):
            return None, rc
        with open(out) as f:
            result = json.loads(f.readlines()[-1])
        return {r["tokens"]: r for r in result["rows"]}, 0 if result["pass"] else 1


def main():
    a = pair_arguments()
    counts = [int(t) for t in a.tokens.split(",")]
    try:
        import jax

        jax.devices("gpu")
        import nccl.ep.jax as epjax

        epjax.register_targets()
    except Exception as e:  # no JAX, no CUDA backend, or no libnccl_ep_jax.so
        print("ep_jax_overhead: nothing to run here (%s: %s)" % (type(e).__name__, e))
        return 77
    jrows, jax_ok, gpu = _jax_rows(counts, a.hidden, a.topk, a.experts, a.iters)
    ll_row, ll_ok = _jax_ll_row(min(counts), a.hidden, a.topk, a.experts, a.iters)
    print("ep_jax_overhead: Low-Latency EXPERT_MAJOR pair, T %d, in a jitted loop: %.1f us a pair; with a select over "
          "the whole dispatch output %.1f us (results %s)" % (
              ll_row["tokens"], ll_row["loop_us"], ll_row["loop_with_select_us"], "equal" if ll_ok else "DIFFER"))
    trows, torch_rc = _torch_rows(counts, a)
    if trows is None:
        print("ep_jax_overhead: bench/ep_python_overhead.py failed (exit %d)" % torch_rc)
        return 1
    rows = []
    for j in jrows:
        t = trows[j["tokens"]]
        c_us, py_us = t["c"]["wall_us"], t["python"]["wall_us"]
        row = {"tokens": j["tokens"], "jax": j, "c_us": c_us, "torch_us": py_us,
               "c_back_to_back_us": t["back_to_back_us"]["c"], "torch_back_to_back_us": t["back_to_back_us"]["python"],
               "overhead_jax_us": j["step_us"] - c_us, "overhead_torch_us": py_us - c_us,
               "overhead_jax_back_to_back_us": j["back_to_back_us"] - t["back_to_back_us"]["c"],
               "loop_minus_c_back_to_back_us": j["loop_us"] - t["back_to_back_us"]["c"]}
        # The same work as the jitted step (the routing bound at every dispatch, weights carried): torch's custom op
        # pair and the same calls through Group (ep_python_overhead's ops and ops_work); the c and python pairs
        # above reuse a handle bound once.
        if "ops_work" in t:
            row.update({"torch_ops_us": t["ops"]["wall_us"], "same_work_us": t["ops_work"]["wall_us"],
                        "overhead_jax_vs_same_work_us": j["step_us"] - t["ops_work"]["wall_us"]})
            b2b = t["back_to_back_us"]
            if "ops_work" in b2b:
                row.update({"same_work_back_to_back_us": b2b["ops_work"], "torch_ops_back_to_back_us": b2b["ops"],
                            "loop_minus_same_work_back_to_back_us": j["loop_us"] - b2b["ops_work"]})
        rows.append(row)
        print("ep_jax_overhead: T %5d: c %7.1f us, torch %7.1f us (+%.1f), jax step %7.1f us (+%.1f); back to back "
              "per pair: c %.1f, jax %.1f (+%.1f); jax in a jitted loop %.1f us a pair" % (
                  j["tokens"], c_us, py_us, row["overhead_torch_us"], j["step_us"], row["overhead_jax_us"],
                  row["c_back_to_back_us"], j["back_to_back_us"], row["overhead_jax_back_to_back_us"], j["loop_us"]))
    ok = jax_ok and ll_ok and torch_rc == 0
    print("ep_jax_overhead: results %s" % ("equal" if ok else "DIFFER"))
    append_json(a.json, {"test": "ep_jax_overhead", "pass": ok, "gpu": gpu, "ranks": 1, "hidden": a.hidden,
                         "topk": a.topk, "experts": a.experts, "iters": a.iters, "rows": rows,
                         "low_latency": ll_row})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
