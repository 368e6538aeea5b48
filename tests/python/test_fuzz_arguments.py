"""The Python layers' argument checking, fuzzed (hypothesis, on the CPU): whatever a caller passes, a call either
works or raises one of nccl's typed exceptions (NcclError and its subclasses) with a message, never a crash, a
ctypes or torch error, or an integer silently cut to fit a C field. Covers what runs without a GPU: nccl.m2n's
layouts, local boxes and the host planner; nccl.ep's group configuration (query_group_info), and Group.dispatch /
combine on a group shell with the C call stubbed (test_ep_args.py's); the DeepEP drop-ins' dispatch and combine on
their CPU models of nccl.ep's groups (test_deepep_cpu.py's, test_deepep_elastic_cpu.py's), where what the drop-in
does not implement may raise NotImplementedError naming it; nccl.ep.jax's calls at trace time (jax.eval_shape).
Seeded by hypothesis's database-free profile
below, so that a CI run is reproducible; NCCL_EXT_FUZZ_EXAMPLES scales the examples per test (default 300)."""

import os

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import nccl.ep as ep  # noqa: E402  (after torch: one libnccl in the process, torch's)
import nccl.m2n as m2n  # noqa: E402
from nccl._ext.errors import NcclError  # noqa: E402

import test_ep_args as shell  # noqa: E402  (its group shell, stand-in handle and on_cpu fixture)

EXAMPLES = int(os.environ.get("NCCL_EXT_FUZZ_EXAMPLES", "300"))
settings.register_profile("nccl_ext", max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                 HealthCheck.filter_too_much])
settings.load_profile("nccl_ext")

# Integers around every edge a C field has: small ones (most valid), negative ones, and past int32 / int64; and what
# is not an integer at all.
EDGES = [0, 1, -1, 2**31 - 1, 2**31, -2**31 - 1, 2**32 + 1, 2**63 - 1, 2**63, 2**64 + 3, -2**63 - 1]
ints = st.one_of(st.integers(-3, 17), st.sampled_from(EDGES), st.integers(-2**70, 2**70))
small = st.integers(0, 9)
NOT_INTS = [3.5, 2.0, float("nan"), float("inf"), "8", None, [2], b"x", True]
hostile = st.one_of(ints, st.sampled_from(NOT_INTS))
INT32, INT64 = (-2**31, 2**31 - 1), (-2**63, 2**63 - 1)


def _fits(v, bounds):
    return isinstance(v, int) and bounds[0] <= v <= bounds[1]


@st.composite
def perturbed(draw, base: dict, values):
    """`base` (valid arguments) with 0-2 of its entries replaced by a draw of `values`."""
    args = dict(base)
    for key in draw(st.lists(st.sampled_from(sorted(base)), max_size=2, unique=True)):
        args[key] = draw(values)
    return args


def _typed(call):
    """Runs call(): returns its result, or None when it raised a typed nccl error with a message; anything else
    fails the test."""
    try:
        return call()
    except NcclError as e:
        assert str(e).strip(), "a refusal without a message: %r" % (e,)
        return None


# -- nccl.m2n --------------------------------------------------------------------------------------------------------

dtypes = st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32,
                          torch.int64, torch.uint8])


@st.composite
def meshes(draw):
    """A mesh of 1-3 dims of rank numbers (duplicates and negatives included), sometimes ragged."""
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    rank = st.one_of(st.integers(0, 7), ints)

    def build(ds):
        if len(ds) == 1:
            return [draw(rank) for _ in range(ds[0])]
        return [build(ds[1:]) for _ in range(ds[0])]

    mesh = build(dims)
    if len(dims) > 1 and draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
        mesh[0] = mesh[0][:-1] or [0]  # ragged
    return mesh


