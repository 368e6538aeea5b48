"""README.md's Python quick start, run as written: the ```python block under "Quick start (Python)" is read from
the README and executed with the names it leaves to the caller (x, topk_idx, topk_weights, and experts, here the
doubling of every received row), on 1 rank or under torchrun (one-GPU nodes too). Its `out` is checked against torch:
token t comes back once, doubled, from every rank that hosts one of its experts. The CPU test checks that the block
is there and compiles, so that an edit of the README that breaks it fails CI."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
LOCAL_OF_256 = {1: 256, 2: 128, 4: 64, 8: 32}


def _block():
    text = README.read_text()
    section = text.split("## Quick start (Python)", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "README.md: no ```python block under 'Quick start (Python)'"
    return found.group(1)


def test_quickstart_block_compiles():
    code = _block()
    compile(code, "README.md (Quick start, Python)", "exec")
    for name in ("x", "topk_idx", "topk_weights", "experts", "out"):  # what this file gives it, and what it reads
        assert re.search(r"\b%s\b" % name, code), name


@pytest.mark.gpu
def test_quickstart_runs_as_written(world):
    torch = pytest.importorskip("torch")
    from _seeded import on_rank, routed_tokens

    rank, R = world
    if R not in LOCAL_OF_256:
        pytest.skip("the quick start's 256 experts over %d ranks" % R)
    local = LOCAL_OF_256[R]
    idx, x, w = routed_tokens(rank, R, max_tokens=64, hidden=7168, local=local, topk=8, seed=9100)
    names = {"x": x.cuda(), "topk_idx": idx.cuda(), "topk_weights": w.float().cuda(), "experts": lambda t: t * 2}
    exec(compile(_block(), "README.md (Quick start, Python)", "exec"), names)
    torch.cuda.synchronize()
    out = names["out"]
    ranks_hit = torch.stack([on_rank(idx, d, local).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
    assert out.shape == x.shape
    assert torch.equal(out.cpu(), (x.float() * 2 * ranks_hit.unsqueeze(1)).to(torch.bfloat16))
