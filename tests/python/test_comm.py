"""The NCCL unique id's trip through torch.distributed (CPU): every byte kept, zeros included; a short id refused."""

import ctypes

import pytest

from nccl._ext import comm
from nccl._ext.errors import NcclInvalidArgument


def test_unique_id_keeps_every_byte():
    raw = bytes([7, 0, 0, 9] + [0] * 60 + list(range(1, 65)))  # NULs early: a c_char array would cut it at byte 1
    uid = comm.id_from_bytes(raw)
    assert comm.id_to_bytes(uid) == raw
    assert bytes(uid.internal) == raw


def test_a_real_id_round_trips():
    uid = comm._UniqueId()
    try:
        comm._nccl_call("ncclGetUniqueId", ctypes.byref(uid))
    except Exception as e:  # no loadable NCCL, or no network interface for its bootstrap
        pytest.skip("ncclGetUniqueId: %s" % e)
    raw = comm.id_to_bytes(uid)
    assert len(raw) == 128 and comm.id_to_bytes(comm.id_from_bytes(raw)) == raw


@pytest.mark.parametrize("bad", [b"", b"\x01" * 127, None, "x" * 128])
def test_a_wrong_id_is_refused(bad):
    with pytest.raises(NcclInvalidArgument, match="unique id of 128 bytes"):
        comm.id_from_bytes(bad)


def test_bytes_cross_a_group_whole(one_process_gloo):
    from nccl._ext.objects import all_gather_bytes, broadcast_bytes

    raw = bytes([0, 255, 0, 7]) + bytes(range(256))
    assert broadcast_bytes(raw, len(raw)) == raw
    assert all_gather_bytes(raw) == [raw]
    assert all_gather_bytes(b"") == [b""]
