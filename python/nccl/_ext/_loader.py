"""Finds and loads libnccl_ep.so / libnccl_m2n.so and the libnccl.so.2 and libcudart.so.13 they need.

One libnccl per process, and our libraries use that one: a process that imported torch already holds torch's copy
(the `nvidia-nccl-cu13` wheel). So a library already loaded is used as it is; otherwise the first of these is loaded
(RTLD_GLOBAL, so that our libraries' DT_NEEDED resolves to it):
  NCCL_EXT_NCCL_LIBRARY (a file), NCCL_HOME/lib, the nvidia-nccl-cu13 wheel, the NCCL the libraries were linked
  against, CUDA_HOME/lib64, /usr/local/cuda/lib64, then the dynamic loader's own search.
Our libraries come from the package (nccl/_lib) or NCCL_EXT_LIB_DIR (a build tree's lib/, for development). They
carry a part for each NCCL release family they were built for and use the loaded release's
(ncclEpCheckNcclRuntime); a release they do not serve is refused with a message naming it and the supported ones.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from .cvalues import checked_args
from .errors import NcclInvalidUsage, error_for

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


def _build_info():
    try:
        from . import _build_info  # written by CMake into the wheel
        return _build_info
    except ImportError:  # a source tree (NCCL_EXT_LIB_DIR): no record
        return None


def _already_loaded(soname: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    except OSError:
        return None


def _wheel_dir(module: str, sub: str) -> list[Path]:
    try:
        m = __import__(module, fromlist=["__path__"])
    except ImportError:
        return []
    return [Path(p) / sub for p in getattr(m, "__path__", [])]


def _first_loadable(soname: str, dirs: list[Path], explicit: str | None) -> ctypes.CDLL:
    tried = []
    if explicit:
        return ctypes.CDLL(explicit, mode=ctypes.RTLD_GLOBAL)  # asked for by name: its error is the answer
    for d in dirs:
        f = d / soname
        if f.is_file():
            try:
                return ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:  # e.g. a wrong architecture: say so if nothing else works
                tried.append("%s (%s)" % (f, e))
    try:
        return ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        looked = ", ".join(str(d) for d in dirs) or "nowhere else"
        raise OSError("%s not found: looked in %s, then the loader's search path (%s)%s. Install the NCCL wheel "
                      "(pip install 'nccl-ext[cu13]') or set NCCL_HOME / CUDA_HOME"
                      % (soname, looked, e, "; failed: " + "; ".join(tried) if tried else "")) from None


def _cuda_dirs() -> list[Path]:
    dirs = _wheel_dir("nvidia.cu13", "lib") + _wheel_dir("nvidia.cuda_runtime", "lib")
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            dirs += [Path(root) / "lib64", Path(root) / "lib"]
    return dirs


def _nccl_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("NCCL_HOME"):
        dirs += [Path(os.environ["NCCL_HOME"]) / "lib", Path(os.environ["NCCL_HOME"]) / "lib64"]
    dirs += _wheel_dir("nvidia.nccl", "lib")
    info = _build_info()
    if info is not None and info.nccl_library_dir:
        dirs.append(Path(info.nccl_library_dir))
    return dirs + _cuda_dirs()


def nccl() -> ctypes.CDLL:
    """libnccl.so.2 as this process uses it (loading it first if nothing has)."""
    with _lock:
        lib = _libs.get("nccl")
        if lib is None:
            lib = _already_loaded("libnccl.so.2") or _first_loadable(
                "libnccl.so.2", _nccl_dirs(), os.environ.get("NCCL_EXT_NCCL_LIBRARY"))
            _libs["nccl"] = lib
        return lib


def library_dir() -> Path:
    return Path(os.environ.get("NCCL_EXT_LIB_DIR") or Path(__file__).resolve().parent.parent / "_lib")


def _release(code: int) -> str:
    return "%d.%d.%d" % (code // 10000, code // 100 % 100, code % 100)


def loaded_nccl_version() -> int:
    """NCCL_VERSION_CODE of the libnccl.so.2 this process uses (ncclGetVersion)."""
    v = ctypes.c_int(0)
    fn = nccl().ncclGetVersion
    fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    if fn(ctypes.byref(v)) != 0:
        raise NcclInvalidUsage("ncclGetVersion failed on %s" % nccl_path())
    return v.value


def _refuse_unserved_nccl(loaded: int, why: str = "") -> None:
    """NcclInvalidUsage naming the loaded release and the supported ones, where the build record says this package
    does not serve it (the libraries then may not even load: a release older than 2.28 lacks the Device API)."""
    info = _build_info()
    built = [tuple(int(x) for x in r.split(".")) for r in getattr(info, "nccl_releases", [])]
    if not built:
        if why:  # a source tree: no record, but the loader's own error says enough with the release added
            raise NcclInvalidUsage("%s (the NCCL in this process: %s, %s)" % (why, _release(loaded), nccl_path()))
        return
    for major, minor, patch in built:
        if loaded // 100 == major * 100 + minor and loaded % 100 >= patch:
            return
    raise NcclInvalidUsage(
        "the libnccl loaded in this process is NCCL %s (%s), which this package does not support: it supports "
        "NCCL %s. Load a supported release first (torch loads its own when imported; pip install "
        "'nccl-ext[cu13]' installs one)%s" % (
            _release(loaded), nccl_path(),
            ", ".join("%d.%d.x from %d.%d.%d" % (a, b, a, b, c) for a, b, c in built), "; " + why if why else ""))


def load(name: str) -> ctypes.CDLL:
    """libnccl_<name>.so ("ep" or "m2n"), loaded once, after cudart and NCCL; an NCCL this package does not serve is
    refused first."""
    nccl()
    _refuse_unserved_nccl(loaded_nccl_version())
    with _lock:
        lib = _libs.get(name)
        if lib is not None:
            return lib
        if _already_loaded("libcudart.so.13") is None:
            _first_loadable("libcudart.so.13", _cuda_dirs(), None)
        path = library_dir() / ("libnccl_%s.so" % name)
        if not path.is_file():
            raise OSError("%s is missing: this package was not built with its libraries (pip install . builds them; "
                          "NCCL_EXT_LIB_DIR points at a build tree's lib/)" % path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            if "undefined symbol: nccl" in str(e):
                _refuse_unserved_nccl(loaded_nccl_version(), str(e))
            raise
        _libs[name] = lib
        return lib


def bind(name: str, prefix: str, signatures: dict) -> ctypes.CDLL:
    """libnccl_<name>, once: every function of `signatures` (name -> argtypes) returning an int result, the
    last-error function, and the NCCL release checked (check_nccl_runtime)."""
    lib = load(name)
    if not getattr(lib, "_nccl_ext_ready", False):
        for fn_name, args in signatures.items():
            fn = getattr(lib, fn_name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        err = getattr(lib, "nccl%sGetLastError" % prefix)
        err.restype = ctypes.c_char_p
        err.argtypes = []
        check_nccl_runtime(lib, prefix)
        lib._nccl_ext_ready = True
    return lib


def check(lib: ctypes.CDLL, prefix: str, name: str, rc: int) -> None:
    """Raises the exception class of a non-zero result `rc` of lib.<name> with the library's last-error text."""
    if rc != 0:
        text = getattr(lib, "nccl%sGetLastError" % prefix)().decode(errors="replace")
        raise error_for(rc, text or "%s failed" % name)


