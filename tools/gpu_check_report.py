#!/usr/bin/env python3
"""Collects the runs of tools/gpu_check.sh into one JSON file and prints the summary table.

Exit status 0 if every run passed, else 1. Standard library only (the GPU machines have no internet).
"""
import argparse
import hashlib
import datetime
import json
import os
import re
import subprocess
import sys

ERROR_LINE = re.compile(r"error|fail|warn|assert|timed out|traceback|exception", re.IGNORECASE)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:  # noqa: BLE001 - metadata is best effort; the runs themselves are what count
        return ""


def source_sha1(root="."):
    """SHA-1 over the sources (path and bytes of every file under the source folders, sorted): names the tree that
    ran even where the checkout's git metadata is older than its files (a copied working tree). The same function
    on a clone of a commit gives the value to compare with."""
    h = hashlib.sha1()
    for top in ("common", "nccl_ep", "nccl_m2n", "python", "tests", "bench", "tools", "examples"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and d != "results")
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def machine():
    gpus = [line.split(", ") for line in sh(
        "nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader").splitlines()]
    commit = os.environ.get("NCCL_EXT_GIT_COMMIT") or sh("git rev-parse HEAD 2>/dev/null") or "unknown"
    return {
        "gpus": [{"index": g[0], "name": g[1], "driver": g[2], "memory": g[3]} for g in gpus if len(g) == 4],
        "topology": sh("nvidia-smi topo -m 2>/dev/null | head -5"),
        "git_commit": commit,
        "git_dirty": bool(sh("git status --porcelain --untracked-files=no 2>/dev/null")),
        "source_sha1": source_sha1(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_nccl": sh("python3 -c 'import torch; print(torch.cuda.nccl.version())' 2>/dev/null"),
        # The NCCL release every run loaded (LD_PRELOAD: tools/nccl_preload.sh) and the release whose headers
        # compiled the part of our libraries that served it (common/nccl_abi.h).
        "nccl": sh("%s/bin/nccl_ext_info 2>&1 | grep '^NCCL:'" % os.environ.get("BUILDDIR", "build")),
        "nccl_releases_built": sh("grep -o 'NCCL_EXT_ABI_RELEASES_BUILT:INTERNAL=.*' %s/CMakeCache.txt | cut -d= -f2"
                                  % os.environ.get("BUILDDIR", "build")),
        # ... and every NCCL_* variable set (the transport's settings change one-GPU nodes' times severalfold:
        # docs/PERFORMANCE.md, section 6), these four named even when unset; not NCCL_VERSION, a container's label
        # that NCCL does not read (the library is "nccl" above)
        "env": {k: os.environ.get(k) for k in sorted(
            {"NCCL_NVLS_ENABLE", "NCCL_EXT_TIMEOUT_S", "NCCL_EXT_LSA_DOMAIN_SIZE", "LD_PRELOAD"} |
            {k for k in os.environ if k.startswith("NCCL_") and k not in ("NCCL_EXT_GIT_COMMIT", "NCCL_VERSION")})},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="TSV: name, nranks, exit code, seconds, json lines, log")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", default="gpu-check")
    a = ap.parse_args()
    rows = []
    with open(a.runs) as f:
        for line in f:
            name, n, rc, secs, jpath, log = line.rstrip("\n").split("\t")
            results = []
            if os.path.exists(jpath):
                with open(jpath) as jf:
                    results = [json.loads(x) for x in jf if x.strip()]
            status = {0: "pass", 77: "skipped (no GPU)", 125: "FAIL: not run (time budget spent)",
                      143: "FAIL: stopped (gpu-check got a signal during this run)",
                      98: "inconclusive (virtual ranks under the sanitizer: a device wait timed out or the run was "
                          "killed, nothing of ours reported)"}.get(int(rc), "FAIL (exit %s)" % rc)
            if int(rc) == 0 and (not results or not all(r.get("pass") for r in results)):
                status = "FAIL (no passing result line)"
            tail = ""
            if not status.startswith(("pass", "skipped")) and os.path.exists(log):  # failed or inconclusive
                with open(log, errors="replace") as lf:
                    lines = lf.readlines()
                # The first lines that name an error (a launcher's summary can fill the tail), then the tail.
                first = [x for x in lines[:-15] if ERROR_LINE.search(x)][:12]
                tail = "".join(first + (["...\n"] if first else []) + lines[-15:])
            rows.append({"name": name, "nranks": int(n), "status": status, "seconds": float(secs or 0),
                         "results": results, "log_tail": tail})
    doc = {"kind": a.kind, "machine": machine(), "runs": rows}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(doc["machine"]["nccl"] or "NCCL: unknown (no nccl_ext_info in the build)")
    print("%-32s %6s %9s  %s" % ("test", "ranks", "seconds", "status"))
    for r in rows:
        print("%-32s %6d %9.1f  %s" % (r["name"], r["nranks"], r["seconds"], r["status"]))
        if r["log_tail"]:
            print("    " + r["log_tail"].replace("\n", "\n    "))
    failed = [r for r in rows if not r["status"].startswith(("pass", "skipped", "inconclusive"))]
    unsure = [r for r in rows if r["status"].startswith("inconclusive")]
    print("\n%d passed, %d failed, %d inconclusive" % (len(rows) - len(failed) - len(unsure), len(failed), len(unsure)))
    print("results: %s" % a.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
