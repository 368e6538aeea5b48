"""nccl.ep's rank masks (Group(enable_mask=True), Low-Latency fault tolerance) on the CPU: what reaches the group
config, the C calls mask_query / mask_update / mask_clean make (recorded, not made), combine's missing_experts in
the C structs and every refusal with its message. Needs torch (skipped without it); no GPU."""

import contextlib
import ctypes
import functools
import types

import pytest

torch = pytest.importorskip("torch")

import nccl.ep as ep  # noqa: E402  (after torch: one libnccl in the process, torch's)
from nccl._ext import tensor as T  # noqa: E402

R, L, M, K, H = 4, 2, 8, 3, 256


class _Stream:
    cuda_stream = 0


class _Comm:
    """What Group reads of a Communicator (patched in as ep.Communicator: the group is then not its owner)."""

    rank, size, handle, device = 0, R, None, torch.device("cpu")


@pytest.fixture
def calls(monkeypatch):
    """The C calls of nccl.ep, recorded as (name, args) instead of made; the stand-in streams allocate as the
    current one (the CPU's)."""
    made = []
    monkeypatch.setattr(ep, "_call", lambda name, *args: made.append((name, args)))
    monkeypatch.setattr(ep, "_allocating_on", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(ep, "_record_on", lambda stream, *tensors: None)
    return made


def _group(calls, monkeypatch, **kwargs):
    """A Group over a stand-in communicator, its ncclEpCreateGroup recorded: (group, the config it passed)."""
    monkeypatch.setattr(ep, "Communicator", _Comm)
    g = ep.Group(_Comm(), num_experts=R * L, max_tokens_per_rank=M, hidden=H, **kwargs)
    g._g = ctypes.c_void_p(1)  # stands for the C group the recorded call did not make
    (name, args), = [c for c in calls if c[0] == "ncclEpCreateGroup"]
    return g, args[2]._obj


def test_enable_mask_reaches_the_group_config(calls, monkeypatch):
    g, cfg = _group(calls, monkeypatch, algorithm="low_latency", enable_mask=True)
    assert cfg.enable_mask == 1 and cfg.algorithm == ep._ALGO["low_latency"] and g.enable_mask
    calls.clear()
    g, cfg = _group(calls, monkeypatch, algorithm="low_latency")
    assert cfg.enable_mask == 0 and not g.enable_mask


def test_rail_round_tokens_reaches_the_group_config(calls, monkeypatch):
    _, cfg = _group(calls, monkeypatch, rail_round_tokens=96)
    assert cfg.rail_round_tokens == 96
    calls.clear()
    _, cfg = _group(calls, monkeypatch)
    assert cfg.rail_round_tokens == 0  # NCCL_EP_AUTO: the environment's, else the library's default


def test_rail_staging_bytes_max_reaches_the_group_config(calls, monkeypatch):
    _, cfg = _group(calls, monkeypatch, rail_staging_bytes_max=1 << 33)
    assert cfg.rail_staging_bytes_max == 1 << 33  # a size_t: budgets past 4 GiB
    calls.clear()
    _, cfg = _group(calls, monkeypatch)
    assert cfg.rail_staging_bytes_max == 0  # no limit
    calls.clear()
    monkeypatch.setattr(ep, "Communicator", _Comm)
    with pytest.raises(ep.NcclInvalidArgument, match="rail_staging_bytes_max -1 < 0"):
        ep.Group(_Comm(), num_experts=R * L, max_tokens_per_rank=M, hidden=H, rail_staging_bytes_max=-1)
    assert calls == []  # refused before the group is made


def test_enable_mask_is_for_low_latency_groups(calls, monkeypatch):
    monkeypatch.setattr(ep, "Communicator", _Comm)
    with pytest.raises(ep.NcclInvalidUsage, match="enable_mask=True: rank masks belong to the Low-Latency mode"):
        ep.Group(_Comm(), num_experts=R * L, max_tokens_per_rank=M, hidden=H, enable_mask=True)
    assert calls == []  # refused before the group is made


@pytest.mark.parametrize("mask,want", [
    ([True, False, True, True], [1, 0, 1, 1]),
    ([1, 0, 0, 7], [1, 0, 0, 1]),  # nonzero = active
    (torch.tensor([0, 1, 1, 0], dtype=torch.int32), [0, 1, 1, 0]),
    (torch.tensor([True, True, False, True]), [1, 1, 0, 1]),
])
def test_mask_update_passes_one_int_per_rank(calls, monkeypatch, mask, want):
    g, _ = _group(calls, monkeypatch, algorithm="low_latency", enable_mask=True)
    g.mask_update(mask, stream=_Stream())
    name, (group, host, stream) = calls[-1]
    assert name == "ncclEpMaskUpdate" and group is g._g and stream == 0
    assert isinstance(host, ctypes.Array) and list(host) == want


@pytest.mark.parametrize("mask,text", [
    ([1, 1, 1], "mask_update: 3 entries for a group of 4 ranks; give one per rank"),
    ([1] * 5, "mask_update: 5 entries for a group of 4 ranks"),
    (torch.ones(2, 2, dtype=torch.int32), r"mask_update: mask must be 1-D \(one entry per rank\); got shape \(2, 2\)"),
])
def test_mask_update_refusals(calls, monkeypatch, mask, text):
    g, _ = _group(calls, monkeypatch, algorithm="low_latency", enable_mask=True)
    calls.clear()
    with pytest.raises(ep.NcclInvalidArgument, match=text):
        g.mask_update(mask, stream=_Stream())
    assert calls == []


def test_mask_query_and_clean(calls, monkeypatch):
    g, _ = _group(calls, monkeypatch, algorithm="low_latency", enable_mask=True)
    mask = g.mask_query(stream=_Stream())
    name, (group, dev, stream) = calls[-1]
    assert name == "ncclEpMaskQuery" and group is g._g and dev == mask.data_ptr()
    assert mask.dtype == torch.int32 and mask.shape == (R,) and mask.device == _Comm.device
    g.mask_clean(stream=_Stream())
    assert calls[-1] == ("ncclEpMaskClean", (g._g, 0))


def test_mask_calls_after_close_are_refused(calls, monkeypatch):
    g, _ = _group(calls, monkeypatch, algorithm="low_latency", enable_mask=True)
    g._g = ctypes.c_void_p()
    for call in (g.mask_query, g.mask_clean, lambda **kw: g.mask_update([1] * R, **kw)):
        with pytest.raises(ep.NcclInvalidUsage, match="used after close"):
            call(stream=_Stream())


# -- combine's missing_experts in the C structs ---------------------------------------------------------------------
class _FakeHandle:
    """What Group.combine reads of a Handle."""

    def __init__(self, group, layout="expert_major", num_tokens=5):
        self.group, self.layout, self.num_tokens, self.topk = group, layout, num_tokens, K
        self._prepared, self._open_outputs = {}, None

    def _handle(self):
        return None

    def _on(self, raw_stream):
        return raw_stream


def _shell(low_latency=True, enable_mask=True):
    g = ep.Group.__new__(ep.Group)
    g.comm = types.SimpleNamespace(device=torch.device("cpu"))  # the tensors' device here
    g.low_latency, g.enable_mask, g.size, g.local_experts = low_latency, enable_mask, R, L
    return g


@pytest.fixture
def on_cpu(monkeypatch):
    """CPU tensors accepted as if on a GPU, and the prepared C calls recorded instead of made."""
    invoked = []
    monkeypatch.setattr(ep, "describe", functools.partial(T.describe, require_cuda=False))
    monkeypatch.setattr(ep._Prepared, "invoke", lambda self, *args: invoked.append(self))
    monkeypatch.setattr(ep, "_allocating_on", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(ep, "_record_on", lambda stream, *tensors: None)
    return invoked


def _combine(g, h, **kwargs):
    y = torch.zeros(L * R * M, H, dtype=torch.bfloat16)
    return g.combine(y, h, stream=_Stream(), **kwargs)


def test_missing_experts_in_the_combine_structs(on_cpu):
    g = _shell()
    h = _FakeHandle(g)
    missing = torch.full((5,), -1, dtype=torch.int32)
    _combine(g, h, topk_weights=torch.rand(5, K), missing_experts=missing)
    outputs = on_cpu[0].structs[1]
    d = outputs.missing_experts
    assert (d.ndim, list(d.sizes)[:1], d.datatype, d.data) == (1, [5], T.NCCL_INT32, missing.data_ptr())
    again = torch.zeros(5, dtype=torch.int32)
    _combine(g, h, topk_weights=torch.rand(5, K), missing_experts=again)
    assert on_cpu[1] is on_cpu[0] and d.data == again.data_ptr()  # same prepared call, this call's tensor
    _combine(g, h, topk_weights=torch.rand(5, K))  # another signature: no missing_experts
    assert on_cpu[2] is not on_cpu[0] and on_cpu[2].structs[1].missing_experts.data is None
    assert len(h._prepared) == 2


def test_a_send_only_combine_keeps_missing_experts_until_complete(on_cpu):
    g = _shell()
    h = _FakeHandle(g)
    missing = torch.zeros(5, dtype=torch.int32)
    out = _combine(g, h, missing_experts=missing, send_only=True)
    (kept, _stream) = h._open_outputs
    assert kept == (out, missing, None) and on_cpu[0].structs[2].send_only == 1


def test_missing_experts_of_no_tokens_has_no_pointer(on_cpu):
    g = _shell()
    h = _FakeHandle(g, num_tokens=0)
    _combine(g, h, missing_experts=torch.zeros(0, dtype=torch.int32))
    d = on_cpu[0].structs[1].missing_experts
    assert d.ndim == 1 and d.data is None


@pytest.mark.parametrize("ll,mask,missing,exc,text", [
    (True, True, torch.zeros(5, dtype=torch.int64), ep.NcclInvalidArgument,
     "missing_experts has dtype torch.int64; expected torch.int32"),
    (True, True, torch.zeros(6, dtype=torch.int32), ep.NcclInvalidArgument,
     r"missing_experts has shape \(6,\); the routing has 5 tokens"),
    (True, True, torch.zeros(5, 1, dtype=torch.int32), ep.NcclInvalidArgument,
     "missing_experts must have 1 dimensions"),
    (True, True, torch.zeros(10, dtype=torch.int32)[::2], ep.NcclInvalidArgument, "missing_experts must be contiguous"),
    (True, True, [0] * 5, ep.NcclInvalidArgument, "missing_experts must be a torch.Tensor, not list"),
    (True, False, torch.zeros(5, dtype=torch.int32), ep.NcclInvalidUsage, "this one is Low-Latency without a mask"),
    (False, False, torch.zeros(5, dtype=torch.int32), ep.NcclInvalidUsage,
     "this one is High-Throughput without a receive cap"),
])
def test_missing_experts_refusals(on_cpu, ll, mask, missing, exc, text):
    g = _shell(low_latency=ll, enable_mask=mask)
    h = _FakeHandle(g)
    with pytest.raises(exc, match=text):
        _combine(g, h, missing_experts=missing)
    assert on_cpu == []


def test_a_high_throughput_group_with_a_receive_cap_takes_missing_experts(on_cpu):
    g = _shell(low_latency=False, enable_mask=False)
    g.max_recv_rows_per_rank = 100
    h = _FakeHandle(g)
    _combine(g, h, missing_experts=torch.zeros(5, dtype=torch.int32))
    assert on_cpu[0].structs[1].missing_experts.ndim == 1


def test_missing_experts_must_be_on_the_gpu(on_cpu, monkeypatch):
    # Only missing_experts is held to the CUDA check here: y stays a CPU stand-in.
    def describe(t, name, **kwargs):
        return T.describe(t, name, require_cuda=name == "missing_experts", **kwargs)

    monkeypatch.setattr(ep, "describe", describe)
    g = _shell()
    with pytest.raises(ep.NcclInvalidArgument, match="missing_experts must be a CUDA tensor; it is on cpu"):
        _combine(g, _FakeHandle(g), missing_experts=torch.zeros(5, dtype=torch.int32))


def test_mask_functions_are_bound():
    lib = ep._lib()
    for name in ("ncclEpMaskQuery", "ncclEpMaskUpdate", "ncclEpMaskClean"):
        assert getattr(lib, name).restype is ctypes.c_int and getattr(lib, name).argtypes == ep._SIGNATURES[name]


# -- recv_wait_cycles (DeepEP's *_wait_recv_cost_stats) in the combine structs ---------------------------------------
def test_recv_wait_cycles_in_the_combine_structs(on_cpu):
    g = _shell(enable_mask=False)
    h = _FakeHandle(g)
    waits = torch.zeros(R, dtype=torch.int64)
    out = _combine(g, h, recv_wait_cycles=waits, send_only=True)
    d = on_cpu[0].structs[1].recv_wait_cycles
    assert (d.ndim, list(d.sizes)[:1], d.datatype, d.data) == (1, [R], T.NCCL_INT64, waits.data_ptr())
    assert h._open_outputs[0] == (out, None, waits)  # kept until complete
    again = torch.zeros(R, dtype=torch.int64)
    _combine(g, h, recv_wait_cycles=again, send_only=True)
    assert on_cpu[1] is on_cpu[0] and d.data == again.data_ptr()
    _combine(g, h)  # another signature: none
    assert on_cpu[2].structs[1].recv_wait_cycles.data is None


@pytest.mark.parametrize("ll,waits,exc,text", [
    (True, torch.zeros(R, dtype=torch.int32), ep.NcclInvalidArgument,
     "recv_wait_cycles has dtype torch.int32; expected torch.int64"),
    (True, torch.zeros(R + 1, dtype=torch.int64), ep.NcclInvalidArgument,
     r"recv_wait_cycles has shape \(5,\); it is \[4\] \(one per rank\)"),
    (True, torch.zeros(2 * R, dtype=torch.int64)[::2], ep.NcclInvalidArgument, "recv_wait_cycles must be contiguous"),
    (False, torch.zeros(R, dtype=torch.int64), ep.NcclInvalidUsage,
     "combine: recv_wait_cycles is for Low-Latency groups; this one is High-Throughput"),
])
def test_recv_wait_cycles_refusals(on_cpu, ll, waits, exc, text):
    g = _shell(low_latency=ll, enable_mask=False)
    with pytest.raises(exc, match=text):
        _combine(g, _FakeHandle(g), recv_wait_cycles=waits)
    assert on_cpu == []