@st.composite
def layouts(draw):
    shape = draw(st.lists(st.one_of(st.integers(0, 12), ints), min_size=0, max_size=4))
    mesh = draw(meshes())
    n = 1
    m = mesh
    while isinstance(m, list):
        n, m = n * len(m), m[0]
    if draw(st.booleans()):
        depth, m = 0, mesh
        while isinstance(m, list):
            depth, m = depth + 1, m[0]
        placements = draw(st.lists(st.one_of(st.integers(-2, 5), ints), min_size=max(0, depth - 1), max_size=depth + 1))
        return dict(global_shape=shape, dtype=draw(dtypes), mesh=mesh, placements=placements)
    box = st.tuples(st.lists(st.one_of(small, ints), min_size=len(shape), max_size=len(shape)),
                    st.lists(st.one_of(small, ints), min_size=len(shape), max_size=len(shape)))
    boxes = draw(st.lists(box, min_size=max(0, n - 1), max_size=n + 1))
    return dict(global_shape=shape, dtype=draw(dtypes), mesh=mesh, boxes=boxes)


def _accepted_values_fit(lay):
    """An accepted layout says what it was given: no dimension, offset or rank was cut to fit its C field."""
    c = lay._c
    assert tuple(c.globalShape[i] for i in range(c.ndims)) == lay.global_shape
    assert [lay._ranks[i] for i in range(len(lay.mesh_ranks))] == lay.mesh_ranks
    if lay.placements is not None:
        assert [lay._placements[i] for i in range(len(lay.placements))] == lay.placements
    else:
        nd = len(lay.global_shape)
        for i, (o, s) in enumerate(lay.boxes):
            assert tuple(lay._boxes[i].offset[:nd]) == tuple(o) and tuple(lay._boxes[i].shape[:nd]) == tuple(s)


@st.composite
def near_valid_layouts(draw):
    """A valid layout (shape, mesh 0..n-1, placements) with one number replaced by a hostile value."""
    nd, n = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 16)) for _ in range(nd)]
    mesh = list(range(n))
    placements = [draw(st.integers(-1, nd - 1))]
    where = draw(st.sampled_from(["shape", "mesh", "placements", "none"]))
    bad = draw(hostile)
    if where == "shape":
        shape[draw(st.integers(0, nd - 1))] = bad
    elif where == "mesh":
        mesh[draw(st.integers(0, n - 1))] = bad
    elif where == "placements":
        placements[0] = bad
    return dict(global_shape=shape, dtype=draw(dtypes), mesh=mesh, placements=placements)


@given(st.one_of(layouts(), near_valid_layouts()), st.one_of(small, hostile), st.one_of(small, hostile))
def test_m2n_layout_arguments(args, n_ranks, rank):
    lay = _typed(lambda: m2n.Layout(**args))
    if lay is None:
        return
    assert all(_fits(v, INT64) for v in args["global_shape"])
    assert all(_fits(v, INT32) for v in lay.mesh_ranks)
    _accepted_values_fit(lay)
    if _typed(lambda: lay.validate(n_ranks)) is not None:
        assert _fits(n_ranks, INT32)
    box = _typed(lambda: lay.local_box(rank))
    if box is not None:
        assert len(box) == 2 and len(box[0]) == len(lay.global_shape)


@given(layouts(), layouts(), st.one_of(small, ints), st.one_of(st.integers(1, 9), ints),
       st.one_of(st.integers(0, 4), ints), st.sampled_from([1, 128, 0, -1, 7]))
def test_m2n_host_plan_arguments(src_args, dst_args, rank, n_ranks, per_domain, block_rows):
    src = _typed(lambda: m2n.Layout(**src_args))
    dst = _typed(lambda: m2n.Layout(**dst_args))
    if src is None or dst is None:
        return

    def plan():
        with m2n.HostPlan([("w", src, dst)], rank=rank, n_ranks=n_ranks, ranks_per_domain=per_domain,
                          fp8_block_rows=block_rows) as p:
            for kind in ("sends", "recvs", "copies"):
                p.transfers(kind)
            return p.info

    info = _typed(plan)
    if info is not None:
        assert info["total_bytes"] >= 0


# -- nccl.ep: the group's configuration ------------------------------------------------------------------------------

