"""nccl.ep.jax on a GPU: 1 rank, or several processes under torchrun (on one GPU with --one-gpu nodes: every process
a JAX runtime of its own on GPU 0, its own NCCL host id, so every row between ranks goes over the rail exchange).

Any rank count: group setup (the NCCL unique id through jax.distributed's key-value store, the cache per (mesh,
axis), close and make again); High-Throughput dispatch and combine inside jit + shard_map (rows grouped by source
rank with their local ids and weights, the counts, rows past the count zero and ids -1, two routings on one handle,
bf16 / fp16 / fp32); their gradient, by jax.vjp inside shard_map and by jax.grad of a loss over the sharded output
(a squared error: its cotangent depends on the forward's output, so the backward's calls follow the forward's by
data). Every rank derives every rank's inputs from the seed and checks its own outputs against numpy, without any
exchange. 1 rank only: jax.grad through dispatch + combine against the same function on one device in plain JAX
(the squared error, and a loss linear in the output, whose backward has no data dependence on the forward's calls:
see that test); Low-Latency
RANK_MAJOR and EXPERT_MAJOR dispatch (bf16, and fp8 with and without power-of-two scales: the bytes and scales of
the library's quantiser, common/numeric.h, redone in numpy) and their combines (by rank, with the dispatched
weights, with the owner's, with none); errors (a handle id nobody registered, a closed handle, a mode or shape
the handler refuses: XLA's runtime error carrying the library's text; a wrong shape at trace time).

Values are multiples of 1/8 small enough that every product and sum is exact in fp32, so everything compares exactly
(bf16 / fp16 results: the exact value rounded once, as the library rounds). XLA allocates the outputs, so they cannot
be poisoned directly: before each call the allocator's free memory is filled with 0x7f bytes (a NaN or 3.4e38 in
every float type, 2139062143 as int32), where an output row the library failed to write is likely to show.

Every process runs all the collective calls of a test before checking anything, so that a failed check on one rank
leaves no peer waiting in a call. Under a launcher jax.distributed is initialised here, before any JAX computation,
with a coordinator port of its own (rank 0's free port, sent over the launcher's gloo group). This module sets
XLA_PYTHON_CLIENT_PREALLOCATE=false and a small XLA_PYTHON_CLIENT_MEM_FRACTION when it is collected (unless set), for
every process of the pytest run: several JAX runtimes share the GPU, and torch tests share the process."""

import dataclasses
import os
import re
import zlib

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if "XLA_CLIENT_MEM_FRACTION" not in os.environ:  # jax refuses both at once
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.1")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import nccl.ep as ep  # noqa: E402
import nccl.ep.jax as epjax  # noqa: E402
from nccl._ext import _loader  # noqa: E402

pytestmark = pytest.mark.gpu

M, H, L, K = 32, 256, 4, 3  # High-Throughput: tokens per rank at most, hidden, experts per rank, top-k
T = 29                      # tokens of every rank (shard_map: one shape on every rank); T < M: rows past the count
HG = 64  # hidden of the gradient tests (fp32: every sum of their backward exact, see _grad_reference)
LL_M, LL_T, LL_H, LL_L = 32, 29, 256, 4  # Low-Latency (1 rank): slots per rank, tokens, hidden (2 fp8 blocks), experts
_POISON = 0x7F7F7F7F


# -- the world ---------------------------------------------------------------------------------------------------------
def _coordinator_port(rank: int) -> int:
    """A port for jax.distributed's coordinator, other than the launcher's (MASTER_PORT, in use by torch's store):
    rank 0 asks the kernel for a free one and sends it over the launcher's gloo group."""
    import socket

    import torch.distributed as dist

    box = [None]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            box[0] = s.getsockname()[1]
    dist.broadcast_object_list(box, src=0)
    assert box[0] != int(os.environ["MASTER_PORT"])
    return box[0]


