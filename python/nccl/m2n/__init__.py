"""nccl.m2n: resharding tensors between layouts and groups of GPUs (libnccl_m2n).

Today this module loads the library and checks its NCCL; the planner and executor bindings (layouts from DTensor,
Plan, reshard, the RL weight-sync helper) arrive with the issue "Python package, part 2" once the C executor exists.
"""

from __future__ import annotations

import ctypes

from .._ext import _loader
from .._ext.errors import NcclError, error_for

__all__ = ["version", "NcclError"]


def _lib() -> ctypes.CDLL:
    lib = _loader.load("m2n")
    if not getattr(lib, "_nccl_ext_ready", False):
        lib.ncclM2nGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.ncclM2nGetVersion.restype = ctypes.c_int
        lib.ncclM2nGetLastError.restype = ctypes.c_char_p
        _loader.check_nccl_runtime(lib, "M2n")
        lib._nccl_ext_ready = True
    return lib


def version() -> tuple[int, int, int]:
    """libnccl_m2n's (major, minor, patch)."""
    lib = _lib()
    v = ctypes.c_int(0)
    rc = lib.ncclM2nGetVersion(ctypes.byref(v))
    if rc != 0:
        raise error_for(rc, lib.ncclM2nGetLastError().decode(errors="replace"))
    return v.value // 10000, v.value // 100 % 100, v.value % 100


_lib()  # at import, as nccl.ep
