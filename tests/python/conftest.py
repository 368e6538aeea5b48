"""pytest setup: the `gpu` marker (tests that need a CUDA device; skipped without one), and --json FILE: one result
line at the end, in the GPU tests' format (tools/gpu_check_report.py collects it)."""

import json

import pytest


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
