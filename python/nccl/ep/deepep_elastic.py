"""DeepEP V2's `deep_ep.ElasticBuffer` API on nccl.ep's High-Throughput mode:

    from nccl.ep.deepep import ElasticBuffer, EPHandle

Code written for DeepEP V2's expert-parallel calls runs unchanged: `ElasticBuffer(group, num_bytes)` or
`ElasticBuffer(group, num_max_tokens_per_rank=..., hidden=..., num_topk=...)`, `dispatch`, `combine`, `barrier`,
`capture`, `destroy`, `get_buffer_size_hint`, the domain sizes and `get_theoretical_num_sms`, with `EPHandle`,
`EventHandle` and `EventOverlap`; the same return tuples, shapes, dtypes and meanings. How the calls map:

- dispatch binds its routing to an nccl.ep handle of the buffer's group for `num_experts` (one group an expert
  count, made at the first dispatch with it, collectively, by nccl.ep.deepep.Buffer's group logic): FLAT without
  `do_expand` (a row per (token, this rank), grouped by source rank, tokens in source order), EXPERT_MAJOR with it
  (a row per (token, local expert), zones by local expert aligned to `expert_alignment`, rows by (source rank,
  token) inside). `do_cpu_sync=True` (the default without a handle) is EXACT sizing: one host wait for the receive
  count, at binding, and outputs of exactly the received rows; False is WORST_CASE sizing: no host wait, outputs of
  the most rows any routing gives (rows past the received ones unspecified), `num_recv_tokens_per_expert_list` [].
  Both orders are DeepEP's deterministic one (sorted by source rank, then token), so `deterministic=True` changes
  nothing here.
- A dispatch is one nccl.ep dispatch of x whose per-token side words (nccl.ep's High-Throughput scales, forwarded
  bit for bit) are x's fp8 scales, then a routing row: its global index (rank * num_max_tokens_per_rank + token),
  its top-k ids and, if given, its top-k weights. From it come `recv_topk_weights` (every top-k column, as
  DeepEP's), the handle's `recv_src_metadata` and each expanded row's top-k column. nccl.ep never carries the
  weights itself, so that its EXPERT_MAJOR combine sums rows unweighted, as DeepEP's combine does. A cached
  dispatch (`handle=`) carries the weights, if given, as its side words.
- combine returns every row to its token's owner, DeepEP V2's way to the bit: without `do_expand` each row is a (token,
  rank) part as given; with it, each rank first sums its rows of a token in top-k column order (fp32, rounded to
  bf16: `allow_multiple_reduction=True`); the owner sums the parts in fp32 from the bias (one tensor, or two added
  in fp32) or 0, in the order of the last top-k column of each rank, and rounds once (nccl.ep's High-Throughput
  combine with `bias`). Expanded without multiple reduction, the rows move as fp32 (column slices of the group's row
  size), each rank's part unrounded, the biases added after. `topk_weights` come back to their top-k columns, each
  from the rank that holds that column's expert (0 for columns without one).
- Calls run on the current stream (there is no communication stream): `previous_event` and
  `previous_event_before_epilogue` are waited on first; with `async_with_compute_stream` the returned EventOverlap
  holds an event recorded after the call. `allocate_on_comm_stream`, `num_qps`, `do_zero_padding` (nccl.ep zeroes
  every pad row, its scales and weights) change nothing.
- The group holds `num_max_tokens_per_rank` tokens of `hidden` bf16 columns (fp8 rows are smaller; rows of hidden
  below 128 x (1 + 2 top-k) are widened to hold the side words, a word per 128 bytes) and max(num_topk, 8) top-k
  entries; a buffer sized by `num_bytes` alone fixes them at its first dispatch (collective:
  the largest token count, row and top-k of any rank). `num_bytes` itself is not a limit: nccl.ep sizes its window
  (get_buffer_size_hint says how much memory that is).

`num_gpu_timeout_secs` (100 by default, as DeepEP's) bounds every device wait of the buffer's groups (their
`timeout_s`: a rank that does not arrive within it fails the call with an error; NCCL_EXT_TIMEOUT_S does not apply).
Accepted where they change no result: `deterministic`, `prefer_overlap_with_compute`, `sl_idx`,
`num_allocated_qps`, `num_cpu_timeout_secs`, `use_fp8_dispatch` (sizing only), `num_qps`,
`allocate_on_comm_stream`, `do_zero_padding`; `use_tma_aligned_col_major_sf=True` returns the scales copied into
DeepEP's column-major layout (rows padded to 4). `allow_hybrid_mode` decides what get_logical_domain_size reports:
(NVLink domains, ranks a domain), or (1, ranks) without it; across several domains of several ranks DeepEP's hybrid
combine rounds each domain's sum to bf16 once more, which nccl.ep does not (the last bit may differ from DeepEP's
hybrid mode, not from its direct mode). Raise NotImplementedError naming themselves: `num_cpu_bytes` > 0, the
Engram, PP and AGRS methods and their size hints. `get_comm_stream` returns the caller's current stream. `do_expand`
takes any `expert_alignment` of 1..1024 (DeepGEMM's M tile: 128, or 224 on sm_100). fp8 scales are fp32 or
UE8M0-packed int32, forwarded bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import NcclError, NcclInvalidArgument, _combine_weights, query_group_info
from . import deepep as _v1
from .deepep import _shape_dtype, _unsupported

__all__ = ["ElasticBuffer", "EPHandle", "EventHandle", "EventOverlap"]

_BUFFER_ALIGNMENT = 2 << 20  # DeepEP's buffer sizes are multiples of 2 MiB
_TMA_ROWS = 4                # fp32 scale packs of a 16-byte TMA row: the column-major layout pads rows to this
_NO_TOKEN = 2**62            # sort key of rows that stand for no received token (past every global index)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


class EventHandle:
    """DeepEP's EventHandle: a CUDA event recorded on the current stream when made (ElasticBuffer.capture())."""

    def __init__(self):
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)


