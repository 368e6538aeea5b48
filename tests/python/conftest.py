"""pytest setup: the `gpu` marker (tests that need a CUDA device; skipped without one), and --json FILE: one result
line at the end, in the GPU tests' format (tools/gpu_check_report.py collects it)."""

import json

import pytest


@pytest.fixture(scope="module")
def one_rank_world():
    """A torch.distributed group for a GPU test module: the launcher's under torchrun, else a single-process gloo
    group of our own, destroyed after the module (the CPU tests that follow expect none). Sets the CUDA device."""
    import os

    import torch
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    yield
    if made:
        dist.destroy_process_group()


def pytest_addoption(parser):
    parser.addoption("--json", default=None, help="append a result line for make gpu-check")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (make gpu-check runs these)")


def _have_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (or no torch) on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--json")
    if not path:
        return
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {k: len(rep.stats.get(k, [])) for k in ("passed", "failed", "error", "skipped")} if rep else {}
    line = {"test": "python", "pass": exitstatus == 0 and counts.get("passed", 0) > 0, "gpu": _have_gpu()}
    line.update(counts)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
