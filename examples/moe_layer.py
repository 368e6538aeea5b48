"""A Mixture-of-Experts layer on nccl.ep, trained for a few steps and compared with the same layer on one GPU.

    torchrun --nproc_per_node N examples/moe_layer.py [--steps 5] [--tokens 256] [--hidden 512] [--json FILE]
    python examples/moe_layer.py                       # 1 rank, no launcher

Each rank holds E/N experts (a two-layer MLP each) and a shared router. Forward: the router picks top-k experts per
token, nccl.ep.autograd.dispatch sends every token to the ranks of its experts (FLAT layout: one row per (token,
rank) with the local expert ids and weights), each rank runs its experts on the rows that name them and weights
their outputs, nccl.ep.autograd.combine sums each token's rows back at its owner. Backward runs through the same
handle. The reference is the whole layer (all experts, the router, the same initial weights and data) computed on
one GPU with plain torch, for every rank's tokens: after each step the loss and every parameter must match.
Exits 0 when they do, 1 otherwise (printing the largest differences).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import nccl.ep as ep
import nccl.ep.autograd as epa


class Experts(torch.nn.Module):
    """`n` two-layer MLPs; `forward(rows, local_ids, weights)` sums w * expert_e(row) over each row's local slots."""

    def __init__(self, n, hidden, ffn, gen):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(n, hidden, ffn, generator=gen) / hidden ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(n, ffn, hidden, generator=gen) / ffn ** 0.5)

    def forward(self, rows, local_ids, weights):
        out = torch.zeros_like(rows)
        for e in range(self.w1.shape[0]):
            hit = local_ids == e                       # [rows, K]
            r = hit.any(dim=1)
            if not bool(r.any()):
                continue
            w = (weights * hit).sum(dim=1, keepdim=True)[r]
            y = torch.relu(rows[r] @ self.w1[e]) @ self.w2[e]
            out = out.index_add(0, r.nonzero().squeeze(1), w * y)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts-per-rank", type=int, default=4)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--json", default=None, help="append a result line (make gpu-check)")
    a = ap.parse_args()
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29611")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dev = torch.device("cuda")
    E, K, H, T = a.experts_per_rank * world, a.topk, a.hidden, a.tokens

    # Every rank builds the whole model from one seed: its own experts for the distributed layer, all for the reference.
    gen = torch.Generator().manual_seed(1234)
    router = torch.nn.Linear(H, E, bias=False)
    router.weight.data = torch.randn(E, H, generator=gen) / H ** 0.5
    everyone = Experts(E, H, 2 * H, gen)
    mine = Experts(a.experts_per_rank, H, 2 * H, torch.Generator())
    lo = rank * a.experts_per_rank
    mine.w1.data = everyone.w1.data[lo:lo + a.experts_per_rank].clone()
    mine.w2.data = everyone.w2.data[lo:lo + a.experts_per_rank].clone()
    router_ref = torch.nn.Linear(H, E, bias=False)
    router_ref.weight.data = router.weight.data.clone()
    for m in (router, mine, everyone, router_ref):
        m.to(dev)
    opt = torch.optim.SGD(list(router.parameters()) + list(mine.parameters()), lr=0.1)
    opt_ref = torch.optim.SGD(list(router_ref.parameters()) + list(everyone.parameters()), lr=0.1)

    group = ep.Group(num_experts=E, max_tokens_per_rank=T, hidden=H, dtype=torch.float32, max_topk=K)
    worst = 0.0
    for step in range(a.steps):
        data = torch.Generator().manual_seed(100 + step)
        xs = [torch.randn(T, H, generator=data).to(dev) for _ in range(world)]  # every rank's tokens
        target = [torch.randn(T, H, generator=data).to(dev) for _ in range(world)]
        # Distributed layer on my tokens.
        x = xs[rank]
        w, idx = torch.topk(torch.softmax(router(x), dim=-1), K, dim=-1)
        recv_x, recv_w, handle = epa.dispatch(group, x, idx, w)
        y = mine(recv_x, handle.topk_local.long(), recv_w)
        out = epa.combine(group, y, handle)
        loss = torch.nn.functional.mse_loss(out, target[rank])
        opt.zero_grad()
        loss.backward()
        handle.close()
        # Gradients of the shared router are summed over ranks, as data parallelism would.
        for p in router.parameters():
            g = p.grad.cpu()  # the group may be gloo (a CPU backend)
            dist.all_reduce(g)
            p.grad.copy_(g)
        opt.step()
        # Reference: the whole layer on one GPU, every rank's tokens, the same loss summed over ranks.
        ref_loss_total = 0
        opt_ref.zero_grad()
        for r in range(world):
            wr, ir = torch.topk(torch.softmax(router_ref(xs[r]), dim=-1), K, dim=-1)
            yr = everyone(xs[r], ir, wr)
            lr_ = torch.nn.functional.mse_loss(yr, target[r])
            lr_.backward()
            if r == rank:
                ref_loss = lr_.detach()
            ref_loss_total += float(lr_)
        opt_ref.step()
        diffs = {
            "loss": float((loss.detach() - ref_loss).abs()),
            "router": float((router.weight - router_ref.weight).abs().max()),
            "w1": float((mine.w1 - everyone.w1[lo:lo + a.experts_per_rank]).abs().max()),
            "w2": float((mine.w2 - everyone.w2[lo:lo + a.experts_per_rank]).abs().max()),
        }
        worst = max(worst, *diffs.values())
        if rank == 0:
            print("step %d: loss %.6f (reference %.6f); largest differences %s" % (
                step, float(loss), float(ref_loss), ", ".join("%s %.2e" % kv for kv in diffs.items())))
    group.close()
    ok = worst < 1e-4
    if rank == 0:
        print("moe_layer: %d ranks, %d steps -> %s (largest difference %.2e)" % (world, a.steps,
                                                                              "PASS" if ok else "FAIL", worst))
        if a.json:
            import json
            with open(a.json, "a") as f:
                f.write(json.dumps({"test": "moe_layer", "pass": ok, "ranks": world, "steps": a.steps,
                                    "largest_difference": worst}) + "\n")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
