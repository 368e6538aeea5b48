"""nccl.ep.jax on the CPU: tracing and lowering of the custom calls (their target names in the lowered module), the
shape rules (worst-case outputs), argument errors at trace time, the custom_vjp wiring (jax.grad's jaxpr holds the
backward's custom calls), shard_map, group setup's pieces that need no GPU, the FFI library's loading and
registration (when built), and the import boundaries (no torch in the JAX path, no jax in the torch layer)."""

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import nccl.ep as ep  # noqa: E402
import nccl.ep.jax as epjax  # noqa: E402

T, K, H, L, R = 8, 2, 64, 4, 3


def _spec(low_latency=False, layout="flat", rows=None, max_token_bytes=256, ident=(123 << 24) | 7):
    m = T  # max_tokens_per_rank
    if rows is None:
        rows = R * m if layout in ("flat", "rank_major") else L * R * m
    return epjax.HandleSpec(id=ident, low_latency=low_latency, layout=layout, num_tokens=T, topk=K, rows=rows,
                            ranks=R, local_experts=L, max_token_bytes=max_token_bytes, max_tokens_per_rank=m)


def _args(dtype=jnp.bfloat16, hidden=H):
    return (jax.ShapeDtypeStruct((T, hidden), dtype), jax.ShapeDtypeStruct((T, K), jnp.int32),
            jax.ShapeDtypeStruct((T, K), jnp.float32))


def _targets(text):
    return [line.split("@")[1].split("(")[0] for line in text.splitlines() if "stablehlo.custom_call @" in line]


def test_lowering_names_the_high_throughput_targets():
    spec = _spec()

    def layer(x, idx, w):
        recv = epjax.dispatch(spec, x, idx, w)
        return epjax.combine(spec, recv.tokens * recv.weights.sum(axis=1, keepdims=True).astype(recv.tokens.dtype))

    text = jax.jit(layer).lower(*_args()).as_text()
    assert _targets(text) == ["nccl_ep_ht_dispatch", "nccl_ep_ht_combine"]
    assert "handle_id = %d : i64" % spec.id in text


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
def test_lowering_names_the_low_latency_targets(layout):
    spec = _spec(low_latency=True, layout=layout)

    def step(x, idx, w):
        recv = epjax.ll_dispatch(spec, x, idx, w)
        return epjax.ll_combine(spec, recv.tokens, w if layout == "expert_major" else None)

    text = jax.jit(step).lower(*_args()).as_text()
    assert _targets(text) == ["nccl_ep_ll_dispatch", "nccl_ep_ll_combine"]
    assert "with_weights = true" in text


@pytest.mark.parametrize("zero", [None, True, False])
def test_low_latency_zero_past_counts_reaches_the_handler(zero):
    """The dispatch's attribute: true unless the caller says False (the handler then leaves those rows)."""
    spec = _spec(low_latency=True, layout="expert_major")
    kw = {} if zero is None else {"zero_past_counts": zero}
    text = jax.jit(lambda x, idx: epjax.ll_dispatch(spec, x, idx, **kw).tokens).lower(*_args()[:2]).as_text()
    assert "zero_past_counts = %s" % ("false" if zero is False else "true") in text


