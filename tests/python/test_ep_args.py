"""nccl.ep's torch adapter on the CPU: descriptors, and every argument the Python layer rejects, with its message.
Needs torch (skipped without it); no GPU."""

import ctypes

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
    prep = ep._Prepared("ncclEpDispatch", inputs, outputs, ep._CallConfig.new(), [(inputs.tokens, True)],
                        [(outputs.tokens, (6, 8), torch.bfloat16), (outputs.topk_idx, (6, 2), torch.int32)],
                        torch.device("cpu"))
    for _ in range(2):  # a second call: new tensors, the same structs
        x = torch.ones((4, 8), dtype=torch.bfloat16)
        tokens, idx = prep.fill((x,))
        assert inputs.tokens.data == x.data_ptr()
        assert (outputs.tokens.data, outputs.topk_idx.data) == (tokens.data_ptr(), idx.data_ptr())
        assert (tokens.shape, tokens.dtype, idx.shape, idx.dtype) == ((6, 8), torch.bfloat16, (6, 2), torch.int32)
        assert list(outputs.topk_idx.sizes)[:2] == [6, 2] and outputs.topk_idx.datatype == T.NCCL_INT32
    empty = ep._Prepared("ncclEpCombine", ep._CombineTensors.new(), ep._CombineTensors.new(), ep._CallConfig.new(),
                         [], [(ep._CombineTensors.new().tokens, (0, 8), torch.float32)], torch.device("cpu"))
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
