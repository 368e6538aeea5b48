"""RL weight sync with nccl.m2n.WeightSync: a trainer holding a small Qwen3-like model as DTensors on a
FSDP(2) x TP(2) mesh sends its weights after every step to inference ranks holding vLLM-style TP(4) shards.

    torchrun --nproc_per_node 8 examples/m2n_weight_sync.py            # disjoint: trainer ranks 0-3, inference 4-7
    torchrun --nproc_per_node 4 examples/m2n_weight_sync.py            # co-located: both on ranks 0-3
    ... --one-gpu nodes                                                # every rank on one GPU

With 8 or more ranks the sides are disjoint, with 4 to 7 co-located; ranks past them hold nothing and take part.

Trainer placements, as FSDP2 + TP writes them: TP shards column-parallel weights (q, k, v, gate, up, embeddings,
lm_head) by rows and FSDP then shards each TP shard by rows again ([_StridedShard(0, split_factor=2), Shard(0)]);
row-parallel weights (o, down) are [Shard(0), Shard(1)]; norms [Shard(0), Replicate()]. Inference: column-parallel
weights Shard(0), row-parallel Shard(1), norms Replicate, over 4 ranks; q, k, v and gate, up are row blocks of one
fused parameter per layer (qkv_proj, gate_up_proj), as vLLM holds them: each part's destination is a view of it.
Every rank builds the same full weights from one seed; after each sync every inference shard must equal its slice
of the trainer's current full weights, and no fused parameter may keep a poisoned row.
A "training step" adds the step number to every trainer weight in place. Exits 0 when every check passes.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

import nccl.m2n as m2n  # noqa: E402
from _launch import append_json, start  # noqa: E402

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
ROW = ("o_proj", "down_proj")


def model_shapes(layers, hidden, heads, kv_heads, head_dim, ffn, vocab):
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = "model.layers.%d." % i
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,),
                       p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                       p + "mlp.down_proj.weight": (hidden, ffn)})
    return shapes


def kind(name):
    return "column" if any(k in name for k in COLUMN) else "row" if any(k in name for k in ROW) else "norm"


FUSED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))


def fused_place(name):
    """(the fused parameter's name, this part's place in it) for a part of one, else (None, -1)."""
    for fused_as, parts in FUSED:
        for i, part in enumerate(parts):
            if "." + part + "." in name:
                return name.replace(part, fused_as), i
    return None, -1


def fuse(shapes_and_layouts, device):
    """The inference side's tensors: q/k/v of a layer as row blocks of one qkv_proj parameter and gate/up as row
    blocks of one gate_up_proj (as vLLM holds them), every other tensor on its own; all NaN-poisoned. Returns
    ({name: (tensor or view, layout)}, {fused name: parameter})."""
    out, groups = {}, {}
    for name, (shape, lay) in shapes_and_layouts.items():
        fused_name, place = fused_place(name)
        if fused_name is None:
            out[name] = (torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device), lay)
        else:
            groups.setdefault(fused_name, []).append((place, name, shape, lay))
    fused = {}
    for fused_name, parts in groups.items():
        parts.sort()
        param = torch.full((sum(shape[0] for _, _, shape, _ in parts), parts[0][2][1]), float("nan"),
                           dtype=torch.bfloat16, device=device)
        fused[fused_name] = param
        at = 0
        for _, name, shape, lay in parts:
            out[name] = (param[at:at + shape[0]], lay)  # a contiguous row block, written in place
            at += shape[0]
    return out, fused


def local_slice(full, layout, rank):
    off, shp = layout.local_box(rank)
    return full[tuple(slice(o, o + n) for o, n in zip(off, shp))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--one-gpu", choices=["nodes"], default=None, help="every rank on GPU 0, each its own NCCL node")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rank, world, device = start(a.one_gpu == "nodes")
    if world < 4:
        print("m2n_weight_sync: needs at least 4 ranks (FSDP(2) x TP(2)), got %d" % world)
        return 2
    colocated = world < 8
    trainer_ranks = list(range(4))
    infer_ranks = list(range(4)) if colocated else list(range(4, 8))
    # Every rank makes both meshes (a DeviceMesh is built collectively); only members hold shards.
    tmesh = DeviceMesh("cuda", torch.tensor(trainer_ranks).view(2, 2), mesh_dim_names=("fsdp", "tp"))
    imesh = DeviceMesh("cuda", torch.tensor(infer_ranks), mesh_dim_names=("tp",))
    shapes = model_shapes(a.layers, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, vocab=1000)
    gen = torch.Generator().manual_seed(11)
    # Small integers: exact in bf16, and so are the steps added to them (on the GPU and here alike).
    fulls = {n: torch.randint(-60, 60, s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}

    trainer, inference = {}, {}
    for name, full in fulls.items():
        k = kind(name)
        placements = ([_StridedShard(0, split_factor=2), Shard(0)] if k == "column" else
                      [Shard(0), Shard(1)] if k == "row" else [Shard(0), Replicate()])
        if rank in trainer_ranks:
            lay = m2n.Layout.from_device_mesh(tmesh, placements, full.shape, torch.bfloat16)
            local = local_slice(full, lay, rank).contiguous().to(device)
            trainer[name] = DTensor.from_local(local, tmesh, placements, run_check=False, shape=full.shape,
                                               stride=full.stride())
        if rank in infer_ranks:  # vLLM names without the "model." prefix; its own TP layout
            ip = [Shard(0)] if k == "column" else [Shard(1)] if k == "row" else [Replicate()]
            lay = m2n.Layout.from_device_mesh(imesh, ip, full.shape, torch.bfloat16)
            inference[name.removeprefix("model.")] = (lay.local_box(rank)[1], lay)
    fused = {}
    if rank in infer_ranks:  # vLLM fuses q, k, v and gate, up into one parameter: each part is a view of it
        inference, fused = fuse(inference, device)

    ok = True
    with m2n.WeightSync(timeout_s=60) as ws:
        t0 = time.perf_counter()
        ws.plan(trainer=trainer or None, inference=inference or None,
                name_map=lambda n: n if n.startswith("lm_head") else "model." + n)
        plan_s = time.perf_counter() - t0
        for step in range(a.steps):
            t0 = time.perf_counter()
            ws.sync()
            torch.cuda.synchronize()
            sync_ms = (time.perf_counter() - t0) * 1e3
            bad = [n for n, (y, lay) in inference.items()
                   if not torch.equal(y.cpu(), local_slice(fulls[n if n.startswith("lm_head") else "model." + n],
                                                           lay, rank))]
            bad += [n for n, param in fused.items() if bool(torch.isnan(param).any())]  # every row block written
            flag = torch.tensor([len(bad)], device=device)
            dist.all_reduce(flag)
            ok = ok and int(flag) == 0
            if rank == 0:
                print("m2n_weight_sync: step %d: %d tensors synced in %.1f ms, %d mismatched shards on all ranks"
                      % (step, len(ws.names), sync_ms, int(flag)))
            if bad:
                print("rank %d: mismatched %s" % (rank, bad[:3]))
            for name, dt in trainer.items():  # the training step: weights change in place
                dt.to_local().add_(step + 1)
            for name in fulls:
                fulls[name] = fulls[name] + (step + 1)
    if rank == 0:
        mode = "one-GPU nodes" if a.one_gpu else "real GPUs"
        print("m2n_weight_sync: %s, %d ranks (%s), %d tensors, plan %.2f s -> %s" % (
            "co-located" if colocated else "disjoint", world, mode, len(shapes), plan_s, "PASS" if ok else "FAIL"))
        append_json(a.json, {"test": "m2n_weight_sync", "pass": ok, "ranks": world, "colocated": colocated,
                             "mode": mode, "tensors": len(shapes), "steps": a.steps, "plan_s": plan_s})
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
