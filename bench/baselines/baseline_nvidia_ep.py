"""NVIDIA's nccl-extensions 0.1.0 (`nccl.ep`, PyPI) timed on the shapes of our ep_bench, one rank.

Rows (bf16, top-8 of 256 experts, uniform random routing from --seed):
  LL  EXPERT_MAJOR and RANK_MAJOR dispatch, combine and the pair, 128 and 256 tokens x 7168 and 4096
  HT  FLAT dispatch, combine and the pair, 4096 x 7168, at 16 and 132 SMs (GroupConfig.max_num_sms),
      and the handle update (Handle.update with the same routing)
Each figure is the median of --iters back-to-back (dispatch, combine) pairs on one stream, each call between its
own CUDA events, after --warmup pairs (the first call JIT-compiles their kernels). JSON lines (--json FILE,
appended) use ep_bench's field names where they mean the same: what (ep_dispatch, ep_combine, ep_dispatch_combine,
ep_update_handle), pass, dtype, layout, tokens, hidden, topk, experts, nranks, sms, us_median, iters, gpu, mode,
plus impl, nccl_version, us_p25, us_p75 and world (= nranks, the key run_ep_bench.sh groups baselines by).
LL rows carry "sms": 0 (the library picks).

Runs only in a venv holding their package (tools/nvidia_ep_wheelhouse.sh), never beside ours: both install
`nccl.ep`. NCCL 2.30.x must be the libnccl.so.2 of the process (LD_PRELOAD) and NCCL_HOME its headers (their JIT
compiles against NCCL_HOME/include; left unset, nccl.ep takes the nvidia-nccl-cu13 package's, torch's 2.28).
Exits 77 with a message when their package, a GPU or NCCL 2.30.x is absent.

Where their API stops the process on inputs we refuse with an error (read from their 0.1.0 headers and Python):
  - Layout.UNSET "trips an assertion at handle-init time" (enums.py); we return ncclInvalidArgument.
  - OverflowPolicy AUTO resolves to TRAP: HT recv overflow past max_recv_tokens_per_rank is a device trap that
    ends the process (enums.py); we report the overflow as an error.
  - A remote rank that times out in a wait is a GPU trap unless the group has enable_mask (group.py).
  - A High-Throughput dispatch whose recv_topk_idx (an output) is not int64 asserts and aborts the process (seen on
    one H100: bench/results/nvidia-ep-ht-int32-abort-20261205T1915Z.txt); the driver passes int64 there, int32 to
    the Low-Latency RANK_MAJOR dispatch (which takes it).
"""
import argparse
import json
import os
import statistics
import sys

IMPL = "nvidia-nccl-extensions-0.1.0"
SKIP = 77


def skip(msg):
    print("baseline_nvidia_ep: skipped: " + msg, file=sys.stderr)
    sys.exit(SKIP)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="append one JSON line per row to FILE")
    p.add_argument("--iters", type=int, default=100, help="timed (dispatch, combine) pairs per row")
    p.add_argument("--warmup", type=int, default=10, help="untimed pairs first (the first call JIT-compiles)")
    p.add_argument("--seed", type=int, default=1234, help="routing seed")
    p.add_argument("--mode", choices=("all", "ll", "ht"), default="all")
    p.add_argument("--quick", action="store_true", help="one LL and one HT shape, 20 iterations")
    return p.parse_args()


def load():
    """Imports torch and their nccl.ep, or exits 77 saying what is missing."""
    try:
        import torch
    except ImportError:
        skip("no torch")
    if not torch.cuda.is_available():
        skip("no GPU")
    try:
        import nccl.core as nc
        import nccl.ep as ep
    except ImportError as e:
        skip("NVIDIA's nccl-extensions is not importable (%s): run in the venv of tools/nvidia_ep_wheelhouse.sh" % e)
    if not hasattr(ep, "GroupConfig") or not hasattr(nc, "Communicator"):
        skip("`nccl.ep` here is not NVIDIA's (%s): unset PYTHONPATH, use their venv" % ep.__file__)
    if not os.path.realpath(ep.__file__).startswith(os.path.realpath(sys.prefix)):
        skip("`nccl.ep` resolves outside this venv (%s)" % ep.__file__)
    info = nc.get_version().libnccl
    if info is None or (info.version.major, info.version.minor) != (2, 30):
        skip("NCCL 2.30.x is not the loaded libnccl (%s): LD_PRELOAD ../shared/nccl's 2.30.7" %
             (info.version if info else "none"))
    return torch, nc, ep, str(info.version)


