"""pytest setup: the `gpu` marker (tests that need a CUDA device; skipped without one), and --json FILE: one result
line at the end, in the GPU tests' format (tools/gpu_check_report.py collects it)."""

import json

import pytest


@pytest.fixture(scope="session")
def launched_world():
    """Under a launcher (torchrun: WORLD_SIZE set), the gloo group of its ranks for the whole session: made once and
    destroyed at the end. A second init_process_group on the launcher's store would find the first group's keys
    there, and a rank that reads them before rank 0 rewrites them connects to rank 0's closed gloo sockets."""
    import datetime

    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        # A bounded wait: a rank that fails alone must not leave the others in a collective for gloo's 30 minutes.
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    yield
    if made:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def world(request):
    """A torch.distributed group for a GPU test module: under a launcher the session's gloo group of its ranks
    (launched_world), else a single-process gloo group of our own, destroyed after the module (the CPU tests that
    follow expect none). Sets the CUDA device: LOCAL_RANK's, or 0 for every rank with --one-gpu nodes. Yields
    (rank, size)."""
    import datetime
    import os

    import torch
    import torch.distributed as dist

    made = False
    if "WORLD_SIZE" in os.environ:
        request.getfixturevalue("launched_world")
    elif not dist.is_initialized():
        made = True
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    one_gpu = os.environ.get("NCCL_EXT_TEST_ONE_GPU") == "nodes"
    torch.cuda.set_device(0 if one_gpu else int(os.environ.get("LOCAL_RANK", 0)))
    yield dist.get_rank(), dist.get_world_size()
    if made:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_rank_world(world):
    """world, for a module written for one rank: skipped under a launcher with several."""
    if world[1] != 1:
        pytest.skip("written for 1 rank (%d here): several ranks need their own tests (test_ep_ll_ranks.py, "
                    "test_ep_ht_ranks.py, test_deepep_ranks.py)" % world[1])
    yield world


@pytest.fixture
def one_process_gloo():
    """A single-process gloo group for one CPU test (torch's object-free collectives work on it)."""
    import os

    pytest.importorskip("torch")
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29800 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _launcher(what: str, default: str) -> str:
    """This process's rank or size ("rank" / "size") as its launcher set it: torchrun's, or mpirun's (Open MPI,
    MPICH)."""
    import os

    names = {"rank": ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
             "size": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")}[what]
    return next((os.environ[v] for v in names if v in os.environ), default)


def pytest_addoption(parser):
    parser.addoption("--json", default=None, help="append a result line for make gpu-check")
    parser.addoption("--one-gpu", default=None, choices=["nodes"],
                     help="every rank of the launcher on GPU 0, each its own NCCL node (tests/README.md)")


def pytest_configure(config):
    import os

    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (make gpu-check runs these)")
    config.addinivalue_line("markers", "caching_allocator: needs PyTorch's caching allocator (CUDA graph capture that "
                            "allocates, the allocator's snapshot); skipped under PYTORCH_NO_CUDA_MEMORY_CACHING=1, "
                            "which make gpu-sanitize sets")
    if config.getoption("--one-gpu") == "nodes":  # before any NCCL call reads the environment
        os.environ["NCCL_EXT_TEST_ONE_GPU"] = "nodes"
        os.environ["NCCL_HOSTID"] = "ncclext-node-%s" % _launcher("rank", "0")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def _have_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") not in ("", "0"):
        # Without the caching allocator torch calls cudaMalloc inside a capture (not permitted) and has no snapshot.
        nocache = pytest.mark.skip(reason="needs PyTorch's caching allocator (PYTORCH_NO_CUDA_MEMORY_CACHING is set)")
        for item in items:
            if "caching_allocator" in item.keywords:
                item.add_marker(nocache)
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (or no torch) on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--json")
    if not path or _launcher("rank", "0") != "0":  # one line per run: rank 0's
        return
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {k: len(rep.stats.get(k, [])) for k in ("passed", "failed", "error", "skipped")} if rep else {}
    line = {"test": "python", "ranks": int(_launcher("size", "1")),
            "pass": exitstatus == 0 and counts.get("passed", 0) > 0, "gpu": _have_gpu()}
    line.update(counts)
    # Why tests skipped, so that a run's JSON says what it did not cover: {reason: count}.
    reasons = {}
    for r in (rep.stats.get("skipped", []) if rep else []):
        why = r.longrepr[2] if isinstance(r.longrepr, tuple) and len(r.longrepr) == 3 else str(r.longrepr)
        why = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
        reasons[why] = reasons.get(why, 0) + 1
    if reasons:
        line["skipped_reasons"] = reasons
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
