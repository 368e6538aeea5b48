"""nccl.ep.deepep_elastic (DeepEP V2's ElasticBuffer) on the CPU: R ranks as R threads of this process, each with
its own ElasticBuffer over a stand-in process group, whose nccl.ep groups are a torch model of the High-Throughput
mode as nccl_ep.h documents it (_ModelGroup: FLAT and EXPERT_MAJOR layouts, EXACT and WORST_CASE sizing, pad rows
zeroed, rows past the received ones left as garbage, combine summing each rank's part in fp32 and rounding to the
rows' dtype, EXPERT_MAJOR parts summed per rank first). Checked against tests/python/_elastic_reference.py: the
returned tuples, shapes and dtypes, every EPHandle field, cached dispatch, combine (not expanded, expanded with and
without multiple reduction, biases), the weights both ways, the calls made of nccl.ep; the NotImplementedError list;
get_buffer_size_hint against nccl.ep.query_group_info (the C library's host arithmetic). Needs torch."""

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import _elastic_reference as ref  # noqa: E402
import nccl.ep as ep  # noqa: E402
import nccl.ep.deepep as deep_ep  # noqa: E402
import nccl.ep.deepep_elastic as elastic  # noqa: E402
from nccl.ep import NcclInvalidArgument  # noqa: E402

M, H, LOCAL, K = 12, 128, 5, 4  # tokens a rank at most, hidden, experts a rank, top-k


# -- R ranks as threads ----------------------------------------------------------------------------------------------
class _World:
    """The ranks' meeting point: exchange() is an all-gather of Python objects (a collective of the model)."""

    def __init__(self, ranks, domain_size):
        self.ranks, self.domain_size = ranks, domain_size
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.board = [None] * ranks
        self.groups = []
        self.lock = threading.Lock()

    def exchange(self, rank, item):
        self.board[rank] = item
        self.barrier.wait()
        items = list(self.board)
        self.barrier.wait()  # nobody writes the next item before every rank has read this one
        return items


class _ProcessGroup:
    def __init__(self, world, rank):
        self.world, self._rank = world, rank

    def rank(self):
        return self._rank

    def size(self):
        return self.world.ranks


def _all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    items = group.world.exchange(group.rank(), tensor.clone())
    stacked = torch.stack(items)
    tensor.copy_(stacked.amax(0) if op == dist.ReduceOp.MAX else stacked.sum(0))


@pytest.fixture
def model(monkeypatch):
    """torch.distributed's rank queries and all_reduce on _ProcessGroup, nccl.ep groups as _ModelGroup."""
    monkeypatch.setattr(dist, "get_rank", lambda group=None: group.rank())
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: group.size())
    monkeypatch.setattr(dist, "all_reduce", _all_reduce)
    monkeypatch.setattr(deep_ep, "Group", _ModelGroup)


def _on_ranks(ranks, fn, domain_size=1):
    """fn(process_group) on every rank, each in its thread; their results, or the first failure."""
    world = _World(ranks, domain_size)

    def run(rank):
        try:
            return fn(_ProcessGroup(world, rank))
        except BaseException:
            world.barrier.abort()  # the others fail at their next collective instead of waiting for it
            raise

    with ThreadPoolExecutor(ranks) as pool:
        futures = [pool.submit(run, r) for r in range(ranks)]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return [f.result() for f in futures], world


# -- the model of nccl.ep's High-Throughput group ------------------------------------------------------------------
class _ModelHandle:
    def __init__(self, group, routings, layout, sizing, alignment):
        self.group, self.layout, self.sizing, self.alignment = group, layout, sizing, alignment
        me, local, R = group.rank, group.local_experts, group.size
        self.topk_idx = routings[me]
        self.num_tokens, self.topk = self.topk_idx.shape
        self.rec = ref.Received([r.cpu() for r in routings], me, local, group.max_tokens_per_rank,
                                alignment if layout == "expert_major" else 1)
        rec = self.rec
        self.expert_counts = torch.tensor(rec.counts, dtype=torch.int32)
        self.expert_offsets = torch.tensor(rec.offsets, dtype=torch.int32)
        self.rank_counts = torch.tensor(rec.per_source_tokens(R), dtype=torch.int32)
        flat = layout == "flat"
        self.recv_total = torch.tensor([rec.n if flat else rec.expanded_rows], dtype=torch.int32)
        if sizing == "exact":
            self.rows = rec.n if flat else rec.expanded_rows
        else:
            worst = R * group.max_tokens_per_rank
            self.rows = worst if flat else worst * min(self.topk, local) + local * (alignment - 1)

    def output_rows(self):
        return self.rows


