"""nccl.ep's torch adapter on the CPU: descriptors, and every argument the Python layer rejects, with its message.
Needs torch (skipped without it); no GPU."""

import ctypes
import re
import types

import pytest

torch = pytest.importorskip("torch")

import nccl.ep as ep  # noqa: E402  (after torch: one libnccl in the process, torch's)
from nccl._ext import tensor as T  # noqa: E402


def test_descriptor_of_a_tensor():
    t = torch.zeros((3, 5), dtype=torch.bfloat16)
    d = T.describe(t, "x", require_cuda=False)
    assert (d.ndim, d.datatype, d.data) == (2, T.NCCL_BFLOAT16, t.data_ptr())
    assert list(d.sizes) == [3, 5, 0, 0]


@pytest.mark.parametrize("dtype,code", [(torch.bfloat16, 9), (torch.float16, 6), (torch.float32, 7),
                                        (torch.int32, 2), (torch.int64, 4), (torch.uint8, 1),
                                        (torch.float8_e4m3fn, 10)])
def test_dtype_codes(dtype, code):
    assert T.nccl_dtype(dtype) == code


def test_empty_tensor_has_no_pointer():
    d = T.describe(torch.zeros((0, 8), dtype=torch.float32), "x", require_cuda=False)
    assert d.data is None and list(d.sizes)[:2] == [0, 8]


def test_a_prepared_call_points_its_structs_at_each_calls_tensors():
    """Group.dispatch / combine's cached structs: each call's inputs and new outputs land in the very structs the C
    call reads (descriptors are views into them), shapes and dtypes from the signature."""
    x = torch.zeros((4, 8), dtype=torch.bfloat16)
    inputs = ep._DispatchInputs.new(tokens=T.describe(x, "x", require_cuda=False))
    outputs = ep._DispatchOutputs.new(tokens=T.descriptor((6, 8), torch.bfloat16),
                                      topk_idx=T.descriptor((6, 2), torch.int32))
    prep = ep._Prepared("ncclEpDispatch", inputs, outputs, ep._DispatchConfig.new(), [(inputs.tokens, True)],
                        [(outputs.tokens, (6, 8), torch.bfloat16), (outputs.topk_idx, (6, 2), torch.int32)],
                        torch.device("cpu"))
    for _ in range(2):  # a second call: new tensors, the same structs
        x = torch.ones((4, 8), dtype=torch.bfloat16)
        tokens, idx = prep.fill((x,))
        assert inputs.tokens.data == x.data_ptr()
        assert (outputs.tokens.data, outputs.topk_idx.data) == (tokens.data_ptr(), idx.data_ptr())
        assert (tokens.shape, tokens.dtype, idx.shape, idx.dtype) == ((6, 8), torch.bfloat16, (6, 2), torch.int32)
        assert list(outputs.topk_idx.sizes)[:2] == [6, 2] and outputs.topk_idx.datatype == T.NCCL_INT32
    empty = ep._Prepared("ncclEpCombine", ep._CombineInputs.new(), ep._CombineOutputs.new(), ep._CombineConfig.new(),
                         [], [(ep._CombineOutputs.new().tokens, (0, 8), torch.float32)], torch.device("cpu"))
    (out,) = empty.fill(())
    assert out.shape == (0, 8)


@pytest.mark.parametrize("make,kwargs,text", [
    (lambda: [1, 2], {}, "x must be a torch.Tensor, not list"),
    (lambda: torch.zeros(4, 4, dtype=torch.float64), {}, "float64 has no NCCL equivalent"),
    (lambda: torch.zeros(4, 4, dtype=torch.int16), {"dtypes": (torch.int32, torch.int64)},
     "x has dtype torch.int16; expected torch.int32 or torch.int64"),
    (lambda: torch.zeros(4), {"ndim": 2}, "x must have 2 dimensions; got shape (4,)"),
    (lambda: torch.zeros(1, 1, 1, 1, 1), {}, "x has 5 dimensions; at most 4"),
    (lambda: torch.zeros(4, 6).t(), {}, "x must be contiguous"),
])
def test_rejected_tensors(make, kwargs, text):
    with pytest.raises(ep.NcclInvalidArgument) as e:
        T.describe(make(), "x", require_cuda=False, **kwargs)
    assert text in str(e.value)


