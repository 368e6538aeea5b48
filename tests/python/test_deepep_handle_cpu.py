"""The DeepEP entries of nccl.ep.deepep's High-Throughput dispatch handle on the CPU, against DeepEP's definitions
in plain Python (tests/python/_deepep_reference.py): first the pure-torch pieces, every rank's payload exchanged by
hand as all_to_all_single would (1, 2 and 4 ranks, channels fewer and more than tokens, ranks with no tokens, exact
and worst-case rows); then Buffer.dispatch on torch's fake process group (rank 1 of 4) with a stand-in nccl.ep group
and the exchange played by the test, and on 2 real gloo processes. Needs torch."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import _deepep_reference as ref  # noqa: E402
import nccl.ep.deepep as deep_ep  # noqa: E402
from nccl.ep import NcclInvalidArgument  # noqa: E402

CAP, H, LOCAL = 40, 64, 2  # tokens per rank at most, hidden, experts per rank


def _in_rank(seed, ranks):
    """Every rank's is_token_in_rank [T_s, R]: T_s in [0, CAP), rank 0 with none on even seeds."""
    gen = torch.Generator().manual_seed(seed * 31 + ranks)
    sizes = [int(torch.randint(0, CAP, (1,), generator=gen)) for _ in range(ranks)]
    if seed % 2 == 0:
        sizes[0] = 0
    return [torch.rand(t, ranks, generator=gen) < 0.4 for t in sizes]


def _exchange(payloads, me):
    """What all_to_all_single gives rank me: row s is rank s's row for me."""
    return torch.stack([p[me] for p in payloads])


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("channels", [1, 3, 12, 64])
def test_handle_entries_match_deepeps_definitions(ranks, channels):
    for seed in range(6):
        in_rank = _in_rank(seed, ranks)
        sent = [deep_ep._handle_payload(t, channels, CAP) for t in in_rank]
        lists = [t.tolist() for t in in_rank]
        for me in range(ranks):
            payload, channel_prefix, send_head = sent[me]
            assert payload.shape == (ranks, ranks + channels + CAP) and payload.dtype == torch.int32
            total = sum(int(t[:, me].sum()) for t in in_rank)
            for rows in (total, total + 7):  # exact sizing, and num_worst_tokens past the received rows
                got = deep_ep._handle_from_payloads(_exchange([p for p, _, _ in sent], me), me, channels, rows)
                rank_prefix, recv_channel_prefix, recv_src_idx = got
                want = ref.handle(lists, me, channels, rows)
                for t, shape in zip((rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, send_head),
                                    ((ranks, ranks), (ranks, channels), (ranks, channels), (rows,),
                                     (len(lists[me]), ranks))):
                    assert t.dtype == torch.int32 and tuple(t.shape) == shape and t.is_contiguous()
                assert rank_prefix.tolist() == want[0], (seed, me)
                assert channel_prefix.tolist() == want[1], (seed, me)
                assert recv_channel_prefix.tolist() == want[2], (seed, me)
                assert recv_src_idx.tolist() == want[3], (seed, me)
                assert send_head.tolist() == want[4], (seed, me)


def test_reference_reads_deepeps_layout_back():
    """The reference against what DeepEP's receivers do with it: source i's rows of recv_x end at
    rank_prefix_matrix[i][me] (DeepEP's test_intranode.py reads it so), and channel c of source s starts at
    recv_channel_prefix_matrix[s][c] inside its block, where recv_src_idx holds that channel's first token."""
    in_rank = [t.tolist() for t in _in_rank(1, 4)]
    for me in range(4):
        rank_prefix, _, recv_channel_prefix, recv_src_idx, _ = ref.handle(in_rank, me, 3)
        start = 0
        for s in range(4):
            end = rank_prefix[s][me]
            assert recv_src_idx[start:end] == [t for t, row in enumerate(in_rank[s]) if row[me]]
            for c in range(3):
                begin, stop = ref.channel_range(len(in_rank[s]), 3, c)
                first = [t for t in range(begin, stop) if in_rank[s][t][me]][:1]
                at = start + recv_channel_prefix[s][c]
                assert recv_src_idx[at:at + len(first)] == first
            start = end