group_args = st.fixed_dictionaries({
    "num_experts": st.one_of(st.integers(1, 512), ints),
    "max_tokens_per_rank": st.one_of(st.integers(1, 8192), ints),
}, optional={
    "hidden": st.one_of(st.integers(1, 8192), ints),
    "max_token_bytes": st.one_of(st.integers(16, 65536), ints),
    "max_topk": st.one_of(st.integers(1, 32), ints),
    "num_sms": st.one_of(small, ints),
    "timeout_s": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 100)),
    "algorithm": st.sampled_from(["high_throughput", "low_latency", "fast", ""]),
    "enable_mask": st.booleans(),
    "rail_round_tokens": st.one_of(st.integers(0, 4096), ints),
    "rail_staging_bytes_max": st.one_of(st.integers(0, 2**34), ints),
    "ht_hierarchical": st.sampled_from([None, True, False]),
    "rail_overlap": st.sampled_from([None, True, False]),
    "dtype": st.sampled_from([None, torch.bfloat16, torch.float32, torch.float8_e4m3fn]),
})


INT_ARGS = {"num_experts": INT32, "max_tokens_per_rank": INT32, "hidden": INT32, "max_token_bytes": INT32,
            "max_topk": INT32, "num_sms": INT32, "rail_round_tokens": INT32, "rail_staging_bytes_max": (0, 2**64 - 1)}
hostile_or_float = st.one_of(hostile, st.floats(allow_nan=True, allow_infinity=True))
near_valid_group = st.builds(dict, algorithm=st.sampled_from(["high_throughput", "low_latency"])).flatmap(
    lambda a: perturbed(dict(a, num_experts=64, max_tokens_per_rank=128, hidden=512, max_topk=8, num_sms=0,
                             timeout_s=5.0, rail_round_tokens=0, rail_staging_bytes_max=0), hostile_or_float))


@given(st.one_of(st.integers(1, 64), hostile), st.one_of(st.integers(1, 8), hostile),
       st.one_of(group_args, near_valid_group))
def test_ep_query_group_info_arguments(nranks, lsa_size, args):
    info = _typed(lambda: ep.query_group_info(nranks, lsa_size, **args))
    if info is None:
        return
    assert info["window_bytes"] > 0 and info["n_domains"] >= 1
    # Accepted: every number was one the C config holds as given (nothing cut to fit).
    assert _fits(nranks, INT32) and _fits(lsa_size, INT32)
    for k, bounds in INT_ARGS.items():
        if k in args:
            assert _fits(args[k], bounds) or isinstance(args[k], bool), (k, args[k])
    t = args.get("timeout_s")
    assert t is None or (t == t and 0 <= t < float("inf")), t


# -- nccl.ep: dispatch and combine on a group shell (no C group; the C call stubbed) ---------------------------------

tensor_dtypes = st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int32,
                                 torch.int64, torch.float64, torch.bool])


