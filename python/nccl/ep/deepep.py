"""DeepEP's V1 `deep_ep.Buffer` API on nccl.ep (High-Throughput and Low-Latency, inside and across NVLink
domains):

    import nccl.ep.deepep as deep_ep

Code written for `deep_ep` runs unchanged for what nccl.ep implements: `Buffer` (`get_dispatch_layout`, `dispatch`,
`combine`; with `low_latency_mode=True` the Low-Latency calls, receive hooks and `zero_copy` combine; with
`enable_shrink=True` the rank-mask calls of DeepEP's main branch), `Config`, `EventOverlap`, `topk_idx_t`; DeepEP
V2's `ElasticBuffer`, `EPHandle` and `EventHandle` come from nccl.ep.deepep_elastic (`from nccl.ep.deepep import
ElasticBuffer`). `low_latency_combine(use_logfmt=True)` moves bf16 rows (exact, no smaller messages; warned once).
The Low-Latency wait-time statistics (`*_wait_recv_cost_stats`) get nccl.ep's receive wait cycles per source.
What it does not implement raises NotImplementedError naming the argument or method (the dispatch handle's entries
above 8 ranks that are not a multiple of 8, or when not asked for).
`get_comm_stream` returns the caller's current stream (nccl.ep's calls run there). The High-Throughput handle is
DeepEP's intranode tuple up to 8 ranks, its internode one above (see _DispatchHandle). `Buffer(None, ...,
comm=<mpi4py communicator>)` (TensorRT-LLM's way) works: the NCCL communicator's id goes over MPI, and the Buffer's
few collectives of its own run there on the host (a host synchronisation each: the first dispatch's sizes, a
Low-Latency group's, and the High-Throughput handle entries' all-to-all, which `Buffer.dispatch_handle_entries =
False` skips). docs/COMPATIBILITY.md lists every method and how it differs.

How it differs inside (none of it changes results):
- Calls run on the current stream (there is no communication stream): `previous_event` is waited on first, and
  with `async_finish` the returned EventOverlap is recorded after the call.
- Groups are sized at the first dispatch, collectively: at least `Buffer.max_tokens_per_rank` tokens (4096, or
  NCCL_EP_DEEPEP_MAX_TOKENS) and the largest rows and top-k seen then; a later call beyond them raises with the
  numbers. Another expert count makes another group. The Low-Latency group is made at the first
  `low_latency_dispatch` for its (tokens, hidden, experts, top-k) and made anew (after a device synchronisation)
  when they change: make the first call before a CUDA graph capture.
- Low-Latency dispatches bind their routing to `Buffer.num_low_latency_handles` (2) handles in turn, as DeepEP's
  two buffers: a combine whose handle two later dispatches reused is refused. Hooks must be called in the order of
  their calls. fp32 fp8 scales come row-major (DeepEP's are column-major: the same values under other strides);
  UE8M0-packed ones have DeepEP's strides.
- The High-Throughput handle's DeepEP entries cost each dispatch one all-to-all over the Buffer's process group
  (`Buffer.dispatch_handle_entries = False` skips it); combine and cached dispatch do not read them.
- `get_local_buffer_tensor` gives memory of the Buffer's own (num_rdma_bytes or num_nvl_bytes), not the
  communication buffers; `get_low_latency_rdma_size_hint` returns the bytes the Low-Latency group will hold.
- The mask calls keep DeepEP's convention (1 = masked). A peer that stopped in the middle of a call is masked, and
  the next call raises NcclRemoteError once, naming it (DeepEP reports nothing).
"""

from __future__ import annotations

import math
import os
import warnings

import torch
import torch.distributed as dist

from .._ext.comm import Communicator
from . import _LL_MAX_TOKENS, Group, NcclInvalidArgument, NcclInvalidUsage, _combine_weights, query_group_info

__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t"]
__version__ = "1.2.1"  # the DeepEP release whose API this mirrors

topk_idx_t = torch.int64

_KNOWN_RANKS = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160)
_ELASTIC_NAMES = ("ElasticBuffer", "EPHandle", "EventHandle")  # DeepEP V2's, from nccl.ep.deepep_elastic


def __getattr__(name):
    # Imported on first use: nccl.ep.deepep_elastic builds on this module.
    if name in _ELASTIC_NAMES:
        from . import deepep_elastic

        return getattr(deepep_elastic, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


_LOGFMT_WARNED = []


def _warn_logfmt_once() -> None:
    if not _LOGFMT_WARNED:
        _LOGFMT_WARNED.append(True)
        warnings.warn("nccl.ep.deepep: low_latency_combine(use_logfmt=True) moves the rows in bf16 (exact; LogFMT's "
                      "10-bit encoding is not implemented by nccl.ep yet, so the messages are not smaller)",
                      stacklevel=3)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError("nccl.ep.deepep: %s is not implemented by nccl.ep yet (High-Throughput and "
                               "Low-Latency dispatch and combine are, inside one NVLink domain and across domains)"
                               % what)


class _Hook:
    """The receive hook of a Low-Latency call with return_recv_hook=True: the call issued its sends only (nccl.ep's
    send-only half); calling the hook enqueues the receive half (ncclEpComplete) on the current stream, after which
    the outputs are there in stream order. Call it once; hooks of a kind in the order of their calls, each before
    two more calls of that kind (nccl.ep's staging has two banks)."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        self._fn = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is None:
            raise NcclInvalidUsage("nccl.ep.deepep: this receive hook was already called")
        fn()


class EventOverlap:
    """An optional CUDA event and the tensors it keeps alive; `with ev:` and `ev.current_stream_wait()` make the
    current stream wait for it (a no-op without an event)."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is None:
            raise ValueError("EventOverlap.current_stream_wait: no event (the call was not async_finish)")
        torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.event is not None:
            self.current_stream_wait()
        return False


class Config:
    """DeepEP's tuning record. nccl.ep uses `num_sms` (the SMs of the call); the chunk sizes are checked as DeepEP
    checks them and otherwise unused (nccl.ep has no chunked NVLink ring)."""

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256):
        if not num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens:
            raise ValueError("Config: num_max_nvl_chunked_send_tokens must be below num_max_nvl_chunked_recv_tokens")
        if not num_max_rdma_chunked_send_tokens <= num_max_rdma_chunked_recv_tokens // 2:
            raise ValueError("Config: num_max_rdma_chunked_send_tokens must be at most half of "
                             "num_max_rdma_chunked_recv_tokens")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        rs = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = -(-num_max_rdma_chunked_recv_tokens // rs) * rs

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of a receive window for Buffer.max_tokens_per_rank rows of `hidden_bytes` from every rank (the
        nccl.ep group sizes itself; the value is for code that passes it to Buffer)."""
        return Buffer.max_tokens_per_rank * num_ranks * hidden_bytes

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0: nccl.ep needs no RDMA buffer from its caller (its rail staging sizes itself; a num_rdma_bytes given
        to Buffer anyway bounds the High-Throughput groups' staging)."""
        return 0


class _TorchRanks:
    """The Buffer's own collectives (small integer tensors) over a torch ProcessGroup, on its device."""

    def __init__(self, group):
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)

    def all_reduce(self, t, op: str = "sum") -> None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.group)

    def all_to_all(self, out, inp) -> None:
        dist.all_to_all_single(out, inp, group=self.group)

    def group_arg(self):
        """What nccl.ep's Group is made over: the ProcessGroup (each Group makes its own communicator)."""
        return self.group

    def close(self) -> None:
        pass


class _MpiRanks:
    """The same over an mpi4py communicator: each collective on the host, as Python lists (mpi4py's object calls:
    no numpy needed; the tensors are a few hundred integers), and one NCCL communicator of the Buffer's (its id
    broadcast by MPI), shared by its nccl.ep groups."""

    def __init__(self, comm):
        try:
            import mpi4py  # noqa: F401  (the calls below are the communicator's own)
        except ImportError as e:
            raise NcclInvalidArgument("Buffer(comm=...): mpi4py is not importable here (%s)" % e) from e
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.group, self._nccl = None, None

    def all_reduce(self, t, op: str = "sum") -> None:
        every = self.comm.allgather(t.reshape(-1).tolist())  # each rank's values
        fold = max if op == "max" else sum
        t.copy_(torch.tensor([fold(v) for v in zip(*every)], dtype=t.dtype).reshape(t.shape))

    def all_to_all(self, out, inp) -> None:
        """inp's rows split in size equal blocks, block i to rank i; out gets rank i's block for me at block i."""
        blocks = inp.reshape(self.size, -1).tolist()
        got = self.comm.alltoall(blocks)
        out.copy_(torch.tensor(got, dtype=out.dtype).reshape(out.shape))

    def group_arg(self):
        if self._nccl is None:
            self._nccl = Communicator.from_mpi(self.comm)
        return self._nccl

    def close(self) -> None:
        if self._nccl is not None:
            nccl, self._nccl = self._nccl, None
            nccl.close()