def _garbage(shape, dtype):
    """Unwritten memory: NaN for floats, 0xFF bytes for fp8 (handled as uint8), -7 for ints."""
    if dtype == torch.uint8:
        return torch.full(shape, 0xFF, dtype=dtype)
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype)


def _bytes(t):
    """fp8 tensors as uint8 (torch's CPU kernels stack and fill bytes; the model moves bytes)."""
    return None if t is None else t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class _ModelGroup:
    """nccl.ep.Group(algorithm="high_throughput") in torch, one rank of it (see the module's docstring)."""

    def __init__(self, group, *, num_experts, max_tokens_per_rank, max_token_bytes, max_topk, num_sms=0,
                 rail_staging_bytes_max=0, timeout_s=None):
        self.world, self.rank, self.size, self.timeout_s = group.world, group.rank(), group.size(), timeout_s
        self.num_experts, self.local_experts = num_experts, num_experts // self.size
        self.max_tokens_per_rank, self.max_token_bytes, self.max_topk = max_tokens_per_rank, max_token_bytes, max_topk
        self.num_sms, self.calls, self.closed = num_sms, [], False
        self.world.exchange(self.rank, None)  # collective
        with self.world.lock:
            self.world.groups.append(self)

    def info(self):
        return {"n_domains": self.size // self.world.domain_size, "domain_size": self.world.domain_size}

    def close(self):
        self.closed = True

    # What the library refuses (a typed error, as nccl.ep's checks raise), not asserts: the fuzz tests
    # (test_fuzz_arguments.py) run the drop-in on this model and accept typed refusals only.
    def create_handle(self, topk_idx, layout, sizing, alignment):
        self.calls.append(("create_handle", layout, sizing, alignment))
        if topk_idx.shape[0] > self.max_tokens_per_rank or topk_idx.shape[1] > self.max_topk:
            raise NcclInvalidArgument("model: topk_idx %s past the group's tokens or top-k" % (tuple(topk_idx.shape),))
        return _ModelHandle(self, self.world.exchange(self.rank, topk_idx), layout, sizing, alignment)

    def _check_row(self, t):
        row = t.shape[1] * t.element_size()
        if not t.is_contiguous() or row > self.max_token_bytes or row % 16:
            raise NcclInvalidArgument("model: rows %s %s not contiguous, past max_token_bytes or not of 16-byte "
                                      "multiples" % (tuple(t.shape), t.dtype))

    def dispatch(self, x, handle, scales=None, num_sms=0):
        self.calls.append(("dispatch", tuple(x.shape), x.dtype, None if scales is None else scales.shape[1], num_sms))
        self._check_row(x)
        if scales is not None and not 1 <= scales.shape[1] <= self.max_token_bytes // 128:
            raise NcclInvalidArgument("model: %d scale words a row; from 1 to max_token_bytes / 128 = %d"
                                      % (scales.shape[1], self.max_token_bytes // 128))
        sent = self.world.exchange(self.rank, (_bytes(x), scales))
        rec, rows = handle.rec, handle.rows
        xs, ss = [p[0] for p in sent], [p[1] for p in sent]
        tokens = _garbage((rows, x.shape[1]), _bytes(x).dtype)
        out_scales = _garbage((rows, scales.shape[1]), scales.dtype) if scales is not None else None
        topk_idx = None
        if handle.layout == "flat":
            tokens[:rec.n] = rec.rows(xs)
            if scales is not None:
                out_scales[:rec.n] = rec.rows(ss)
            topk_idx = _garbage((rows, handle.topk), torch.int32)
            topk_idx[:rec.n] = rec.local_ids.int()
        else:
            n = rec.expanded_rows
            tokens[:n] = rec.expanded(xs)
            if scales is not None:
                out_scales[:n] = rec.expanded(ss)
        if x.dtype == torch.float8_e4m3fn:
            tokens = tokens.view(x.dtype)
        return SimpleNamespace(tokens=tokens, topk_idx=topk_idx, scales=out_scales, handle=handle,
                               expert_counts=handle.expert_counts, rank_counts=handle.rank_counts)

    def combine(self, y, handle, num_sms=0, bias=None):
        self.calls.append(("combine", tuple(y.shape), y.dtype, num_sms, None if bias is None else bias.dtype))
        self._check_row(y)
        rec = handle.rec
        if y.shape[0] < handle.rows:
            raise NcclInvalidArgument("model: combine input of %d rows; the handle has %d" % (y.shape[0], handle.rows))
        parts = {}
        for i, (s, t) in enumerate(rec.tokens):
            if handle.layout == "flat":
                parts[(s, t)] = y[i]
            else:  # this rank's rows of the token summed in fp32 in column order (weights 1), in the rows' dtype
                part = torch.zeros(y.shape[1], dtype=torch.float32)
                for r in rec.slots[i]:
                    if r >= 0:
                        part += y[r].float()
                parts[(s, t)] = part.to(y.dtype)
        everyone = self.world.exchange(self.rank, parts)
        out = torch.empty((handle.num_tokens, y.shape[1]), dtype=y.dtype)
        for t in range(handle.num_tokens):  # fp32 from the bias, the ranks by their last top-k column
            acc = bias[t].float().clone() if bias is not None else torch.zeros(y.shape[1], dtype=torch.float32)
            for d in ref.rank_order(self.topk_idx_of(handle, t), self.local_experts):
                acc += everyone[d][(self.rank, t)].float()
            out[t] = acc.to(y.dtype)
        return out

    @staticmethod
    def topk_idx_of(handle, t):
        return [int(e) for e in handle.topk_idx[t]]


# -- inputs ---------------------------------------------------------------------------------------------------------
def _inputs(s, R, seed=0):
    """Source s's tokens: (topk_idx [T, K] int64 with -1s, x [T, H] bf16, weights [T, K] fp32), T in [1, M]."""
    gen = torch.Generator().manual_seed(1000 * seed + 31 * s + R)
    T = 1 + (5 * s + 3 + seed) % M
    E = R * LOCAL
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    idx[torch.rand(T, K, generator=gen) < 0.2] = -1
    x = (torch.randint(-64, 65, (T, H), generator=gen) / 16).to(torch.bfloat16)
    w = torch.randint(1, 9, (T, K), generator=gen) / 8
    return idx, x, w.float()


def _buffer(pg, **kwargs):
    args = dict(num_max_tokens_per_rank=M, hidden=H, num_topk=K, explicitly_destroy=True)
    args.update(kwargs)
    return elastic.ElasticBuffer(pg, **args)


# -- dispatch and combine --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("R", [1, 4])
@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize("fp8", [False, "fp32", "ue8m0"])
def test_dispatch_cached_dispatch_and_combine(model, R, expand, sync, fp8):
    alignment = 3  # no power of two (DeepGEMM's 224 on sm_100 is not either); not expanded, only the counts
    E = R * LOCAL

    def rank(pg):
        me = pg.rank()
        inputs = [_inputs(s, R) for s in range(R)]
        idx, x, w = inputs[me]
        rec = ref.Received([i[0] for i in inputs], me, LOCAL, M, alignment if expand else 1)
        buf = _buffer(pg)
        stats = torch.full((LOCAL,), 3, dtype=torch.int32)
        x_in = ref.fp8_tokens(x, fp8 == "ue8m0") if fp8 else x
        recv_x, recv_idx, recv_w, h, event = buf.dispatch(
            x_in, topk_idx=idx, topk_weights=w, cumulative_local_expert_recv_stats=stats, num_experts=E,
            expert_alignment=alignment, num_sms=6, do_cpu_sync=sync, do_expand=expand)
        assert event.event is None
        assert stats.tolist() == [3 + c for c in rec.counts]
        # What the rows must hold, in order; worst-case outputs have more rows (garbage past the received ones).
        want_x = [ref.fp8_tokens(i[1], fp8 == "ue8m0") if fp8 else i[1] for i in inputs]
        layout = rec.expanded if expand else rec.rows
        n = rec.expanded_rows if expand else rec.n
        got = recv_x if not fp8 else recv_x[0]
        group = buf._core._groups[E]
        rows = got.shape[0]
        if sync:
            assert rows == n
        else:
            worst = R * M
            assert rows == (worst * min(K, LOCAL) + LOCAL * (alignment - 1) if expand else worst)
        if fp8:
            assert torch.equal(recv_x[0][:n].view(torch.uint8), layout([q.view(torch.uint8) for q, _ in want_x]))
            assert recv_x[1].dtype == (torch.int32 if fp8 == "ue8m0" else torch.float32)
            assert torch.equal(recv_x[1][:n], layout([s for _, s in want_x]))
        else:
            assert torch.equal(recv_x[:n], layout(want_x))
        if expand:
            assert recv_idx is None
            assert recv_w.shape == (rows,) and torch.equal(recv_w[:n], rec.expanded_weights([i[2] for i in inputs]))
            assert bool((recv_w[n:] == 0).all())
        else:
            assert recv_idx.dtype == torch.int64 and recv_idx.shape == (rows, K)
            assert torch.equal(recv_idx[:n], rec.local_ids) and bool((recv_idx[n:] == -1).all())
            assert recv_w.shape == (rows, K) and torch.equal(recv_w[:n], rec.rows([i[2] for i in inputs]))
            assert bool((recv_w[n:] == 0).all())
        _check_handle(h, rec, idx, R, expand, sync, alignment, E)
        # The nccl.ep calls: one binding, then one dispatch of x with its side words: its scales (fp8: H / 128),
        # then the routing row (1 + K + K words); no weights ever (the model takes none).
        layout_name = "expert_major" if expand else "flat"
        assert group.calls[:3] == [
            ("create_handle", layout_name, "exact" if sync else "worst_case", alignment if expand else 1),
            ("dispatch", tuple(x.shape), torch.float8_e4m3fn if fp8 else torch.bfloat16,
             (H // 128 if fp8 else 0) + 1 + 2 * K, 6)]
        # A cached dispatch: the same rows along the handle's routing (and its weights, when given), in one call.
        cached = buf.dispatch(x_in, handle=h, topk_weights=w, do_expand=expand)
        assert cached[3] is h and len(group.calls) == 3 and group.calls[2][-1] == 6  # the handle's SMs
        assert group.calls[2][3] == (H // 128 if fp8 else 0) + K or (w is None and group.calls[2][3] in (None, 1))
        if fp8:
            assert torch.equal(cached[0][0][:n].view(torch.uint8), recv_x[0][:n].view(torch.uint8))
        else:
            assert torch.equal(cached[0][:n], recv_x[:n])
        assert torch.equal(cached[2][:n], recv_w[:n])
        assert (cached[1] is None) == expand and (expand or torch.equal(cached[1], recv_idx))
        # combine: the rows' parts back to their owners, and the weights to their columns.
        y = torch.zeros(rows, H, dtype=torch.bfloat16)
        y[:n] = ref.combine_inputs(rec, H, expand)
        out, out_w, event = buf.combine(y, h, topk_weights=recv_w)
        assert event.event is None
        assert torch.equal(out, ref.combined(idx, me, LOCAL, M, H, expand))
        assert torch.equal(out_w, torch.where(idx >= 0, w, 0.0))
        buf.destroy()
        assert group.closed

    _on_ranks(R, rank)


def _check_handle(h, rec, idx, R, expand, sync, alignment, E):
    n = rec.n
    aligned = [ref.align(c, alignment) for c in rec.counts]
    assert (h.do_expand, h.num_experts, h.expert_alignment, h.num_max_tokens_per_rank, h.num_sms) == (
        expand, E, alignment, M, 6)
    assert torch.equal(h.topk_idx, idx) and h.topk_idx.data_ptr() != idx.data_ptr()  # do_handle_copy
    assert h.num_recv_tokens == (n if sync else R * M)
    assert h.num_recv_tokens_per_expert_list == (aligned if sync else [])
    if sync:
        assert h.num_expanded_tokens == sum(aligned)
    assert h.num_unaligned_recv_tokens_per_expert.tolist() == rec.counts
    psum = h.psum_num_recv_tokens_per_expert
    assert psum.dtype == torch.int32
    if expand:
        assert psum.tolist() == [o + c for o, c in zip(rec.offsets, rec.counts)]
    else:
        assert psum.tolist() == [sum(aligned[:e + 1]) for e in range(len(aligned))]
    assert h.psum_num_recv_tokens_per_scaleup_rank.tolist() == [n]  # one-rank domains, hybrid: one scaleup rank
    meta = h.recv_src_metadata
    assert meta.dtype == torch.int32 and meta.shape == (h.num_recv_tokens, K + 2)
    assert torch.equal(meta[:n], rec.metadata(expand)) and bool((meta[n:] == -1).all())
    assert torch.equal(h.dst_buffer_slot_idx, ref.dst_slots(idx, LOCAL, R))
    assert h.token_metadata_at_forward is None and h.channel_linked_list is None


@pytest.mark.parametrize("domain_size,hybrid", [(1, True), (1, False), (2, True), (2, False)])
def test_received_tokens_by_scaleup_rank(model, domain_size, hybrid):
    """psum_num_recv_tokens_per_scaleup_rank follows get_logical_domain_size: with hybrid mode, per rank index
    inside a domain (domains of one: the total), else per source rank."""
    R, E = 4, 4 * LOCAL

    def rank(pg):
        me = pg.rank()
        inputs = [_inputs(s, R) for s in range(R)]
        rec = ref.Received([i[0] for i in inputs], me, LOCAL, M)
        buf = _buffer(pg, allow_hybrid_mode=hybrid)
        logical = (R // domain_size, domain_size) if hybrid else (1, R)
        assert buf.get_logical_domain_size() == logical and buf.get_physical_domain_size() == (R // domain_size,
                                                                                               domain_size)
        assert (buf.num_scaleout_ranks, buf.num_scaleup_ranks) == logical
        assert (buf.scaleout_rank_idx, buf.scaleup_rank_idx) == (me // logical[1], me % logical[1])
        per_source = rec.per_source_tokens(R)
        for expand in (False, True):
            h = buf.dispatch(inputs[me][1], topk_idx=inputs[me][0], num_experts=E, num_sms=2, do_expand=expand)[3]
            by_index = [sum(per_source[i::logical[1]]) for i in range(logical[1])]
            assert h.psum_num_recv_tokens_per_scaleup_rank.tolist() == [sum(by_index[:i + 1])
                                                                       for i in range(len(by_index))]

    _, world = _on_ranks(R, rank, domain_size)
    assert all(g.closed for g in world.groups if g.max_tokens_per_rank == 1)  # the domain probes


@pytest.mark.parametrize("expand,multiple", [(False, True), (True, True), (True, False), (False, False)])
@pytest.mark.parametrize("num_bias", [0, 1, 2])
def test_combine_rounds_as_deepep(model, expand, multiple, num_bias):
    """Expanded rows are summed per rank and rounded to bf16 (allow_multiple_reduction) or kept in fp32; biases are
    added before the one rounding at the end (fp32 rows, in column slices of the group's row size)."""
    R, E = 3, 3 * LOCAL

    def rank(pg):
        me = pg.rank()
        inputs = [_inputs(s, R, seed=2) for s in range(R)]
        idx, x, _ = inputs[me]
        rec = ref.Received([i[0] for i in inputs], me, LOCAL, M, 2 if expand else 1)
        buf = _buffer(pg, allow_multiple_reduction=multiple)
        _, _, _, h, _ = buf.dispatch(x, topk_idx=idx, num_experts=E, expert_alignment=2, num_sms=2,
                                     do_expand=expand)
        group = buf._core._groups[E]
        gen = torch.Generator().manual_seed(me)
        biases = tuple(torch.randn((idx.shape[0], H), generator=gen).to(torch.bfloat16) for _ in range(num_bias))
        bias = None if not biases else biases[0] if num_bias == 1 else biases
        before = len(group.calls)
        out, out_w, _ = buf.combine(ref.combine_inputs(rec, H, expand), h, bias=bias)
        assert out_w is None and out.dtype == torch.bfloat16
        assert torch.equal(out, ref.combined(idx, me, LOCAL, M, H, expand, multiple, biases))
        fp32 = expand and not multiple
        # fp32 rows: H * 4 bytes in column slices of the group's row bytes, a combine each (one here: the rows are
        # widened for the dispatch's side words; test_fp32_combine_slices_rows_wider_than_the_groups has several);
        # else one of bf16 rows, the bias (the sum of two in fp32) given to it
        bias_dtype = None if not biases or fp32 else torch.bfloat16 if num_bias == 1 else torch.float32
        width = buf._core._caps[1] // 4
        assert [c[1:] for c in group.calls[before:]] == (
            [((h._ep.rows, min(width, H - c)), torch.float32, 2, None) for c in range(0, H, width)] if fp32
            else [((h._ep.rows, H), torch.bfloat16, 2, bias_dtype)])

    _on_ranks(R, rank)


def test_a_buffer_sized_by_bytes_fixes_its_group_at_the_first_dispatch(model):
    """Without num_max_tokens_per_rank / hidden, the first dispatch fixes the group's tokens, row and top-k:
    collectively, the largest of every rank's (num_max_tokens_per_rank, or its tokens; bf16 rows; top-k)."""
    R, E = 2, 2 * LOCAL

    def rank(pg):
        me = pg.rank()
        idx, x, w = _inputs(me, R)
        buf = elastic.ElasticBuffer(pg, num_bytes=1 << 30, explicitly_destroy=True)
        assert buf.num_bytes == 1 << 30 and buf._core._caps is None
        _, _, _, h, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=E, num_sms=2,
                                     num_max_tokens_per_rank=M + 5 * me)
        group = buf._core._groups[E]
        # (rows of hidden H = 128, widened for the side words: 128 x (H / 128 + 1 + 2 x 8) bytes)
        assert (group.max_tokens_per_rank, group.max_token_bytes, group.max_topk) == (M + 5, 128 * (1 + 1 + 16), 8)
        assert h.num_max_tokens_per_rank == M + 5 * me  # the call's, for the global indices
        with pytest.raises(NcclInvalidArgument, match="18 tokens exceed this ElasticBuffer.s 17"):
            buf.dispatch(torch.zeros(M + 6, H, dtype=torch.bfloat16), topk_idx=torch.zeros(M + 6, K).long(),
                         num_experts=E, num_sms=2, num_max_tokens_per_rank=2 * M)
        buf.destroy()

    _on_ranks(R, rank)


def test_defaults_sms_and_handle_copy(model, monkeypatch):
    monkeypatch.setattr(elastic, "_device_sms", lambda: 132)

    def rank(pg):
        idx, x, w = _inputs(0, 1)
        buf = _buffer(pg)
        assert buf.get_theoretical_num_sms(3, K) == 64 and buf.get_theoretical_num_qps(64) == 0
        recv_x, _, _, h, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=LOCAL, do_handle_copy=False)
        assert h.num_sms == 64 and h.topk_idx is idx
        assert buf._core._groups[LOCAL].calls[0] == ("create_handle", "flat", "exact", 1)  # do_cpu_sync: True
        monkeypatch.setattr(elastic, "_device_sms", lambda: 40)
        assert buf.get_theoretical_num_sms(3, K) == 40

    _on_ranks(1, rank)


def test_tma_aligned_scales_are_deepeps_column_major_layout(model):
    def rank(pg):
        idx, x, w = _inputs(1, 1)
        q, s = ref.fp8_tokens(x)
        buf = _buffer(pg)
        (rq, rs), *_ = buf.dispatch((q, s), topk_idx=idx, num_experts=LOCAL, num_sms=2, do_expand=True,
                                    expert_alignment=4, use_tma_aligned_col_major_sf=True, do_zero_padding=True)
        rows = rq.shape[0]
        assert rs.shape == (rows, H // 128) and rs.stride() == (1, ref.align(rows, 4))
        rec = ref.Received([idx], 0, LOCAL, M, 4)
        assert torch.equal(rs, rec.expanded([s]))

    _on_ranks(1, rank)


# -- refusals --------------------------------------------------------------------------------------------------------
@pytest.fixture
def one_buffer(model):
    made = {}

    def rank(pg):
        made["buffer"] = _buffer(pg)

    _on_ranks(1, rank)
    return made["buffer"]


@pytest.mark.parametrize("method", ["engram_write", "engram_fetch", "pp_set_config", "pp_send", "pp_recv",
                                    "create_agrs_session", "destroy_agrs_session", "agrs_new_session",
                                    "agrs_set_config", "agrs_get_inplace_tensor", "all_gather"])
def test_methods_not_implemented_name_themselves(one_buffer, method):
    with pytest.raises(NotImplementedError, match="ElasticBuffer." + method):
        getattr(one_buffer, method)(None)


def test_the_comm_stream_is_the_callers(one_buffer, monkeypatch):
    current = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    assert one_buffer.get_comm_stream() is current


@pytest.mark.parametrize("hint", ["get_engram_storage_size_hint", "get_pp_buffer_size_hint",
                                  "get_agrs_num_max_session_bytes", "get_agrs_buffer_size_hint"])
def test_size_hints_of_other_features_not_implemented(hint):
    with pytest.raises(NotImplementedError, match=hint):
        getattr(elastic.ElasticBuffer, hint)(1, 2)


def test_cpu_memory_not_implemented(model):
    with pytest.raises(NotImplementedError, match="num_cpu_bytes=4194304"):
        _on_ranks(1, lambda pg: elastic.ElasticBuffer(pg, num_bytes=8 << 20, num_cpu_bytes=4 << 20))


def test_dispatch_refuses_scales_and_alignments_it_cannot_take(one_buffer):
    idx, x, _ = _inputs(0, 1)
    for scales in (torch.zeros(x.shape[0], 1, dtype=torch.int64), torch.zeros(x.shape[0], dtype=torch.int32)):
        with pytest.raises(NcclInvalidArgument, match="scales must be \\[num_tokens, packs\\] fp32 or int32"):
            one_buffer.dispatch((x.to(torch.float8_e4m3fn), scales), topk_idx=idx, num_experts=LOCAL)
    with pytest.raises(NcclInvalidArgument, match="expert_alignment 2048 with do_expand: nccl.ep aligns expert zones "
                       "to 1..1024 rows"):
        one_buffer.dispatch(x, topk_idx=idx, num_experts=LOCAL, do_expand=True, expert_alignment=2048)


@pytest.mark.parametrize("kwargs,text", [
    ({}, "topk_idx and num_experts are required"),
    ({"topk_idx": True, "num_experts": LOCAL, "num_max_tokens_per_rank": 2}, "tokens exceed num_max_tokens_per_rank 2"),
    ({"topk_idx": True, "num_experts": LOCAL, "do_zero_padding": True}, "do_zero_padding is for do_expand=True"),
    ({"topk_idx": "short", "num_experts": LOCAL}, "topk_idx must be"),
])
def test_dispatch_refusals(one_buffer, kwargs, text):
    idx, x, _ = _inputs(0, 1)
    kwargs = dict(kwargs)
    if kwargs.get("topk_idx") is True:
        kwargs["topk_idx"] = idx
    elif kwargs.get("topk_idx") == "short":
        kwargs["topk_idx"] = idx[1:]
    with pytest.raises(NcclInvalidArgument, match=text):
        one_buffer.dispatch(x, **kwargs)


def test_cached_dispatch_and_combine_refusals(model):
    def rank(pg):
        idx, x, w = _inputs(0, 1)
        buf = _buffer(pg)
        h = buf.dispatch(x, topk_idx=idx, num_experts=LOCAL, num_sms=2)[3]
        for kwargs, text in (({"topk_idx": idx}, "takes no topk_idx"), ({"do_cpu_sync": True}, "no CPU sync"),
                             ({"num_experts": 2 * LOCAL}, "num_experts=10, the handle's is 5"),
                             ({"do_expand": True}, "do_expand=True, the handle's is False"),
                             ({"handle": object()}, "handle must come from ElasticBuffer.dispatch")):
            kwargs.setdefault("handle", h)
            with pytest.raises(NcclInvalidArgument, match=text):
                buf.dispatch(x, **kwargs)
        with pytest.raises(NcclInvalidArgument, match="x must be a \\[rows, hidden\\] bfloat16"):
            buf.combine(torch.zeros(h.num_recv_tokens, H), h)
        with pytest.raises(NcclInvalidArgument, match="bias must be"):
            buf.combine(torch.zeros(h.num_recv_tokens, H, dtype=torch.bfloat16), h, bias=torch.zeros(1, H))
        with pytest.raises(NcclInvalidArgument, match="handle must come from ElasticBuffer.dispatch"):
            buf.combine(torch.zeros(1, H, dtype=torch.bfloat16), (1, 2))
        with pytest.raises(ValueError, match="only for explicitly_destroy=True"):
            _buffer(pg, explicitly_destroy=False).destroy()

    _on_ranks(1, rank)


# -- the rest of the surface -----------------------------------------------------------------------------------------
def test_accepted_where_they_change_no_result(model):
    def rank(pg):
        idx, x, w = _inputs(0, 1)
        buf = _buffer(pg, deterministic=True, prefer_overlap_with_compute=False, sl_idx=1, num_allocated_qps=7,
                      num_cpu_timeout_secs=5, use_fp8_dispatch=True)
        plain = _buffer(pg)
        a = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=LOCAL, num_sms=2, num_qps=3,
                         allocate_on_comm_stream=True)
        b = plain.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=LOCAL, num_sms=2)
        assert all(torch.equal(u, v) for u, v in zip(a[:3], b[:3]))

    _on_ranks(1, rank)


def test_gpu_timeout_bounds_the_groups_waits(model):
    """num_gpu_timeout_secs is every group's timeout_s (DeepEP's default 100 s included); not a positive int: typed."""
    def rank(pg):
        idx, x, w = _inputs(0, 1)
        for given, want in (({}, 100), (dict(num_gpu_timeout_secs=7), 7)):
            buf = _buffer(pg, **given)
            buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=LOCAL, num_sms=2)
            assert buf._core._groups[LOCAL].timeout_s == want
        for bad in (0, -1, 2.5, True, None):
            with pytest.raises(NcclInvalidArgument, match="num_gpu_timeout_secs"):
                _buffer(pg, num_gpu_timeout_secs=bad)

    _on_ranks(1, rank)


def test_the_drop_in_module_exposes_v2():
    from nccl.ep.deepep import ElasticBuffer, EPHandle, EventHandle

    assert (ElasticBuffer, EPHandle, EventHandle) == (elastic.ElasticBuffer, elastic.EPHandle, elastic.EventHandle)
    with pytest.raises(AttributeError):
        deep_ep.NoSuchThing  # noqa: B018


def test_allow_mnnvl_is_accepted(model):
    # An nccl.ep NVLink domain is NCCL's LSA team, which spans a multi-node NVLink domain: nothing to switch on.
    _on_ranks(1, lambda pg: deep_ep.Buffer(pg, 0, 0, allow_mnnvl=True))


def test_event_overlap_waits_then_runs_its_hook():
    waits, ran = [], []
    event = SimpleNamespace(current_stream_wait=lambda: waits.append(1))
    ev = elastic.EventOverlap(event)
    ev.register_hook_after_wait(lambda: ran.append(len(waits)))
    with pytest.raises(ValueError, match="registered already"):
        ev.register_hook_after_wait(print)
    with ev:
        pass
    assert waits == [1] and ran == [1] and ev.event is event  # the hook once, after the wait
    with ev(release_handle=True):
        pass
    assert waits == [1, 1] and ran == [1] and ev.event is None
    with elastic.EventOverlap():  # no event: nothing to wait for
        pass
    with pytest.raises(ValueError, match="no event"):
        elastic.EventOverlap().current_stream_wait()


def test_previous_events_are_waited_on(monkeypatch):
    """An EventHandle (capture()'s), an EventOverlap of either API, or a torch event: the current stream waits."""
    waited = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(
        wait_event=lambda e: waited.append(e)))
    handle = elastic.EventHandle.__new__(elastic.EventHandle)
    handle.current_stream_wait = lambda: waited.append("handle")
    raw = object()
    for ev in (None, elastic.EventOverlap(), handle, elastic.EventOverlap(handle), deep_ep.EventOverlap(raw), raw):
        elastic._wait(ev)
    assert waited == ["handle", "handle", raw, raw]


def test_fp32_combine_slices_rows_wider_than_the_groups():
    # fp32 rows wider than the group's row bytes (64 here: 16 columns) go in column slices, a combine each, and come
    # back side by side.
    shell = SimpleNamespace(_core=SimpleNamespace(_caps=(M, 64, 8, 0)))
    seen = []
    group = SimpleNamespace(combine=lambda y, ep, num_sms=0: seen.append(tuple(y.shape)) or y * 2)
    y = torch.randn(5, 40)
    out = elastic.ElasticBuffer._combine_fp32(shell, group, None, y, 2)
    assert seen == [(5, 16), (5, 16), (5, 8)] and torch.equal(out, y * 2)


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_buffer_size_hint_is_the_largest_group_nccl_ep_would_make(model, ranks):
    world = _World(ranks, 1)
    pg = _ProcessGroup(world, 0)
    got = elastic.ElasticBuffer.get_buffer_size_hint(pg, 4096, 7168, 6)
    args = dict(num_experts=1024 // ranks * ranks, max_tokens_per_rank=4096, max_token_bytes=7168 * 2, max_topk=8)
    sizes = [ep.query_group_info(ranks, lsa, **args) for lsa in range(1, ranks + 1) if ranks % lsa == 0]
    want = max(i["window_bytes"] + i["rail_staging_bytes"] for i in sizes)
    assert got % (2 << 20) == 0 and want <= got < want + (2 << 20)
    if ranks == 1:  # one domain: the window alone
        assert sizes[0]["rail_staging_bytes"] == 0
    else:  # the largest split holds rail staging beside the window
        assert want > sizes[-1]["window_bytes"]
    # fp8 dispatch shares the window of bf16 rows; more top-k than 8 widens the rows' metadata
    assert elastic.ElasticBuffer.get_buffer_size_hint(pg, 4096, 7168, 6, use_fp8_dispatch=True) == got
    assert elastic.ElasticBuffer.get_buffer_size_hint(pg, 4096, 7168, 16) >= got


def test_constructor_sizes_the_group_and_reports_the_hint(model):
    def rank(pg):
        buf = _buffer(pg, num_max_tokens_per_rank=64, hidden=100, num_topk=9)
        # hidden * 2 bytes rounded up to 16 (208), widened for the dispatch's side words: a word per 128 bytes, for
        # fp8 scales (0 here) and the routing row (1 + 2 x 9)
        assert buf._core._caps == (64, 128 * (0 + 1 + 2 * 9), 9, 0)
        assert buf.num_bytes == elastic.ElasticBuffer.get_buffer_size_hint(pg, 64, 100, 9)

    _on_ranks(2, rank)