@st.composite
def tensors(draw, rows=None, cols=None):
    """A CPU tensor of 0-3 dims, mostly near the shapes the shell group takes, sometimes anything; or not a tensor."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([None, [1, 2], 3.0, "x"]))
    nd = draw(st.sampled_from([2, 2, 2, 1, 0, 3]))
    near = [rows if rows is not None else shell.R * shell.M, cols if cols is not None else shell.H]
    shape = [draw(st.one_of(st.sampled_from(near + [0, 1, 128, 5]), st.integers(0, 300))) for _ in range(nd)]
    t = torch.zeros(shape, dtype=draw(tensor_dtypes))
    if nd == 2 and draw(st.integers(0, 9)) == 0:
        t = t.t()  # not contiguous
    return t


@given(st.booleans(), st.sampled_from(["rank_major", "expert_major", "flat"]), tensors(rows=5),
       st.fixed_dictionaries({}, optional={
           "topk_weights": tensors(rows=5, cols=shell.K), "scales": tensors(rows=5, cols=2),
           "out_dtype": st.sampled_from([None, torch.bfloat16, torch.float8_e4m3fn, torch.float32]),
           "round_scale": st.booleans(), "send_only": st.booleans(), "num_sms": st.one_of(small, ints),
           "recv_wait_cycles": tensors(rows=shell.R),
       }))
def test_ep_dispatch_arguments(on_cpu, ll, layout, x, kwargs):
    g = shell._shell(low_latency=ll)
    h = shell._FakeHandle(g, layout)
    _typed(lambda: g.dispatch(x, handle=h, stream=shell._Stream(), **kwargs))


@given(st.booleans(), st.sampled_from(["rank_major", "expert_major", "flat"]), tensors(),
       st.fixed_dictionaries({}, optional={
           "topk_weights": tensors(rows=5, cols=shell.K), "out": tensors(rows=5),
           "send_only": st.booleans(), "num_sms": st.one_of(small, ints), "recv_wait_cycles": tensors(rows=shell.R),
       }))
def test_ep_combine_arguments(on_cpu, ll, layout, y, kwargs):
    g = shell._shell(low_latency=ll)
    h = shell._FakeHandle(g, layout)
    _typed(lambda: g.combine(y, h, stream=shell._Stream(), **kwargs))


on_cpu = shell.on_cpu  # the fixture, for the two tests above


# -- the DeepEP drop-ins on their CPU models (test_deepep_cpu.py's Low-Latency group, test_deepep_elastic_cpu.py's
# High-Throughput group): a refusal is a typed nccl error or, for what the drop-in does not implement, a
# NotImplementedError naming it ------------------------------------------------------------------------------------
from unittest import mock  # noqa: E402

import nccl.ep.deepep as deep_ep  # noqa: E402
import nccl.ep.deepep_elastic as elastic  # noqa: E402
import test_deepep_cpu as v1  # noqa: E402
import test_deepep_elastic_cpu as v2  # noqa: E402

fake_world, ll, model, one_buffer = v1.fake_world, v1.ll, v2.model, v2.one_buffer  # their fixtures


def _refused_or_done(call):
    try:
        return call()
    except (NcclError, NotImplementedError) as e:
        assert str(e).strip(), "a refusal without a message: %r" % (e,)
        return None


index_tensors = st.one_of(tensors(rows=v2.M, cols=v2.K),
                          st.integers(-2, 2 * v2.LOCAL).map(lambda e: torch.full((v2.M, v2.K), e, dtype=torch.int64)))
elastic_x = st.one_of(tensors(rows=v2.M, cols=v2.H), st.tuples(tensors(rows=v2.M, cols=v2.H), tensors(rows=v2.M)))


@given(elastic_x, st.fixed_dictionaries({}, optional={
    "topk_idx": index_tensors, "topk_weights": tensors(rows=v2.M, cols=v2.K),
    "num_experts": st.one_of(st.just(v2.LOCAL), hostile), "num_max_tokens_per_rank": st.one_of(small, hostile),
    "expert_alignment": st.one_of(small, hostile), "num_sms": st.one_of(small, hostile), "do_expand": st.booleans(),
    "do_cpu_sync": st.sampled_from([None, True, False]), "do_zero_padding": st.booleans(),
    "use_tma_aligned_col_major_sf": st.booleans(), "handle": st.sampled_from([None, object(), (1, 2)]),
}))
def test_deepep_elastic_dispatch_arguments(one_buffer, x, kwargs):
    with mock.patch.object(elastic, "_device_sms", lambda: 132):  # the SMs a GPU would report
        _refused_or_done(lambda: one_buffer.dispatch(x, **kwargs))


@given(tensors(cols=v2.H), st.fixed_dictionaries({}, optional={
    "topk_weights": tensors(cols=v2.K),
    "bias": st.one_of(tensors(rows=v2.M, cols=v2.H), st.tuples(tensors(), tensors())),
    "num_sms": st.one_of(small, hostile), "handle": st.sampled_from([None, object()]),
}))
def test_deepep_elastic_combine_arguments(one_buffer, y, kwargs):
    idx, x, w = v2._inputs(0, 1)
    with mock.patch.object(elastic, "_device_sms", lambda: 132):
        handle = one_buffer.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=v2.LOCAL)[3]
        kwargs.setdefault("handle", handle)
        _refused_or_done(lambda: one_buffer.combine(y, **kwargs))


@given(tensors(rows=v1.LM, cols=v1.LH), st.one_of(tensors(rows=v1.LM, cols=v1.LK), index_tensors),
       st.one_of(st.just(v1.LM), hostile), st.one_of(st.just(v1.E), hostile), st.fixed_dictionaries({}, optional={
           "use_fp8": st.booleans(), "round_scale": st.booleans(), "use_ue8m0": st.booleans(),
           "return_recv_hook": st.booleans(),  # not async_finish: its CUDA event needs a GPU
           "cumulative_local_expert_recv_stats": st.one_of(st.none(), tensors(rows=v1.E // v1.R)),
           "dispatch_wait_recv_cost_stats": st.one_of(st.none(), tensors(rows=v1.R)),
       }))
def test_deepep_low_latency_dispatch_arguments(ll, x, topk_idx, m, num_experts, kwargs):
    _refused_or_done(lambda: ll.low_latency_dispatch(x, topk_idx, m, num_experts, **kwargs))


@given(st.one_of(dtypes, st.sampled_from([None, "uint8", 1])),
       st.one_of(st.none(), st.lists(st.one_of(small, ints), max_size=3)), st.one_of(small, hostile), st.booleans())
def test_deepep_local_buffer_tensor_arguments(fake_world, dtype, size, offset, rdma):
    buf = deep_ep.Buffer(v1.dist.group.WORLD, 4096, 1 << 12)
    t = _refused_or_done(lambda: buf.get_local_buffer_tensor(dtype, size, offset, rdma))
    if t is not None:  # accepted: a view inside the Buffer's memory, from the offset
        assert t.numel() * t.element_size() <= 4096 - offset


# -- nccl.ep.jax at trace time (jax.eval_shape: no device, no FFI library): arguments of any shape and dtype, and
# things that are not arrays ---------------------------------------------------------------------------------------
jax_dtypes = ["bfloat16", "float16", "float32", "float8_e4m3fn", "int32", "int64", "uint8", "bool"]


@st.composite
def jax_args(draw, rows, cols):
    """A ShapeDtypeStruct of 0-3 dims near [rows, cols], or something that is not an array."""
    jnp = pytest.importorskip("jax.numpy")
    jax = pytest.importorskip("jax")
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([None, [1, 2], 3.0, "x"]))
    nd = draw(st.sampled_from([2, 2, 2, 1, 0, 3]))
    shape = tuple(draw(st.one_of(st.sampled_from([rows, cols, 0, 1, 128]), st.integers(0, 300))) for _ in range(nd))
    return jax.ShapeDtypeStruct(shape, getattr(jnp, draw(st.sampled_from(jax_dtypes))))


@given(st.booleans(), st.sampled_from(["flat", "rank_major", "expert_major"]), jax_args(8, 64), jax_args(8, 2),
       jax_args(8, 2), st.fixed_dictionaries({}, optional={
           "fp8": st.sampled_from([True, False, 1, "yes"]), "round_scale": st.booleans(),
           "zero_past_counts": st.sampled_from([True, False, None, 0])}))
def test_jax_dispatch_and_combine_arguments(ll, layout, x, idx, w, kwargs):
    jax = pytest.importorskip("jax")
    import nccl.ep.jax as epjax

    R, L, T, K = 3, 4, 8, 2
    rows = L * R * T if layout == "expert_major" else R * T
    spec = epjax.HandleSpec(id=(123 << 24) | 9, low_latency=ll, layout=layout, num_tokens=T, topk=K, rows=rows,
                            ranks=R, local_experts=L, max_token_bytes=256, max_tokens_per_rank=T)
    def traced(fn, *args):
        """fn(*args) traced by jax.eval_shape: the arrays as its arguments, anything else closed over (eval_shape
        itself refuses non-arrays, before nccl.ep.jax sees them)."""
        arrays = [i for i, a in enumerate(args) if isinstance(a, jax.ShapeDtypeStruct)]

        def call(*traced_arrays):
            full = list(args)
            for i, a in zip(arrays, traced_arrays):
                full[i] = a
            return fn(*full)

        return _refused_or_done(lambda: jax.eval_shape(call, *[args[i] for i in arrays]))

    if ll:
        traced(lambda *a: epjax.ll_dispatch(spec, *a, **kwargs), x, idx, w)
        traced(lambda y, w_: epjax.ll_combine(spec, y, w_), x, w)
    else:
        traced(lambda *a: epjax.dispatch(spec, *a), x, idx, w)
        traced(lambda y: epjax.combine(spec, y), x)