def test_cpu_tensor_is_refused_by_default():
    with pytest.raises(ep.NcclInvalidArgument, match="x must be a CUDA tensor; it is on cpu"):
        T.describe(torch.zeros(2, 2), "x")


def test_group_needs_torch_distributed():
    if torch.distributed.is_initialized():
        pytest.skip("torch.distributed is initialised (torchrun)")
    with pytest.raises(ep.NcclInvalidArgument, match="torch.distributed is not initialised"):
        ep.Group(num_experts=8, max_tokens_per_rank=16, hidden=64)


def test_group_needs_a_row_size():
    with pytest.raises(ep.NcclInvalidArgument, match="give hidden"):
        ep.Group(num_experts=8, max_tokens_per_rank=16)


def test_unknown_choice_is_named():
    with pytest.raises(ep.NcclInvalidArgument, match="layout='diagonal': expected one of expert_major, flat"):
        ep._choice(ep._LAYOUT, "diagonal", "layout")


def test_null_objects_are_errors_not_crashes():
    with pytest.raises(ep.NcclInvalidArgument, match="group is NULL"):
        ep._call("ncclEpGroupGetAsyncError", ctypes.c_void_p())
    ep._call("ncclEpGroupDestroy", ctypes.c_void_p())  # destroying NULL is nothing to do, like free(NULL)
    ep._call("ncclEpHandleDestroy", ctypes.c_void_p())


# -- Low-Latency: the Python layer's translation into the C structs, on the CPU ------------------------------------
# A Group shell (no C group) and a stand-in handle carry what Group.dispatch / combine read; the C call is stubbed
# (the structs it would get are inspected instead) and CPU tensors stand in for CUDA ones.

R, L, M, K, H = 2, 4, 8, 3, 256


class _Stream:
    cuda_stream = 0


class _FakeHandle:
    """What Group.dispatch / combine read of a Handle."""

    def __init__(self, group, layout, num_tokens=5, topk=K):
        self.group, self.layout, self.sizing = group, layout, "worst_case"
        self.num_tokens, self.topk, self.topk_idx = num_tokens, topk, None
        self.low_latency = group.low_latency
        self.expert_counts = self.rank_counts = self.expert_offsets = self.recv_total = None
        self._prepared, self._open_outputs = {}, None

    def output_rows(self):
        if self.layout == "rank_major":
            return R * M
        if self.layout == "expert_major" and self.group.low_latency:
            return L * R * M
        return 7  # a High-Throughput stand-in

    def _handle(self):
        return None

    def _on(self, raw_stream):
        return raw_stream


def _shell(low_latency=True):
    g = ep.Group.__new__(ep.Group)
    g.comm = types.SimpleNamespace(device=torch.device("cpu"))  # the tensors' device here
    g.algorithm = "low_latency" if low_latency else "high_throughput"
    g.low_latency, g.size, g.local_experts, g.max_tokens_per_rank = low_latency, R, L, M
    g.num_experts = R * L
    return g


@pytest.fixture
def on_cpu(monkeypatch):
    """CPU tensors accepted as if on a GPU, and the C calls recorded instead of made."""
    import functools

    calls = []
    monkeypatch.setattr(ep, "describe", functools.partial(T.describe, require_cuda=False))
    monkeypatch.setattr(ep._Prepared, "invoke", lambda self, *args: calls.append((self, args)))
    monkeypatch.setattr(ep, "_allocating_on", _Allocating)
    monkeypatch.setattr(ep, "_record_on", lambda stream, *ts: _Allocating.recorded.append(
        (stream, [t for t in ts if t is not None])))
    _Allocating.recorded = []
    monkeypatch.setattr(ep._Prepared, "_new_outputs", _Allocating.wrap(ep._Prepared._new_outputs))
    _Allocating.made = []
    return calls


class _Allocating:
    """Stands in for ep._allocating_on: `made` records, per allocation of a call's outputs, the stream whose context
    it ran in (None: none) and how many tensors it made."""

    current, made = None, []

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        _Allocating.current = self.stream

    def __exit__(self, *exc):
        _Allocating.current = None
        return False

    @staticmethod
    def wrap(new_outputs):
        def recorded(prep):
            outs = new_outputs(prep)
            _Allocating.made.append((_Allocating.current, len(outs)))
            return outs
        return recorded


