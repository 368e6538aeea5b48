"""nccl.m2n.Plan on a GPU, 1 rank: a transposing local reshard (destination strides) and a batch by name, against
torch, destinations poisoned first; a wrongly shaped tensor refused. (Several ranks: one-GPU nodes under torchrun,
once the C executor has run there.)"""

import pytest

torch = pytest.importorskip("torch")
import nccl.m2n as m2n  # noqa: E402

pytestmark = pytest.mark.gpu


def test_transposing_local_reshard(one_rank_world):
    R, C = 37, 53
    src = m2n.Layout((R, C), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE])
    dst = m2n.Layout((R, C), torch.bfloat16, mesh=[0], placements=[m2n.REPLICATE], local_strides=[(1, R)])
    x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
    y = torch.full((C, R), float("nan"), device="cuda", dtype=torch.bfloat16)  # column-major storage of [R, C]
    with m2n.Plan([("w", src, dst)]) as plan:
        plan.execute([x], [y.t()])
        torch.cuda.synchronize()
    assert torch.equal(y.t(), x)


def test_a_batch_by_name(one_rank_world):
    shapes = {"a": (64, 32), "b": (7,), "c": (5, 3, 2)}
    tensors = [(n, m2n.Layout(s, torch.float32, mesh=[0], placements=[m2n.REPLICATE]),
                m2n.Layout(s, torch.float32, mesh=[0], placements=[m2n.REPLICATE])) for n, s in shapes.items()]
    src = {n: torch.randn(s, device="cuda") for n, s in shapes.items()}
    dst = {n: torch.full(s, float("nan"), device="cuda") for n, s in shapes.items()}
    with m2n.Plan(tensors) as plan:
        for _ in range(3):  # a plan is reused
            for t in dst.values():
                t.fill_(float("nan"))
            plan.execute(src, dst)
            torch.cuda.synchronize()
            assert all(torch.equal(src[n], dst[n]) for n in shapes)
        with pytest.raises(m2n.NcclError, match="has shape"):
            plan.execute(src, {**dst, "a": torch.empty(3, 3, device="cuda")})
