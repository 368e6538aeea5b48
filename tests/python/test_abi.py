"""The ctypes mirrors of nccl_ep.h's structs against the C compiler's own layout (CPU; needs a C compiler and the
CUDA/NCCL headers, else skipped), and the C API's argument checks reached through them."""

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import nccl.ep as ep
import nccl.m2n as m2n
from nccl._ext.tensor import CTensor

ROOT = Path(__file__).resolve().parents[2]
STRUCTS = {
    "ncclEpTensor_t": CTensor,
    "ncclEpGroupConfig_t": ep._GroupConfig,
    "ncclEpHandleConfig_t": ep._HandleConfig,
    "ncclEpLayoutInfo_t": ep._LayoutInfo,
    "ncclEpDispatchInputs_t": ep._DispatchInputs,
    "ncclEpDispatchOutputs_t": ep._DispatchOutputs,
    "ncclEpDispatchConfig_t": ep._DispatchConfig,
    "ncclEpCombineConfig_t": ep._CombineConfig,
    "ncclEpCombineInputs_t": ep._CombineInputs,
    "ncclEpCombineOutputs_t": ep._CombineOutputs,
    "ncclEpGroupInfo_t": ep._GroupInfo,
    "ncclM2nMesh_t": m2n._Mesh,
    "ncclM2nBox_t": m2n._Box,
    "ncclM2nLayout_t": m2n._Layout,
    "ncclM2nTensorSpec_t": m2n._TensorSpec,
    "ncclM2nPlanConfig_t": m2n._PlanConfig,
    "ncclM2nTransfer_t": m2n._Transfer,
    "ncclM2nPlanInfo_t": m2n._PlanInfo,
    "ncclM2nExecConfig_t": m2n._ExecConfig,
}


def _include_dirs():
    dirs = [ROOT / "nccl_ep" / "include", ROOT / "nccl_m2n" / "include"]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            dirs.append(Path(root) / "include")
    try:
        from nccl._ext import _build_info
        dirs.append(Path(_build_info.nccl_library_dir).parent / "include")
    except ImportError:
        pass
    return [d for d in dirs if d.is_dir()]


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not (ROOT / "nccl_ep" / "include" / "nccl_ep.h").is_file():
        pytest.skip("no C compiler or no source tree")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "nccl_ep.h"', '#include "nccl_m2n.h"',
             "int main(void) {",
             '  printf("{");']
    first = True
    for cname, cls in STRUCTS.items():

        fields = ", ".join('\\"%s\\": %%zu' % f for f, _ in cls._fields_)
        args = ", ".join("offsetof(%s, %s)" % (cname, f) for f, _ in cls._fields_)
        sep = "" if first else ", "
        first = False
        lines.append('  printf("%s\\"%s\\": {\\"sizeof\\": %%zu, %s}", sizeof(%s), %s);' % (sep, cname, fields, cname,
                                                                                               args))

    lines += ['  printf("}\\n");', "  return 0;", "}"]
    d = tmp_path_factory.mktemp("abi")
    (d / "abi.c").write_text("\n".join(lines))
    cmd = [cc, "-std=c99", "-o", str(d / "abi"), str(d / "abi.c")] + ["-I%s" % i for i in _include_dirs()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("nccl_ep.h does not compile here (CUDA/NCCL headers missing?): " + r.stderr[-400:])
    return json.loads(subprocess.run([str(d / "abi")], capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("cname", sorted(STRUCTS))
def test_struct_layout(c_layout, cname):
    cls = STRUCTS[cname]
    got = c_layout[cname]
    assert ctypes.sizeof(cls) == got["sizeof"], cname
    for f, _ in cls._fields_:
        assert getattr(cls, f).offset == got[f], "%s.%s" % (cname, f)


def _create_group(**fields):
    cfg = ep._GroupConfig.new(algorithm=1, num_experts=8, max_tokens_per_rank=16, max_token_bytes=64, max_topk=2)
    for k, v in fields.items():
        setattr(cfg, k, v)
    g = ctypes.c_void_p()
    fake_comm = ctypes.c_void_p(1)  # never reached: every case below fails validation first
    ep._call("ncclEpCreateGroup", ctypes.byref(g), fake_comm, ctypes.byref(cfg))


@pytest.mark.parametrize("field,value,text", [
    ("num_experts", 0, "num_experts 0 not in [1, 1024]"),
    ("max_tokens_per_rank", 0, "max_tokens_per_rank 0 not in"),
    ("max_token_bytes", 24, "max_token_bytes 24: must be a multiple of 16"),
    ("max_topk", 33, "max_topk 33 not in [1, 32]"),
    ("num_sms", -1, "num_sms -1 < 0"),
    ("lsa_domain_size", -2, "lsa_domain_size -2 < 0"),
    ("rail_round_tokens", -5, "rail_round_tokens -5 < 0"),
])
def test_config_fields_reach_the_c_checks(field, value, text):
    # Each field's message proves that ctypes put it where the C library reads it.
    with pytest.raises(ep.NcclInvalidArgument) as e:
        _create_group(**{field: value})
    assert text in str(e.value)


def test_low_latency_sizing_reaches_the_c_checks():
    # algorithm 0 is read as Low-Latency: the library refuses its 2048 tokens (LL: at most 1024) before touching the
    # fake communicator (High-Throughput takes 2048).
    with pytest.raises(ep.NcclInvalidArgument) as e:
        _create_group(algorithm=0, max_tokens_per_rank=2048)
    assert "max_tokens_per_rank 2048: the Low-Latency mode takes at most 1024" in str(e.value), str(e.value)


def test_round_scale_follows_num_sms_in_the_dispatch_config_only():
    # The split mirrors (their offsets against the C compiler's are test_struct_layout's): round_scale sits after
    # num_sms in the dispatch config only, send_only last in the combine config and before the dispatch config's
    # appended global_expert_ids.
    cfg = ep._DispatchConfig.new(num_sms=3, round_scale=1, send_only=1, global_expert_ids=1)
    raw = (ctypes.c_int * 6).from_buffer_copy(cfg)
    assert list(raw) == [ctypes.sizeof(ep._DispatchConfig), ep._MAGIC, 3, 1, 1, 1]
    craw = (ctypes.c_int * 4).from_buffer_copy(ep._CombineConfig.new(num_sms=2, send_only=1))
    assert list(craw) == [ctypes.sizeof(ep._CombineConfig), ep._MAGIC, 2, 1]
    assert ctypes.sizeof(ep._CombineConfig) == 16 and ctypes.sizeof(ep._DispatchConfig) == 24


def test_bad_header_is_refused():
    with pytest.raises(ep.NcclInvalidArgument):
        _create_group(size=8)
