"""The installed package: namespace layout, loading, versions, errors (CPU; no torch needed)."""

import importlib.util
import os
import subprocess
import sys

import pytest

import nccl.ep
import nccl.m2n
from nccl._ext import errors


def test_namespace_package():
    spec = importlib.util.find_spec("nccl")
    assert spec.origin in (None, "namespace"), "nccl must be a namespace package (no nccl/__init__.py)"
    assert nccl.ep.__file__ and nccl.m2n.__file__


def test_versions():
    assert nccl.ep.version() == (0, 1, 0)
    assert nccl.m2n.version() == (0, 1, 0)


def test_one_libnccl_and_its_release():
    from nccl._ext import _loader

    path = _loader.nccl_path()
    assert "libnccl.so" in path
    built, loaded = _loader.check_nccl_runtime(nccl.ep._lib(), "Ep")
    assert built // 100 == loaded // 100 and built <= loaded, (built, loaded)  # the loaded family's part
    assert _loader.check_nccl_runtime(nccl.m2n._lib(), "M2n") == (built, loaded)


@pytest.mark.parametrize("code,cls", [(1, errors.NcclUnhandledCudaError), (2, errors.NcclSystemError),
                                      (3, errors.NcclInternalError), (4, errors.NcclInvalidArgument),
                                      (5, errors.NcclInvalidUsage), (6, errors.NcclRemoteError),
                                      (7, errors.NcclInProgress)])
def test_error_classes(code, cls):
    e = errors.error_for(code, "the text")
    assert type(e) is cls and e.code == code and e.message == "the text" and isinstance(e, errors.NcclError)
    assert getattr(nccl.ep, cls.__name__) is cls


def test_unknown_code_keeps_it():
    e = errors.error_for(42, "odd")
    assert type(e) is errors.NcclError and e.code == 42 and "42" in str(e)


def test_invalid_argument_is_a_value_error():
    assert issubclass(errors.NcclInvalidArgument, ValueError)


def test_missing_library_is_named():
    env = dict(os.environ, NCCL_EXT_LIB_DIR="/nonexistent/lib")
    r = subprocess.run([sys.executable, "-c", "import nccl.ep"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "/nonexistent/lib/libnccl_ep.so is missing" in r.stderr, r.stderr


def test_missing_nccl_is_named(tmp_path):
    env = dict(os.environ, NCCL_EXT_NCCL_LIBRARY=str(tmp_path / "libnccl.so.2"))
    env.pop("LD_PRELOAD", None)  # a preloaded libnccl (tools/nccl_preload.sh) is one the process already has
    r = subprocess.run([sys.executable, "-c", "import nccl.m2n"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "libnccl.so.2" in r.stderr, r.stderr
