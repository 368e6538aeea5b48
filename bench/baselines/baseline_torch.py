# Copied from shared/reference/baseline_torch.py (the team's baseline script) so that it travels with the
# repository to the GPU machines; bench/run_ep_bench.sh runs it in the same session as ep_bench. Changed: the
# world size is `--world N` (default 2, the original's) and every line says it ("world"); with more than 2 ranks
# the 1 GiB send/recv runs between ranks 0 and 1 only (the others would wait for a sender that never comes).
"""Baseline figures on a 2-GPU machine, measured with PyTorch and its bundled NCCL.
Prints one JSON line per measurement: the practical link limit and what users would pick instead of an EP/M2N library."""
import json, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def ev_time(fn, iters=20, warm=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    ts.sort(); return ts[len(ts)//2]

def peer_copy():
    out = []
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device='cuda:0'); a.random_(0, 255)
    b = torch.empty(n, dtype=torch.uint8, device='cuda:1')
    t = ev_time(lambda: b.copy_(a, non_blocking=True))
    out.append(dict(what='peer_copy_ce_0to1', bytes=n, s=t, GBps=n/t/1e9))
    # SM-driven copy through a kernel reading a peer pointer is not exposed by torch; copy engine only.
    # bidirectional: two streams
    c = torch.empty(n, dtype=torch.uint8, device='cuda:1'); c.random_(0,255)
    d = torch.empty(n, dtype=torch.uint8, device='cuda:0')
    s0 = torch.cuda.Stream(device='cuda:0'); s1 = torch.cuda.Stream(device='cuda:1')
    def bidi():
        with torch.cuda.stream(s0): b.copy_(a, non_blocking=True)
        with torch.cuda.stream(s1): d.copy_(c, non_blocking=True)
        s0.synchronize(); s1.synchronize()
    for _ in range(3): bidi()
    ts=[]
    for _ in range(10):
        t0=time.perf_counter(); bidi(); ts.append(time.perf_counter()-t0)
    ts.sort(); t=ts[len(ts)//2]
    out.append(dict(what='peer_copy_ce_bidirectional_total', bytes=2*n, s=t, GBps=2*n/t/1e9))
    # local HBM copy
    e_ = torch.empty(n, dtype=torch.uint8, device='cuda:0')
    t = ev_time(lambda: e_.copy_(a))
    out.append(dict(what='hbm_d2d_copy_gpu0', bytes=2*n, s=t, GBps=2*n/t/1e9, note='read+write bytes'))
    return out

def worker(rank, world, q):
    torch.cuda.set_device(rank)
    dist.init_process_group('nccl', rank=rank, world_size=world, init_method='tcp://127.0.0.1:29533', device_id=torch.device('cuda', rank))
    res = []
    # all_to_all_single, equal splits
    for mb in (1, 16, 256, 1024):
        n = mb << 20
        x = torch.randn(n // 2, dtype=torch.bfloat16, device='cuda'); y = torch.empty_like(x)
        t = ev_time(lambda: dist.all_to_all_single(y, x))
        res.append(dict(what='nccl_all_to_all_single', total_bytes_per_rank=n, s=t, algbw_GBps=n/t/1e9, busbw_GBps=n/t/1e9*(world-1)/world))
    # send/recv one direction 1 GiB (M2N baseline: trainer rank 0 -> inference rank 1)
    n = 1 << 30
    z = torch.empty(n // 2, dtype=torch.bfloat16, device='cuda').normal_()
    def sr():
        if rank == 0: dist.send(z, 1)
        elif rank == 1: dist.recv(z, 0)
    if rank < 2:
        t = ev_time(sr, iters=10, warm=3)
        res.append(dict(what='nccl_send_recv_1GiB', bytes=n, s=t, GBps=n/t/1e9))
    t = ev_time(lambda: dist.broadcast(z, 0), iters=10, warm=3)
    res.append(dict(what='nccl_broadcast_1GiB', bytes=n, s=t, GBps=n/t/1e9))
    # Naive MoE dispatch/combine the way a framework without an EP library does it:
    # permute tokens by destination rank, exchange split sizes, all_to_all_single (variable), then reverse.
    for T, H, K, E in ((4096, 7168, 8, 256), (128, 7168, 8, 256)):
        g = torch.Generator(device='cuda'); g.manual_seed(1234 + rank)
        x = torch.randn(T, H, dtype=torch.bfloat16, device='cuda')
        scores = torch.rand(T, E, device='cuda', generator=g)
        topk = scores.topk(K, dim=1).indices
        epr = E // world
        dest_rank = topk // epr                       # [T,K]
        flat_rank = dest_rank.flatten()
        order = torch.argsort(flat_rank, stable=True)
        tok = (torch.arange(T, device='cuda').unsqueeze(1).expand(T, K).flatten())[order]
        send_counts = torch.bincount(flat_rank, minlength=world)
        def dispatch():
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts)
            sc = send_counts.tolist(); rc = recv_counts.tolist()   # host sync, as frameworks do
            send = x.index_select(0, tok)
            recv = torch.empty(sum(rc), H, dtype=x.dtype, device='cuda')
            dist.all_to_all_single(recv, send, rc, sc)
            return recv, sc, rc
        recv, sc, rc = dispatch()
        def combine():
            back = torch.empty(sum(sc), H, dtype=x.dtype, device='cuda')
            dist.all_to_all_single(back, recv, sc, rc)
            out = torch.zeros(T, H, dtype=torch.float32, device='cuda')
            out.index_add_(0, tok, back.float())
            return out.to(torch.bfloat16)
        td = ev_time(lambda: dispatch(), iters=20, warm=5)
        tc = ev_time(lambda: combine(), iters=20, warm=5)
        sent_bytes = T * K * H * 2
        res.append(dict(what='naive_torch_moe_dispatch', T=T, H=H, K=K, E=E, s=td, us=td*1e6, GBps_token_expert_bytes=sent_bytes/td/1e9))
        res.append(dict(what='naive_torch_moe_combine', T=T, H=H, K=K, E=E, s=tc, us=tc*1e6, GBps_token_expert_bytes=sent_bytes/tc/1e9))
    q.put((rank, res))
    dist.barrier(); dist.destroy_process_group()

if __name__ == '__main__':
    out = []
    world = int(sys.argv[sys.argv.index('--world') + 1]) if '--world' in sys.argv else 2
    if torch.cuda.device_count() >= max(2, world):
        out += peer_copy()
        ctx = mp.get_context('spawn'); q = ctx.Queue()
        ps = [ctx.Process(target=worker, args=(r, world, q)) for r in range(world)]
        for p in ps: p.start()
        got = [q.get() for _ in ps]
        for p in ps: p.join()
        for r, res in sorted(got):
            for x in res: x['rank'] = r; out.append(x)
    for x in out: x['world'] = world; print(json.dumps(x))