def routing(torch, tokens, experts, topk, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices  # distinct experts, uniform
    w = torch.rand(tokens, topk, generator=g)
    return idx.cuda(), (w / w.sum(1, keepdim=True)).float().cuda()


def timed_pairs(torch, dispatch, combine, warmup, iters):
    """Medians and quartiles (us) of dispatch, combine and the pair, back to back on the current stream."""
    for _ in range(warmup):
        dispatch()
        combine()
    torch.cuda.synchronize()
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(iters)]
    for e in ev:
        e[0].record()
        dispatch()
        e[1].record()
        combine()
        e[2].record()
    torch.cuda.synchronize()
    cols = {"dispatch": [1e3 * a.elapsed_time(b) for a, b, _ in ev],
            "combine": [1e3 * b.elapsed_time(c) for _, b, c in ev],
            "dispatch_combine": [1e3 * a.elapsed_time(c) for a, _, c in ev]}
    return {k: quartiles(v) for k, v in cols.items()}


def timed_calls(torch, call, warmup, iters):
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        call()
        b.record()
    torch.cuda.synchronize()
    return quartiles([1e3 * a.elapsed_time(b) for a, b in ev])


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[1], q[0], q[2]


class Bench:
    def __init__(self, torch, nc, ep, nccl_version, args):
        self.torch, self.nc, self.ep, self.args = torch, nc, ep, args
        self.stream = torch.cuda.current_stream()
        self.sp = self.stream.cuda_stream
        self.comm = nc.Communicator.init(1, 0, nc.get_unique_id())
        self.base = {"pass": True, "dtype": "bf16", "nranks": 1, "world": 1, "gpu": torch.cuda.get_device_name(),
                     "impl": IMPL, "nccl_version": nccl_version, "topk": 8, "experts": 256}
        self.out = open(args.json, "a") if args.json else None

    def emit(self, what, med_q1_q3, **kw):
        med, q1, q3 = med_q1_q3
        row = dict(self.base, what=what, us_median=round(med, 2), us_p25=round(q1, 2), us_p75=round(q3, 2),
                   iters=self.args.iters, **kw)
        print("%-20s %-4s %-12s %5d x %5d sms %3d  %8.1f us" % (what, kw["mode"], kw["layout"], kw["tokens"],
                                                                 kw["hidden"], kw["sms"], med))
        if self.out:
            self.out.write(json.dumps(row) + "\n")
            self.out.flush()

    def T(self, t):
        return self.ep.Tensor(t)

    def ll(self, layout, tokens, hidden):
        torch, ep, E, K = self.torch, self.ep, 256, 8
        cfg = ep.GroupConfig(algorithm=ep.Algorithm.LOW_LATENCY, num_experts=E, max_dispatch_tokens_per_rank=tokens,
                             max_token_bytes=hidden * 2)
        group = ep.Group.create(self.comm, cfg)
        idx, w = routing(torch, tokens, E, K, self.args.seed)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        handle = group.create_handle(layout, self.T(idx), stream=self.sp)
        if layout == ep.Layout.EXPERT_MAJOR:
            recv = torch.empty(E, tokens, hidden, dtype=torch.bfloat16, device="cuda")
            counters = torch.empty(E, dtype=torch.int32, device="cuda")
            d_in = ep.DispatchInputs(tokens=self.T(x))
            d_out = ep.DispatchOutputs(tokens=self.T(recv))
            info = ep.LayoutInfo(expert_counters=self.T(counters))
            c_out = ep.CombineOutputs(tokens=self.T(y), topk_weights=self.T(w))  # weights applied at the owner
            name = "expert_major"
        else:
            recv = torch.empty(1, tokens, hidden, dtype=torch.bfloat16, device="cuda")
            r_w = torch.empty(1, tokens, K, dtype=torch.float32, device="cuda")
            r_idx = torch.empty(1, tokens, K, dtype=torch.int32, device="cuda")
            counters = torch.empty(1, dtype=torch.int32, device="cuda")
            d_in = ep.DispatchInputs(tokens=self.T(x), topk_weights=self.T(w))
            d_out = ep.DispatchOutputs(tokens=self.T(recv), topk_weights=self.T(r_w), topk_idx=self.T(r_idx))
            info = ep.LayoutInfo(src_rank_counters=self.T(counters), recv_topk_idx_kind=ep.ExpertIdKind.LOCAL)
            c_out = ep.CombineOutputs(tokens=self.T(y))
            name = "rank_major"
        c_in = ep.CombineInputs(tokens=self.T(recv))  # dispatch's output fed back as the experts' output
        r = timed_pairs(torch, lambda: handle.dispatch(d_in, d_out, layout_info=info, stream=self.sp),
                        lambda: handle.combine(c_in, c_out, stream=self.sp), self.args.warmup, self.args.iters)
        for op in ("dispatch", "combine", "dispatch_combine"):
            self.emit("ep_" + op, r[op], mode="ll", layout=name, tokens=tokens, hidden=hidden, sms=0)
        handle.destroy()
        group.destroy()

    def ht(self, tokens, hidden, sms):
        torch, ep, E, K = self.torch, self.ep, 256, 8
        # One rank receives each token once (flat: one slot per token per rank), so tokens slots suffice.
        cfg = ep.GroupConfig(algorithm=ep.Algorithm.HIGH_THROUGHPUT, num_experts=E,
                             max_dispatch_tokens_per_rank=tokens, max_recv_tokens_per_rank=tokens,
                             max_token_bytes=hidden * 2, max_num_sms=sms)
        group = ep.Group.create(self.comm, cfg)
        idx, w = routing(torch, tokens, E, K, self.args.seed)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        handle = group.create_handle(ep.Layout.FLAT, self.T(idx), stream=self.sp)
        recv = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        r_w = torch.empty(tokens, K, dtype=torch.float32, device="cuda")
        r_idx = torch.empty(tokens, K, dtype=torch.int64, device="cuda")  # int32 here asserts in 0.1.0 (HT)
        d_in = ep.DispatchInputs(tokens=self.T(x), topk_weights=self.T(w))
        d_out = ep.DispatchOutputs(tokens=self.T(recv), topk_weights=self.T(r_w), topk_idx=self.T(r_idx))
        c_in, c_out = ep.CombineInputs(tokens=self.T(recv)), ep.CombineOutputs(tokens=self.T(y))
        r = timed_pairs(torch, lambda: handle.dispatch(d_in, d_out, stream=self.sp),
                        lambda: handle.combine(c_in, c_out, stream=self.sp), self.args.warmup, self.args.iters)
        shape = dict(mode="ht", layout="flat", tokens=tokens, hidden=hidden, sms=sms)
        for op in ("dispatch", "combine", "dispatch_combine"):
            self.emit("ep_" + op, r[op], **shape)
        ti = self.T(idx)
        self.emit("ep_update_handle", timed_calls(torch, lambda: handle.update(ti, stream=self.sp),
                                                  self.args.warmup, self.args.iters), **shape)
        handle.destroy()
        group.destroy()

    def close(self):
        self.comm.destroy()
        if self.out:
            self.out.close()


def main():
    args = parse_args()
    if args.quick:
        args.iters = min(args.iters, 20)
    torch, nc, ep, ver = load()
    b = Bench(torch, nc, ep, ver, args)
    print("%s on %s, NCCL %s (NCCL_HOME %s)" % (IMPL, b.base["gpu"], ver, os.environ.get("NCCL_HOME", "unset")))
    ll_shapes = [(128, 7168)] if args.quick else [(128, 7168), (256, 7168), (128, 4096), (256, 4096)]
    if args.mode in ("all", "ll"):
        for tokens, hidden in ll_shapes:
            for layout in (ep.Layout.EXPERT_MAJOR, ep.Layout.RANK_MAJOR):
                b.ll(layout, tokens, hidden)
    if args.mode in ("all", "ht"):
        for sms in ((16,) if args.quick else (16, 132)):
            b.ht(4096, 7168, sms)
    b.close()


if __name__ == "__main__":
    main()
