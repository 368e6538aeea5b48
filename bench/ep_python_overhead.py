"""Python overhead of nccl.ep's dispatch + combine over the C calls, at decode-like and prefill-like sizes, 1 rank.

    python bench/ep_python_overhead.py [--tokens 128,4096] [--hidden 7168] [--topk 8] [--experts 256] [--json FILE]

For each token count, the median of --iters CUDA-synchronised dispatch + combine pairs (bf16, FLAT layout,
worst-case sizing, a handle bound once) after warm-ups, and the host time of enqueueing them alone, timed in rounds
that run every path below once in turn (bench/_timing.py interleaved):
  c        ncclEpDispatch + ncclEpCombine through ctypes with their structs and output tensors built once (the floor
           any binding pays);
  python   Group.dispatch(x, handle=h) + Group.combine(y, h) (descriptors and output tensors made per call);
  python_out the same with the outputs of an earlier call written again (dispatch(..., out=prev), combine(...,
           out=tensor)): no allocation, as DeepEP's buffer views;
  alloc    the torch.empty calls of `python`'s outputs alone (tokens, their expert ids, the combined tokens): what
           any API that returns new tensors pays, inside `python`'s overhead;
  ops      torch.ops.nccl_ep.dispatch + combine (nccl.ep.ops), which also bind the routing again (ncclEpUpdateHandle),
           send the weights and copy the counts, beside
  ops_work the same work through Group (handle.update, dispatch with weights, counts.clone(), combine): ops - ops_work
           is torch.library's own cost;
  graph_c, graph_python: replays of CUDA graphs that captured `c` and `python` (inside a graph the layer costs
           nothing: the same kernels replay);
  back to back: c, python and python_out, 100 pairs enqueued with one synchronisation at the end, the wall time per
           pair (median of 10 rounds): what an eager loop whose host runs ahead of the GPU pays.
Overhead = python - c (microseconds: the median over the rounds of the difference of the two synchronised times,
with its quartiles; and of the medians of the enqueue times), and (python - c) / c. At 1 rank the
kernels move no byte over a link: the GPU time is local copies, so the overhead is measured against the smallest
GPU time it will ever be added to.
"""

import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from _launch import append_json, start  # noqa: E402
from _timing import back_to_back, interleaved, paired_difference, pair_arguments  # noqa: E402


