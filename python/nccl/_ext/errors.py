"""C errors as Python exceptions: one class per ncclResult_t value, each carrying the code and the library's text."""

from __future__ import annotations


class NcclError(RuntimeError):
    """A failed call of libnccl_ep / libnccl_m2n / libnccl: `code` is the ncclResult_t, `message` the library's text."""

    code = -1

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class NcclUnhandledCudaError(NcclError):
    code = 1


class NcclSystemError(NcclError):
    """The system or a wait gave up (e.g. a host wait's budget ran out; a peer process is gone)."""

    code = 2


class NcclInternalError(NcclError):
    code = 3


class NcclInvalidArgument(NcclError, ValueError):
    code = 4


class NcclInvalidUsage(NcclError):
    code = 5


class NcclRemoteError(NcclError):
    """A peer did not answer in time (a device wait timed out) or is gone."""

    code = 6


class NcclInProgress(NcclError):
    code = 7


_BY_CODE = {c.code: c for c in (NcclUnhandledCudaError, NcclSystemError, NcclInternalError, NcclInvalidArgument,
                                NcclInvalidUsage, NcclRemoteError, NcclInProgress)}


def error_for(code: int, message: str) -> NcclError:
    """The exception for a non-zero ncclResult_t (an unknown code gives the base class, naming it)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return NcclError("%s (ncclResult_t %d)" % (message, code), code)
    return cls(message)