class _DispatchHandle(tuple):
    """What dispatch returns as `handle`: DeepEP's intranode tuple (rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head), with DeepEP's meanings, R ranks, this
    rank `me`, T tokens here, C = config.num_sms // 2 channels (DeepEP's: channel c holds tokens [c * P, (c + 1) * P)
    clipped to T, P = ceil(T / C)):
      rank_prefix_matrix         [R, R] int32, the same on every rank: [i][j] = tokens sent to rank j by ranks 0..i,
                                 so recv_x's rows [i - 1][me] .. [i][me] came from rank i;
      channel_prefix_matrix      [R, C] int32: [d][c] = this rank's tokens of channels 0..c that went to rank d;
      recv_channel_prefix_matrix [R, C] int32: [s][c] = rank s's tokens of channels 0..c-1 that came here (where its
                                 channel c's rows begin inside its block of recv_x);
      recv_src_idx               [rows] int32: each row's token index at its source (-1 for rows past the received
                                 ones with num_worst_tokens);
      is_token_in_rank           [T, R] bool, as given;
      send_head                  [T, R] int32: [t][d] = how many tokens of t's channel before t went to rank d, -1
                                 where t did not (DeepEP's combine rewrites the -1 entries in place; ours reads none).
    Above 8 ranks (R = 8 N: DeepEP's nodes of 8, its RDMA ranks; this rank me = 8 n + l), DeepEP's internode tuple
    (is_token_in_rank, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix, recv_rdma_channel_prefix_matrix,
    recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix, recv_gbl_rank_prefix_sum, recv_src_meta,
    send_rdma_head, send_nvl_head), "to node m" meaning to any of its ranks:
      rdma_channel_prefix_matrix      [N, C] int32: [m][c] = this rank's tokens of channels 0..c that go to node m;
      gbl_channel_prefix_matrix       [R, C] int32: the same per rank (the intranode channel_prefix_matrix);
      recv_rdma_channel_prefix_matrix [N, C] int32: [m][c] = rank (m, l)'s tokens of channels 0..c that go to node n
                                      (the tokens DeepEP forwards through this rank);
      recv_rdma_rank_prefix_sum       [N] int32: inclusive over m of rank (m, l)'s tokens to node n;
      recv_gbl_channel_prefix_matrix  [R, C] int32: [g][c] = the row of recv_x where rank g's channel c begins;
      recv_gbl_rank_prefix_sum        [R] int32: inclusive over g of rank g's tokens here (DeepEP's test reads it:
                                      rows [g - 1] .. [g] came from rank g);
      recv_src_meta                   [rows, 8] uint8: per row, DeepEP's SourceMeta (int32 source node, int32 bits
                                      j = the token also goes to rank (n, j)); -1, 0 past the received rows;
      send_rdma_head                  [T, N] int32: a token's position among the tokens of its channel that go to node
                                      m, -1 where it does not;
      send_nvl_head                   [F, 8] int32, F = recv_rdma_rank_prefix_sum[-1] (N * max tokens with
                                      num_worst_tokens, -1 past F): per token forwarded for node n (by source node,
                                      then token order), its position among its channel's earlier tokens at the
                                      source that go to rank (n, j), -1 where it does not go there.
    The intranode entries cost dispatch no host sync; the internode ones one (send_nvl_head's rows), which DeepEP's
    internode dispatch has too, except with num_worst_tokens. Token counts come from is_token_in_rank. Pass the
    handle back to combine or to a cached dispatch: those use the nccl.ep handle it carries, not the entries. Above 8
    ranks that are not a multiple of 8, or with Buffer.dispatch_handle_entries = False, the entries are not computed
    and indexing the handle raises."""

    def __new__(cls, ep_handle, rows_returned, entries=None, size=6):
        h = super().__new__(cls, entries if entries is not None else ())
        h.ep_handle, h.rows_returned, h.has_entries, h.size = ep_handle, rows_returned, entries is not None, size
        return h

    def _need_entries(self):
        if not self.has_entries:
            raise _unsupported("reading the dispatch handle's entries above %d ranks that are not a multiple of %d "
                               "(DeepEP's nodes) or with Buffer.dispatch_handle_entries = False"
                               % (_NVL_PEERS, _NVL_PEERS))

    def __getitem__(self, i):
        self._need_entries()
        return tuple.__getitem__(self, i)

    def __iter__(self):
        self._need_entries()
        return tuple.__iter__(self)

    def __len__(self):
        return self.size  # DeepEP's intranode handle has six entries, its internode one ten

    def __repr__(self):
        return "_DispatchHandle(rows=%d, entries=%s)" % (self.rows_returned, self.has_entries)