def _dims(d):
    return list(d.sizes)[:d.ndim], d.datatype


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
@pytest.mark.parametrize("mode", ["bf16", "quantised", "quantised_pow2", "fp8_forwarded"])
def test_low_latency_dispatch_structs(on_cpu, layout, mode):
    g = _shell()
    h = _FakeHandle(g, layout)
    n = h.output_rows()
    fp8 = torch.float8_e4m3fn
    x = torch.zeros(5, H, dtype=fp8 if mode == "fp8_forwarded" else torch.bfloat16)
    scales = torch.ones(5, H // 128) if mode == "fp8_forwarded" else None
    w = torch.rand(5, K)
    out_dtype = fp8 if mode.startswith("quantised") else None
    recv = g.dispatch(x, topk_weights=w, handle=h, scales=scales, out_dtype=out_dtype,
                      round_scale=mode == "quantised_pow2", stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    fp8_out = mode != "bf16"
    assert _dims(outputs.tokens) == ([n, H], T.NCCL_FLOAT8E4M3 if fp8_out else T.NCCL_BFLOAT16)
    assert recv.tokens.shape == (n, H) and recv.tokens.dtype == (fp8 if fp8_out else torch.bfloat16)
    assert outputs.tokens.data == recv.tokens.data_ptr()
    if fp8_out:
        assert _dims(outputs.scales) == ([n, H // 128], T.NCCL_FLOAT32) and recv.scales.shape == (n, H // 128)
    else:
        assert outputs.scales.ndim == 0 and recv.scales is None
    assert (inputs.scales.ndim != 0) == (mode == "fp8_forwarded")
    if layout == "rank_major":
        assert _dims(outputs.topk_idx) == ([n, K], T.NCCL_INT32) and recv.topk_idx.shape == (n, K)
        assert _dims(outputs.topk_weights) == ([n, K], T.NCCL_FLOAT32)
    else:
        assert outputs.topk_idx.ndim == 0 and recv.topk_idx is None
        assert _dims(outputs.topk_weights) == ([n], T.NCCL_FLOAT32)
    assert _dims(outputs.src_info) == ([n], T.NCCL_INT32) and outputs.src_info.data == recv.src_info.data_ptr()
    assert (cfg.num_sms, cfg.round_scale) == (0, 1 if mode == "quantised_pow2" else 0)
    # The counts: four descriptors into one new int32 tensor per call, passed as the dispatch's layout_info.
    assert args[3] is prep.info_ref
    base = recv.expert_counts.data_ptr()
    for d, count, offset in ((info.expert_counters, L, 0), (info.src_rank_counters, R, L),
                             (info.expert_offsets, L, L + R), (info.recv_total_counter, 1, 2 * L + R)):
        assert _dims(d) == ([count], T.NCCL_INT32) and d.data == base + 4 * offset
    assert (recv.expert_counts.shape, recv.rank_counts.shape, recv.expert_offsets.shape, recv.recv_total.shape) == (
        (L,), (R,), (L,), (1,))
    assert h.expert_counts is recv.expert_counts and h.recv_total is recv.recv_total  # the handle's: the last's
    again = g.dispatch(x, topk_weights=w, handle=h, scales=scales, out_dtype=out_dtype,
                       round_scale=mode == "quantised_pow2", stream=_Stream())
    assert on_cpu[1][0] is prep and again.expert_counts.data_ptr() != base  # same structs, new counts


@pytest.mark.parametrize("forwarded", [False, True])
def test_low_latency_ue8m0_dispatch_structs(on_cpu, forwarded):
    # bf16 x quantised with ue8m0=True, or fp8 x with int32 scales: scales [N, H/512] int32 (four exponent bytes a
    # word); round_scale stays the caller's (the library rounds to powers of two for int32 scales).
    g = _shell()
    h = _FakeHandle(g, "expert_major")
    n, hd = h.output_rows(), 512
    if forwarded:
        recv = g.dispatch(torch.zeros(5, hd, dtype=torch.float8_e4m3fn), handle=h,
                          scales=torch.zeros(5, hd // 512, dtype=torch.int32), stream=_Stream())
    else:
        recv = g.dispatch(torch.zeros(5, hd, dtype=torch.bfloat16), handle=h, out_dtype=torch.float8_e4m3fn,
                          ue8m0=True, stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    assert _dims(outputs.scales) == ([n, hd // 512], T.NCCL_INT32)
    assert recv.scales.shape == (n, hd // 512) and recv.scales.dtype == torch.int32
    assert (inputs.scales.ndim != 0) == forwarded and cfg.round_scale == 0


@pytest.mark.parametrize("words,dtype", [(1, torch.float32), (3, torch.int32)])
def test_low_latency_forwarded_scales_of_the_callers_layout(on_cpu, words, dtype):
    # fp8 x with scales [T, S] of any S and dtype (a scale per token, packed words): outputs.scales [N, S] of the
    # same dtype, the inputs' as given (the library moves them bit for bit).
    g = _shell()
    h = _FakeHandle(g, "rank_major")
    n = h.output_rows()
    scales = torch.zeros(5, words, dtype=dtype)
    recv = g.dispatch(torch.zeros(5, H, dtype=torch.float8_e4m3fn), handle=h, scales=scales, stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    want = T.NCCL_FLOAT32 if dtype == torch.float32 else T.NCCL_INT32
    assert _dims(inputs.scales) == ([5, words], want) and _dims(outputs.scales) == ([n, words], want)
    assert recv.scales.shape == (n, words) and recv.scales.dtype == dtype


@pytest.mark.parametrize("mode", ["nvfp4_quantised", "nvfp4_quantised_uint8", "nvfp4_forwarded"])
def test_low_latency_nvfp4_dispatch_structs(on_cpu, mode):
    # bf16 x with out_dtype float4_e2m1fn_x2 (or uint8) and a global scale: tokens [N, H/2] of that dtype, scales
    # [N, H/16] float8_e4m3fn; NVFP4 x [T, H/2] with its [T, H/16] scales: forwarded, the same shapes and dtypes.
    g = _shell()
    h = _FakeHandle(g, "rank_major")
    n = h.output_rows()
    fp4 = torch.uint8 if mode == "nvfp4_quantised_uint8" else torch.float4_e2m1fn_x2
    gs = torch.full((1,), 2.5)
    if mode == "nvfp4_forwarded":
        x, scales = torch.zeros(5, H // 2, dtype=torch.uint8).view(fp4), torch.zeros(5, H // 16, dtype=torch.uint8)
        recv = g.dispatch(x, handle=h, scales=scales.view(torch.float8_e4m3fn), stream=_Stream())
    else:
        recv = g.dispatch(torch.zeros(5, H, dtype=torch.bfloat16), handle=h, out_dtype=fp4, global_scale=gs,
                          stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    assert _dims(outputs.tokens) == ([n, H // 2], T.NCCL_UINT8)
    assert recv.tokens.shape == (n, H // 2) and recv.tokens.dtype == fp4
    assert _dims(outputs.scales) == ([n, H // 16], T.NCCL_FLOAT8E4M3)
    assert recv.scales.shape == (n, H // 16) and recv.scales.dtype == torch.float8_e4m3fn
    if mode == "nvfp4_forwarded":
        assert _dims(inputs.tokens) == ([5, H // 2], T.NCCL_UINT8) and _dims(inputs.scales) == ([5, H // 16],
                                                                                               T.NCCL_FLOAT8E4M3)
        assert inputs.global_scale.ndim == 0
    else:
        assert _dims(inputs.global_scale) == ([1], T.NCCL_FLOAT32) and inputs.global_scale.data == gs.data_ptr()
        assert inputs.scales.ndim == 0


def test_tokens_out_is_the_output_and_is_checked(on_cpu):
    # The caller's tensor (e.g. Group.dispatch_window()'s) becomes outputs.tokens (its first rows, as many as the
    # other outputs have: the same start) and the result's tokens; its dtype, width and rows are checked here.
    g = _shell(low_latency=False)
    h = _FakeHandle(g, "flat")
    h.expert_counts, h.rank_counts = torch.zeros(L, dtype=torch.int32), torch.zeros(R, dtype=torch.int32)
    x = torch.zeros(5, H, dtype=torch.bfloat16)
    y = torch.empty(9, H, dtype=torch.bfloat16)
    recv = g.dispatch(x, handle=h, tokens_out=y, stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    assert recv.tokens is y and outputs.tokens.data == y.data_ptr() and _dims(outputs.tokens) == ([7, H],
                                                                                                 T.NCCL_BFLOAT16)
    assert recv.topk_idx.shape == (7, K)  # the other outputs as usual
    for bad, text in ((torch.empty(6, H, dtype=torch.bfloat16), r"the output is \[7 \(or more\), %d\]" % H),
                      (torch.empty(9, H + 8, dtype=torch.bfloat16), "tokens_out has shape"),
                      (torch.empty(9, H, dtype=torch.float16), "tokens_out has dtype torch.float16")):
        with pytest.raises(ep.NcclInvalidArgument, match=text):
            g.dispatch(x, handle=h, tokens_out=bad, stream=_Stream())


def test_high_throughput_dispatch_is_unchanged(on_cpu):
    g = _shell(low_latency=False)
    h = _FakeHandle(g, "flat")
    h.expert_counts, h.rank_counts = torch.zeros(L, dtype=torch.int32), torch.zeros(R, dtype=torch.int32)
    recv = g.dispatch(torch.zeros(5, H, dtype=torch.bfloat16), topk_weights=torch.rand(5, K), handle=h,
                      stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    assert args[3] is None and info is None and outputs.src_info.ndim == 0 and cfg.round_scale == 0
    assert recv.tokens.shape == (7, H) and recv.topk_idx.shape == (7, K) and recv.topk_weights.shape == (7, K)
    assert recv.expert_counts is h.expert_counts and recv.src_info is None and recv.scales is None


@pytest.mark.parametrize("x_dtype,scales", [
    (torch.float8_e4m3fn, torch.ones(5, 1)),                        # one scale a token
    (torch.float8_e4m3fn, torch.zeros(5, H // 512, dtype=torch.int32)),  # DeepEP's packed UE8M0
    (torch.uint8, torch.zeros(5, H // 32, dtype=torch.int32)),      # packed fp4 rows, e4m3 block scales four a word
    (torch.uint8, None),
])
def test_high_throughput_forwards_scales_as_the_caller_lays_them_out(on_cpu, x_dtype, scales):
    g = _shell(low_latency=False)
    h = _FakeHandle(g, "flat")
    h.expert_counts, h.rank_counts = torch.zeros(L, dtype=torch.int32), torch.zeros(R, dtype=torch.int32)
    width = H // 2 if x_dtype == torch.uint8 else H
    recv = g.dispatch(torch.zeros(5, width, dtype=x_dtype), handle=h, scales=scales, stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, info = prep.structs
    assert _dims(outputs.tokens) == ([7, width], T.NCCL_UINT8 if x_dtype == torch.uint8 else T.NCCL_FLOAT8E4M3)
    if scales is None:
        assert inputs.scales.ndim == 0 and outputs.scales.ndim == 0 and recv.scales is None
    else:
        code = T.NCCL_INT32 if scales.dtype == torch.int32 else T.NCCL_FLOAT32
        assert _dims(inputs.scales) == ([5, scales.shape[1]], code)
        assert _dims(outputs.scales) == ([7, scales.shape[1]], code)
        assert recv.scales.shape == (7, scales.shape[1]) and recv.scales.dtype == scales.dtype


@pytest.mark.parametrize("ll,kwargs,exc,text", [
    (True, {"x": torch.zeros(5, H, dtype=torch.float16)}, ep.NcclInvalidArgument,
     "Low-Latency dispatch takes bfloat16, or float8_e4m3fn or NVFP4 (float4_e2m1fn_x2, uint8) with scales"),
    (True, {"out_dtype": torch.float16}, ep.NcclInvalidArgument,
     "converts bfloat16 to float8_e4m3fn or NVFP4 (float4_e2m1fn_x2, uint8) only"),
    (True, {"round_scale": True}, ep.NcclInvalidArgument, "round_scale=True: for bf16 x quantised to fp8 on the way"),
    (True, {"round_scale": True, "out_dtype": torch.uint8, "global_scale": torch.ones(1)}, ep.NcclInvalidArgument,
     "round_scale=True: for bf16 x quantised to fp8"),
    (True, {"out_dtype": torch.float4_e2m1fn_x2}, ep.NcclInvalidArgument, "global_scale: a [1] fp32 CUDA tensor"),
    (True, {"global_scale": torch.ones(1)}, ep.NcclInvalidArgument, "global_scale: a [1] fp32 CUDA tensor"),
    (True, {"x": torch.zeros(5, H // 2, dtype=torch.uint8)}, ep.NcclInvalidArgument,
     "x is NVFP4 (torch.uint8): give its scales [T, H/16]"),
    (True, {"x": torch.zeros(5, 100, dtype=torch.uint8), "scales": torch.zeros(5, 12, dtype=torch.uint8)},
     ep.NcclInvalidArgument, "hidden 200 is not a multiple of 128"),
    (False, {"global_scale": torch.ones(1)}, ep.NcclInvalidUsage, "global_scale: for the Low-Latency mode's NVFP4"),
    (True, {"out_dtype": torch.float8_e4m3fn, "scales": torch.ones(5, 2)}, ep.NcclInvalidArgument,
     "the sender computes them"),
    (True, {"x": torch.zeros(5, 200, dtype=torch.bfloat16), "out_dtype": torch.float8_e4m3fn},
     ep.NcclInvalidArgument, "hidden 200 is not a multiple of 128"),
    (True, {"x": torch.zeros(5, H, dtype=torch.float8_e4m3fn)}, ep.NcclInvalidArgument, "give its scales"),
    (True, {"scales": torch.ones(5, 2)}, ep.NcclInvalidArgument,
     "scales: for float8_e4m3fn or NVFP4 x only"),
    (False, {"out_dtype": torch.float8_e4m3fn}, ep.NcclInvalidUsage, "quantising on the way is the Low-Latency"),
    (False, {"round_scale": True}, ep.NcclInvalidUsage, "round_scale=True: for the Low-Latency mode"),
    (False, {"ue8m0": True}, ep.NcclInvalidUsage, "ue8m0=True: for the Low-Latency mode"),
    (True, {"ue8m0": True}, ep.NcclInvalidArgument, "ue8m0=True: for bf16 x quantised to fp8 on the way"),
    (True, {"ue8m0": True, "out_dtype": torch.float8_e4m3fn}, ep.NcclInvalidArgument,
     "ue8m0=True needs hidden % 512 == 0"),
])
def test_dispatch_refusals(on_cpu, ll, kwargs, exc, text):
    g = _shell(low_latency=ll)
    h = _FakeHandle(g, "expert_major")
    kwargs = dict(kwargs)
    x = kwargs.pop("x", torch.zeros(5, H, dtype=torch.bfloat16))
    with pytest.raises(exc, match=re.escape(text)):
        g.dispatch(x, handle=h, stream=_Stream(), **kwargs)
    assert on_cpu == []


def test_combine_bias_structs(on_cpu):
    g = _shell(low_latency=False)
    h = _FakeHandle(g, "flat")
    y = torch.zeros(h.output_rows(), H, dtype=torch.bfloat16)
    for bias in (torch.rand(5, H).to(torch.bfloat16), torch.rand(5, H)):  # the tokens' dtype, or fp32
        g.combine(y, h, bias=bias, stream=_Stream())
        inputs = on_cpu[-1][0].structs[0]
        assert _dims(inputs.bias) == ([5, H], T.NCCL_BFLOAT16 if bias.dtype == torch.bfloat16 else T.NCCL_FLOAT32)
        assert inputs.bias.data == bias.data_ptr()
    g.combine(y, h, stream=_Stream())
    assert on_cpu[-1][0].structs[0].bias.ndim == 0


def test_low_latency_combine_structs(on_cpu):
    g = _shell()
    h = _FakeHandle(g, "expert_major")
    y = torch.zeros(L * R * M, H, dtype=torch.bfloat16)
    w = torch.rand(5, K)
    out = g.combine(y, h, topk_weights=w, stream=_Stream())
    (prep, args), = on_cpu
    inputs, outputs, cfg, _ = prep.structs
    assert _dims(inputs.tokens) == ([L * R * M, H], T.NCCL_BFLOAT16)
    assert _dims(inputs.topk_weights) == ([5, K], T.NCCL_FLOAT32) and inputs.topk_weights.data == w.data_ptr()
    assert _dims(outputs.tokens) == ([5, H], T.NCCL_BFLOAT16) and outputs.tokens.data == out.data_ptr()
    assert ctypes.sizeof(cfg) == ctypes.sizeof(ep._CombineConfig)
    g.combine(y, h, stream=_Stream())  # without owner weights: another signature, no topk_weights
    assert on_cpu[1][0].structs[0].topk_weights.ndim == 0


@pytest.mark.parametrize("ll,layout,kwargs,exc,text", [
    (True, "expert_major", {"y": torch.zeros(L * R * M, H)}, ep.NcclInvalidArgument,
     "Low-Latency combine takes bfloat16"),
    (True, "rank_major", {"topk_weights": torch.rand(5, K)}, ep.NcclInvalidUsage,
     "for Low-Latency EXPERT_MAJOR handles; this one is Low-Latency RANK_MAJOR"),
    (False, "expert_major", {"topk_weights": torch.rand(5, K)}, ep.NcclInvalidUsage,
     "this one is High-Throughput EXPERT_MAJOR"),
    (True, "expert_major", {"topk_weights": torch.rand(4, K)}, ep.NcclInvalidArgument,
     r"topk_weights has shape \(4, 3\); the routing is \[5, 3\]"),
    (True, "expert_major", {"topk_weights": torch.rand(5, K, dtype=torch.float64)}, ep.NcclInvalidArgument,
     "topk_weights has dtype torch.float64"),
    (True, "expert_major", {"bias": torch.zeros(5, H, dtype=torch.bfloat16)}, ep.NcclInvalidUsage,
     "bias is for High-Throughput handles"),
    (False, "flat", {"bias": torch.zeros(4, H, dtype=torch.bfloat16)}, ep.NcclInvalidArgument,
     r"bias has shape \(4, %d\); the combine output is \(5, %d\)" % (H, H)),
    (False, "flat", {"bias": torch.zeros(5, H, dtype=torch.float16)}, ep.NcclInvalidArgument,
     "bias has dtype torch.float16"),
])
def test_combine_refusals(on_cpu, ll, layout, kwargs, exc, text):
    g = _shell(low_latency=ll)
    h = _FakeHandle(g, layout)
    kwargs = dict(kwargs)
    y = kwargs.pop("y", torch.zeros(h.output_rows(), H, dtype=torch.bfloat16))
    with pytest.raises(exc, match=text):
        g.combine(y, h, stream=_Stream(), **kwargs)
    assert on_cpu == []


@pytest.mark.parametrize("ll,layout,sizing,alignment,exc,text", [
    (True, "flat", "worst_case", 1, ep.NcclInvalidUsage, "handles are 'rank_major' or 'expert_major'"),
    (True, "expert_major", "exact", 1, ep.NcclInvalidUsage, "Low-Latency outputs are always worst-case sized"),
    (True, "rank_major", "worst_case", 4, ep.NcclInvalidArgument, "alignment=4: Low-Latency expert zones are fixed"),
    (False, "rank_major", "worst_case", 1, ep.NcclInvalidUsage, "belongs to the Low-Latency mode"),
    (True, "expert_major", "sometimes", 1, ep.NcclInvalidArgument, "sizing='sometimes': expected one of"),
])
def test_handle_refusals(ll, layout, sizing, alignment, exc, text):
    with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
        ep.Handle(_shell(low_latency=ll), torch.zeros(5, K, dtype=torch.int64), layout, sizing, alignment, None)


def test_default_layouts():
    assert _shell(low_latency=True)._layout(None) == "expert_major"
    assert _shell(low_latency=False)._layout(None) == "flat"
    assert _shell(low_latency=True)._layout("rank_major") == "rank_major"


def test_low_latency_group_size_is_checked_first():
    with pytest.raises(ep.NcclInvalidArgument, match="a Low-Latency group takes 1..1024 tokens per rank"):
        ep.Group(num_experts=8, max_tokens_per_rank=2048, hidden=64, algorithm="low_latency")
    with pytest.raises(ep.NcclInvalidArgument, match="algorithm='fastest': expected one of"):
        ep.Group(num_experts=8, max_tokens_per_rank=16, hidden=64, algorithm="fastest")


@pytest.mark.parametrize("low_latency,layout", [(True, "rank_major"), (True, "expert_major"), (False, "flat")])
def test_dispatch_out_reuses_the_outputs_of_an_earlier_dispatch(on_cpu, low_latency, layout):
    # out=: the same tensors (and, Low-Latency, the same counts tensor) written again, no new allocation; a result of
    # another signature or handle is refused.
    g = _shell(low_latency)
    h = _FakeHandle(g, layout)
    x = torch.zeros(5, H, dtype=torch.bfloat16)
    w = torch.rand(5, K)
    first = g.dispatch(x, topk_weights=w, handle=h, stream=_Stream())
    kept = [first.tokens.data_ptr(), first.topk_weights.data_ptr()]
    again = g.dispatch(torch.ones(5, H, dtype=torch.bfloat16), topk_weights=w, handle=h, out=first, stream=_Stream())
    assert again is first and [again.tokens.data_ptr(), again.topk_weights.data_ptr()] == kept
    (prep, _), (prep2, _) = on_cpu
    assert prep is prep2 and prep.structs[1].tokens.data == kept[0]
    if low_latency:
        assert again.expert_counts.data_ptr() == first.expert_counts.data_ptr()
    with pytest.raises(ep.NcclInvalidArgument, match="out must be the result of an earlier dispatch"):
        g.dispatch(x, handle=h, out=first, stream=_Stream())  # no weights: another signature
    with pytest.raises(ep.NcclInvalidArgument, match="out must be the result of an earlier dispatch"):
        g.dispatch(x, topk_weights=w, handle=_FakeHandle(g, layout), out=first, stream=_Stream())


@pytest.mark.parametrize("low_latency,layout", [(True, "rank_major"), (False, "flat")])
def test_outputs_are_allocated_for_the_stream_the_call_names(on_cpu, monkeypatch, low_latency, layout):
    # The caching allocator reuses a freed block for later work of the stream it was allocated for: a call on
    # stream= must get that stream's outputs, or a caller who drops them races the call. No stream: the current one.
    g = _shell(low_latency)
    h = _FakeHandle(g, layout)
    x, s = torch.zeros(5, H, dtype=torch.bfloat16), _Stream()
    recv = g.dispatch(x, handle=h, stream=s)
    g.combine(recv.tokens, h, stream=s)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    g.dispatch(x, handle=h)  # the current stream's
    # tokens and topk_idx (Low-Latency: with src_info and the counts); combine's [T, H]
    assert _Allocating.made == [(s, 4 if low_latency else 2), (s, 1), (None, 4 if low_latency else 2)]


def test_a_tensor_on_another_device_than_the_groups_is_refused():
    """Every tensor of a call is on the group's device (here cuda:1, the tensors on the CPU: the check itself, with
    no GPU), named in the message, before anything is described or launched."""
    g = object.__new__(ep.Group)
    g.comm = types.SimpleNamespace(device=torch.device("cuda", 1))
    x = torch.zeros((4, 8), dtype=torch.bfloat16)
    with pytest.raises(ep.NcclInvalidArgument, match=r"x is on cpu; the group's device is cuda:1"):
        g._prepare_dispatch(None, None, x, None, None, 0)
    with pytest.raises(ep.NcclInvalidArgument, match=r"out is on cpu; the group's device is cuda:1"):
        g._same_device(("y", None), ("out", x))


@pytest.mark.parametrize("low_latency,layout", [(True, "rank_major"), (False, "flat")])
def test_inputs_are_recorded_on_the_stream_the_call_names(on_cpu, monkeypatch, low_latency, layout):
    """A call on stream= marks its inputs as used by that stream (record_stream), so that the caller may drop them
    at once; a call on the current stream needs nothing (torch's own ordering), and the handle holds no inputs."""
    g = _shell(low_latency)
    h = _FakeHandle(g, layout)
    x, w, s = torch.zeros(5, H, dtype=torch.bfloat16), torch.rand(5, K), _Stream()
    recv = g.dispatch(x, topk_weights=w, handle=h, stream=s)
    g.combine(recv.tokens, h, stream=s)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    g.dispatch(x, handle=h)
    assert [(st, [id(t) for t in ts]) for st, ts in _Allocating.recorded] == [
        (s, [id(x), id(w)]), (s, [id(recv.tokens)])]
    assert not hasattr(h, "_inputs_alive")
