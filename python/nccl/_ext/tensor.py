"""torch tensors as the C APIs' tensor descriptors: dense row-major, checked here with messages, never copied."""

from __future__ import annotations

import ctypes

from .errors import NcclInvalidArgument

MAX_DIMS = 4  # NCCL_EP_MAX_TENSOR_DIMS

# ncclDataType_t (nccl.h)
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_INT64 = 0, 1, 2, 4
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_BFLOAT16, NCCL_FLOAT8E4M3 = 6, 7, 9, 10


class CTensor(ctypes.Structure):
    """ncclEpTensor_t."""

    _fields_ = [("ndim", ctypes.c_uint), ("datatype", ctypes.c_int), ("data", ctypes.c_void_p),
                ("win_hdl", ctypes.c_void_p), ("win_offset", ctypes.c_size_t),
                ("sizes", ctypes.c_int64 * MAX_DIMS)]


_TABLE = {}


def _table() -> dict:
    if not _TABLE:  # built once: execute checks hundreds of tensors a call
        import torch

        _TABLE.update({torch.bfloat16: NCCL_BFLOAT16, torch.float16: NCCL_FLOAT16, torch.float32: NCCL_FLOAT32,
                       torch.int32: NCCL_INT32, torch.int64: NCCL_INT64, torch.uint8: NCCL_UINT8,
                       torch.int8: NCCL_INT8})
        if hasattr(torch, "float8_e4m3fn"):
            _TABLE[torch.float8_e4m3fn] = NCCL_FLOAT8E4M3
        if hasattr(torch, "float4_e2m1fn_x2"):  # two e2m1 values a byte: bytes to the C APIs (NVFP4 rows)
            _TABLE[torch.float4_e2m1fn_x2] = NCCL_UINT8
    return _TABLE


def nccl_dtype(dtype) -> int:
    try:
        code = _table().get(dtype)
    except TypeError:  # not hashable: no dtype at all
        code = None
    if code is None:
        raise NcclInvalidArgument("dtype %s has no NCCL equivalent" % dtype)
    return code


def torch_dtype(code: int):
    """The torch dtype of NCCL type `code`, or None."""
    for dtype, c in _table().items():
        if c == code:
            return dtype
    return None


def describe(t, name: str, dtypes=None, ndim: int | None = None, require_cuda: bool = True) -> CTensor:
    """The descriptor of tensor `t` (argument `name` in messages), after checking what the C API cannot see."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise NcclInvalidArgument("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if dtypes is not None and t.dtype not in dtypes:
        raise NcclInvalidArgument("%s has dtype %s; expected %s" % (name, t.dtype, " or ".join(str(d) for d in dtypes)))
    if ndim is not None and t.dim() != ndim:
        raise NcclInvalidArgument("%s must have %d dimensions; got shape %s" % (name, ndim, tuple(t.shape)))
    if t.dim() > MAX_DIMS:
        raise NcclInvalidArgument("%s has %d dimensions; at most %d" % (name, t.dim(), MAX_DIMS))
    if require_cuda and t.device.type != "cuda":
        raise NcclInvalidArgument("%s must be a CUDA tensor; it is on %s" % (name, t.device))
    if not t.is_contiguous():
        raise NcclInvalidArgument("%s must be contiguous (dense, row-major); no copy is made behind your back: pass "
                                  "%s.contiguous()" % (name, name))
    d = CTensor()
    d.ndim = t.dim()
    d.datatype = nccl_dtype(t.dtype)
    d.data = t.data_ptr() if t.numel() > 0 else None
    for i, s in enumerate(t.shape):
        d.sizes[i] = s
    return d


def descriptor(shape, dtype) -> CTensor:
    """The descriptor of a dense tensor of `shape` and `dtype` still to be allocated (data set later)."""
    d = CTensor()
    d.ndim = len(shape)
    d.datatype = nccl_dtype(dtype)
    for i, s in enumerate(shape):
        d.sizes[i] = s
    return d


def absent() -> CTensor:
    """An unset optional tensor (data NULL), as NCCL_EP_TENSOR_INIT."""
    d = CTensor()
    d.datatype = NCCL_BFLOAT16
    return d