def call(lib: ctypes.CDLL, prefix: str, name: str, *args) -> None:
    """Calls lib.<name>(*args); a non-zero result raises its exception class with the library's last-error text.
    An integer argument its C parameter cannot hold is refused first (cvalues.checked_args)."""
    fn = getattr(lib, name)
    check(lib, prefix, name, fn(*checked_args(fn, name, args)))


def version(lib: ctypes.CDLL, prefix: str) -> tuple[int, int, int]:
    """(major, minor, patch) from nccl<prefix>GetVersion's major * 10000 + minor * 100 + patch."""
    v = ctypes.c_int(0)
    call(lib, prefix, "nccl%sGetVersion" % prefix, ctypes.byref(v))
    return v.value // 10000, v.value // 100 % 100, v.value % 100


def check_nccl_runtime(lib: ctypes.CDLL, prefix: str) -> tuple[int, int]:
    """(built, loaded) NCCL version codes: the loaded libnccl's, and the release whose headers compiled the part of
    the library that serves it; NcclInvalidUsage when no part does."""
    fn = getattr(lib, "nccl%sCheckNcclRuntime" % prefix)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    built, loaded = ctypes.c_int(0), ctypes.c_int(0)
    rc = fn(ctypes.byref(built), ctypes.byref(loaded))
    if rc != 0:
        err = getattr(lib, "nccl%sGetLastError" % prefix)
        err.restype = ctypes.c_char_p
        raise NcclInvalidUsage("%s (the NCCL in this process: %s)" % (err().decode(errors="replace"), nccl_path()))
    return built.value, loaded.value


def nccl_path() -> str:
    """The file of the libnccl.so.2 this process uses (from /proc/self/maps), or "unknown"."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnccl.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return "unknown"