def test_lowering_for_cuda_on_a_cpu_machine():
    spec = _spec()
    traced = jax.jit(lambda x, idx, w: epjax.combine(spec, epjax.dispatch(spec, x, idx, w).tokens)).trace(*_args())
    assert _targets(traced.lower(lowering_platforms=("cuda",)).as_text()) == ["nccl_ep_ht_dispatch",
                                                                             "nccl_ep_ht_combine"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_high_throughput_shapes(dtype):
    spec = _spec()
    recv = jax.eval_shape(lambda x, idx, w: epjax.dispatch(spec, x, idx, w), *_args(dtype))
    assert (recv.tokens.shape, recv.tokens.dtype) == ((R * T, H), jnp.dtype(dtype))
    assert (recv.local_ids.shape, recv.local_ids.dtype) == ((R * T, K), jnp.int32)
    assert (recv.weights.shape, recv.weights.dtype) == ((R * T, K), jnp.float32)
    assert (recv.expert_counts.shape, recv.rank_counts.shape) == ((L,), (R,))
    assert (recv.recv_dropped.shape, recv.recv_dropped.dtype) == ((1,), jnp.int32)
    out = jax.eval_shape(lambda y: epjax.combine(spec, y), jax.ShapeDtypeStruct((R * T, H), dtype))
    assert (out.shape, out.dtype) == ((T, H), jnp.dtype(dtype))


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
@pytest.mark.parametrize("fp8", [False, True])
def test_low_latency_shapes(layout, fp8):
    spec = _spec(low_latency=True, layout=layout, max_token_bytes=512)
    x, idx, w = _args(hidden=256)
    recv = jax.eval_shape(lambda x, idx, w: epjax.ll_dispatch(spec, x, idx, w, fp8=fp8), x, idx, w)
    n = spec.rows
    assert recv.tokens.shape == (n, 256)
    assert recv.tokens.dtype == (jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    assert recv.scales.shape == ((n, 2) if fp8 else (0,))
    rm = layout == "rank_major"
    assert recv.weights.shape == ((n, K) if rm else (n,))
    assert recv.local_ids.shape == ((n, K) if rm else (0,))
    assert (recv.src_info.shape, recv.expert_counts.shape, recv.rank_counts.shape) == ((n,), (L,), (R,))
    bare = jax.eval_shape(lambda x, idx: epjax.ll_dispatch(spec, x, idx), x, idx)
    assert bare.weights.shape == (0,)
    out = jax.eval_shape(lambda y: epjax.ll_combine(spec, y), jax.ShapeDtypeStruct((n, 256), jnp.float32))
    assert (out.shape, out.dtype) == ((T, 256), jnp.bfloat16)


def _raises(exc, match, fn, *args):
    with pytest.raises(exc, match=match):
        jax.eval_shape(fn, *args)


def _zeros(*sds):
    return [jnp.zeros(a.shape, a.dtype) for a in sds]


def test_argument_errors_at_trace_time_name_the_argument():
    spec = _spec()
    x, idx, w = _zeros(*_args())
    d = epjax.dispatch
    _raises(ep.NcclInvalidArgument, "x has 9 rows", lambda x: d(spec, x, idx, w), jax.ShapeDtypeStruct((9, H),
                                                                                                    jnp.bfloat16))
    _raises(ep.NcclInvalidArgument, "x has dtype int32", lambda x: d(spec, x, idx, w),
            jax.ShapeDtypeStruct((T, H), jnp.int32))
    _raises(ep.NcclInvalidArgument, "x must have 2 dimensions", lambda x: d(spec, x, idx, w),
            jax.ShapeDtypeStruct((T, H, 1), jnp.bfloat16))
    _raises(ep.NcclInvalidArgument, "x: a row of 1024 bytes", lambda x: d(spec, x, idx, w),
            jax.ShapeDtypeStruct((T, 512), jnp.bfloat16))
    _raises(ep.NcclInvalidArgument, "x: a row of 6 bytes", lambda x: d(spec, x, idx, w),
            jax.ShapeDtypeStruct((T, 3), jnp.bfloat16))
    _raises(ep.NcclInvalidArgument, "topk_idx has dtype float32", lambda i: d(spec, x, i, w),
            jax.ShapeDtypeStruct((T, K), jnp.float32))
    _raises(ep.NcclInvalidArgument, r"topk_idx has shape \(8, 3\)", lambda i: d(spec, x, i, w),
            jax.ShapeDtypeStruct((T, K + 1), jnp.int32))
    _raises(ep.NcclInvalidArgument, r"topk_weights has shape \(8, 1\)", lambda v: d(spec, x, idx, v),
            jax.ShapeDtypeStruct((T, 1), jnp.float32))
    _raises(ep.NcclInvalidArgument, "topk_weights has dtype int32", lambda v: d(spec, x, idx, v),
            jax.ShapeDtypeStruct((T, K), jnp.int32))
    _raises(ep.NcclInvalidArgument, "y has 8 rows", lambda y: epjax.combine(spec, y), x)
    _raises(ep.NcclInvalidArgument, "handle must be a nccl.ep.jax Handle", lambda x: d(spec.id, x, idx, w), x)
    _raises(ep.NcclInvalidUsage, "Low-Latency handle", lambda x: d(_spec(low_latency=True, layout="rank_major"),
                                                                   x, idx, w), x)
    _raises(ep.NcclInvalidUsage, "High-Throughput handle", lambda x: epjax.ll_dispatch(spec, x, idx), x)


def test_low_latency_argument_errors():
    rm = _spec(low_latency=True, layout="rank_major", max_token_bytes=512)
    x, idx, w = _zeros(*_args())
    _raises(ep.NcclInvalidArgument, "x has dtype float32", lambda x: epjax.ll_dispatch(rm, x, idx),
            jax.ShapeDtypeStruct((T, H), jnp.float32))
    _raises(ep.NcclInvalidArgument, "hidden 64 is not a multiple of 128",
            lambda x: epjax.ll_dispatch(rm, x, idx, fp8=True), x)
    _raises(ep.NcclInvalidArgument, "round_scale=True", lambda x: epjax.ll_dispatch(rm, x, idx, round_scale=True), x)
    _raises(ep.NcclInvalidArgument, "zero_past_counts must be a bool",
            lambda x: epjax.ll_dispatch(rm, x, idx, zero_past_counts=1), x)
    _raises(ep.NcclInvalidUsage, "EXPERT_MAJOR handles", lambda y: epjax.ll_combine(rm, y, w),
            jax.ShapeDtypeStruct((rm.rows, H), jnp.bfloat16))


def test_grad_runs_both_calls_backwards():
    spec = _spec()

    def loss(x, w, idx):
        recv = epjax.dispatch(spec, x, idx, w)
        y = recv.tokens.astype(jnp.float32) * recv.weights.sum(axis=1, keepdims=True)
        return jnp.sum(epjax.combine(spec, y.astype(recv.tokens.dtype)).astype(jnp.float32) ** 2)

    x, idx, w = _args()
    grad = jax.grad(loss, argnums=(0, 1))
    text = str(jax.make_jaxpr(grad)(jnp.zeros(x.shape, x.dtype), jnp.zeros(w.shape), jnp.zeros(idx.shape, jnp.int32)))
    names = [line.split("target_name=")[1].split()[0] for line in text.splitlines() if "target_name=" in line]
    # forward: dispatch, combine; backward: combine's gradient (a redispatch), dispatch's (a combine of the rows'
    # gradients and one of the weights' gradients, padded to 4 columns)
    assert names == ["nccl_ep_ht_dispatch", "nccl_ep_ht_combine", "nccl_ep_ht_redispatch", "nccl_ep_ht_combine",
                     "nccl_ep_ht_combine"]
    assert "f32[8,4]" in text
    gx, gw = jax.eval_shape(grad, jnp.zeros(x.shape, x.dtype), jnp.zeros(w.shape), jnp.zeros(idx.shape, jnp.int32))
    assert (gx.shape, gx.dtype, gw.shape, gw.dtype) == ((T, H), jnp.bfloat16, (T, K), jnp.float32)


def test_backward_redispatch_is_ordered_after_the_forward_dispatch():
    # A linear loss: the cotangent of combine's output is a constant, which alone would let XLA run the backward's
    # redispatch before the forward dispatch binds the routing. The redispatch's operand must come out of an
    # optimization barrier that also takes a value computed from the forward dispatch's outputs.
    spec = _spec()

    def loss(x, w, idx):
        recv = epjax.dispatch(spec, x, idx, w)
        return jnp.sum(epjax.combine(spec, recv.tokens).astype(jnp.float32))

    x, idx, w = _args()
    jaxpr = jax.make_jaxpr(jax.grad(loss))(jnp.zeros(x.shape, x.dtype), jnp.zeros(w.shape),
                                           jnp.zeros(idx.shape, jnp.int32)).jaxpr
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}  # variable -> the equation that made it

    def upstream(v, seen):
        e = producers.get(v)
        if e is None or id(e) in seen:
            return
        seen.add(id(e))
        yield e
        for u in e.invars:
            if hasattr(u, "aval") and not hasattr(u, "val"):
                yield from upstream(u, seen)

    calls = [e for e in jaxpr.eqns if "target_name" in str(e.params)]
    redispatch = [e for e in calls if "nccl_ep_ht_redispatch" in str(e.params)]
    assert len(redispatch) == 1
    before = [str(e.params) for v in redispatch[0].invars for e in upstream(v, set())]
    assert any("nccl_ep_ht_dispatch" in p for p in before), "the redispatch does not depend on the forward dispatch"


def test_grad_of_bf16_weights_keeps_their_dtype():
    spec = _spec()

    def loss(w):
        recv = epjax.dispatch(spec, jnp.zeros((T, H), jnp.bfloat16), jnp.zeros((T, K), jnp.int32), w)
        return jnp.sum(recv.weights)

    g = jax.eval_shape(jax.grad(loss), jax.ShapeDtypeStruct((T, K), jnp.bfloat16))
    assert (g.shape, g.dtype) == ((T, K), jnp.bfloat16)


def test_low_latency_calls_are_not_differentiable():
    spec = _spec(low_latency=True, layout="rank_major")
    with pytest.raises(ValueError, match="nccl_ep_ll_dispatch` cannot be differentiated"):
        jax.eval_shape(jax.grad(lambda x: jnp.sum(epjax.ll_dispatch(spec, x, jnp.zeros((T, K), jnp.int32)).tokens
                                                  .astype(jnp.float32))), jax.ShapeDtypeStruct((T, H), jnp.bfloat16))


def _run(code: str, env=None) -> str:
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_shard_map_over_an_expert_axis():
    # Four CPU devices in a fresh process (the device count is fixed when jax starts): the calls inside shard_map
    # see this rank's shapes, and their outputs vary along the axis as their inputs do.
    out = _run("""
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        import nccl.ep.jax as epjax
        mesh = jax.make_mesh((4,), ("ep",))
        spec = epjax.HandleSpec(id=5, low_latency=False, layout="flat", num_tokens=8, topk=2, rows=32, ranks=4,
                                local_experts=2, max_token_bytes=256, max_tokens_per_rank=8)
        @jax.jit
        @jax.shard_map(mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
        def layer(x, idx, w):
            recv = epjax.dispatch(spec, x, idx, w)
            print("varying", sorted(jax.typeof(recv.tokens).manual_axis_type.varying))
            return epjax.combine(spec, recv.tokens)
        sh = NamedSharding(mesh, P("ep"))
        args = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in (((32, 64), jnp.bfloat16), ((32, 2), jnp.int32),
                                                                      ((32, 2), jnp.float32))]
        text = layer.lower(*args).as_text()
        print(text.count("stablehlo.custom_call @nccl_ep_ht"))
        grad = jax.jit(jax.grad(lambda *a: layer(*a).astype(jnp.float32).sum(), argnums=(0, 2)))
        print(grad.lower(*args).as_text().count("stablehlo.custom_call @nccl_ep_ht"))
    """, {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"})
    assert out.split() == ["varying", "['ep']", "2", "4"]


def test_axis_ranks():
    import numpy as np

    ids = np.arange(8).reshape(2, 4)  # ("dp", "ep")
    assert epjax.axis_ranks(ids, ("dp", "ep"), "ep", 6) == ([4, 5, 6, 7], 2)
    assert epjax.axis_ranks(ids, ("dp", "ep"), "dp", 6) == ([2, 6], 1)
    with pytest.raises(ep.NcclInvalidArgument, match="axis 'tp' is not an axis"):
        epjax.axis_ranks(ids, ("dp", "ep"), "tp", 6)
    with pytest.raises(ep.NcclInvalidArgument, match="device 9 is not in the mesh"):
        epjax.axis_ranks(ids, ("dp", "ep"), "ep", 9)


class _Store:
    """jax.distributed's key-value store as the group setup uses it."""

    def __init__(self):
        self.kv, self.waits = {}, []

    def key_value_set_bytes(self, key, value):
        assert key not in self.kv
        self.kv[key] = value

    def blocking_key_value_get_bytes(self, key, timeout_in_ms):
        self.waits.append(timeout_in_ms)
        return self.kv[key]


def test_unique_id_through_the_key_value_store():
    store, made = _Store(), []

    def make():
        made.append(1)
        return bytes(range(128))

    assert epjax.share_unique_id(store, "k/0", 0, make, 5.0) == bytes(range(128))
    assert epjax.share_unique_id(store, "k/0", 1, make, 5.0) == bytes(range(128))
    assert made == [1] and store.waits == [5000]


def test_handle_ids_name_static_shapes():
    a, b = (False, "flat", 8, 2, 4, 2, 256, 8), (False, "flat", 16, 2, 4, 2, 256, 8)
    ids = [epjax._new_id(a), epjax._new_id(b), epjax._new_id(a)]
    assert len(set(ids)) == 3
    assert ids[0] >> 24 == ids[2] >> 24 != ids[1] >> 24
    assert all(0 < i < 2**63 for i in ids)


def test_group_refuses_what_it_cannot_serve():
    mesh = jax.make_mesh((1,), ("ep",))
    with pytest.raises(ep.NcclInvalidArgument, match="give hidden"):
        epjax.group(mesh, "ep", num_experts=4, max_tokens_per_rank=8)
    with pytest.raises(ep.NcclInvalidArgument, match="a Low-Latency group takes 1..1024"):
        epjax.group(mesh, "ep", num_experts=4, max_tokens_per_rank=2048, hidden=64, algorithm="low_latency")
    with pytest.raises(ep.NcclInvalidArgument, match="algorithm='fast'"):
        epjax.group(mesh, "ep", num_experts=4, max_tokens_per_rank=8, hidden=64, algorithm="fast")
    with pytest.raises(ep.NcclInvalidArgument, match="recv_overflow='keep'"):
        epjax.group(mesh, "ep", num_experts=4, max_tokens_per_rank=8, hidden=64, max_recv_rows_per_rank=4,
                    recv_overflow="keep")
    if jax.devices()[0].platform == "cpu":
        with pytest.raises(ep.NcclInvalidUsage, match="is not a CUDA GPU"):
            epjax.group(mesh, "ep", num_experts=4, max_tokens_per_rank=8, hidden=64)


def test_the_receive_cap_reaches_the_group_config():
    cfg = epjax._config(num_experts=4, max_tokens_per_rank=8, hidden=64, dtype=jnp.bfloat16, max_token_bytes=None,
                        max_topk=2, num_sms=0, timeout_s=None, algorithm="high_throughput",
                        max_recv_rows_per_rank=12, recv_overflow="drop")
    assert (cfg.max_recv_rows_per_rank, cfg.recv_overflow) == (12, 1)
    default = epjax._config(**{k: v for k, v in epjax._CONFIG_DEFAULTS.items()
                               if k not in ("num_experts", "max_tokens_per_rank", "hidden")},
                            num_experts=4, max_tokens_per_rank=8, hidden=64)
    assert (default.max_recv_rows_per_rank, default.recv_overflow) == (0, 0)
    assert epjax._config_key(cfg) != epjax._config_key(default)


def test_ffi_library_loads_and_registers():
    from nccl._ext import _loader

    if not (_loader.library_dir() / "libnccl_ep_jax.so").is_file():
        pytest.skip("libnccl_ep_jax.so not built (jaxlib's FFI headers were not found at configure time)")
    lib = epjax._ffi_lib()
    for symbol in epjax.TARGETS.values():
        assert getattr(lib, symbol)
    assert epjax._loader.version(lib, "EpJax") == ep.version()
    epjax.register_targets()
    epjax.register_targets()  # once
    with pytest.raises(ep.NcclInvalidArgument, match="no handle registered as 42"):
        epjax._lib_call("ncclEpJaxHandleDestroy", 42)
    rows = ctypes.c_int64(0)  # a handle's host waits need a deadline
    with pytest.raises(ep.NcclInvalidArgument, match="wait_seconds must be > 0"):
        epjax._lib_call("ncclEpJaxHandleCreate", 43, None, 0, 0, 0, 4, 2, 1, 1, 0.0, ctypes.byref(rows))


def test_the_host_waits_deadline_is_twice_the_device_budget(monkeypatch):
    assert epjax._host_wait_s(5) == 20.0
    monkeypatch.setenv("NCCL_EXT_TIMEOUT_S", "30")
    assert epjax._host_wait_s(None) == 70.0
    monkeypatch.delenv("NCCL_EXT_TIMEOUT_S")
    assert epjax._host_wait_s(0) == 210.0  # the libraries' default budget, 100 s


def test_no_torch_in_the_jax_path_and_no_jax_in_the_torch_layer():
    out = _run("""
        import sys
        import nccl.ep.jax
        print("torch" in sys.modules)
    """)
    assert out.split() == ["False"]
    pytest.importorskip("torch")
    out = _run("""
        import sys
        import nccl.ep, nccl.ep.autograd, nccl.ep.ops, nccl.ep.deepep, nccl.m2n
        print(any(m == "jax" or m.startswith("jax.") or m == "jaxlib" for m in sys.modules))
    """)
    assert out.split() == ["False"]
