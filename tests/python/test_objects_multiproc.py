"""nccl._ext.objects across real processes (CPU, gloo): what the Communicator's unique id and WeightSync's layouts
travel by. Two and three ranks, payloads of different lengths (one empty), bytes of every value."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _rank_main(rank, world, store, results):
    from nccl._ext.objects import all_gather_bytes, broadcast_bytes

    # A file store: no port to pick (a free port found first can be taken before the store binds it).
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    try:
        uid = bytes([0, 7, 0, 255] + list(range(124))) if rank == 0 else None
        got_id = broadcast_bytes(uid, 128)
        mine = bytes((rank * 37 + i) % 256 for i in range(rank * 5))  # rank 0 sends nothing
        gathered = all_gather_bytes(mine)
        results[rank] = (got_id, gathered)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_bytes_cross_processes_whole(world, tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    mp.start_processes(_rank_main, args=(world, str(tmp_path / "store"), results), nprocs=world, join=True,
                       start_method="spawn")
    uid = bytes([0, 7, 0, 255] + list(range(124)))
    want = [bytes((r * 37 + i) % 256 for i in range(r * 5)) for r in range(world)]
    for r in range(world):
        got_id, gathered = results[r]
        assert got_id == uid
        assert gathered == want