@pytest.fixture(scope="module")
def jax_world(request):
    """(rank, size, mesh): the processes of the launcher (WORLD_SIZE; else this one alone), jax.distributed
    initialised among them, and a mesh of one device per process in process order, axis "ep". Skips without
    libnccl_ep_jax.so or without a JAX CUDA backend."""
    if not (_loader.library_dir() / "libnccl_ep_jax.so").is_file():
        pytest.skip("libnccl_ep_jax.so not built (jaxlib's FFI headers were not found at configure time)")
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1:
        request.getfixturevalue("launched_world")
        one_gpu = os.environ.get("NCCL_EXT_TEST_ONE_GPU") == "nodes"  # conftest's --one-gpu nodes
        gpu = 0 if one_gpu else int(os.environ.get("LOCAL_RANK", "0"))
        jax.distributed.initialize(coordinator_address="%s:%d" % (os.environ["MASTER_ADDR"], _coordinator_port(rank)),
                                   num_processes=size, process_id=rank, local_device_ids=[gpu])
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip("no JAX CUDA backend (%s)" % e)
    first = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        first.setdefault(d.process_index, d)
    assert len(first) == size and jax.process_index() == rank, (first, rank)
    yield rank, size, Mesh(np.array(list(first.values())), ("ep",))
    if size > 1:
        jax.distributed.shutdown()


@pytest.fixture(scope="module")
def one_rank(jax_world):
    if jax_world[1] != 1:
        pytest.skip("written for 1 rank (%d here)" % jax_world[1])
    yield jax_world


def _ht_group(mesh, axis, R):
    return epjax.group(mesh, axis, num_experts=L * R, max_tokens_per_rank=M, hidden=H, dtype=jnp.float32,
                       max_topk=K, num_sms=8, timeout_s=60)


@pytest.fixture(scope="module")
def ht(jax_world):
    """The High-Throughput group of the mesh (fp32 rows at most: the gradient tests'), with (rank, size, mesh)."""
    rank, R, mesh = jax_world
    g = _ht_group(mesh, "ep", R)
    yield g, rank, R, mesh
    g.close()


@pytest.fixture(scope="module")
def ll(one_rank):
    g = epjax.group(one_rank[2], "ep", num_experts=LL_L, max_tokens_per_rank=LL_M, hidden=LL_H, max_topk=K,
                    num_sms=8, timeout_s=60, algorithm="low_latency")
    yield g
    g.close()


