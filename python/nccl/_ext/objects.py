"""Bytes over a torch.distributed group without torch's object collectives (broadcast_object_list and
all_gather_object need numpy, which a torch install may lack): uint8 tensors on the group's device."""

from __future__ import annotations


def _device(group):
    """CPU for a group with a CPU backend (gloo, also in a "cpu:gloo,cuda:nccl" mix), else the current GPU."""
    import torch
    import torch.distributed as dist

    name = str(dist.get_backend(group))
    return torch.device("cpu") if "gloo" in name or name in ("fake", "mpi") else torch.device(
        "cuda", torch.cuda.current_device())


def _to_bytes(t) -> bytes:
    return bytes(t.cpu().tolist())


def broadcast_bytes(data: bytes | None, size: int, group=None) -> bytes:
    """`size` bytes from the group's rank 0 (`data` there; None elsewhere) to every rank."""
    import torch
    import torch.distributed as dist

    dev = _device(group)
    if data is not None:
        t = torch.tensor(list(data), dtype=torch.uint8, device=dev)
    else:
        t = torch.zeros(size, dtype=torch.uint8, device=dev)
    dist.broadcast(t, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return _to_bytes(t)


def all_gather_bytes(data: bytes, group=None) -> list:
    """Every rank's `data` (any length), in group rank order."""
    import torch
    import torch.distributed as dist

    dev = _device(group)
    n = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(n)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    longest = max(lengths) if lengths else 0
    mine = torch.zeros(max(1, longest), dtype=torch.uint8, device=dev)
    if data:
        mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=dev)
    parts = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(parts, mine, group=group)
    return [_to_bytes(p[:k]) for p, k in zip(parts, lengths)]