class _LowLatencyHandle(tuple):
    """What low_latency_dispatch returns as `handle`: DeepEP's five entries, (src_info, layout_range,
    num_max_dispatch_tokens_per_rank, hidden, num_experts), with their DeepEP meanings:
      src_info     [L, R * M] int32: each received row's token index at its source rank (nccl.ep's src_info is
                   source * M + token; this is it modulo M);
      layout_range [L, R] int64: per (local expert, source rank), (first row << 32) | rows, derived from src_info
                   and the counts.
    Both are computed on first access, on the current stream (combine needs neither), and kept: a CUDA graph that
    replays the dispatch recomputes them only if the capture read them. Rows past an expert's count are
    unspecified, as in DeepEP. Pass the handle to low_latency_combine of the same Buffer before
    Buffer.num_low_latency_handles later dispatches."""

    def __new__(cls, owner, slot, seq, ep_handle, raw_src_info, recv_count, num_ranks, m, hidden, num_experts):
        h = super().__new__(cls, (None, None, m, hidden, num_experts))
        h.owner, h.slot, h.seq, h.ep_handle = owner, slot, seq, ep_handle
        h.raw_src_info, h.recv_count, h.num_ranks = raw_src_info, recv_count, num_ranks
        h._src_info = h._layout_range = None
        return h

    @property
    def src_info(self):
        if self._src_info is None:
            local, m = self.recv_count.numel(), self[2]
            self._src_info = (self.raw_src_info % m).view(local, self.num_ranks * m)
        return self._src_info

    @property
    def layout_range(self):
        if self._layout_range is None:
            local, ranks, m = self.recv_count.numel(), self.num_ranks, self[2]
            raw = self.raw_src_info.view(local, ranks * m)
            valid = torch.arange(ranks * m, device=raw.device) < self.recv_count.unsqueeze(1)
            src = torch.where(valid, raw // m, ranks).long()  # rows past the count go to a spare column
            counts = torch.zeros(local, ranks + 1, dtype=torch.int64, device=raw.device)
            counts.scatter_add_(1, src, torch.ones_like(src))
            counts = counts[:, :ranks]
            begin = counts.cumsum(1) - counts
            self._layout_range = (begin << 32) | counts
        return self._layout_range

    def _entries(self):
        return (self.src_info, self.layout_range) + tuple.__getitem__(self, slice(2, 5))

    def __getitem__(self, i):
        if isinstance(i, slice) or i in (0, 1, -5, -4):
            return self._entries()[i]
        return tuple.__getitem__(self, i)

    def __iter__(self):
        return iter(self._entries())

    def __repr__(self):
        return ("_LowLatencyHandle(num_max_dispatch_tokens_per_rank=%d, hidden=%d, num_experts=%d)"
                % tuple.__getitem__(self, slice(2, 5)))


class _LowLatencyState:
    """The nccl.ep Low-Latency group of a Buffer for one (M, hidden, num_experts, top-k), and its ring of handles:
    dispatch n binds its routing to handle n % len(handles); seqs[slot] is the dispatch bound there now."""

    def __init__(self, group, key, num_handles: int):
        self.group, self.key = group, key
        self.handles = [None] * num_handles
        self.topk = None  # the top-k the ring's handles were made for (a handle keeps its top-k)
        self.seqs = [-1] * num_handles
        self.combine_buffers = [None] * num_handles  # get_next_low_latency_combine_buffer's, one per slot

    def drop_handles(self, device) -> None:
        """LOCAL: the ring's handles, after the device's queued work (they must not be in use); made again by the
        next dispatch (a Low-Latency handle's binding is local)."""
        if any(h is not None for h in self.handles) and device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        for h in self.handles:
            if h is not None:
                h.close()
        self.handles = [None] * len(self.handles)
        self.seqs = [-1] * len(self.seqs)

    def close(self, device) -> None:
        """COLLECTIVE: the handles and the group."""
        self.drop_handles(device)
        self.group.close()


class Buffer:
    num_sms: int = 20
    # The nccl.ep group's capacity, fixed at the first dispatch (see the module's docstring).
    max_tokens_per_rank: int = int(os.environ.get("NCCL_EP_DEEPEP_MAX_TOKENS", "4096"))
    max_token_bytes: int = 0
    max_topk: int = 8
    # The intranode groups' receive cap (Group's max_recv_rows_per_rank; 0: none): a rank's window holds this many
    # received rows instead of group size x max_tokens_per_rank, rows past it are dropped (recv_overflow "drop") and
    # counted in the handle's recv_dropped. Set it to the num_worst_tokens the dispatches pass.
    max_recv_rows_per_rank: int = 0
    # Low-Latency dispatches whose handles stay valid for combine at once (DeepEP: two buffers).
    num_low_latency_handles: int = 2
    # (M, hidden, ranks, experts) of the last get_low_latency_rdma_size_hint in this process (see __init__).
    _low_latency_hint = None
    # Whether dispatch computes its handle's DeepEP entries (see _DispatchHandle): one all-to-all over the Buffer's
    # process group of R x (R + num_sms / 2 + max_tokens_per_rank) int32 per dispatch. False skips it (nothing of
    # nccl.ep reads the entries) and indexing the handle raises.
    dispatch_handle_entries: bool = True

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm=None):
        if group is None and comm is None:
            raise NcclInvalidArgument("Buffer: give a torch ProcessGroup, or group=None and comm=<an mpi4py "
                                      "communicator>")
        # allow_mnnvl needs nothing: an nccl.ep NVLink domain is NCCL's LSA team, which spans multi-node NVLink.
        self._ranks = _TorchRanks(group) if group is not None else _MpiRanks(comm)
        self.group = group
        self.rank, self.group_size = self._ranks.rank, self._ranks.size
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.explicitly_destroy = low_latency_mode, explicitly_destroy
        self.enable_shrink = enable_shrink
        self._ll_mask = [1] * self.group_size  # enable_shrink: the rank mask (1 = active) while no LL group holds it
        self._groups = {}  # num_experts -> nccl.ep Group, each made at the first dispatch with that expert count
        self._caps = None  # (tokens, row bytes, top-k, SMs) of every group, fixed at the first dispatch
        self._timeout_s = None  # the groups' device-wait timeout (ElasticBuffer's num_gpu_timeout_secs); None: default
        self._ll = None  # _LowLatencyState, made at the first low_latency_dispatch
        self._ll_seq = 0  # low_latency_dispatch calls so far
        self._scratch = {}  # get_local_buffer_tensor's memory, by the size it is named after
        self._ll_device = None
        # Shrink mode exists to survive a rank that stops calling, and making the Low-Latency group at the first
        # low_latency_dispatch is collective: a rank that never makes that call would hang the others there. So a
        # shrink Buffer makes its group here, collectively as DeepEP's constructor allocates, with the sizes of the
        # last get_low_latency_rdma_size_hint of this process for its rank count (top-k: Buffer.max_topk, or more
        # later as a call needs).
        hint = Buffer._low_latency_hint
        if low_latency_mode and enable_shrink and hint is not None and hint[2] == self.group_size:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
            self._low_latency_group(hint[0], hint[1], hint[3], Buffer.max_topk, device)

    # -- static helpers ---------------------------------------------------------------------------------------------
    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        if new_num_sms % 2 != 0:
            raise ValueError("Buffer.set_num_sms: the SM count must be even")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return EventOverlap(event)

    @staticmethod
    def is_sm90_compiled() -> bool:
        return True

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        if num_ranks not in _KNOWN_RANKS:
            raise ValueError("Buffer.get_dispatch_config: no config for %d ranks" % num_ranks)
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        if num_ranks not in _KNOWN_RANKS:
            raise ValueError("Buffer.get_combine_config: no config for %d ranks" % num_ranks)
        return Config(Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """The device memory a rank's Low-Latency group holds for these sizes (top-k Buffer.max_topk): its window and
        rail staging, as nccl.ep.query_group_info reports them for NVLink domains of _domain_size_guess(num_ranks)
        ranks (no communicator exists yet to say). The group allocates that memory itself at the first
        low_latency_dispatch, whatever num_rdma_bytes the Buffer is given; callers that size other memory by the
        hint (DeepEP's users pass it as num_rdma_bytes, get_local_buffer_tensor's size) get a true figure. The
        arguments are checked as dispatch would. The process remembers the last hint's sizes: a Buffer made next
        with enable_shrink=True for that many ranks makes its Low-Latency group in its constructor (see
        Buffer.__init__)."""
        _check_low_latency_sizes("get_low_latency_rdma_size_hint", num_max_dispatch_tokens_per_rank, hidden,
                                 num_experts, num_ranks)
        Buffer._low_latency_hint = (num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)
        info = query_group_info(num_ranks, _domain_size_guess(num_ranks), num_experts=num_experts,
                                max_tokens_per_rank=num_max_dispatch_tokens_per_rank, hidden=hidden,
                                max_topk=Buffer.max_topk, algorithm="low_latency")
        return int(info["window_bytes"] + info["rail_staging_bytes"])

    def get_next_low_latency_combine_buffer(self, handle):
        """The [L, R * M, H] bf16 buffer of the handle's slot to write the experts' outputs into: then
        low_latency_combine(..., zero_copy=True) reads it (x is then not read). One buffer per slot of the handle
        ring, made at its first request and kept with the group. nccl.ep's combine reads its input where it lies
        and writes each row straight into the owner's staging, so with or without this buffer no copy is made on the
        sending side; the buffer exists for code written against DeepEP's API."""
        self._need_low_latency("get_next_low_latency_combine_buffer")
        st = self._low_latency_state_of(handle, "get_next_low_latency_combine_buffer")
        return self._combine_buffer(st, handle)

    def _combine_buffer(self, st, handle):
        local, rows, hidden = handle.recv_count.numel(), self.group_size * handle[2], handle[3]
        buf = st.combine_buffers[handle.slot]
        if buf is None:
            buf = torch.empty(local, rows, hidden, dtype=torch.bfloat16, device=handle.recv_count.device)
            st.combine_buffers[handle.slot] = buf
        return buf

    def get_local_buffer_tensor(self, dtype: torch.dtype, size: torch.Size | None = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> torch.Tensor:
        """num_rdma_bytes (use_rdma_buffer) or num_nvl_bytes of device memory, from byte `offset`, as `dtype` (shaped
        `size` if given), as DeepEP's. Not nccl.ep's buffers, which it does not expose: memory of this Buffer's own,
        made at the first request and kept until destroy(); no call of nccl.ep reads or writes it, so code that uses
        DeepEP's idle buffer as scratch (LightLLM's prefill) keeps working and needs no clean_low_latency_buffer
        after, but the memory is not shared with the communication buffers."""
        nbytes = int(self.num_rdma_bytes if use_rdma_buffer else self.num_nvl_bytes)
        what = "num_rdma_bytes" if use_rdma_buffer else "num_nvl_bytes"
        if not isinstance(dtype, torch.dtype):
            raise NcclInvalidArgument("get_local_buffer_tensor: dtype must be a torch.dtype; got %r" % (dtype,))
        itemsize = dtype.itemsize
        if not isinstance(offset, int) or not 0 <= offset <= nbytes or offset % itemsize:
            raise NcclInvalidArgument("get_local_buffer_tensor: offset %r not within the Buffer's %s (%d) or not a "
                                      "multiple of %s's %d bytes" % (offset, what, nbytes, dtype, itemsize))
        raw = self._scratch.get(what)
        if raw is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            raw = self._scratch[what] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        tensor = raw[offset:offset + (nbytes - offset) // itemsize * itemsize].view(dtype)
        if size is None:
            return tensor
        if not isinstance(size, (tuple, list)) or not all(isinstance(d, int) and 0 <= d < 2**63 for d in size):
            raise NcclInvalidArgument("get_local_buffer_tensor: size must be a torch.Size of dimensions >= 0; got %r"
                                      % (size,))
        numel = math.prod(size)
        if numel > tensor.numel():
            raise NcclInvalidArgument("get_local_buffer_tensor: size %s needs %d elements; %s from offset %d holds %d"
                                      % (tuple(size), numel, what, offset, tensor.numel()))
        return tensor[:numel].view(torch.Size(size))

    def get_comm_stream(self):
        """DeepEP's communication stream. nccl.ep has none of its own: its calls run on the caller's current stream,
        which this returns. `record_stream` on it then orders nothing more, and work forked onto it runs in order
        with the caller's (no overlap, the same results)."""
        return torch.cuda.current_stream()

    # -- layout -----------------------------------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts: int, previous_event=None, async_finish: bool = False,
                            allocate_on_comm_stream: bool = False):
        """Local (no communication): (num_tokens_per_rank [R] int32, num_tokens_per_rdma_rank, num_tokens_per_expert
        [E] int32, is_token_in_rank [T, R] bool, event). A token counts once per rank however many of its experts are
        there. num_tokens_per_rdma_rank is DeepEP's: None up to 8 ranks, else [R / 8] int32, the tokens that go to
        each block of 8 ranks (DeepEP's RDMA ranks, its nodes of 8 GPUs); nccl.ep's dispatch does not need it."""
        self._wait(previous_event)
        if topk_idx.dim() != 2:
            raise NcclInvalidArgument("get_dispatch_layout: topk_idx must be [num_tokens, num_topk]")
        if num_experts % self.group_size != 0:
            raise NcclInvalidArgument("get_dispatch_layout: %d experts do not divide among %d ranks"
                                      % (num_experts, self.group_size))
        valid = topk_idx >= 0
        rank_of = torch.where(valid, topk_idx // (num_experts // self.group_size), -1)
        ranks = torch.arange(self.group_size, device=topk_idx.device)
        is_token_in_rank = (rank_of.unsqueeze(-1) == ranks).any(dim=1)
        num_tokens_per_rank = is_token_in_rank.sum(dim=0, dtype=torch.int32)
        num_tokens_per_expert = torch.bincount(topk_idx[valid], minlength=num_experts).to(torch.int32)
        return (num_tokens_per_rank, _tokens_per_rdma_rank(is_token_in_rank), num_tokens_per_expert, is_token_in_rank,
                self._event(async_finish))

    # -- dispatch / combine -----------------------------------------------------------------------------------------
    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment: int = 1, num_worst_tokens: int = 0, config: Config | None = None,
                 previous_event=None, async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event), as DeepEP's
        intranode dispatch: rows grouped by source rank in source-token order; local expert ids (int64), -1 for
        experts elsewhere; weights 0 there; the per-expert list (a host sync) rounded up to `expert_alignment`.
        With `num_worst_tokens` nothing waits on the host: outputs have that many rows, the list is empty and the
        rows past the received ones have expert -1. handle: DeepEP's six entries (see _DispatchHandle), computed on
        the current stream with one all-to-all over the Buffer's process group and no host sync. A cached dispatch
        (handle given) returns recv_x and the event."""
        self._wait(previous_event)
        x, scales = x if isinstance(x, tuple) else (x, None)
        if scales is not None and not scales.is_contiguous():
            scales = scales.contiguous()
        config = config if config is not None else Config(Buffer.num_sms)
        num_sms = config.num_sms
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise NcclInvalidArgument("dispatch: a cached dispatch (handle given) takes no topk_idx/topk_weights")
            if not isinstance(handle, _DispatchHandle):
                raise NcclInvalidArgument("dispatch: handle must come from this module's dispatch")
            recv = handle.ep_handle.group.dispatch(x, handle=handle.ep_handle, scales=scales,
                                                   num_sms=self._sms(num_sms))
            return self._x_out(recv, handle.rows_returned, scales), None, None, None, None, self._event(async_finish)
        if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
            raise NcclInvalidArgument("dispatch: without a handle, num_tokens_per_rank, is_token_in_rank and "
                                      "num_tokens_per_expert are required (get_dispatch_layout)")
        if (topk_idx is None) != (topk_weights is None):
            raise NcclInvalidArgument("dispatch: give topk_idx and topk_weights together, or neither")
        if num_worst_tokens and topk_idx is None:
            raise NcclInvalidArgument("dispatch: num_worst_tokens needs topk_idx")
        if (not isinstance(is_token_in_rank, torch.Tensor) or is_token_in_rank.dtype != torch.bool
                or tuple(is_token_in_rank.shape) != (x.shape[0], self.group_size)):
            raise NcclInvalidArgument("dispatch: is_token_in_rank must be [%d, %d] bool (get_dispatch_layout's); got "
                                      "%s" % (x.shape[0], self.group_size, _shape_dtype(is_token_in_rank)))
        num_experts = num_tokens_per_expert.numel()
        routing = topk_idx if topk_idx is not None else self._routing_by_rank(is_token_in_rank, num_experts)
        group = self._group_for(x, routing, num_experts)
        recv = group.dispatch(x, routing, topk_weights, scales=scales,
                                 sizing="worst_case" if num_worst_tokens else "exact", num_sms=self._sms(num_sms))
        rows = num_worst_tokens if num_worst_tokens else recv.tokens.shape[0]
        h = _DispatchHandle(recv.handle, rows, self._handle_entries(is_token_in_rank, config, rows, num_worst_tokens),
                            6 if self.group_size <= _NVL_PEERS else 10)

        def aligned(counts):  # the per-expert list (a host sync), each rounded up to expert_alignment
            return [-(-c // expert_alignment) * expert_alignment for c in counts.tolist()]

        if topk_idx is None:  # the rows carry no experts: the list comes from every rank's num_tokens_per_expert
            total = num_tokens_per_expert.clone()
            self._ranks.all_reduce(total)
            local = num_experts // self.group_size
            counts = aligned(total[self.rank * local:(self.rank + 1) * local])
            return self._x_out(recv, rows, scales), None, None, counts, h, self._event(async_finish)
        counts = [] if num_worst_tokens else aligned(recv.expert_counts)
        recv_idx = recv.topk_idx[:rows].to(torch.int64)
        recv_w = recv.topk_weights[:rows]
        if num_worst_tokens:  # rows past the received ones (left as they were) carry no expert and no weight
            received = (torch.arange(rows, device=x.device) < recv.rank_counts.sum()).unsqueeze(1)
            recv_idx = torch.where(received, recv_idx, torch.full_like(recv_idx, -1))
            recv_w = torch.where(received, recv_w, torch.zeros_like(recv_w))
        return self._x_out(recv, rows, scales), recv_idx, recv_w, counts, h, self._event(async_finish)

    def combine(self, x, handle, topk_weights=None, bias=None, config: Config | None = None, previous_event=None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """(combined_x [T, H], combined_topk_weights [T, K] or None, event): each token's rows summed, unweighted,
        over the ranks it went to (DeepEP's intranode combine); topk_weights [rows, K] summed alike; `bias` (a
        tensor or two) added."""
        self._wait(previous_event)
        if not isinstance(handle, _DispatchHandle):
            raise NcclInvalidArgument("combine: handle must come from this module's dispatch")
        num_sms = self._sms(config.num_sms if config is not None else Buffer.num_sms)
        ep_handle = handle.ep_handle
        group = ep_handle.group
        out = group.combine(self._combine_input(x, ep_handle), ep_handle, num_sms=num_sms)
        combined_w = None
        if topk_weights is not None:
            combined_w = _combine_weights(
                lambda w: group.combine(self._combine_input(w, ep_handle), ep_handle, num_sms=num_sms), topk_weights)
        if bias is not None:
            for b in (bias if isinstance(bias, tuple) else (bias,)):
                out = out + b
        return out, combined_w, self._event(async_finish)

    # -- Low-Latency -------------------------------------------------------------------------------------------------
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Checks its arguments. Without enable_shrink it does nothing else: nccl.ep's Low-Latency buffers need no
        cleaning (their flags are sequence numbers of the calls, not zeroed words), also after High-Throughput
        calls. With enable_shrink, as DeepEP's: COLLECTIVE over the ranks active in this rank's mask, on the current
        stream: the Low-Latency group's flags and call numbers are reset (Group.mask_clean), so that a rank made
        active again after it missed calls continues in step with the others (nothing to reset before the first
        low_latency_dispatch). No hook may be pending."""
        self._need_low_latency("clean_low_latency_buffer")
        _check_low_latency_sizes("clean_low_latency_buffer", num_max_dispatch_tokens_per_rank, hidden, num_experts,
                                 self.group_size)
        if self.enable_shrink and self._ll is not None:
            self._ll.group.mask_clean()

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Local: masks `rank_to_mask` in this rank's mask (mask=True) or makes it active again (False); nothing
        goes to or comes from a masked rank from the next Low-Latency call on. Unlike DeepEP's (a kernel on the
        stream), it reads the mask on the host to change one entry (waits for the current stream)."""
        self._need_shrink("low_latency_update_mask_buffer")
        if not 0 <= rank_to_mask < self.group_size:
            raise NcclInvalidArgument("low_latency_update_mask_buffer: rank_to_mask %d not in [0, %d)"
                                      % (rank_to_mask, self.group_size))
        active = self._active_ranks()
        active[rank_to_mask] = 0 if mask else 1
        self._set_active_ranks(active)

    def low_latency_query_mask_buffer(self, mask_status) -> None:
        """Local, on the current stream: mask_status (int32, num_ranks elements) gets DeepEP's view of this rank's
        mask, 1 = masked and 0 = active, ranks the kernels masked (not arrived in time) included."""
        self._need_shrink("low_latency_query_mask_buffer")
        if (not isinstance(mask_status, torch.Tensor) or mask_status.dtype != torch.int32
                or mask_status.numel() != self.group_size):
            raise NcclInvalidArgument("low_latency_query_mask_buffer: mask_status must be an int32 tensor of %d "
                                      "elements (one per rank); got %s" % (self.group_size, _shape_dtype(mask_status)))
        if self._ll is None:
            masked = torch.tensor([0 if a else 1 for a in self._ll_mask], dtype=torch.int32)
        else:
            masked = 1 - self._ll.group.mask_query()
        mask_status.copy_(masked.view(mask_status.shape))

    def low_latency_clean_mask_buffer(self) -> None:
        """Local, as DeepEP's: every rank active again in this rank's mask."""
        self._need_shrink("low_latency_clean_mask_buffer")
        self._set_active_ranks([1] * self.group_size)

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """COLLECTIVE, on the current stream: (recv_x, recv_count, handle, event, hook), as DeepEP's.
        x [T, H] bf16 (T <= num_max_dispatch_tokens_per_rank = M <= 1024), topk_idx [T, K] int64 (or int32), -1 =
        none. recv_x [L, R * M, H]: bf16, or with use_fp8 (e4m3 [L, R * M, H], scales [L, R * M, H / 128] fp32,
        row-major; with use_ue8m0, which needs round_scale and H % 512 == 0, DeepEP's [L, R * M, H / 512] int32 with
        column-major last two dims, four exponent bytes an int32, see _pack_ue8m0): zone e's first recv_count[e] rows
        are its tokens, by (source rank, token); the rest unspecified. Quantisation: one scale per 128 columns,
        amax / 448 (round_scale: rounded up to a power of two).
        recv_count [L] int32, this dispatch's own; cumulative_local_expert_recv_stats [L] int32 gets it added (on the
        stream). handle: see _LowLatencyHandle. event: recorded after the call with async_finish, else empty.
        hook: with return_recv_hook a callable that receives (the call itself only sent; the outputs exist once
        the hook's work has run on the stream; hooks in the order of their dispatches, each before two more
        dispatches), else None; async_finish and return_recv_hook together are refused, as DeepEP does.
        dispatch_wait_recv_cost_stats [num_ranks] int64 gets, per source rank, the clock64 cycles this rank's
        receive half waited for it added (by the hook's work with return_recv_hook): DeepEP's unit, summed over
        nccl.ep's waiting warps rather than DeepEP's per-expert waiters, so compare sources and ranks, not
        libraries."""
        self._need_low_latency("low_latency_dispatch")
        _check_finish_flags("low_latency_dispatch", async_finish, return_recv_hook)
        m = num_max_dispatch_tokens_per_rank
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
            raise NcclInvalidArgument("low_latency_dispatch: x must be a [num_tokens, hidden] bfloat16 tensor; got %s"
                                      % (_shape_dtype(x),))
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
            raise NcclInvalidArgument("low_latency_dispatch: topk_idx must be [%d, num_topk]; got %s"
                                      % (x.shape[0], _shape_dtype(topk_idx)))
        _check_low_latency_sizes("low_latency_dispatch", m, x.shape[1], num_experts, self.group_size)
        if use_ue8m0 and not round_scale:
            raise NcclInvalidArgument("low_latency_dispatch: use_ue8m0=True needs round_scale=True (UE8M0 holds powers "
                                      "of two; DeepEP asserts it too)")
        ue8m0 = bool(use_fp8 and use_ue8m0)
        if ue8m0 and x.shape[1] % 512:
            raise NcclInvalidArgument("low_latency_dispatch: use_ue8m0=True needs hidden %% 512 == 0 (four scales of "
                                      "128 columns an int32); hidden is %d" % x.shape[1])
        if x.shape[0] > m:
            raise NcclInvalidArgument("low_latency_dispatch: %d tokens exceed num_max_dispatch_tokens_per_rank %d"
                                      % (x.shape[0], m))
        local = num_experts // self.group_size
        if cumulative_local_expert_recv_stats is not None:
            stats = cumulative_local_expert_recv_stats
            if (not isinstance(stats, torch.Tensor) or stats.dtype != torch.int32
                    or tuple(stats.shape) != (local,)):
                raise NcclInvalidArgument("low_latency_dispatch: cumulative_local_expert_recv_stats must be [%d] "
                                          "int32; got %s" % (local, _shape_dtype(stats)))
        _check_cost_stats("low_latency_dispatch", "dispatch_wait_recv_cost_stats", dispatch_wait_recv_cost_stats,
                          self.group_size)
        st = self._low_latency_group(m, x.shape[1], num_experts, topk_idx.shape[1], x.device)
        if st.topk != topk_idx.shape[1]:  # another top-k on the same group: a ring of handles for it (earlier
            st.drop_handles(x.device)      # dispatches' handles are then no longer bound)
            st.topk = topk_idx.shape[1]
        fresh = all(h is None for h in st.handles)
        for i, h in enumerate(st.handles):  # the whole ring at once, bound to this routing: none made in a capture
            if h is None:
                st.handles[i] = st.group.create_handle(topk_idx, layout="expert_major")
        seq, slot = self._ll_seq, self._ll_seq % len(st.handles)
        self._ll_seq += 1
        h = st.handles[slot]
        if not fresh:
            h.update(topk_idx)
        st.seqs[slot] = seq
        recv = st.group.dispatch(x, handle=h, out_dtype=torch.float8_e4m3fn if use_fp8 else None,
                                 round_scale=bool(round_scale and use_fp8), send_only=bool(return_recv_hook),
                                 recv_wait_cycles=dispatch_wait_recv_cost_stats)
        hidden, rows = x.shape[1], self.group_size * m
        recv_x = recv.tokens.view(local, rows, hidden)
        scales = packed = None
        if use_fp8:
            scales = recv.scales.view(local, rows, hidden // 128)
            if ue8m0:  # filled once the scales exist (by the hook with return_recv_hook)
                packed = torch.empty((local, hidden // 512, rows, 4), dtype=torch.uint8, device=x.device)
                recv_x = (recv_x, packed.view(torch.int32).view(local, hidden // 512, rows).transpose(1, 2))
            else:
                recv_x = (recv_x, scales)
        stats = cumulative_local_expert_recv_stats

        def received(group=st.group, h=h, counts=recv.expert_counts):
            if return_recv_hook:
                group.complete(h)  # the receive half: the counts exist from here on
            if packed is not None:
                _pack_ue8m0(scales, packed)
            if stats is not None:
                stats.add_(counts)

        handle = _LowLatencyHandle(self, slot, seq, h, recv.src_info, recv.expert_counts, self.group_size, m, hidden,
                                   num_experts)
        if not return_recv_hook:
            received()
            return recv_x, recv.expert_counts, handle, self._event(async_finish), None
        return recv_x, recv.expert_counts, handle, self._event(False), _Hook(received)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out=None, combine_wait_recv_cost_stats=None):
        """COLLECTIVE, on the current stream: (combined_x [T, H] bf16, event, hook), as DeepEP's. x [L, R * M, H]
        bf16, contiguous: the experts' outputs in low_latency_dispatch's layout (rows past the counts are not read).
        Each (token, expert) row returns to its owner, which sums them weighted by topk_weights [T, K] fp32 in
        top-k column order (fp32). topk_idx [T, K] must be the dispatch's routing: nccl.ep bound it at dispatch and
        checks only its shape here. out: an optional [T, H] bf16 output. event / hook as low_latency_dispatch's (not
        both). zero_copy=True: the rows are in get_next_low_latency_combine_buffer(handle) (x is not read).
        use_logfmt=True is accepted and the rows travel in bf16, unencoded: the result is the exact bf16 combine
        (at least as accurate as DeepEP's LogFMT, which its tests hold to the bf16 tolerance), without LogFMT's
        smaller messages (a warning says so once). combine_wait_recv_cost_stats: as low_latency_dispatch's
        dispatch_wait_recv_cost_stats, the cycles waited for each rank's returned rows."""
        if use_logfmt:
            _warn_logfmt_once()
        self._need_low_latency("low_latency_combine")
        _check_cost_stats("low_latency_combine", "combine_wait_recv_cost_stats", combine_wait_recv_cost_stats,
                          self.group_size)
        _check_finish_flags("low_latency_combine", async_finish, return_recv_hook)
        st = self._low_latency_state_of(handle)
        m, hidden = handle[2], handle[3]
        local, rows = handle.recv_count.numel(), self.group_size * m
        if zero_copy:
            x = st.combine_buffers[handle.slot]
            if x is None:
                raise NcclInvalidUsage("low_latency_combine(zero_copy=True): no get_next_low_latency_combine_buffer("
                                       "handle) was asked for this handle's slot: write the rows there first")
        if (not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16
                or tuple(x.shape) != (local, rows, hidden)):
            raise NcclInvalidArgument("low_latency_combine: x must be [%d, %d, %d] bfloat16 (the dispatch's "
                                      "layout); got %s" % (local, rows, hidden, _shape_dtype(x)))
        if not x.is_contiguous():
            raise NcclInvalidArgument("low_latency_combine: x must be contiguous; no copy is made behind your back: "
                                      "pass x.contiguous()")
        routing = (handle.ep_handle.num_tokens, handle.ep_handle.topk)
        for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != routing:
                raise NcclInvalidArgument("low_latency_combine: %s must be [%d, %d] (the dispatch's routing); got %s"
                                          % ((name,) + routing + (_shape_dtype(t),)))
        combined = st.group.combine(x.view(local * rows, hidden), handle.ep_handle, topk_weights=topk_weights,
                                    out=out, send_only=bool(return_recv_hook),
                                    recv_wait_cycles=combine_wait_recv_cost_stats)
        if not return_recv_hook:
            return combined, self._event(async_finish), None
        return combined, self._event(False), _Hook(lambda group=st.group, h=handle.ep_handle: group.complete(h))

    def destroy(self) -> None:
        """COLLECTIVE (explicitly_destroy=True buffers): frees the nccl.ep groups (and get_local_buffer_tensor's
        memory, once its tensors are gone)."""
        if not self.explicitly_destroy:
            raise ValueError("Buffer.destroy: only for explicitly_destroy=True buffers")
        self._scratch = {}
        groups, self._groups = self._groups, {}
        for g in groups.values():
            g.close()
        ll, self._ll = self._ll, None
        if ll is not None:
            ll.close(self._ll_device)
        self._ranks.close()  # an mpi4py Buffer's NCCL communicator, after its groups

    # -- internals --------------------------------------------------------------------------------------------------
    def _need_low_latency(self, method: str) -> None:
        if not self.low_latency_mode:
            raise NcclInvalidUsage("Buffer.%s: this Buffer was made without low_latency_mode=True (DeepEP refuses "
                                   "it too)" % method)

    def _need_shrink(self, method: str) -> None:
        self._need_low_latency(method)
        if not self.enable_shrink:
            raise NcclInvalidUsage("Buffer.%s: this Buffer was made without enable_shrink=True (DeepEP asserts "
                                   "\"Shrink mode must be enabled\")" % method)

    def _active_ranks(self) -> list:
        """The rank mask (1 = active): the Low-Latency group's, read on the host, or the Buffer's before the group
        exists."""
        if self._ll is None:
            return list(self._ll_mask)
        return self._ll.group.mask_query().tolist()

    def _set_active_ranks(self, active) -> None:
        if self._ll is None:
            self._ll_mask = list(active)
        else:
            self._ll.group.mask_update(active)

    def _low_latency_group(self, m, hidden, num_experts, topk, device) -> _LowLatencyState:
        """The Low-Latency group for (M, hidden, num_experts) and at least top-k: the current one, or (collectively)
        a new one once every rank is seen to ask for the same, the previous one destroyed first."""
        key = (m, hidden, num_experts, topk)
        if self._ll is not None and self._ll.key[:3] == key[:3] and topk <= self._ll.key[3]:
            return self._ll
        both = torch.tensor(list(key) + [-v for v in key], dtype=torch.int64, device=device)
        self._ranks.all_reduce(both, "max")
        high, low = both[:4].tolist(), [-v for v in both[4:].tolist()]
        if high != low:
            raise NcclInvalidArgument(
                "low_latency_dispatch: (num_max_dispatch_tokens_per_rank, hidden, num_experts, num_topk) differ "
                "between ranks: from %s to %s; every rank must pass the same" % (tuple(low), tuple(high)))
        if self._ll is not None:
            if self.enable_shrink:  # the mask outlives the group: the new one starts from it
                self._ll_mask = self._active_ranks()
            old, self._ll = self._ll, None
            old.close(self._ll_device)
        group = Group(self._ranks.group_arg(), num_experts=num_experts, max_tokens_per_rank=m, hidden=hidden,
                      max_topk=topk, algorithm="low_latency", enable_mask=self.enable_shrink)
        if self.enable_shrink and not all(self._ll_mask):
            group.mask_update(self._ll_mask)
        self._ll, self._ll_device = _LowLatencyState(group, key, max(1, Buffer.num_low_latency_handles)), device
        return self._ll

    def _low_latency_state_of(self, handle, method: str = "low_latency_combine") -> _LowLatencyState:
        """The state a Low-Latency handle belongs to, refusing one of another Buffer, group or a reused slot."""
        if not isinstance(handle, _LowLatencyHandle):
            raise NcclInvalidArgument("%s: handle must come from low_latency_dispatch" % method)
        st = self._ll
        if handle.owner is not self:
            raise NcclInvalidUsage("%s: the handle comes from another Buffer's low_latency_dispatch" % method)
        if st is None or all(h is not handle.ep_handle for h in st.handles):
            raise NcclInvalidUsage("%s: the handle's dispatch is no longer bound: the Low-Latency "
                                   "group was made anew (other sizes) or destroyed since" % method)
        if st.seqs[handle.slot] != handle.seq:
            raise NcclInvalidUsage(
                "%s: the handle's dispatch is no longer bound: %d later low_latency_dispatch calls "
                "reused its nccl.ep handle (Buffer.num_low_latency_handles = %d dispatches stay valid at once)"
                % (method, self._ll_seq - handle.seq - 1, len(st.seqs)))
        return st

    @staticmethod
    def _wait(previous_event) -> None:
        if previous_event is not None and previous_event.event is not None:
            torch.cuda.current_stream().wait_event(previous_event.event)

    @staticmethod
    def _event(async_finish: bool) -> EventOverlap:
        return Buffer.capture() if async_finish else EventOverlap()

    @staticmethod
    def _rows(t, rows):
        return None if t is None else t[:rows]

    def _routing_by_rank(self, is_token_in_rank, num_experts):
        """A routing of one pseudo-expert (the first local one) per destination rank: the rows DeepEP sends when
        dispatch gets no top-k."""
        per_rank = num_experts // self.group_size
        ranks = torch.arange(self.group_size, device=is_token_in_rank.device, dtype=torch.int64) * per_rank
        return torch.where(is_token_in_rank, ranks, torch.full_like(ranks, -1))

    def _handle_entries(self, is_token_in_rank, config, rows, worst):
        """COLLECTIVE (with dispatch_handle_entries; above 8 ranks, a multiple of 8), on the current stream: DeepEP's
        intranode handle (no host sync) or its internode one (one host sync unless `worst`). What only other ranks
        know (their counts, their channel counts to this rank or its node, the tokens they sent) comes in one
        all-to-all of _handle_payload or _internode_payload rows."""
        r = self.group_size
        if not Buffer.dispatch_handle_entries or (r > _NVL_PEERS and r % _NVL_PEERS):
            return None
        channels = max(1, config.num_sms // 2)
        if r > _NVL_PEERS:
            return self._internode_entries(is_token_in_rank, channels, rows, worst)
        payload, channel_prefix, send_head = _handle_payload(is_token_in_rank, channels, max(1, self._caps[0]))
        received = torch.empty_like(payload)
        self._ranks.all_to_all(received, payload)
        rank_prefix, recv_channel_prefix, recv_src_idx = _handle_from_payloads(received, self.rank, channels, rows)
        return (rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head)

    def _internode_entries(self, is_token_in_rank, channels, rows, worst):
        max_tokens = max(1, self._caps[0])
        payload, rdma_prefix, gbl_prefix, send_rdma_head = _internode_payload(is_token_in_rank, channels, max_tokens)
        received = torch.empty_like(payload)
        self._ranks.all_to_all(received, payload)
        recv_rdma_channel, recv_rdma_rank, recv_gbl_channel, recv_gbl_rank, recv_src_meta, send_nvl_head = \
            _internode_from_payloads(received, self.rank, channels, rows, max_tokens)
        if not worst:  # DeepEP's size: the tokens forwarded through this rank (a host sync, as DeepEP's)
            send_nvl_head = send_nvl_head[:int(recv_rdma_rank[-1])]
        return (is_token_in_rank, rdma_prefix, gbl_prefix, recv_rdma_channel, recv_rdma_rank, recv_gbl_channel,
                recv_gbl_rank, recv_src_meta, send_rdma_head, send_nvl_head)

    def _x_out(self, recv, rows, scales):
        return (recv.tokens[:rows], recv.scales[:rows]) if scales is not None else recv.tokens[:rows]

    def _sms(self, num_sms: int) -> int:
        return max(1, min(num_sms, self._caps[3]))

    def _combine_input(self, x, ep_handle):
        """x with at least the rows the handle's dispatch output has (worst-case sizing: num_worst_tokens may be
        fewer than nccl.ep's worst case; the missing rows are zeros, a copy of x)."""
        need = ep_handle.output_rows()
        if x.shape[0] >= need:
            return x
        return torch.cat([x, x.new_zeros((need - x.shape[0],) + tuple(x.shape[1:]))])

    def _group_for(self, x, routing, num_experts) -> Group:
        """The nccl.ep group for `num_experts` (a group is made for one expert count; DeepEP's Buffer takes any):
        made collectively at the first dispatch with that count, sized by the capacity fixed at the very first."""
        row_bytes = x.shape[1] * x.element_size()
        if self._caps is None:  # collective: every rank's first dispatch
            need = torch.tensor([x.shape[0], row_bytes, routing.shape[1]], dtype=torch.int64, device=x.device)
            self._ranks.all_reduce(need, "max")
            t_max, b_max, k_max = (int(v) for v in need.tolist())
            self._caps = (max(Buffer.max_tokens_per_rank, t_max), max(Buffer.max_token_bytes, b_max, 16),
                          max(Buffer.max_topk, k_max), max(Buffer.num_sms, 2))
        for what, value, cap in (("tokens", x.shape[0], self._caps[0]), ("row bytes", row_bytes, self._caps[1]),
                                 ("top-k", routing.shape[1], self._caps[2])):
            if value > cap:
                raise NcclInvalidArgument(
                    "dispatch: %d %s exceed the nccl.ep group's %d, fixed at the first dispatch; set "
                    "Buffer.max_tokens_per_rank / max_token_bytes / max_topk before it" % (value, what, cap))
        group = self._groups.get(num_experts)
        if group is None:  # collective: every rank dispatches with the same expert counts in the same order
            cap = int(Buffer.max_recv_rows_per_rank)
            group = Group(self._ranks.group_arg(), num_experts=num_experts, max_tokens_per_rank=self._caps[0],
                          max_token_bytes=self._caps[1], max_topk=self._caps[2], num_sms=self._caps[3],
                          rail_staging_bytes_max=int(self.num_rdma_bytes),
                          **(dict(max_recv_rows_per_rank=cap, recv_overflow="drop") if cap else {}),
                          **({} if self._timeout_s is None else dict(timeout_s=self._timeout_s)))
            self._groups[num_experts] = group
        return group


_NVL_PEERS = 8  # DeepEP's NUM_MAX_NVL_PEERS: the GPUs of one of its nodes (an RDMA rank)


def _domain_size_guess(num_ranks: int) -> int:
    """The NVLink domain size a group of num_ranks ranks will likely have, for the size hints (static: no
    communicator to ask): NCCL_EXT_LSA_DOMAIN_SIZE, else the launcher's LOCAL_WORLD_SIZE (torchrun), else this
    machine's GPUs, else num_ranks; then the largest divisor of num_ranks not above it (domains tile the ranks)."""
    guess = 0
    for name in ("NCCL_EXT_LSA_DOMAIN_SIZE", "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            guess = int(value)
            break
    if not guess and torch.cuda.is_available():
        guess = torch.cuda.device_count()
    guess = max(1, min(guess or num_ranks, num_ranks))
    while num_ranks % guess:
        guess -= 1
    return guess


def _tokens_per_rdma_rank(is_token_in_rank):
    """DeepEP's num_tokens_per_rdma_rank from is_token_in_rank [T, R]: None up to 8 ranks (its intranode settings),
    else [R / 8] int32, how many tokens hit each block of 8 consecutive ranks."""
    t, r = is_token_in_rank.shape
    if r <= _NVL_PEERS:
        return None
    if r % _NVL_PEERS:
        raise NcclInvalidArgument("get_dispatch_layout: %d ranks: DeepEP's internode layout takes a multiple of %d"
                                  % (r, _NVL_PEERS))
    return is_token_in_rank.view(t, r // _NVL_PEERS, _NVL_PEERS).any(dim=2).sum(dim=0, dtype=torch.int32)


def _channel_counts(is_token_in_rank, channels: int):
    """(before, channel_prefix_matrix, send_head) of is_token_in_rank [T, D] (D destinations: ranks, or nodes) and C
    channels: before [T + 1, D] int32, [i][d] = tokens among 0..i-1 that go to d; channel_prefix_matrix [D, C],
    [d][c] = tokens of channels 0..c that go to d; send_head [T, D], a token's position among the tokens of its
    channel that go to d, -1 where it does not."""
    t, r = is_token_in_rank.shape
    dev = is_token_in_rank.device
    before = torch.zeros(t + 1, r, dtype=torch.int32, device=dev)
    torch.cumsum(is_token_in_rank.to(torch.int32), 0, dtype=torch.int32, out=before[1:])
    per = max(1, -(-t // channels))  # tokens per channel (DeepEP's get_channel_task_range)
    channel_end = (torch.arange(1, channels + 1, device=dev) * per).clamp(max=t)
    channel_prefix = before[channel_end].t().contiguous()
    channel_begin = torch.arange(t, device=dev) // per * per
    send_head = torch.where(is_token_in_rank, before[:t] - before[channel_begin], -1).to(torch.int32)
    return before, channel_prefix, send_head


def _handle_payload(is_token_in_rank, channels: int, max_tokens: int):
    """(payload, channel_prefix_matrix, send_head) of this rank's is_token_in_rank [T, R] (T <= max_tokens) and C
    channels. payload [R, R + C + max_tokens] int32, what this rank sends rank d in row d: its token counts to every
    rank [R], its channel_prefix_matrix row d [C], and the indices of its tokens that go to d in token order (then
    filler). channel_prefix_matrix [R, C] int32: [d][c] = tokens of channels 0..c that go to d. send_head [T, R]
    int32: a token's position among the tokens of its channel that go to d, -1 where it does not go to d. Static
    shapes: nothing waits on the host."""
    t, r = is_token_in_rank.shape
    before, channel_prefix, send_head = _channel_counts(is_token_in_rank, channels)
    payload = torch.full((r, r + channels + max_tokens), -1, dtype=torch.int32, device=is_token_in_rank.device)
    payload[:, :r] = before[t]
    payload[:, r:r + channels] = channel_prefix
    # A stable sort of "goes to d" first: the tokens to d in token order, then the others.
    order = torch.sort((~is_token_in_rank).t().to(torch.uint8), dim=1, stable=True).indices
    payload[:, r + channels:r + channels + t] = order
    return payload, channel_prefix, send_head


def _handle_from_payloads(received, rank: int, channels: int, rows: int):
    """The entries that need other ranks' tokens, from received [R, R + C + max_tokens] (row s: what rank s sent this
    rank, _handle_payload's row for it): rank_prefix_matrix [R, R] int32, recv_channel_prefix_matrix [R, C] int32 and
    recv_src_idx [rows] int32 (rows grouped by source rank in rank order, each source's in token order; -1 past the
    received ones)."""
    r = received.shape[0]
    counts = received[:, :r]  # [s][d]: tokens rank s sends rank d
    rank_prefix = counts.cumsum(0, dtype=torch.int32)
    recv_channel_prefix = torch.zeros(r, channels, dtype=torch.int32, device=received.device)
    recv_channel_prefix[:, 1:] = received[:, r:r + channels - 1]
    sources = received[:, r + channels:]
    end = rank_prefix[:, rank].long()
    begin = end - counts[:, rank]
    row = torch.arange(rows, device=received.device)
    src = torch.searchsorted(end, row, right=True)  # the source whose block holds the row; r past the last one
    valid = src < r
    src = src.clamp(max=r - 1)
    at = (row - begin[src]).clamp(0, sources.shape[1] - 1)
    recv_src_idx = torch.where(valid, sources[src, at], -1).to(torch.int32)
    return rank_prefix, recv_channel_prefix, recv_src_idx


def _internode_payload(is_token_in_rank, channels: int, max_tokens: int):
    """The internode handle's local part, for R = 8 N ranks (DeepEP's nodes of 8 GPUs, RDMA ranks), T tokens here
    (T <= max_tokens, at most 2^23) and C channels: (payload, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix,
    send_rdma_head). payload [R, 2 + 2 C + max_tokens] int32, what this rank sends rank d = 8 n + j in row d: its token
    count to d, its gbl_channel_prefix_matrix row d [C], its rdma_channel_prefix_matrix row n [C], T, then each of its
    tokens that goes to node n (to any of its ranks) in token order as t * 256 + the token's 8 bits over node n's
    ranks (then filler -1). rdma_channel_prefix_matrix [N, C]: [m][c] = tokens of channels 0..c that go to node m;
    gbl_channel_prefix_matrix [R, C]: the same per rank; send_rdma_head [T, N]: a token's position among the tokens
    of its channel that go to node m, -1 where it does not. Static shapes: nothing waits on the host."""
    t, r = is_token_in_rank.shape
    nodes = r // _NVL_PEERS
    dev = is_token_in_rank.device
    bits = is_token_in_rank.view(t, nodes, _NVL_PEERS).to(torch.int32)
    mask = (bits << torch.arange(_NVL_PEERS, device=dev, dtype=torch.int32)).sum(dim=2, dtype=torch.int32)  # [T, N]
    to_node = mask != 0
    _, gbl_prefix, _ = _channel_counts(is_token_in_rank, channels)
    node_payload, rdma_prefix, send_rdma_head = _handle_payload(to_node, channels, max_tokens)
    payload = torch.full((r, 2 + 2 * channels + max_tokens), -1, dtype=torch.int32, device=dev)
    node_of = torch.arange(r, device=dev) // _NVL_PEERS
    payload[:, 0] = is_token_in_rank.sum(dim=0, dtype=torch.int32)
    payload[:, 1:1 + channels] = gbl_prefix
    payload[:, 1 + channels:1 + 2 * channels] = rdma_prefix[node_of]
    payload[:, 1 + 2 * channels] = t
    order = node_payload[:, nodes + channels:nodes + channels + t].long()  # [N, T]: tokens to node m first
    entries = torch.where(to_node.t().gather(1, order), order * 256 + mask.t().gather(1, order).long(), -1)
    payload[:, 2 + 2 * channels:2 + 2 * channels + t] = entries[node_of].to(torch.int32)
    return payload, rdma_prefix, gbl_prefix, send_rdma_head


def _internode_from_payloads(received, rank: int, channels: int, rows: int, max_tokens: int):
    """The internode handle's entries that need other ranks' data, from received [R, 2 + 2 C + max_tokens] (row g:
    what rank g sent this rank, _internode_payload's row for it), this rank r = 8 n + l: recv_rdma_channel_prefix_matrix
    [N, C] (rank (m, l)'s tokens of channels 0..c to node n), recv_rdma_rank_prefix_sum [N] (inclusive over m of rank
    (m, l)'s tokens to node n), recv_gbl_channel_prefix_matrix [R, C] (the first row of rank g's channel c in recv_x),
    recv_gbl_rank_prefix_sum [R] (inclusive over g of rank g's tokens here), recv_src_meta [rows, 8] uint8 (per row,
    int32 source node and int32 bits over node n's ranks; -1 and 0 past the received rows) and send_nvl_head
    [N * max_tokens, 8] (per token this rank forwards for node n, by source node then token order: its position
    among the earlier tokens of its channel at the source that go to rank (n, j), -1 where it does not go there; the
    rows past the forwarded ones -1; the caller cuts it to recv_rdma_rank_prefix_sum[-1] rows)."""
    r = received.shape[0]
    nodes, dev = r // _NVL_PEERS, received.device
    n, lane = divmod(rank, _NVL_PEERS)
    counts = received[:, 0]
    gbl_prefix = counts.cumsum(0, dtype=torch.int32)
    begin = gbl_prefix - counts
    recv_gbl_channel = begin.unsqueeze(1).repeat(1, channels)
    recv_gbl_channel[:, 1:] += received[:, 1:channels]
    peers = torch.arange(nodes, device=dev) * _NVL_PEERS + lane  # the ranks with my local index, one a node
    recv_rdma_channel = received[peers, 1 + channels:1 + 2 * channels].contiguous()
    recv_rdma_rank = recv_rdma_channel[:, -1].cumsum(0, dtype=torch.int32)
    entries = received[:, 2 + 2 * channels:].long()  # [R, max_tokens], filler -1
    valid = entries >= 0
    bits = torch.where(valid, entries & 255, 0)
    # recv_src_meta: rank g's entries with my bit, in order, at rows begin[g] + their rank among them.
    mine = valid & ((bits >> lane) & 1).bool()
    at = torch.where(mine, begin.long().unsqueeze(1) + mine.long().cumsum(1) - 1, rows)
    meta = torch.zeros(rows + 1, 2, dtype=torch.int32, device=dev)
    meta[:, 0] = -1
    source_node = (torch.arange(r, device=dev) // _NVL_PEERS).to(torch.int32).unsqueeze(1).expand_as(at)
    meta[:, 0].scatter_(0, at.clamp(max=rows).reshape(-1), source_node.reshape(-1))
    meta[:, 1].scatter_(0, at.clamp(max=rows).reshape(-1), bits.to(torch.int32).reshape(-1))
    meta = meta[:rows]
    recv_src_meta = meta.contiguous().view(torch.uint8).view(rows, 8)
    # send_nvl_head: the tokens ranks (m, l) send node n, m ascending, each in token order.
    fwd = entries[peers]  # [N, max_tokens]
    fwd_valid = fwd >= 0
    token = torch.where(fwd_valid, fwd >> 8, 0)
    source_tokens = received[peers, 1 + 2 * channels].long().unsqueeze(1)  # T of each source
    per = (source_tokens + channels - 1).div(channels, rounding_mode="floor").clamp(min=1)
    channel = torch.where(fwd_valid, token // per, channels)  # filler after every channel: rows stay sorted
    first = torch.searchsorted(channel.contiguous(), channel.contiguous())  # each entry's channel's first entry
    hit = (((fwd & 255).unsqueeze(2) >> torch.arange(_NVL_PEERS, device=dev)) & 1) * fwd_valid.unsqueeze(2)
    before = hit.cumsum(1) - hit  # [N, max_tokens, 8]: entries before this one with bit j
    value = before - before.gather(1, first.unsqueeze(2).expand_as(before))
    value = torch.where(hit.bool(), value, -1).to(torch.int32)
    start = (recv_rdma_rank - recv_rdma_channel[:, -1]).long().unsqueeze(1)
    row = torch.where(fwd_valid, start + torch.arange(fwd.shape[1], device=dev), nodes * fwd.shape[1])
    send_nvl_head = torch.full((nodes * fwd.shape[1] + 1, _NVL_PEERS), -1, dtype=torch.int32, device=dev)
    send_nvl_head.index_copy_(0, row.reshape(-1), value.reshape(-1, _NVL_PEERS))
    return (recv_rdma_channel, recv_rdma_rank, recv_gbl_channel.to(torch.int32), gbl_prefix, recv_src_meta,
            send_nvl_head[:-1])


def _pack_ue8m0(scales, out) -> None:
    """DeepEP's UE8M0 scale layout, on the current stream: scales [L, N, G] fp32 powers of two (one per 128 columns,
    G % 4 == 0) into out [L, G / 4, N, 4] uint8, which viewed as int32 [L, G / 4, N] and transposed is DeepEP's [L, N,
    G / 4] int32 with column-major last two dims: int32 (l, n, p) holds the exponent bytes (float bits >> 23) of
    scales g = 4p .. 4p + 3 of row n, g = 4p in the low byte."""
    l, n, g = scales.shape
    exponent = torch.bitwise_and(scales.view(torch.int32) >> 23, 0xFF)
    out.copy_(exponent.view(l, n, g // 4, 4).permute(0, 2, 1, 3))


def _shape_dtype(t) -> str:
    if isinstance(t, torch.Tensor):
        return "%s %s" % (list(t.shape), t.dtype)
    return type(t).__name__


def _check_finish_flags(method: str, async_finish, return_recv_hook) -> None:
    if async_finish and return_recv_hook:
        raise NcclInvalidArgument("%s: async_finish and return_recv_hook together (DeepEP refuses them too): the "
                                  "hook is the way to wait" % method)


def _check_cost_stats(method: str, name: str, stats, num_ranks: int) -> None:
    """DeepEP's checks of a *_wait_recv_cost_stats tensor: int64, [num_ranks], contiguous (None: not asked for)."""
    if stats is None:
        return
    if (not isinstance(stats, torch.Tensor) or stats.dtype != torch.int64 or tuple(stats.shape) != (num_ranks,)
            or not stats.is_contiguous()):
        strided = isinstance(stats, torch.Tensor) and not stats.is_contiguous()
        raise NcclInvalidArgument("%s: %s must be a contiguous [%d] int64 tensor; got %s%s"
                                  % (method, name, num_ranks, _shape_dtype(stats), " (strided)" if strided else ""))


def _check_low_latency_sizes(method: str, m, hidden, num_experts, num_ranks) -> None:
    for name, value in (("num_max_dispatch_tokens_per_rank", m), ("hidden", hidden), ("num_experts", num_experts),
                        ("num_ranks", num_ranks)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise NcclInvalidArgument("%s: %s must be an int; got %r" % (method, name, value))
    if num_ranks < 1:
        raise NcclInvalidArgument("%s: num_ranks %d < 1" % (method, num_ranks))
    if not 1 <= m <= _LL_MAX_TOKENS:
        raise NcclInvalidArgument("%s: num_max_dispatch_tokens_per_rank %d not in [1, %d] (nccl.ep's Low-Latency "
                                  "mode)" % (method, m, _LL_MAX_TOKENS))
    if hidden < 1:
        raise NcclInvalidArgument("%s: hidden %d < 1" % (method, hidden))
    if num_experts < 1 or num_experts % num_ranks:
        raise NcclInvalidArgument("%s: %d experts do not divide among %d ranks" % (method, num_experts, num_ranks))
