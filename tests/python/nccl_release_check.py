"""The installed package beside one NCCL release (tools/python_test.sh runs it in a venv, no GPU needed).

--expect V: the libnccl.so.2 of nvidia-nccl-cu13 V is the one loaded, and the part of our libraries that serves it
is the one built for V's family (its headers' release is in the wheel's build record, same family, not newer).
--expect-refused V: importing nccl.ep beside V fails with NcclInvalidUsage naming V and the supported releases (a
release older than 2.28 lacks the Device API our libraries link to: the loader refuses it before loading them).
--torch: torch imported first; its NCCL is the one loaded and a part built for its family serves it.
"""

import argparse
import sys


def code(v: str) -> int:
    major, minor, patch = (int(x) for x in v.split("."))
    return major * 10000 + minor * 100 + patch


def name(c: int) -> str:
    return "%d.%d.%d" % (c // 10000, c // 100 % 100, c % 100)


def served(expect: int) -> None:
    import nccl.ep
    import nccl.m2n
    from nccl._ext import _build_info, _loader

    built, loaded = _loader.check_nccl_runtime(nccl.ep._lib(), "Ep")
    assert _loader.check_nccl_runtime(nccl.m2n._lib(), "M2n") == (built, loaded)
    assert loaded == expect, "loaded NCCL %s, expected %s (%s)" % (name(loaded), name(expect), _loader.nccl_path())
    assert name(built) in _build_info.nccl_releases, (name(built), _build_info.nccl_releases)
    assert built // 100 == loaded // 100 and built <= loaded, (name(built), name(loaded))
    print("NCCL %s (%s): served by the part built against NCCL %s's headers; the wheel has %s" %
          (name(loaded), _loader.nccl_path(), name(built), " ".join(_build_info.nccl_releases)))


def main() -> int:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--expect")
    g.add_argument("--expect-refused")
    g.add_argument("--torch", action="store_true")
    a = ap.parse_args()
    if a.expect:
        served(code(a.expect))
    elif a.torch:
        import torch

        v = torch.cuda.nccl.version()
        served(code("%d.%d.%d" % tuple(v[:3])))
        print("beside torch %s" % torch.__version__)
    else:
        from nccl._ext.errors import NcclInvalidUsage

        try:
            import nccl.ep  # binds the library at import, which checks the release first

            nccl.ep.version()
        except NcclInvalidUsage as e:
            text = str(e)
            assert a.expect_refused in text and "2.30.x from" in text, text
            print("NCCL %s refused: %s" % (a.expect_refused, text))
            return 0
        print("NCCL %s was not refused" % a.expect_refused, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
