#!/usr/bin/env python3
"""The include/ folder of one NCCL release, for a build that compiles against several (CMake's NCCL_EXT_NCCL_RELEASES).

Prints the path of a folder holding nccl.h, nccl_device.h and nccl_device/ of release VERSION, taken from, in order:
  1. --dir: a folder the user names (its include/ or itself), checked to be that release;
  2. the cache (--cache, default $NCCL_EXT_HEADER_CACHE or ~/.cache/nccl-ext/nccl-headers): VERSION/include;
  3. PyPI (its simple index; PIP_INDEX_URL where set): the `nvidia-nccl-cu13` wheel of that version. Only the headers are read: the wheel's central directory
     and its include/ members are fetched with HTTP range requests (about 1 MB of a 200 MB wheel), each member
     checked against the archive's CRC-32; a server that ignores ranges gets the whole wheel, checked against
     PyPI's SHA-256. Then stored in the cache.
Nothing is written outside the cache. Exit status 0 with the path on stdout, 1 with a message on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

PACKAGE = "nvidia-nccl-cu13"
# PEP 691's JSON form of the simple index: PIP_INDEX_URL where the user set one, else PyPI.
INDEX = (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")
TIMEOUT_S = 60


def header_version(include: Path) -> str | None:
    """'2.30.7' from include/nccl.h's NCCL_MAJOR/MINOR/PATCH, or None."""
    try:
        text = (include / "nccl.h").read_text(errors="replace")
    except OSError:
        return None
    parts = [re.search(r"^#define NCCL_%s\s+(\d+)" % k, text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def complete(include: Path) -> bool:
    return (include / "nccl.h").is_file() and (include / "nccl_device.h").is_file() and (include / "nccl_device").is_dir()


class RangeReader(io.RawIOBase):
    """A seekable read-only file over HTTP range requests (zipfile reads the central directory, then members)."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, b) -> int:
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        req = urllib.request.Request(self.url, headers={"Range": "bytes=%d-%d" % (self.pos, self.pos + n - 1)})
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            if r.status != 206:
                raise OSError("the server ignored a range request (HTTP %d)" % r.status)
            data = r.read()
        if len(data) != n:
            raise OSError("range request returned %d bytes, expected %d" % (len(data), n))
        b[:n] = data
        self.pos += n
        self.fetched += n
        return n


def wheel_url(version: str) -> tuple[str, int, str]:
    """(url, size, sha256) of the release's x86_64 manylinux wheel (every platform's wheel has the same headers)."""
    req = urllib.request.Request("%s/%s/" % (INDEX, PACKAGE), headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        files = json.load(r).get("files", [])
    prefix = "%s-%s-" % (PACKAGE.replace("-", "_"), version)
    wheels = [f for f in files if f.get("filename", "").startswith(prefix) and f["filename"].endswith(".whl")
              and not f.get("yanked")]
    wheels.sort(key=lambda f: ("x86_64" not in f["filename"], f["filename"]))
    if not wheels:
        raise OSError("%s/%s/ lists no wheel of %s %s" % (INDEX, PACKAGE, PACKAGE, version))
    w = wheels[0]
    url = urllib.parse.urljoin("%s/%s/" % (INDEX, PACKAGE), w["url"])
    return url, int(w.get("size") or 0), w["hashes"]["sha256"]


def extract_headers(z: zipfile.ZipFile, dest: Path) -> int:
    """Writes the wheel's nvidia/nccl/include/** under dest (include/...); returns the file count."""
    n = 0
    for info in z.infolist():
        name = info.filename
        if "/include/" not in name or name.endswith("/") or not name.startswith("nvidia/nccl/include/"):
            continue
        rel = Path(name[len("nvidia/nccl/"):])
        if ".." in rel.parts:
            raise OSError("unsafe member name %s" % name)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:  # zipfile checks each member's CRC-32
            shutil.copyfileobj(src, dst)
        n += 1
    return n


def fetch(version: str, cache: Path) -> Path:
    url, size, sha256 = wheel_url(version)
    target = cache / version
    tmp = Path(tempfile.mkdtemp(prefix=".%s-" % version, dir=cache))
    try:
        try:
            if size <= 0:
                raise OSError("the index gives no size")
            reader = RangeReader(url, size)
            with zipfile.ZipFile(io.BufferedReader(reader, buffer_size=1 << 16)) as z:
                n = extract_headers(z, tmp)
            how = "%d header files, %.1f MB of a %.0f MB wheel by range requests" % (n, reader.fetched / 1e6, size / 1e6)
        except OSError as e:
            shutil.rmtree(tmp / "include", ignore_errors=True)
            whole = tmp / "wheel.whl"
            h = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r, open(whole, "wb") as f:
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != sha256:
                raise OSError("%s: SHA-256 %s, PyPI says %s" % (url, h.hexdigest(), sha256))
            with zipfile.ZipFile(whole) as z:
                n = extract_headers(z, tmp)
            whole.unlink()
            how = "%d header files from the whole wheel (%s)" % (n, e)
        include = tmp / "include"
        if not complete(include) or header_version(include) != version:
            raise OSError("%s %s: the wheel's include/ holds no complete NCCL %s headers" % (PACKAGE, version, version))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
        print("nccl_headers: NCCL %s: %s" % (version, how), file=sys.stderr)
        return target / "include"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("version", help="an NCCL release, e.g. 2.30.3")
    ap.add_argument("--dir", help="a folder with this release's headers (its include/ or the include folder itself)")
    default_cache = os.environ.get("NCCL_EXT_HEADER_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nccl-ext" / "nccl-headers")
    ap.add_argument("--cache", default=default_cache, help="where fetched headers are kept (default: %(default)s)")
    ap.add_argument("--offline", action="store_true", help="never fetch: only --dir or the cache")
    a = ap.parse_args()
    if not re.fullmatch(r"\d+\.\d+\.\d+", a.version):
        print("nccl_headers: %r is not a release like 2.30.3" % a.version, file=sys.stderr)
        return 1
    try:
        if a.dir:
            d = Path(a.dir)
            include = d / "include" if (d / "include" / "nccl.h").is_file() else d
            found = header_version(include)
            if not complete(include) or found != a.version:
                raise OSError("%s holds %s, not the complete headers of NCCL %s" %
                              (include, "NCCL " + found if found else "no nccl.h", a.version))
            print(include.resolve())
            return 0
        cache = Path(a.cache)
        include = cache / a.version / "include"
        if complete(include) and header_version(include) == a.version:
            print(include.resolve())
            return 0
        if a.offline:
            raise OSError("NCCL %s headers are not in %s and --offline forbids fetching them" % (a.version, cache))
        cache.mkdir(parents=True, exist_ok=True)
        print(fetch(a.version, cache).resolve())
        return 0
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        print("nccl_headers: NCCL %s: %s" % (a.version, e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