class EventOverlap(_v1.EventOverlap):
    """DeepEP V2's EventOverlap: `event` is an EventHandle (None when the call was not async);
    `current_stream_wait(release_handle=False)` makes the current stream wait for it, then runs the hook registered
    with `register_hook_after_wait` (once), and with release_handle drops the event; `with ev:` or
    `with ev(release_handle=True):` wait on leaving."""

    def __init__(self, event=None, extra_tensors=None):
        super().__init__(event, extra_tensors)
        self.hook_after_wait = None
        self._release_on_exit = False

    def current_stream_wait(self, release_handle: bool = False) -> None:
        if self.event is None:
            raise ValueError("EventOverlap.current_stream_wait: no event (the call was not async)")
        self.event.current_stream_wait()
        hook, self.hook_after_wait = self.hook_after_wait, None
        if hook is not None:
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait) -> None:
        if self.hook_after_wait is not None:
            raise ValueError("EventOverlap.register_hook_after_wait: a hook is registered already")
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        self._release_on_exit = release_handle
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_on_exit)
        self._release_on_exit = False
        return False


def _wait(event) -> None:
    """The current stream waits for `event`: an EventHandle, an EventOverlap (V1's or V2's) or a torch CUDA event
    (None, or an EventOverlap without an event: nothing)."""
    if isinstance(event, _v1.EventOverlap):
        event = event.event
    if event is None:
        return
    if isinstance(event, EventHandle):
        event.current_stream_wait()
    else:
        torch.cuda.current_stream().wait_event(event)


def _device_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


class EPHandle:
    """What dispatch returns as `handle`, with DeepEP's attributes (R ranks, L local experts, K top-k, a = the
    alignment, N = num_recv_tokens, the received tokens in order of their global index):
      do_expand, num_experts, expert_alignment, num_max_tokens_per_rank, num_sms; topk_idx (the routing, a copy
      with do_handle_copy);
      num_recv_tokens              N: exact (do_cpu_sync) or the worst case (R x the group's tokens a rank);
      num_expanded_tokens          the expanded rows: exact (sum of aligned counts) or the worst-case output rows;
      num_recv_tokens_per_expert_list  aligned counts per local expert (a host list; [] without CPU sync);
      psum_num_recv_tokens_per_scaleup_rank  [scaleup ranks] int32, inclusive prefix sum of the received tokens by
                                   source rank index inside a domain (get_logical_domain_size's second number);
      psum_num_recv_tokens_per_expert  [L] int32: inclusive prefix sum of the aligned counts (not expanded); expanded:
                                   zone start + count (align(psum[i - 1], a) is zone i's start);
      num_unaligned_recv_tokens_per_expert  [L] int32: the counts;
      recv_src_metadata            [N, K + 2] int32: token global index (source rank * num_max_tokens_per_rank +
                                   token), source rank * K + its first top-k column with an expert here, then
                                   (expanded) each column's row in the expanded output (-1: no expert here; not
                                   expanded: -1); rows past the received tokens: -1;
      dst_buffer_slot_idx          [T, K] int32: each token's position among this rank's tokens that go to the rank
                                   of that column's expert (its row inside this rank's block there), -1 for none;
      token_metadata_at_forward, channel_linked_list: None (DeepEP's hybrid kernels' state).
    Pass it to combine, or to dispatch as a cached handle (same layout)."""

    def __init__(self, **fields):
        self.token_metadata_at_forward = self.channel_linked_list = None
        self.__dict__.update(fields)

    def __repr__(self):
        return "EPHandle(do_expand=%s, num_experts=%d, num_recv_tokens=%d)" % (
            self.do_expand, self.num_experts, self.num_recv_tokens)