# -- Buffer.dispatch -------------------------------------------------------------------------------------------------
class _HighThroughputGroup:
    """Stands in for a High-Throughput nccl.ep.Group: a dispatch returns `rows` rows (the world's tokens for this
    rank, set by the test; worst-case sizing: 2 * CAP * R) and records the calls."""

    made = []

    def __init__(self, group, **kwargs):
        self.kwargs, self.calls, self.rows = kwargs, [], 0
        _HighThroughputGroup.made.append(self)

    def dispatch(self, x, topk_idx=None, topk_weights=None, *, handle=None, scales=None, sizing="exact", num_sms=0):
        rows = self.rows if sizing == "exact" else 2 * CAP * dist.get_world_size()
        if handle is None:
            handle = SimpleNamespace(group=self, num_tokens=x.shape[0], output_rows=lambda: rows)
        self.calls.append(("dispatch", handle, sizing))
        k = topk_idx.shape[1] if topk_idx is not None else 1
        return SimpleNamespace(tokens=torch.zeros(rows, x.shape[1], dtype=x.dtype), handle=handle, scales=None,
                               topk_idx=torch.zeros(rows, k, dtype=torch.int32), topk_weights=torch.zeros(rows, k),
                               expert_counts=torch.zeros(LOCAL, dtype=torch.int32),
                               rank_counts=torch.zeros(dist.get_world_size(), dtype=torch.int32))

    def combine(self, y, handle, num_sms=0):
        self.calls.append(("combine", handle, y.shape[0]))
        return torch.zeros(handle.num_tokens, y.shape[1], dtype=y.dtype)


def _routing(in_rank):
    """A top-k routing that sends each token to the ranks of its row (the first local expert there) and -1 else."""
    experts = torch.arange(in_rank.shape[1]) * LOCAL
    return torch.where(in_rank, experts, -1)


def _dispatch(buf, in_rank, **kwargs):
    ranks = dist.get_world_size()
    t = in_rank.shape[0]
    idx = _routing(in_rank)
    per_rank, _, per_expert, layout_in_rank, _ = buf.get_dispatch_layout(idx, LOCAL * ranks)
    assert torch.equal(layout_in_rank, in_rank)
    x = torch.zeros(t, H, dtype=torch.bfloat16)
    if kwargs.pop("with_topk", True):
        kwargs.update(topk_idx=idx, topk_weights=torch.ones(t, ranks))
    return buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                        **kwargs)


def _sized(rows):
    """_HighThroughputGroup whose exact dispatches return `rows` rows."""

    class Sized(_HighThroughputGroup):
        def __init__(self, group, **kwargs):
            super().__init__(group, **kwargs)
            self.rows = rows

    return Sized


