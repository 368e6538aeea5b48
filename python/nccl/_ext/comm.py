"""NCCL communicators for the libraries, made from torch.distributed process groups."""

from __future__ import annotations

import ctypes

from . import _loader
from .errors import NcclInvalidArgument, error_for
from .objects import broadcast_bytes


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]  # NCCL_UNIQUE_ID_BYTES


_P = ctypes.c_void_p
_SIGNATURES = {
    "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_P), ctypes.c_int, _UniqueId, ctypes.c_int],
    "ncclCommFinalize": [_P],
    "ncclCommDestroy": [_P],
    "ncclCommAbort": [_P],
}


def id_to_bytes(uid: _UniqueId) -> bytes:
    """The id's raw bytes (never uid.internal of a c_char array: that reads as a copy cut at the first NUL)."""
    return bytes(uid)


def id_from_bytes(raw) -> _UniqueId:
    if not isinstance(raw, bytes) or len(raw) != ctypes.sizeof(_UniqueId):
        raise NcclInvalidArgument("Communicator: rank 0 sent no NCCL unique id of %d bytes" % ctypes.sizeof(_UniqueId))
    return _UniqueId.from_buffer_copy(raw)


def _nccl_call(name: str, *args) -> None:
    lib = _loader.nccl()
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    fn.argtypes = _SIGNATURES[name]
    rc = fn(*args)
    if rc != 0:
        text = getattr(lib, "ncclGetErrorString")
        text.restype = ctypes.c_char_p
        raise error_for(rc, "%s: %s" % (name, text(rc).decode(errors="replace")))


class Communicator:
    """An NCCL communicator of our own over the ranks of a torch ProcessGroup (None: the default group), in the
    group's rank order, on the current CUDA device (or `device`); or over an mpi4py communicator's (from_mpi).

    COLLECTIVE: every rank of the group constructs it at the same point. Rank 0 makes a unique id and broadcasts it
    over the group itself (a uint8 tensor on the group's device), so any backend the group has will do. Release
    with close() (collective) or abort() (local, after a peer failed), or use it as a context manager.
    """

    def __init__(self, group=None, device=None, *, _mpi=None):
        import torch.distributed as dist

        if _mpi is not None:  # from_mpi: the id goes over the MPI communicator
            self.group, self.rank, self.size = None, _mpi.Get_rank(), _mpi.Get_size()
            self._init(lambda mine: _mpi.bcast(mine, root=0), device)
            return
        if not dist.is_initialized():
            raise NcclInvalidArgument("Communicator: torch.distributed is not initialised (init_process_group first)")
        self.group = group  # the torch group (None: the default one)
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        if self.rank < 0:
            raise NcclInvalidArgument("Communicator: this process is not a member of the group")
        self._init(lambda mine: broadcast_bytes(mine, ctypes.sizeof(_UniqueId), group), device)

    @classmethod
    def from_mpi(cls, comm, device=None) -> "Communicator":
        """COLLECTIVE over an mpi4py communicator (every rank of it, at the same point): the same NCCL communicator,
        in the MPI communicator's rank order, its unique id broadcast by MPI from rank 0 (as TensorRT-LLM builds its
        NCCL communicators). `group` is None then."""
        for name in ("Get_rank", "Get_size", "bcast"):
            if not callable(getattr(comm, name, None)):
                raise NcclInvalidArgument("Communicator.from_mpi: %r has no %s(): an mpi4py communicator is expected"
                                          % (comm, name))
        return cls(device=device, _mpi=comm)

    def _init(self, broadcast, device) -> None:
        """Rank 0's unique id to every rank through `broadcast` (rank 0's bytes in, every rank's copy out), then
        the communicator on `device` (the current CUDA device by default)."""
        import torch

        uid = _UniqueId()
        if self.rank == 0:
            _nccl_call("ncclGetUniqueId", ctypes.byref(uid))
        uid = id_from_bytes(broadcast(id_to_bytes(uid) if self.rank == 0 else None))
        index = torch.cuda.current_device() if device is None else torch.device(device).index
        self.device = torch.device("cuda", index)
        self._comm = ctypes.c_void_p()
        # Called with the handle before close() or abort() frees it (the libraries' per-communicator state, such as
        # nccl.m2n's cached reshard plans).
        self.before_close = []
        with torch.cuda.device(self.device):
            _nccl_call("ncclCommInitRank", ctypes.byref(self._comm), self.size, uid, self.rank)

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ncclComm_t (for the C APIs); invalid after close()."""
        if not self._comm:
            raise NcclInvalidArgument("Communicator: used after close()")
        return self._comm

    def close(self) -> None:
        """COLLECTIVE: finalises and destroys the communicator (every rank calls it). Idempotent."""
        if self._comm:
            c, self._comm = self._comm, ctypes.c_void_p()
            self._run_before_close(c)
            _nccl_call("ncclCommFinalize", c)
            _nccl_call("ncclCommDestroy", c)

    def abort(self) -> None:
        """Local: frees the communicator without waiting for peers (after a peer failed). Idempotent."""
        if self._comm:
            c, self._comm = self._comm, ctypes.c_void_p()
            try:
                self._run_before_close(c)
            finally:
                _nccl_call("ncclCommAbort", c)

    def _run_before_close(self, handle) -> None:
        hooks, self.before_close = getattr(self, "before_close", []), []
        for hook in hooks:
            hook(handle)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