class ElasticBuffer:
    """DeepEP V2's ElasticBuffer on nccl.ep (see the module's docstring). COLLECTIVE over `group` (a torch
    ProcessGroup): finds the NVLink domains with a one-row nccl.ep group, made and closed here."""

    def __init__(self, group, num_bytes: int | None = None, num_cpu_bytes: int = 0, num_max_tokens_per_rank: int = 0,
                 hidden: int = 0, num_topk: int = 0, use_fp8_dispatch: bool = False, deterministic: bool = False,
                 allow_hybrid_mode: bool = True, allow_multiple_reduction: bool = True,
                 prefer_overlap_with_compute: bool = True, sl_idx: int = 3, num_allocated_qps: int = 0,
                 num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100, explicitly_destroy: bool = False):
        if num_cpu_bytes:
            raise _unsupported("ElasticBuffer(num_cpu_bytes=%d) (host memory, DeepEP's Engram storage)" % num_cpu_bytes)
        self.group = group
        self.rank_idx, self.num_ranks = dist.get_rank(group), dist.get_world_size(group)
        self.allow_hybrid_mode, self.allow_multiple_reduction = allow_hybrid_mode, allow_multiple_reduction
        self.prefer_overlap_with_compute, self.deterministic = prefer_overlap_with_compute, deterministic
        self.num_max_tokens_per_rank, self.num_allocated_qps = num_max_tokens_per_rank, num_allocated_qps
        self.explicitly_destroy = explicitly_destroy
        if not isinstance(num_gpu_timeout_secs, int) or isinstance(num_gpu_timeout_secs, bool) or \
                num_gpu_timeout_secs <= 0:
            raise NcclInvalidArgument("ElasticBuffer: num_gpu_timeout_secs=%r: a positive int of seconds"
                                      % (num_gpu_timeout_secs,))
        # nccl.ep.deepep.Buffer keeps the groups, one an expert count, made at the first dispatch with each.
        self._core = _v1.Buffer(group, 0, 0, explicitly_destroy=True)
        self._core._timeout_s = num_gpu_timeout_secs  # every device wait of its groups, as DeepEP's kernels' waits
        if num_max_tokens_per_rank > 0 and hidden > 0:
            self._core._caps = _capacity(num_max_tokens_per_rank, hidden * 2, num_topk)
        if num_bytes is None:
            num_bytes = (self.get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk)
                         if self._core._caps is not None else 0)
        self.num_bytes = num_bytes
        probe = _v1.Group(group, num_experts=self.num_ranks, max_tokens_per_rank=1, max_token_bytes=16, max_topk=1)
        try:
            info = probe.info()
        finally:
            probe.close()
        self.num_rdma_ranks, self.num_nvlink_ranks = info["n_domains"], info["domain_size"]
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks

    # -- sizes and helpers ------------------------------------------------------------------------------------------
    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
                             use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        """Local, no GPU: the device memory of an nccl.ep group made for these sizes on `group`'s ranks, its window
        and rail staging (ncclEpGroupInfoQuery through nccl.ep.query_group_info), aligned to 2 MiB. The host cannot
        see how the ranks split into NVLink domains: this is the largest over every split (one domain holds no rail
        staging; domains of one rank the most). Rows are bf16 (fp8 dispatch uses the same window), the expert count
        the largest a group takes (its share of the window is a few bytes an expert)."""
        n = dist.get_world_size(group)
        args = dict(num_experts=1024 // n * n, max_tokens_per_rank=num_max_tokens_per_rank,
                    max_token_bytes=_capacity(num_max_tokens_per_rank, hidden * 2, num_topk)[1],
                    max_topk=_capacity(1, 16, num_topk)[2])
        sizes, failure = [], None
        for lsa in (d for d in range(1, n + 1) if n % d == 0):
            try:
                info = query_group_info(n, lsa, **args)
            except NcclError as e:  # a split NCCL_EXT_LSA_DOMAIN_SIZE refuses
                failure = e
                continue
            sizes.append(info["window_bytes"] + info["rail_staging_bytes"])
        if not sizes:
            raise failure
        return _align(max(sizes), _BUFFER_ALIGNMENT)

    def get_physical_domain_size(self) -> tuple:
        """(NVLink domains, ranks a domain) of nccl.ep's groups on this buffer's ranks (NCCL's LSA teams)."""
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self) -> tuple:
        """(scaleout ranks, scaleup ranks): the physical domains with allow_hybrid_mode, else (1, ranks)."""
        if self.allow_hybrid_mode:
            return self.num_rdma_ranks, self.num_nvlink_ranks
        return 1, self.num_rdma_ranks * self.num_nvlink_ranks

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, num_scaleout_topk: int = 0,
                                rdma_gbs: float = 0, nvlink_gbs: float = 0, sm_read_gbs: float = 200,
                                sm_write_gbs: float = 50) -> int:
        """The SMs of nccl.ep's calls when none are asked for: 64, or the GPU's SMs if fewer (nccl.ep's kernels
        fill each SM they take; the bandwidth model's arguments are accepted and not used)."""
        return min(64, _device_sms())

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        """0: nccl.ep opens no RDMA queue pairs of its own (NCCL's transports carry its traffic between domains)."""
        return 0

    @staticmethod
    def capture() -> EventHandle:
        return EventHandle()

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True) -> None:
        """COLLECTIVE: a one-element all-reduce over the buffer's group, ordered on the current stream (with
        with_cpu_sync, the device is synchronised before and after)."""
        if with_cpu_sync:
            torch.cuda.synchronize()
        dist.all_reduce(torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device())), group=self.group)
        if with_cpu_sync:
            torch.cuda.synchronize()

    def destroy(self) -> None:
        """COLLECTIVE (explicitly_destroy=True buffers): frees the nccl.ep groups."""
        if not self.explicitly_destroy:
            raise ValueError("ElasticBuffer.destroy: only for explicitly_destroy=True buffers")
        self._core.destroy()

    def get_comm_stream(self):
        """DeepEP's communication stream: the caller's current stream, where nccl.ep's calls run (Buffer's)."""
        return torch.cuda.current_stream()

    # -- dispatch ---------------------------------------------------------------------------------------------------
    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts: int | None = None, num_max_tokens_per_rank: int | None = None,
                 expert_alignment: int | None = None, num_sms: int = 0, num_qps: int = 0, previous_event=None,
                 previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle: EPHandle | None = None, do_handle_copy: bool = True,
                 do_cpu_sync: bool | None = None, do_expand: bool = False, do_zero_padding: bool = False,
                 use_tma_aligned_col_major_sf: bool = False):
        """COLLECTIVE, on the current stream: (recv_x, recv_topk_idx, recv_topk_weights, handle, event), as DeepEP
        V2's. x [T, H] bf16, or (x e4m3 [T, H], scales [T, S] fp32, or int32: UE8M0, four a word); topk_idx [T, K]
        int64 (-1: none), topk_weights [T, K] fp32. recv_x: [N, H] (each received token once, by global index) or,
        with do_expand, [rows, H] (zone e holds expert e's tokens by global index, aligned to expert_alignment, pad
        rows zero), fp8 with its scales; recv_topk_idx [N, K] int64 local expert ids (-1 elsewhere; None with
        do_expand); recv_topk_weights [N, K] fp32 (every column) or, expanded, [rows] (each row's column's weight, 0
        on pads), None without topk_weights. Rows past the received ones (do_cpu_sync=False): recv_topk_idx -1,
        weights 0, recv_x unspecified. A cached dispatch (handle=, topk_idx None, no CPU sync) moves x (and
        topk_weights if given) along the handle's routing and returns that handle."""
        _wait(previous_event)
        _wait(previous_event_before_epilogue)
        x, sf = x if isinstance(x, tuple) else (x, None)
        sf = _forwardable_scales(sf)
        if do_zero_padding and not do_expand:
            raise NcclInvalidArgument("dispatch: do_zero_padding is for do_expand=True (DeepEP asserts it too)")
        if handle is not None:
            recv_x, recv_idx, recv_w = self._cached_dispatch(handle, x, sf, topk_idx, topk_weights, num_experts,
                                                             num_max_tokens_per_rank, expert_alignment, num_sms,
                                                             do_cpu_sync, do_expand, cumulative_local_expert_recv_stats)
        else:
            recv_x, recv_idx, recv_w, handle = self._dispatch(
                x, sf, topk_idx, topk_weights, num_experts, num_max_tokens_per_rank, expert_alignment, num_sms,
                do_cpu_sync, do_expand, do_handle_copy, cumulative_local_expert_recv_stats)
        if sf is not None:
            scales = recv_x[1]
            if use_tma_aligned_col_major_sf:
                scales = _tma_col_major(scales)
            recv_x = (recv_x[0], scales)
        return recv_x, recv_idx, recv_w, handle, self._event(async_with_compute_stream)

    def _dispatch(self, x, sf, topk_idx, topk_weights, num_experts, m, alignment, num_sms, do_cpu_sync, do_expand,
                  do_handle_copy, stats):
        if topk_idx is None or num_experts is None:
            raise NcclInvalidArgument("dispatch: without a handle, topk_idx and num_experts are required")
        _check_routing(x, topk_idx, topk_weights)
        alignment = alignment or 1
        if num_experts % self.num_ranks:
            raise NcclInvalidArgument("dispatch: %d experts do not divide among %d ranks"
                                      % (num_experts, self.num_ranks))
        if do_expand and not 1 <= alignment <= 1024:
            raise NcclInvalidArgument("dispatch: expert_alignment %d with do_expand: nccl.ep aligns expert zones to "
                                      "1..1024 rows" % alignment)
        m = m or self.num_max_tokens_per_rank
        if m and x.shape[0] > m:
            raise NcclInvalidArgument("dispatch: %d tokens exceed num_max_tokens_per_rank %d" % (x.shape[0], m))
        group = self._group(x, topk_idx, num_experts, m or x.shape[0])
        m = m or self._core._caps[0]
        k = topk_idx.shape[1]
        num_sms = num_sms or self.get_theoretical_num_sms(num_experts, k)
        exact = True if do_cpu_sync is None else bool(do_cpu_sync)
        ep = group.create_handle(topk_idx, layout="expert_major" if do_expand else "flat",
                                 sizing="exact" if exact else "worst_case", alignment=alignment if do_expand else 1)
        # One nccl.ep dispatch: x, with its scales and each token's routing row as side words beside it.
        recv, sf_out, meta = _dispatch_with_words(group, ep, x, sf, _routing_rows(topk_idx, topk_weights,
                                                                                  self.rank_idx * m), num_sms)
        fields = dict(do_expand=do_expand, num_experts=num_experts, expert_alignment=alignment,
                      num_max_tokens_per_rank=m, num_sms=num_sms,
                      topk_idx=topk_idx.clone() if do_handle_copy else topk_idx, _ep=ep,
                      dst_buffer_slot_idx=_dst_slots(topk_idx, num_experts // self.num_ranks, self.num_ranks),
                      num_unaligned_recv_tokens_per_expert=ep.expert_counts)
        weights = topk_weights is not None
        if do_expand:
            out = self._expanded(ep, meta, k, m, exact, weights, fields)
        else:
            out = self._flat(ep, recv, meta, k, m, weights, fields)
        counts = ep.expert_counts
        aligned = (counts + (alignment - 1)) // alignment * alignment
        if not do_expand:
            fields["psum_num_recv_tokens_per_expert"] = aligned.cumsum(0, dtype=torch.int32)
        fields["num_recv_tokens_per_expert_list"] = aligned.tolist() if exact else []
        rows = recv.tokens.shape[0]
        if exact:
            fields["num_expanded_tokens"] = sum(fields["num_recv_tokens_per_expert_list"])
        else:
            worst = self.num_ranks * group.max_tokens_per_rank * min(k, group.local_experts)
            fields["num_expanded_tokens"] = rows if do_expand else _align(worst + (alignment - 1) * len(aligned),
                                                                           alignment)
        if stats is not None:
            _add_stats(stats, counts)
        recv_x = (recv.tokens, sf_out) if sf is not None else recv.tokens
        return (recv_x,) + out + (EPHandle(**fields),)

    def _flat(self, ep, recv, meta, k, m, weights, fields):
        """(recv_topk_idx, recv_topk_weights) of a FLAT dispatch, and the handle's fields from its routing rows."""
        rows = recv.tokens.shape[0]
        received = _received(ep, rows).squeeze(1)
        recv_idx = torch.where(received.unsqueeze(1), recv.topk_idx.long(), -1)
        local = recv_idx >= 0
        src = meta[:, 0]
        first = local.int().argmax(1).int()
        metadata = torch.full((rows, k + 2), -1, dtype=torch.int32, device=meta.device)
        metadata[:, 0] = torch.where(received, src, -1)
        metadata[:, 1] = torch.where(received, src // m * k + first, -1)
        fields.update(num_recv_tokens=rows, recv_src_metadata=metadata, _local=local,
                      psum_num_recv_tokens_per_scaleup_rank=self._scaleup_psum(ep.rank_counts))
        return recv_idx, _row_weights(meta, k, received) if weights else None

    def _expanded(self, ep, meta, k, m, exact, weights, fields):
        """(None, recv_topk_weights) of an EXPERT_MAJOR dispatch, and the handle's fields: which row is which
        (token, top-k column), from the zones and the routing rows, on the device (one host wait when exact, for the
        received token count)."""
        rows, dev = meta.shape[0], meta.device
        counts, offsets = ep.expert_counts.long(), ep.expert_offsets.long()
        local = counts.shape[0]
        r = torch.arange(rows, device=dev)
        zone = (torch.searchsorted(offsets, r, right=True) - 1).clamp(min=0)
        topk = meta[:, 1:1 + k]
        hit = topk == (self.rank_idx * local + zone).unsqueeze(1)
        valid = (r < offsets[zone] + counts[zone]) & hit.any(1)
        col = torch.where(valid, hit.int().argmax(1), -1)  # the row's top-k column
        mine = (topk >= self.rank_idx * local) & (topk < (self.rank_idx + 1) * local)
        first_col = mine.int().argmax(1)
        first = valid & (col == first_col)  # one row per received token: its first column with an expert here
        src = meta[:, 0].long()
        keys, order = torch.sort(torch.where(first, src, _NO_TOKEN), stable=True)
        n = int(first.sum()) if exact else self.num_ranks * ep.group.max_tokens_per_rank
        tokens = keys[:n]
        received = tokens != _NO_TOKEN
        at = torch.where(valid, torch.searchsorted(tokens, src), n)  # each row's token
        slots = torch.full(((n + 1) * k,), -1, dtype=torch.int32, device=dev)  # row n: invalid rows' spare
        slots.scatter_(0, at * k + col.clamp(min=0), r.int())
        metadata = torch.full((n, k + 2), -1, dtype=torch.int32, device=dev)
        metadata[:, 0] = torch.where(received, tokens, -1).int()
        metadata[:, 1] = torch.where(received, tokens // m * k + first_col[order[:n]], -1).int()
        metadata[:, 2:] = slots.view(n + 1, k)[:n]
        ranks = self.num_ranks
        per_source = torch.zeros(ranks + 1, dtype=torch.int32, device=dev)
        per_source.scatter_add_(0, torch.where(first, src // m, ranks), first.int())
        fields.update(num_recv_tokens=n, recv_src_metadata=metadata, _col=col,
                      psum_num_recv_tokens_per_expert=(offsets + counts).int(),
                      psum_num_recv_tokens_per_scaleup_rank=self._scaleup_psum(per_source[:ranks]))
        if not weights:
            return None, None
        w = meta[:, 1 + k:1 + 2 * k].view(torch.float32).gather(1, col.clamp(min=0).unsqueeze(1)).squeeze(1)
        return None, torch.where(valid, w, 0.0)

    def _cached_dispatch(self, handle, x, sf, topk_idx, topk_weights, num_experts, m, alignment, num_sms, do_cpu_sync,
                         do_expand, stats):
        if not isinstance(handle, EPHandle):
            raise NcclInvalidArgument("dispatch: handle must come from ElasticBuffer.dispatch")
        if topk_idx is not None or do_cpu_sync:
            raise NcclInvalidArgument("dispatch: a cached dispatch (handle given) takes no topk_idx and does no CPU "
                                      "sync (DeepEP asserts both)")
        for name, given, held in (("num_experts", num_experts, handle.num_experts),
                                  ("num_max_tokens_per_rank", m, handle.num_max_tokens_per_rank),
                                  ("expert_alignment", alignment, handle.expert_alignment),
                                  ("do_expand", do_expand, handle.do_expand)):
            if given is not None and given != held:
                raise NcclInvalidArgument("dispatch: %s=%s, the handle's is %s (a cached dispatch keeps its "
                                          "handle's)" % (name, given, held))
        ep = handle._ep
        group = ep.group
        num_sms = num_sms or handle.num_sms
        _check_routing(x, handle.topk_idx, topk_weights)
        # One nccl.ep dispatch: x, with its scales and the weights (if given) as side words beside it.
        w = None if topk_weights is None else topk_weights.float().contiguous().view(torch.int32)
        recv, sf_out, moved = _dispatch_with_words(group, ep, x, sf, w, num_sms)
        rows = recv.tokens.shape[0]
        recv_w = None
        if topk_weights is not None:
            moved = moved.view(torch.float32)
            if handle.do_expand:
                col = handle._col
                recv_w = torch.where(col >= 0, moved.gather(1, col.clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
            else:
                recv_w = moved.masked_fill(~_received(ep, rows), 0.0)
        recv_idx = None
        if not handle.do_expand:
            recv_idx = torch.where(_received(ep, rows), recv.topk_idx.long(), -1)
        if stats is not None:
            _add_stats(stats, handle.num_unaligned_recv_tokens_per_expert)
        recv_x = (recv.tokens, sf_out) if sf is not None else recv.tokens
        return recv_x, recv_idx, recv_w

    # -- combine ----------------------------------------------------------------------------------------------------
    def combine(self, x, handle: EPHandle, topk_weights=None, bias=None, num_sms: int = 0, num_qps: int = 0,
                previous_event=None, previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                allocate_on_comm_stream: bool = False):
        """COLLECTIVE, on the current stream: (combined_x [T, H] bf16, combined_topk_weights [T, K] fp32 or None,
        event), as DeepEP V2's. x: bf16 rows in the dispatch output's layout (rows past the received ones and pad
        rows are not read): not expanded, one row per received token (this rank's part of its sum); expanded, one
        row per (token, local expert), summed here first (see the module's docstring for the rounding). topk_weights:
        [N, K] (not expanded) or [rows] (expanded) fp32, each returned to its top-k column. bias: [T, H] bf16, or two,
        added in fp32."""
        _wait(previous_event)
        _wait(previous_event_before_epilogue)
        if not isinstance(handle, EPHandle):
            raise NcclInvalidArgument("combine: handle must come from ElasticBuffer.dispatch")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
            raise NcclInvalidArgument("combine: x must be a [rows, hidden] bfloat16 tensor (DeepEP's); got %s"
                                      % _shape_dtype(x))
        ep = handle._ep
        k = handle.topk_idx.shape[1]
        want_w = tuple(handle._col.shape) if handle.do_expand else (x.shape[0], k)
        bad_w = not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != want_w
        if topk_weights is not None and (bad_w or not topk_weights.is_floating_point()):
            raise NcclInvalidArgument("combine: topk_weights must be %s floats (%s); got %s"
                                      % (list(want_w), "one a row of the expanded dispatch" if handle.do_expand
                                         else "x's rows by the top-k columns", _shape_dtype(topk_weights)))
        group, num_sms = ep.group, num_sms or handle.num_sms
        y = self._core._combine_input(x, ep)
        biases = [] if bias is None else list(bias) if isinstance(bias, tuple) else [bias]
        for b in biases:
            if not isinstance(b, torch.Tensor) or tuple(b.shape) != (ep.num_tokens, x.shape[1]):
                raise NcclInvalidArgument("combine: bias must be [%d, %d]; got %s"
                                          % (ep.num_tokens, x.shape[1], _shape_dtype(b)))
        if self.allow_multiple_reduction or not handle.do_expand:
            # DeepEP's own order and roundings (nccl.ep's High-Throughput combine): each rank's part rounded to bf16,
            # then, from the bias, the parts in the order of the last top-k column of each rank.
            first = None if not biases else biases[0] if len(biases) == 1 else biases[0].float() + biases[1].float()
            out = group.combine(y, ep, num_sms=num_sms, bias=first)
        else:  # fp32 rows, one rounding at the end (the bias added last)
            out = self._combine_fp32(group, ep, y.float(), num_sms)
            for b in biases:
                out = out + b.float()
            out = out.to(torch.bfloat16)
        combined_w = None
        if topk_weights is not None:
            if handle.do_expand:
                col = handle._col
                w = torch.zeros(col.shape[0], _align(k, 4), dtype=torch.float32, device=y.device)
                w.scatter_(1, col.clamp(min=0).unsqueeze(1), torch.where(col >= 0, topk_weights.float(), 0.0)
                           .unsqueeze(1))
                combined_w = group.combine(w, ep, num_sms=num_sms)[:, :k]
            else:
                combined_w = _combine_weights(
                    lambda w: group.combine(self._core._combine_input(w, ep), ep, num_sms=num_sms), topk_weights,
                    handle._local)
        return out, combined_w, self._event(async_with_compute_stream)

    def _combine_fp32(self, group, ep, y32, num_sms):
        """combine of fp32 rows in column slices that fit the group's rows."""
        width = max(4, self._core._caps[1] // 16 * 4)
        parts = [group.combine(y32[:, c:c + width].contiguous(), ep, num_sms=num_sms)
                 for c in range(0, y32.shape[1], width)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    # -- internals --------------------------------------------------------------------------------------------------
    def _group(self, x, topk_idx, num_experts, m):
        """The nccl.ep group for num_experts (nccl.ep.deepep.Buffer._group_for), its capacity fixed here first when
        the constructor had no sizes: collectively, the largest of every rank's tokens, bf16 row and top-k."""
        core = self._core
        if core._caps is None:
            need = torch.tensor([max(m, x.shape[0]), max(x.shape[1] * 2, x.shape[1] * x.element_size()),
                                 topk_idx.shape[1]], dtype=torch.int64, device=x.device)
            dist.all_reduce(need, op=dist.ReduceOp.MAX, group=self.group)
            core._caps = _capacity(*need.tolist())
        tokens, row_bytes, topk = core._caps[:3]
        for what, value, cap in (("tokens", x.shape[0], tokens), ("row bytes", x.shape[1] * x.element_size(),
                                                                    row_bytes), ("top-k", topk_idx.shape[1], topk)):
            if value > cap:
                raise NcclInvalidArgument("dispatch: %d %s exceed this ElasticBuffer's %d (num_max_tokens_per_rank, "
                                          "hidden * 2 and max(num_topk, 8) of its constructor, or of its first "
                                          "dispatch)" % (value, what, cap))
        return core._group_for(x, topk_idx, num_experts)

    def _scaleup_psum(self, per_source):
        """Inclusive prefix sum of per-source counts [R] grouped by rank index inside a logical domain."""
        return per_source.view(self.num_scaleout_ranks, self.num_scaleup_ranks).sum(0).cumsum(0, dtype=torch.int32)

    @staticmethod
    def _event(async_with_compute_stream: bool) -> EventOverlap:
        return EventOverlap(EventHandle() if async_with_compute_stream else None)


def _not_provided(name: str, feature: str):
    def refuse(*args, **kwargs):
        raise _unsupported("ElasticBuffer.%s (DeepEP's %s)" % (name, feature))

    return refuse


for _name, _feature in (("engram_write", "Engram"), ("engram_fetch", "Engram"), ("pp_set_config", "PP send/recv"),
                        ("pp_send", "PP send/recv"), ("pp_recv", "PP send/recv"),
                        ("create_agrs_session", "all-gather reduce-scatter"),
                        ("destroy_agrs_session", "all-gather reduce-scatter"),
                        ("agrs_new_session", "all-gather reduce-scatter"),
                        ("agrs_set_config", "all-gather reduce-scatter"),
                        ("agrs_get_inplace_tensor", "all-gather reduce-scatter"),
                        ("all_gather", "all-gather reduce-scatter")):
    setattr(ElasticBuffer, _name, _not_provided(_name, _feature))
for _name, _feature in (("get_engram_storage_size_hint", "Engram"), ("get_pp_buffer_size_hint", "PP send/recv"),
                        ("get_agrs_num_max_session_bytes", "all-gather reduce-scatter"),
                        ("get_agrs_buffer_size_hint", "all-gather reduce-scatter")):
    setattr(ElasticBuffer, _name, staticmethod(_not_provided(_name, _feature)))


def _capacity(tokens: int, row_bytes: int, topk: int) -> tuple:
    """nccl.deepep.Buffer's _caps for a group: tokens, row bytes (a multiple of 16), top-k (at least
    Buffer.max_topk), SMs (0: nccl.ep's default). The rows are wide enough for a dispatch's side words (a word per
    128 bytes of row: _dispatch_with_words): fp8 scales of a row of row_bytes / 2 columns (one a 128) and a routing
    row (1 + 2 top-k words); rows of hidden >= 128 (1 + 2 top-k) already are."""
    topk = max(int(topk), _v1.Buffer.max_topk)
    row_bytes = _align(max(16, int(row_bytes)), 16)
    return int(tokens), max(row_bytes, 128 * (row_bytes // 256 + 1 + 2 * topk)), topk, 0


def _check_routing(x, topk_idx, topk_weights) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise NcclInvalidArgument("dispatch: x must be [num_tokens, hidden]; got %s" % _shape_dtype(x))
    if (not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]
            or topk_idx.dtype not in (torch.int64, torch.int32)):
        raise NcclInvalidArgument("dispatch: topk_idx must be [%d, num_topk] int64; got %s"
                                  % (x.shape[0], _shape_dtype(topk_idx)))
    if topk_weights is not None and (not isinstance(topk_weights, torch.Tensor)
                                     or tuple(topk_weights.shape) != tuple(topk_idx.shape)):
        raise NcclInvalidArgument("dispatch: topk_weights must be [%d, %d] fp32; got %s"
                                  % (tuple(topk_idx.shape) + (_shape_dtype(topk_weights),)))


def _forwardable_scales(sf):
    """fp8 scales as nccl.ep forwards them, bit for bit: fp32, or int32 (UE8M0, four exponents a word), as DeepEP V2
    takes any 4-byte scale pack; row-major (a copy if they have other strides)."""
    if sf is None:
        return None
    if not isinstance(sf, torch.Tensor) or sf.dim() != 2 or sf.dtype not in (torch.float32, torch.int32):
        raise NcclInvalidArgument("dispatch: x's scales must be [num_tokens, packs] fp32 or int32 (UE8M0 packed); "
                                  "got %s" % _shape_dtype(sf))
    return sf.contiguous()


def _tma_col_major(scales):
    """scales [rows, S] copied into DeepEP's TMA-aligned column-major layout: strides (1, rows rounded up to 4)."""
    rows, packs = scales.shape
    out = torch.empty_strided((rows, packs), (1, _align(rows, _TMA_ROWS)), dtype=scales.dtype, device=scales.device)
    out.copy_(scales)
    return out


def _routing_rows(topk_idx, topk_weights, first_index: int):
    """The words each token's dispatch carries beside x, int32 [T, W]: its global index (first_index + t), its K
    top-k ids, then its K weights' bits if given."""
    t, k = topk_idx.shape
    rows = torch.empty((t, 1 + k + (k if topk_weights is not None else 0)), dtype=torch.int32,
                       device=topk_idx.device)
    rows[:, 0] = torch.arange(first_index, first_index + t, dtype=torch.int32, device=topk_idx.device)
    rows[:, 1:1 + k] = topk_idx
    if topk_weights is not None:
        rows[:, 1 + k:] = topk_weights.float().contiguous().view(torch.int32)
    return rows


def _dispatch_with_words(group, ep, x, sf, words, num_sms):
    """One nccl.ep dispatch of x whose scales (High-Throughput side words, forwarded bit for bit) are x's own scales
    sf (fp32 or int32 [T, S], or None) followed by `words` (int32 [T, W], or None): (the result, the received
    scales [N, S] as sf's dtype or None, the received words int32 [N, W] or None)."""
    parts = [p.view(torch.int32) for p in (sf, words) if p is not None]
    side = None if not parts else parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    recv = group.dispatch(x, handle=ep, scales=side, num_sms=num_sms)
    s = 0 if sf is None else sf.shape[1]
    sf_out = None if sf is None else recv.scales[:, :s].contiguous().view(sf.dtype)
    return recv, sf_out, None if words is None else recv.scales[:, s:].view(torch.int32)


def _row_weights(meta, k, received):
    """The top-k weights [rows, K] fp32 of routing rows (0 past the received ones)."""
    return torch.where(received.unsqueeze(1), meta[:, 1 + k:1 + 2 * k].view(torch.float32), 0.0)


def _received(ep, rows):
    return (torch.arange(rows, device=ep.recv_total.device) < ep.recv_total).unsqueeze(1)


def _dst_slots(topk_idx, local: int, ranks: int):
    """[T, K] int32: each token's position among this rank's tokens that go to the rank of that column's expert
    (a token counts once per rank), -1 where the column has none."""
    rank_of = torch.where(topk_idx >= 0, topk_idx // local, -1)
    hits = (rank_of.unsqueeze(-1) == torch.arange(ranks, device=topk_idx.device)).any(1)  # [T, R]
    before = hits.int().cumsum(0, dtype=torch.int32) - hits.int()
    slot = before.gather(1, rank_of.clamp(min=0))
    return torch.where(rank_of >= 0, slot, -1).int()


def _add_stats(stats, counts) -> None:
    if not isinstance(stats, torch.Tensor) or stats.dtype != torch.int32 or tuple(stats.shape) != tuple(counts.shape):
        raise NcclInvalidArgument("dispatch: cumulative_local_expert_recv_stats must be [%d] int32; got %s"
                                  % (counts.shape[0], _shape_dtype(stats)))
    stats.add_(counts)