def main():
    a = pair_arguments()
    start(False, backend="gloo")  # one process, GPU 0
    import torch
    import torch.distributed as dist

    import nccl.ep as ep
    import nccl.ep.ops as epops
    from nccl._ext.tensor import describe

    counts = [int(t) for t in a.tokens.split(",")]
    H, K, E = a.hidden, a.topk, a.experts
    group = ep.Group(num_experts=E, max_tokens_per_rank=max(counts), hidden=H, max_topk=K)
    stream = torch.cuda.current_stream()
    rows_out = []

    ok = True
    for T in counts:
        gen = torch.Generator(device="cuda").manual_seed(T)
        idx = torch.stack([torch.randperm(E, device="cuda", generator=gen)[:K] for _ in range(T)])
        x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
        w = torch.rand(T, K, device="cuda", generator=gen)
        h = group.create_handle(idx, layout="flat", sizing="worst_case")
        # The C floor: every struct and output built once.
        rows = h.output_rows()
        out_tokens = torch.empty((rows, H), dtype=torch.bfloat16, device="cuda")
        out_idx = torch.empty((rows, K), dtype=torch.int32, device="cuda")
        combined = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
        d_in = ep._DispatchInputs.new(tokens=describe(x, "x"))
        d_out = ep._DispatchOutputs.new(tokens=describe(out_tokens, "tokens"), topk_idx=describe(out_idx, "idx"))
        c_in = ep._CombineInputs.new(tokens=describe(out_tokens, "y"))
        c_out = ep._CombineOutputs.new(tokens=describe(combined, "out"))
        d_cfg, c_cfg = ep._DispatchConfig.new(num_sms=0), ep._CombineConfig.new(num_sms=0)
        lib = ep._lib()
        s = ctypes.c_void_p(stream.cuda_stream)

        def c_pair(s=s):
            if lib.ncclEpDispatch(h._h, ctypes.byref(d_in), ctypes.byref(d_out), None, ctypes.byref(d_cfg), s) or \
                    lib.ncclEpCombine(h._h, ctypes.byref(c_in), ctypes.byref(c_out), ctypes.byref(c_cfg), s):
                raise RuntimeError(lib.ncclEpGetLastError().decode())

        def python_pair():
            recv = group.dispatch(x, handle=h)
            return group.combine(recv.tokens, h)

        prev = group.dispatch(x, handle=h)
        combined_out = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")

        def python_out_pair():
            recv = group.dispatch(x, handle=h, out=prev)
            return group.combine(recv.tokens, h, out=combined_out)

        hid = epops.register(h)

        def ops_pair():
            tokens, _, _, _ = torch.ops.nccl_ep.dispatch(hid, x, idx, w)
            return torch.ops.nccl_ep.combine(hid, tokens)

        def alloc():
            return (torch.empty((rows, H), dtype=torch.bfloat16, device="cuda"),
                    torch.empty((rows, K), dtype=torch.int32, device="cuda"),
                    torch.empty((T, H), dtype=torch.bfloat16, device="cuda"))

        def ops_work():
            h.update(idx)
            recv = group.dispatch(x, handle=h, topk_weights=w)
            h.expert_counts.clone()
            return group.combine(recv.tokens, h)

        graphs = {}
        capture = torch.cuda.Stream()  # the C floor's calls name their stream: the capture's
        for name, fn in (("c", lambda: c_pair(ctypes.c_void_p(capture.cuda_stream))), ("python", python_pair)):
            fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=capture):
                fn()
            graphs[name] = g

        row = {"tokens": T}
        fns = {"c": c_pair, "python": python_pair, "python_out": python_out_pair, "alloc": alloc, "ops": ops_pair,
               "ops_work": ops_work, "graph_c": graphs["c"].replay, "graph_python": graphs["python"].replay}
        samples = interleaved(fns, a.iters)
        for name, pairs in samples.items():
            row[name] = {"wall_us": statistics.median(w for w, _ in pairs),
                         "enqueue_us": statistics.median(h for _, h in pairs)}
        # Each overhead: the median of the rounds' differences (a round times every path once, one after another),
        # with its quartiles: the spread of the difference itself, not of either time.
        for name, (path, base) in (("overhead_python_us", ("python", "c")),
                                   ("overhead_python_out_us", ("python_out", "c")),
                                   ("overhead_graph_us", ("graph_python", "graph_c")),
                                   ("torch_library_us", ("ops", "ops_work"))):
            med, q1, q3 = paired_difference(samples[path], samples[base])
            row[name] = med
            row[name.replace("_us", "_quartiles_us")] = [q1, q3]
        row["overhead_python_enqueue_us"] = row["python"]["enqueue_us"] - row["c"]["enqueue_us"]
        # Back to back: 100 pairs enqueued with one synchronisation at the end, per pair; the layer's cost shows only
        # where its host time per pair exceeds the GPU's.
        b2b = back_to_back({"c": c_pair, "python": python_pair, "python_out": python_out_pair, "ops": ops_pair,
                            "ops_work": ops_work}, 100, 10)
        row["back_to_back_us"] = b2b
        row["overhead_back_to_back_us"] = b2b["python"] - b2b["c"]
        del graphs
        sent = (idx >= 0).any(dim=1)
        # Each path once more on poisoned outputs: at 1 rank each sent token's one row comes back as it went.
        combined.fill_(float("nan"))
        c_pair()
        for out in (combined, python_pair(), python_out_pair(), ops_pair()):
            torch.cuda.synchronize()
            ok = ok and torch.equal(out[sent], x[sent])
        row["overhead_python"] = row["overhead_python_us"] / row["c"]["wall_us"]
        row["overhead_ops"] = (row["ops"]["wall_us"] - row["c"]["wall_us"]) / row["c"]["wall_us"]
        rows_out.append(row)
        epops.unregister(hid)
        h.close()
        print("ep_python_overhead: T %5d: c %7.1f us (enqueue %5.1f), python %7.1f us (+%.1f us, quartiles %.1f .. "
              "%.1f; enqueue %5.1f, +%.1f us; of it alloc %.1f), python with out= %.1f us (+%.1f us), graph c %.1f / "
              "python %.1f us, ops %.1f us (same work through Group %.1f us); back to back per pair: c %.1f, python "
              "%.1f (+%.1f us), python with out= %.1f us" % (
                  T, row["c"]["wall_us"], row["c"]["enqueue_us"], row["python"]["wall_us"],
                  row["overhead_python_us"], *row["overhead_python_quartiles_us"], row["python"]["enqueue_us"],
                  row["overhead_python_enqueue_us"], row["alloc"]["enqueue_us"], row["python_out"]["wall_us"],
                  row["overhead_python_out_us"], row["graph_c"]["wall_us"], row["graph_python"]["wall_us"],
                  row["ops"]["wall_us"], row["ops_work"]["wall_us"], b2b["c"], b2b["python"],
                  row["overhead_back_to_back_us"], b2b["python_out"]))
    group.close()
    result = {"test": "ep_python_overhead", "pass": ok, "gpu": torch.cuda.get_device_name(0), "ranks": 1,
              "hidden": H, "topk": K, "experts": E, "iters": a.iters, "rows": rows_out}
    print("ep_python_overhead: results %s" % ("equal" if ok else "DIFFER"))
    append_json(a.json, result)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