# -- data and helpers --------------------------------------------------------------------------------------------------
def _tokens(s, R, seed, local=L, tokens=T, hidden=H):
    """Source s's tokens among R ranks: (the routing [tokens, K] int32 over R * local experts, distinct ids with some
    -1 and one token routed nowhere; x [tokens, hidden] in [-4, 4]; weights [tokens, K] in [1/8, 1]; a second
    weights tensor), float64 multiples of 1/8."""
    rng = np.random.default_rng([seed, R, s])
    E = R * local
    k = min(K, E)
    idx = np.full((tokens, K), -1, np.int32)
    for t in range(tokens):
        idx[t, :k] = rng.permutation(E)[:k]
    idx[rng.random((tokens, K)) < 0.2] = -1
    idx[tokens // 3] = -1
    x = rng.integers(-32, 33, (tokens, hidden)) / 8
    w = rng.integers(1, 9, (tokens, K)) / 8
    w2 = rng.integers(1, 9, (tokens, K)) / 8
    return idx, x, w, w2


def _round(v, dtype):
    """float64 values exact in fp32, as `dtype` (one rounding to nearest even), back as float64."""
    return np.asarray(np.asarray(v, np.float32).astype(dtype), np.float64)


def _host(a):
    """This process's shard of a jax array (the whole array on one device), as numpy."""
    return np.asarray(a.addressable_data(0))


def _f64(a):
    return np.asarray(a, np.float64)


def _dirty():
    """Fills free memory of XLA's allocator with 0x7f bytes (see the module docstring)."""
    a = jnp.full((1 << 20,), _POISON, jnp.int32)
    a.block_until_ready()
    a.delete()


def _sharded(mesh, axis, arr):
    return jax.make_array_from_callback(arr.shape, NamedSharding(mesh, P(axis)), lambda i: arr[i])


def _on(idx, d, local=L):
    """Whether each column's expert lives on rank d."""
    return (idx >= 0) & (idx // local == d)


def _ranks_hit(idx, R):
    return np.stack([_on(idx, d).any(axis=1) for d in range(R)], axis=1)


# -- High-Throughput, any rank count -----------------------------------------------------------------------------------
def _ht_forward(g, mesh, axis, me, R, dtype, seed, rounds=2):
    """Dispatch + combine of `rounds` routings on one handle (the second rebinds it), then every check of this
    rank's outputs: the FLAT rows of every source in order with their local ids and weights, the counts, the rows
    past the count, and the combine of the rows times (receiving rank + 1)."""
    h = g.handle(num_tokens=T, topk=K)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P(axis), out_specs=P(axis))
    def layer(x, idx, w):
        recv = epjax.dispatch(h, x, idx, w)
        factor = (jax.lax.axis_index(axis) + 1).astype(jnp.float32)
        return recv, epjax.combine(h, (recv.tokens.astype(jnp.float32) * factor).astype(recv.tokens.dtype))

    results = []
    for r in range(rounds):  # every collective first
        inputs = [_tokens(s, R, seed + r) for s in range(R)]
        x = np.concatenate([i[1] for i in inputs]).astype(dtype)
        idx = np.concatenate([i[0] for i in inputs])
        w = np.concatenate([i[2] for i in inputs]).astype(np.float32)
        _dirty()
        recv, out = layer(*(_sharded(mesh, axis, a) for a in (x, idx, w)))
        results.append((inputs, jax.tree.map(_host, recv), _host(out)))
    spec = h.spec
    h.close()
    assert spec.rows == R * M and (spec.ranks, spec.local_experts) == (R, L)
    for r, (inputs, recv, out) in enumerate(results):
        rows, ids, wts = [], [], []
        counts = np.zeros(L, np.int64)
        for s, (idx_s, x_s, w_s, _) in enumerate(inputs):  # source by source, its tokens with an expert here in order
            hit = _on(idx_s, me)
            sent = hit.any(axis=1)
            assert int(recv.rank_counts[s]) == int(sent.sum()), (r, s)
            rows.append(x_s[sent])
            ids.append(np.where(hit, idx_s - me * L, -1)[sent])
            wts.append(np.where(hit, w_s, 0.0)[sent])
            counts += np.bincount(idx_s[hit] - me * L, minlength=L)
        n = sum(len(a) for a in rows)
        assert recv.tokens.shape == (R * M, H) and recv.tokens.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(recv.expert_counts, counts, err_msg="round %d" % r)
        np.testing.assert_array_equal(_f64(recv.tokens[:n]), np.concatenate(rows), err_msg="round %d" % r)
        np.testing.assert_array_equal(recv.local_ids[:n], np.concatenate(ids), err_msg="round %d" % r)
        np.testing.assert_array_equal(_f64(recv.weights[:n]), np.concatenate(wts), err_msg="round %d" % r)
        assert not _f64(recv.tokens[n:]).any() and (recv.local_ids[n:] == -1).all() and not recv.weights[n:].any()
        # My token t comes back from every rank d it went to, times d + 1, summed in fp32 and rounded once.
        idx, x = inputs[me][0], inputs[me][1]
        factor = (_ranks_hit(idx, R) * np.arange(1, R + 1)).sum(axis=1, keepdims=True)
        assert out.shape == (T, H) and out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(_f64(out), _round(x * factor, dtype), err_msg="round %d" % r)


@pytest.mark.parametrize("dtype,seed", [(jnp.bfloat16, 100), (jnp.float16, 110), (jnp.float32, 120)],
                         ids=["bf16", "fp16", "fp32"])
def test_dispatch_and_combine_against_numpy(ht, dtype, seed):
    g, me, R, mesh = ht
    _ht_forward(g, mesh, "ep", me, R, dtype, seed)
    g.check()


def test_group_setup_through_the_key_value_store(jax_world):
    """A group of another axis name over the same processes: the unique id under the members' key in jax.distributed's
    store, the group cached per (mesh, axis), another config refused, and after close() a new group (the next key)
    that works."""
    me, R, mesh = jax_world
    mesh2 = Mesh(mesh.devices, ("experts",))
    members = [int(d.id) for d in mesh.devices.flat]
    base = "nccl_ep/jax/%08x" % (zlib.crc32(repr(members).encode()) & 0xFFFFFFFF)
    generation = epjax._generations.get(base, 0)
    g = _ht_group(mesh2, "experts", R)
    try:
        assert (g.rank, g.size, g.local_experts) == (me, R, L) and g.device.process_index == me
        assert _ht_group(mesh2, "experts", R) is g
        with pytest.raises(ep.NcclInvalidUsage, match="another config"):
            epjax.group(mesh2, "experts", num_experts=2 * L * R, max_tokens_per_rank=M, hidden=H, dtype=jnp.float32,
                        max_topk=K, num_sms=8, timeout_s=60)
        _ht_forward(g, mesh2, "experts", me, R, jnp.bfloat16, seed=300, rounds=1)
    finally:
        g.close()
    g2 = _ht_group(mesh2, "experts", R)
    try:
        assert g2 is not g
        _ht_forward(g2, mesh2, "experts", me, R, jnp.bfloat16, seed=310, rounds=1)
    finally:
        g2.close()
    if R > 1:  # rank 0 published each group's id; every rank reads the same bytes
        kv = epjax._kv_client()
        ids = [bytes(kv.blocking_key_value_get_bytes("%s/%d" % (base, generation + i), 10_000)) for i in (0, 1)]
        assert [len(i) for i in ids] == [128, 128] and ids[0] != ids[1]


def _grad_inputs(R, seed):
    """Every source's fp32 inputs (hidden HG) and a target [T, HG] in [-4, 4] for each."""
    inputs = [_tokens(s, R, seed, hidden=HG) for s in range(R)]
    targets = [np.random.default_rng([seed, R, s, 1]).integers(-32, 33, (T, HG)) / 8 for s in range(R)]
    return inputs, targets


def _grad_reference(idx, x, w, R, target):
    """This rank's layer output and the gradients of 0.5 * sum((out - target)^2): every rank d a token went to adds
    x * (its columns' weights) + x^2, so out = x * S + hits * x^2 (S: the routed columns' weights); with
    c = out - target, d/dx = c * (S + 2 hits x) and every routed column of w gets sum_h c x. All exact in fp32:
    |c| <= 64 in steps of 1/64, |c x| <= 256 in steps of 1/512, HG of them sum below 2^24 steps."""
    routed = idx >= 0
    S = np.where(routed, w, 0.0).sum(axis=1, keepdims=True)
    hits = _ranks_hit(idx, R).sum(axis=1, keepdims=True)
    out = x * S + hits * x * x
    c = out - target
    return out, c * (S + 2 * hits * x), np.where(routed, (c * x).sum(axis=1, keepdims=True), 0.0)


def _expert_rows(h, x, idx, w):
    """The layer on this rank's share: dispatch, each received row times the sum of its (local) weights plus its
    square, combine."""
    recv = epjax.dispatch(h, x, idx, w)
    y = recv.tokens * jnp.sum(recv.weights, axis=1, keepdims=True) + recv.tokens * recv.tokens
    return epjax.combine(h, y)


def _check_grads(inputs, targets, me, R, got):
    idx, x, w, _ = inputs[me]
    for name, want, have in zip(("out", "d/dx", "d/dw"), _grad_reference(idx, x, w, R, targets[me]), got):
        assert have.dtype == np.float32, name
        np.testing.assert_array_equal(_f64(have), want, err_msg=name)


def _grad_args(inputs, targets):
    """x, idx, w, target of every rank, concatenated: the global arrays."""
    def every(j, dtype):
        return np.concatenate([i[j] for i in inputs]).astype(dtype)

    return every(1, np.float32), every(0, np.int32), every(2, np.float32), np.concatenate(targets).astype(np.float32)


def test_gradient_by_vjp_inside_shard_map(ht):
    """jax.vjp on each rank's share, its cotangent out - target (so the backward's calls follow the forward's by
    data, as in a training step)."""
    g, me, R, mesh = ht
    h = g.handle(num_tokens=T, topk=K)
    inputs, targets = _grad_inputs(R, seed=400)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
    def step(x, idx, w, target):
        out, vjp = jax.vjp(lambda x, w: _expert_rows(h, x, idx, w), x, w)
        return (out,) + vjp(out - target)

    _dirty()
    got = [_host(a) for a in step(*(_sharded(mesh, "ep", a) for a in _grad_args(inputs, targets)))]
    h.close()
    _check_grads(inputs, targets, me, R, got)


def test_gradient_of_a_loss_over_the_sharded_output(ht):
    """jax.grad outside shard_map, as a training step takes it (the transpose of shard_map runs the backward's calls
    per rank)."""
    g, me, R, mesh = ht
    h = g.handle(num_tokens=T, topk=K)
    inputs, targets = _grad_inputs(R, seed=500)
    layer = jax.shard_map(lambda x, idx, w: _expert_rows(h, x, idx, w), mesh=mesh, in_specs=P("ep"),
                          out_specs=P("ep"))

    @jax.jit
    def step(x, idx, w, target):
        def loss(x, w):
            out = layer(x, idx, w)
            return 0.5 * jnp.sum((out - target) ** 2), out

        (gx, gw), out = jax.grad(loss, argnums=(0, 1), has_aux=True)(x, w)
        return out, gx, gw

    _dirty()
    got = [_host(a) for a in step(*(_sharded(mesh, "ep", a) for a in _grad_args(inputs, targets)))]
    h.close()
    _check_grads(inputs, targets, me, R, got)


# -- 1 rank: the gradient against plain JAX ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["squared", "linear"])
def test_grad_matches_the_same_function_on_one_device(one_rank, ht, loss):
    """jax.grad of a loss through dispatch + combine against the same loss of the same layer in plain JAX on this
    device. "linear": sum(out * G), whose cotangent G reaches the backward's first call (combine's gradient, a
    redispatch through the handle's routing) with no data dependence on the forward's calls: XLA may order it
    before the forward's dispatch binds the routing, which this case would show."""
    g = ht[0]
    h = g.handle(num_tokens=T, topk=K)
    inputs, targets = _grad_inputs(1, seed=600 if loss == "squared" else 610)
    idx, x, w, _ = inputs[0]
    target = jnp.asarray(targets[0], jnp.float32)  # linear: G (steps of 1/8 in [-4, 4]: its sums exact too)
    idx_j = jnp.asarray(idx)

    def reference(x, w):
        routed = idx_j >= 0
        s = jnp.sum(jnp.where(routed, w, 0.0), axis=1, keepdims=True)
        return jnp.where(jnp.any(routed, axis=1, keepdims=True), x * s + x * x, 0.0)

    def grad_step(f):
        def value(x, w):
            out = f(x, w)
            v = 0.5 * jnp.sum((out - target) ** 2) if loss == "squared" else jnp.sum(out * target)
            return v, out

        def step(x, w):
            (gx, gw), out = jax.grad(value, argnums=(0, 1), has_aux=True)(x, w)
            return out, gx, gw

        return jax.jit(step)

    args = (jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
    _dirty()
    got = [np.asarray(a) for a in grad_step(lambda x, w: _expert_rows(h, x, idx_j, w))(*args)]
    h.close()
    want = [np.asarray(a) for a in grad_step(reference)(*args)]
    for name, a, b in zip(("out", "d/dx", "d/dw"), got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)
    if loss == "squared":  # and both against numpy
        _check_grads(inputs, targets, 0, 1, got)


# -- 1 rank: Low-Latency -----------------------------------------------------------------------------------------------
def _fp8(x, pow2):
    """common/numeric.h's fp8QuantizeRow on rows x [n, hidden] (fp32 values): (e4m3 [n, hidden], scales [n,
    hidden/128]): scale = max(amax, 1e-4) / 448 per 128 columns (pow2: rounded up to a power of two), q = e4m3(x /
    scale) (an fp32 division, rounded to nearest even, saturating at 448)."""
    n = x.shape[0]
    b = np.asarray(x, np.float32).reshape(n, -1, 128)
    s = np.maximum(np.abs(b).max(axis=2), np.float32(1e-4)) / np.float32(448)
    if pow2:
        u = s.view(np.uint32)
        s = (((u >> 23) + ((u & 0x7FFFFF) != 0)) << 23).astype(np.uint32).view(np.float32)
    q = np.clip(b / s[:, :, None], -448, 448).astype(jnp.float8_e4m3fn)
    return q.reshape(n, -1), s


def _dequantised(tokens, scales):
    return tokens.astype(jnp.float32) * jnp.repeat(scales, 128, axis=1)


def _ll_data(seed):
    idx, x, w, w_owner = _tokens(0, 1, seed, local=LL_L, tokens=LL_T, hidden=LL_H)
    return idx, x, w, w_owner, jnp.asarray(x, jnp.bfloat16), jnp.asarray(idx), jnp.asarray(w, jnp.float32)


FP8 = [pytest.param(False, False, id="bf16"), pytest.param(True, False, id="fp8"),
       pytest.param(True, True, id="fp8-pow2")]


def _check_ll_rows(recv, rows, x_rows, fp8, pow2, n):
    """The first n rows of a Low-Latency output: the bf16 rows x_rows, or their fp8 bytes and scales."""
    if fp8:
        q, s = _fp8(x_rows, pow2)
        assert recv.tokens.dtype == jnp.float8_e4m3fn and recv.scales.shape == (rows, LL_H // 128)
        np.testing.assert_array_equal(recv.tokens[:n].view(np.uint8), q.view(np.uint8))
        np.testing.assert_array_equal(recv.scales[:n], s)
    else:
        assert recv.tokens.dtype == jnp.bfloat16 and recv.scales.shape == (0,)
        np.testing.assert_array_equal(_f64(recv.tokens[:n]), x_rows)
        assert not _f64(recv.tokens[n:]).any()


@pytest.mark.parametrize("fp8,pow2", FP8)
def test_low_latency_rank_major(ll, fp8, pow2):
    h = ll.handle(num_tokens=LL_T, topk=K, layout="rank_major")
    idx, x, w, _, xj, idxj, wj = _ll_data(700 + 2 * fp8 + pow2)

    @jax.jit
    def step(x, idx, w):
        recv = epjax.ll_dispatch(h, x, idx, w, fp8=fp8, round_scale=pow2)
        rows = _dequantised(recv.tokens, recv.scales) if fp8 else recv.tokens.astype(jnp.float32)
        return recv, epjax.ll_combine(h, rows * 2)  # one row per slot: the caller's reduction (exact: times 2)

    _dirty()
    recv, out = jax.tree.map(np.asarray, step(xj, idxj, wj))
    h.close()
    sent = (idx >= 0).any(axis=1)
    n, N = int(sent.sum()), LL_M
    assert recv.tokens.shape == (N, LL_H)
    np.testing.assert_array_equal(recv.rank_counts, [n])
    np.testing.assert_array_equal(recv.expert_counts, np.bincount(idx[idx >= 0], minlength=LL_L))
    np.testing.assert_array_equal(recv.src_info[:n], np.nonzero(sent)[0])
    np.testing.assert_array_equal(recv.local_ids[:n], idx[sent])
    np.testing.assert_array_equal(_f64(recv.weights[:n]), np.where(idx >= 0, w, 0.0)[sent])
    assert (recv.local_ids[n:] == -1).all() and not recv.weights[n:].any()
    _check_ll_rows(recv, N, x[sent], fp8, pow2, n)
    # One rank: every token's one row comes back, rounded to bf16 (tokens routed nowhere: zero).
    if fp8:
        q, s = _fp8(x, pow2)
        x = _f64(q.astype(np.float32) * np.repeat(s, 128, axis=1))  # an fp32 product, as the step's
    np.testing.assert_array_equal(_f64(out), np.where(sent[:, None], _round(x * 2, jnp.bfloat16), 0.0))


@pytest.mark.parametrize("fp8,pow2", FP8)
def test_low_latency_expert_major(ll, fp8, pow2):
    """Zone l: the (token, column) pairs naming expert l in token order, src_info the token, the pair's weight.
    Combines (expert l multiplies by l % 3 + 1): with the dispatched weights and with the owner's, each token's sum
    rounded once to bf16; after fp8 only with power-of-two scales (then the dequantised rows keep 4 bits and every
    sum is exact; other scales leave the sum's rounding to the kernel's order of operations)."""
    h = ll.handle(num_tokens=LL_T, topk=K, layout="expert_major")
    idx, x, w, w_owner, xj, idxj, wj = _ll_data(800 + 2 * fp8 + pow2)
    zone = LL_M
    factor = np.repeat(np.arange(LL_L) % 3 + 1, zone).astype(np.float32)[:, None]

    @jax.jit
    def step(x, idx, w, w_owner):
        recv = epjax.ll_dispatch(h, x, idx, w, fp8=fp8, round_scale=pow2)
        rows = _dequantised(recv.tokens, recv.scales) if fp8 else recv.tokens.astype(jnp.float32)
        y = rows * factor
        return recv, epjax.ll_combine(h, y), epjax.ll_combine(h, y, w_owner)

    _dirty()
    recv, out_dispatched, out_owner = jax.tree.map(np.asarray, step(xj, idxj, wj, jnp.asarray(w_owner, jnp.float32)))
    h.close()
    assert recv.tokens.shape == (LL_L * zone, LL_H) and recv.weights.shape == (LL_L * zone,)
    assert recv.local_ids.shape == (0,)
    np.testing.assert_array_equal(recv.rank_counts, [int((idx >= 0).any(axis=1).sum())])
    for l in range(LL_L):
        t, k = np.nonzero(idx == l)
        c, o = len(t), l * zone
        assert int(recv.expert_counts[l]) == c, l
        np.testing.assert_array_equal(recv.src_info[o:o + c], t, err_msg="zone %d" % l)
        np.testing.assert_array_equal(_f64(recv.weights[o:o + c]), w[t, k], err_msg="zone %d" % l)
        assert not recv.weights[o + c:o + zone].any(), l
        zone_recv = recv._replace(tokens=recv.tokens[o:o + zone], scales=recv.scales[o:o + zone] if fp8 else
                                  recv.scales)
        _check_ll_rows(zone_recv, zone, x[t], fp8, pow2, c)
    if fp8 and not pow2:
        return
    if fp8:
        q, s = _fp8(x, pow2)
        x = _f64(q.astype(np.float32) * np.repeat(s, 128, axis=1))
    c_of = np.where(idx >= 0, idx % 3 + 1, 0)
    for name, weights, out in (("dispatched weights", w, out_dispatched), ("owner's weights", w_owner, out_owner)):
        want = _round(x * (weights * c_of).sum(axis=1, keepdims=True), jnp.bfloat16)
        np.testing.assert_array_equal(_f64(out), want, err_msg=name)


def test_low_latency_expert_major_without_weights(ll):
    """Dispatched without weights, combined without the owner's: every expert's row counts once."""
    h = ll.handle(num_tokens=LL_T, topk=K, layout="expert_major")
    idx, x, _, _, xj, idxj, _ = _ll_data(900)
    factor = np.repeat(np.arange(LL_L) % 3 + 1, LL_M).astype(np.float32)[:, None]

    @jax.jit
    def step(x, idx):
        recv = epjax.ll_dispatch(h, x, idx)
        return recv.weights, epjax.ll_combine(h, recv.tokens.astype(jnp.float32) * factor)

    _dirty()
    weights, out = (np.asarray(a) for a in step(xj, idxj))
    h.close()
    assert weights.shape == (0,)
    c_of = np.where(idx >= 0, idx % 3 + 1, 0)
    np.testing.assert_array_equal(_f64(out), _round(x * c_of.sum(axis=1, keepdims=True), jnp.bfloat16))


@pytest.mark.parametrize("layout", ["rank_major", "expert_major"])
def test_low_latency_rows_past_the_counts_left(ll, layout):
    """zero_past_counts=False: the received rows and the combine are as with zeros (combine reads no row past the
    counts); the rows past them are whatever the allocator left (dirtied first: 0x7f bytes, not zero)."""
    h = ll.handle(num_tokens=LL_T, topk=K, layout=layout)
    idx, x, w, _, xj, idxj, wj = _ll_data(950 + (layout == "expert_major"))

    @jax.jit
    def step(x, idx):
        recv = epjax.ll_dispatch(h, x, idx, zero_past_counts=False)
        return recv, epjax.ll_combine(h, recv.tokens.astype(jnp.float32) * 2)

    _dirty()
    recv, out = jax.tree.map(np.asarray, step(xj, idxj))
    h.close()
    if layout == "rank_major":
        sent = (idx >= 0).any(axis=1)
        np.testing.assert_array_equal(_f64(recv.tokens[:int(sent.sum())]), x[sent])
        np.testing.assert_array_equal(_f64(out), np.where(sent[:, None], _round(x * 2, jnp.bfloat16), 0.0))
    else:
        for l in range(LL_L):
            t, _ = np.nonzero(idx == l)
            np.testing.assert_array_equal(_f64(recv.tokens[l * LL_M:l * LL_M + len(t)]), x[t], err_msg="zone %d" % l)
        n_of = (idx >= 0).sum(axis=1, keepdims=True)
        np.testing.assert_array_equal(_f64(out), _round(x * 2 * n_of, jnp.bfloat16))


# -- 1 rank: errors ----------------------------------------------------------------------------------------------------
def test_receive_cap_drops_and_counts(one_rank):
    """A group whose receive cap (recv_overflow="drop") is below a routing's rows: recv_dropped counts the rows past
    it, rank_counts the delivered ones, and combine brings back exactly the delivered tokens (the others: zero)."""
    cap = 8
    mesh = Mesh(one_rank[2].devices, ("cap",))  # a group of its own: the module's `ht` group holds (mesh, "ep")
    g = epjax.group(mesh, "cap", num_experts=L, max_tokens_per_rank=M, hidden=H, dtype=jnp.float32, max_topk=K,
                    num_sms=8, timeout_s=60, max_recv_rows_per_rank=cap, recv_overflow="drop")
    try:
        h = g.handle(num_tokens=T, topk=K)
        idx, x, w, _ = _tokens(0, 1, 1100)
        sent = (idx >= 0).any(axis=1)
        n = int(sent.sum())
        assert n > cap and np.all(np.any(x != 0, axis=1))

        @jax.jit
        def step(x, i, w):
            recv = epjax.dispatch(h, x, i, w)
            return recv, epjax.combine(h, recv.tokens)

        _dirty()
        recv, out = jax.tree.map(np.asarray, step(jnp.asarray(x, jnp.float32), jnp.asarray(idx),
                                                  jnp.asarray(w, jnp.float32)))
        assert recv.tokens.shape == (h.spec.rows, H) and h.spec.rows >= cap
        np.testing.assert_array_equal(recv.rank_counts, [cap])
        np.testing.assert_array_equal(recv.recv_dropped, [n - cap])
        assert not _f64(recv.tokens[cap:]).any() and (recv.local_ids[cap:] == -1).all()
        kept = np.all(_f64(out) == x, axis=1) & sent
        assert kept.sum() == cap and not _f64(out[~kept]).any()
        h.close()
    finally:
        g.close()


def _fails_at_run(text, fn, *args):
    """fn(*args) traces and compiles, then fails when it runs: XLA's runtime error carrying the handler's text."""
    with pytest.raises(getattr(jax.errors, "JaxRuntimeError", RuntimeError), match=re.escape(text)):
        jax.block_until_ready(fn(*args))


def test_errors(one_rank, ht):
    g = ht[0]
    h = g.handle(num_tokens=T, topk=K)
    idx, x, w, _ = _tokens(0, 1, 1000)
    args = (jnp.asarray(x, jnp.bfloat16), jnp.asarray(idx), jnp.asarray(w, jnp.float32))

    def ht_dispatch(spec):
        return jax.jit(lambda x, i, w: epjax.dispatch(spec, x, i, w).tokens)

    # An id no handle of this process has (the counter's last value: never reached here).
    nobody = dataclasses.replace(h.spec, id=(h.spec.id >> 24 << 24) | 0xFFFFFF)
    _fails_at_run("nccl_ep_ht_dispatch: no handle registered as %d" % nobody.id, ht_dispatch(nobody), *args)
    _fails_at_run("nccl_ep_ht_combine: no handle registered as %d" % nobody.id,
                  jax.jit(lambda y: epjax.combine(nobody, y)), jnp.zeros((nobody.rows, H), jnp.bfloat16))
    # The handler checks the call against the handle it names: its mode, its shapes.
    as_ll = dataclasses.replace(h.spec, low_latency=True, layout="rank_major")
    _fails_at_run("handle %d is a High-Throughput handle" % h.spec.id,
                  jax.jit(lambda x, i: epjax.ll_dispatch(as_ll, x, i).tokens), *args[:2])
    wider = dataclasses.replace(h.spec, rows=h.spec.rows + 8)
    _fails_at_run("tokens has shape [%d, %d]; the handle's shapes want %d rows" % (wider.rows, H, h.spec.rows),
                  ht_dispatch(wider), *args)
    # Trace time: nothing runs.
    with pytest.raises(ep.NcclInvalidArgument, match="x has 9 rows"):
        ht_dispatch(h)(jnp.zeros((9, H), jnp.bfloat16), *args[1:])
    with pytest.raises(ep.NcclInvalidArgument, match=r"topk_idx has shape \(29, 2\)"):
        ht_dispatch(h)(args[0], args[1][:, :2], args[2])
    # The handle still works after all that.
    layer = jax.jit(lambda x, i, w: epjax.combine(h, epjax.dispatch(h, x, i, w).tokens))
    _dirty()
    out = np.asarray(layer(*args))
    sent = (idx >= 0).any(axis=1, keepdims=True)
    np.testing.assert_array_equal(_f64(out), np.where(sent, x, 0.0))
    # A closed handle is gone.
    spec = h.spec
    h.close()
    _fails_at_run("nccl_ep_ht_dispatch: no handle registered as %d" % spec.id, ht_dispatch(spec), *args)
    g.check()