def _fake_world(monkeypatch, rank, size):
    """torch's fake process group as rank `rank` of `size`, the stand-in nccl.ep group, Buffer sized for CAP."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
    monkeypatch.setattr(deep_ep, "Group", _HighThroughputGroup)
    monkeypatch.setattr(deep_ep.Buffer, "max_tokens_per_rank", CAP)
    _HighThroughputGroup.made = []
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def fake_world(monkeypatch):
    yield from _fake_world(monkeypatch, 1, 4)


@pytest.fixture
def exchange(fake_world, monkeypatch):
    """all_to_all_single played for rank 1 of 4: the other ranks send what _handle_payload makes of `world[s]` (set
    by the test) for `channels`; records each call."""
    state = SimpleNamespace(world=None, channels=None, calls=0)

    def all_to_all_single(output, input, group=None):
        me = dist.get_rank()
        sent = [deep_ep._handle_payload(t, state.channels, CAP)[0] for t in state.world]
        assert torch.equal(input, sent[me])  # this rank's own payload, computed by dispatch
        output.copy_(_exchange(sent, me))
        state.calls += 1

    monkeypatch.setattr(dist, "all_to_all_single", all_to_all_single)
    return state


@pytest.mark.parametrize("num_sms,with_topk,worst", [(20, True, 0), (24, False, 0), (6, True, 3 * CAP)])
def test_dispatch_handle_is_deepeps_tuple(exchange, monkeypatch, num_sms, with_topk, worst):
    in_rank = _in_rank(3, 4)
    me, channels = 1, num_sms // 2
    exchange.world, exchange.channels = in_rank, channels
    total = sum(int(t[:, me].sum()) for t in in_rank)
    monkeypatch.setattr(deep_ep, "Group", _sized(total))
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    config = deep_ep.Config(num_sms, 8, 256) if num_sms != deep_ep.Buffer.num_sms else None  # None: the default
    kwargs = {"config": config, "with_topk": with_topk}
    if worst:
        kwargs["num_worst_tokens"] = worst
    recv_x, _, _, _, handle, _ = _dispatch(buf, in_rank[me], **kwargs)
    rows = worst or total
    assert exchange.calls == 1 and recv_x.shape[0] == rows
    assert isinstance(handle, tuple) and len(handle) == 6
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head = handle
    want = ref.handle([t.tolist() for t in in_rank], me, channels, rows)
    assert rank_prefix.tolist() == want[0] and rank_prefix[3][me] == total  # DeepEP's test reads [i][rank]
    assert channel_prefix.tolist() == want[1] and channel_prefix.shape == (4, channels)
    assert recv_channel_prefix.tolist() == want[2]
    assert recv_src_idx.tolist() == want[3] and recv_src_idx.shape == (rows,)
    assert is_token_in_rank is handle[4] and torch.equal(is_token_in_rank, in_rank[me])
    assert send_head.tolist() == want[4]
    assert handle[0] is rank_prefix and handle[-1] is send_head and len(handle[1:4]) == 3
    # combine and a cached dispatch use the nccl.ep handle the tuple carries, and exchange nothing.
    group = _HighThroughputGroup.made[-1]
    ep_handle = group.calls[-1][1]
    buf.combine(recv_x, handle)
    assert group.calls[-1][:2] == ("combine", ep_handle)
    if not with_topk:
        cached, *_ = buf.dispatch(torch.ones(in_rank[me].shape[0], H, dtype=torch.bfloat16), handle=handle)
        assert group.calls[-1][:2] == ("dispatch", ep_handle) and cached.shape[0] == rows
    assert exchange.calls == 1


def test_dispatch_handle_entries_can_be_switched_off(exchange, monkeypatch):
    in_rank = _in_rank(2, 4)
    exchange.world, exchange.channels = in_rank, deep_ep.Buffer.num_sms // 2
    monkeypatch.setattr(deep_ep.Buffer, "dispatch_handle_entries", False)
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    recv_x, _, _, _, handle, _ = _dispatch(buf, in_rank[1])
    assert exchange.calls == 0 and len(handle) == 6
    with pytest.raises(NotImplementedError, match="dispatch_handle_entries = False"):
        handle[0]
    with pytest.raises(NotImplementedError, match="dispatch_handle_entries = False"):
        tuple(handle)
    buf.combine(recv_x, handle)  # still good for combine
    assert _HighThroughputGroup.made[-1].calls[-1][0] == "combine"


def test_dispatch_handle_has_no_entries_above_eight_ranks_off_nodes_of_eight(fake_world):
    # DeepEP's internode handle needs nodes of 8 ranks: 12 ranks get none, and nothing is exchanged.
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    buf.group_size = 12
    assert buf._handle_entries(torch.zeros(3, 12, dtype=torch.bool), deep_ep.Config(), 0, 0) is None


# -- above 8 ranks: DeepEP's internode handle -------------------------------------------------------------------------
def _sparse_in_rank(seed, ranks, p=0.08):
    """Like _in_rank, fewer ranks a token (so that some tokens miss whole nodes), and a token to no rank at all."""
    gen = torch.Generator().manual_seed(seed * 17 + ranks)
    sizes = [int(torch.randint(0, CAP, (1,), generator=gen)) for _ in range(ranks)]
    if seed % 2 == 0:
        sizes[ranks // 2] = 0
    return [torch.rand(t, ranks, generator=gen) < p for t in sizes]


def _internode_sent(in_rank, channels):
    return [deep_ep._internode_payload(t, channels, CAP) for t in in_rank]


def _check_internode(entries, in_rank, me, channels, rows, worst):
    """The ten entries (is_token_in_rank first) against the reference, with DeepEP's shapes and dtypes."""
    r, nodes = len(in_rank), len(in_rank) // 8
    want = ref.internode_handle([t.tolist() for t in in_rank], me, channels, rows)
    (rdma_prefix, gbl_prefix, recv_rdma_channel, recv_rdma_rank, recv_gbl_channel, recv_gbl_rank, meta, send_rdma_head,
     send_nvl_head) = entries[1:]
    forwarded = want[3][-1]
    shapes = ((nodes, channels), (r, channels), (nodes, channels), (nodes,), (r, channels), (r,), (rows, 8),
              (in_rank[me].shape[0], nodes), (nodes * CAP if worst else forwarded, 8))
    for t, shape in zip(entries[1:], shapes):
        assert tuple(t.shape) == shape and t.is_contiguous(), (me, t.shape, shape)
        assert t.dtype == (torch.uint8 if t is meta else torch.int32)
    assert rdma_prefix.tolist() == want[0] and gbl_prefix.tolist() == want[1], me
    assert recv_rdma_channel.tolist() == want[2] and recv_rdma_rank.tolist() == want[3], me
    assert recv_gbl_channel.tolist() == want[4] and recv_gbl_rank.tolist() == want[5], me
    assert [tuple(v) for v in meta.view(torch.int32).tolist()] == want[6], me
    assert send_rdma_head.tolist() == want[7], me
    assert send_nvl_head[:forwarded].tolist() == want[8], me
    assert bool((send_nvl_head[forwarded:] == -1).all())


@pytest.mark.parametrize("ranks", [16, 24])
@pytest.mark.parametrize("channels", [1, 5, 64])
def test_internode_entries_match_deepeps_definitions(ranks, channels):
    for seed in range(3):
        in_rank = _sparse_in_rank(seed, ranks)
        sent = _internode_sent(in_rank, channels)
        for me in (0, 9, ranks - 1):  # a rank of the first node, of the second, the last
            payload, rdma_prefix, gbl_prefix, send_rdma_head = sent[me]
            assert payload.shape == (ranks, 2 + 2 * channels + CAP) and payload.dtype == torch.int32
            total = sum(int(t[:, me].sum()) for t in in_rank)
            for rows, worst in ((total, False), (total + 5, True)):
                got = deep_ep._internode_from_payloads(_exchange([p[0] for p in sent], me), me, channels, rows, CAP)
                if not worst:
                    got = got[:5] + (got[5][:int(got[1][-1])],)
                entries = (in_rank[me], rdma_prefix, gbl_prefix, got[0], got[1], got[2], got[3], got[4],
                           send_rdma_head, got[5])
                _check_internode(entries, in_rank, me, channels, rows, worst)


def test_internode_reference_reads_deepeps_layout_back():
    """The reference against what DeepEP's receivers do with it: rows [P[g - 1], P[g]) of recv_x came from rank g
    (test_internode.py's check_data), channel c of rank g starts at recv_gbl_channel_prefix_matrix[g][c], and each
    forwarded token's row at recv_rdma_rank_prefix_sum[m - 1] + its rank among rank (m, l)'s tokens to node n."""
    in_rank = [t.tolist() for t in _sparse_in_rank(1, 16, p=0.2)]
    for me in (3, 12):
        n, lane = divmod(me, 8)
        _, _, _, recv_rdma_rank, recv_gbl_channel, recv_gbl_rank, meta, _, send_nvl_head = \
            ref.internode_handle(in_rank, me, 3)
        start = 0
        for g in range(16):
            mine = [t for t, row in enumerate(in_rank[g]) if row[me]]
            assert recv_gbl_rank[g] - start == len(mine)
            assert all(m[0] == g // 8 and m[1] >> lane & 1 for m in meta[start:recv_gbl_rank[g]])
            for c in range(3):
                begin, stop = ref.channel_range(len(in_rank[g]), 3, c)
                assert recv_gbl_channel[g][c] == start + sum(1 for t in mine if t < begin)
            start = recv_gbl_rank[g]
        forwarded = 0
        for m in range(2):
            src = in_rank[m * 8 + lane]
            node_tokens = [t for t, row in enumerate(src) if any(row[n * 8:n * 8 + 8])]
            assert recv_rdma_rank[m] - forwarded == len(node_tokens)
            forwarded = recv_rdma_rank[m]
        assert len(send_nvl_head) == forwarded


@pytest.fixture
def fake_world_16(monkeypatch):
    yield from _fake_world(monkeypatch, 9, 16)


@pytest.mark.parametrize("worst", [0, 16 * CAP])
def test_dispatch_handle_is_deepeps_internode_tuple(fake_world_16, monkeypatch, worst):
    """Buffer.dispatch at rank 9 of 16: DeepEP's ten internode entries, one all-to-all of _internode_payload rows."""
    in_rank, me, channels = _sparse_in_rank(4, 16), 9, 10
    calls = []

    def all_to_all_single(output, input, group=None):
        sent = [p[0] for p in _internode_sent(in_rank, channels)]
        assert torch.equal(input, sent[me])
        output.copy_(_exchange(sent, me))
        calls.append(1)

    monkeypatch.setattr(dist, "all_to_all_single", all_to_all_single)
    total = sum(int(t[:, me].sum()) for t in in_rank)
    monkeypatch.setattr(deep_ep, "Group", _sized(total))
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    kwargs = {"config": deep_ep.Config(2 * channels, 8, 256)}
    if worst:
        kwargs["num_worst_tokens"] = worst
    recv_x, _, _, _, handle, _ = _dispatch(buf, in_rank[me], **kwargs)
    rows = worst or total
    assert calls == [1] and recv_x.shape[0] == rows and len(handle) == 10
    assert handle[0] is not None and torch.equal(handle[0], in_rank[me])
    assert handle[-4].tolist()[-1] == total  # DeepEP's test_internode.py reads handle[-4]
    _check_internode(tuple(handle), in_rank, me, channels, rows, bool(worst))
    buf.combine(recv_x, handle)  # combine uses the nccl.ep handle
    assert _HighThroughputGroup.made[-1].calls[-1][0] == "combine"


@pytest.mark.parametrize("bad", [torch.zeros(5, 4, dtype=torch.bool), torch.zeros(4, 3, dtype=torch.bool),
                                 torch.zeros(4, 4, dtype=torch.int32)])
def test_dispatch_checks_is_token_in_rank(fake_world, bad):
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    with pytest.raises(NcclInvalidArgument, match=r"is_token_in_rank must be \[4, 4\] bool"):
        buf.dispatch(torch.zeros(4, H, dtype=torch.bfloat16), num_tokens_per_rank=torch.zeros(4, dtype=torch.int32),
                     is_token_in_rank=bad, num_tokens_per_expert=torch.zeros(8, dtype=torch.int32))


# -- two real processes ----------------------------------------------------------------------------------------------
def _rank_main(rank, world, store, results):
    # A file store: no port to pick (a free port found first can be taken before the store binds it).
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    try:
        in_rank = _in_rank(5, world)
        deep_ep.Group = _sized(sum(int(t[:, rank].sum()) for t in in_rank))
        deep_ep.Buffer.max_tokens_per_rank = CAP
        buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
        handle = _dispatch(buf, in_rank[rank], config=deep_ep.Config(8, 6, 256))[4]
        results[rank] = [handle[i].tolist() for i in (0, 1, 2, 3, 5)]
    finally:
        dist.destroy_process_group()


def test_dispatch_handle_over_gloo_processes(tmp_path):
    """The exchange through torch's real all_to_all_single (gloo, 2 processes): each rank's entries as the reference
    computes them from every rank's routing."""
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    mp.start_processes(_rank_main, args=(world, str(tmp_path / "store"), results), nprocs=world, join=True,
                       start_method="spawn")
    lists = [t.tolist() for t in _in_rank(5, world)]
    for me in range(world):
        assert results[me] == list(ref.handle(lists, me, 4)), me
