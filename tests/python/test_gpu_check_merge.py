"""tools/gpu_check_merge.py: a rerun's pass keeps the failed attempt, and reports of different releases do not mix."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu_check_merge.py")


def report(path, date, release, runs):
    machine = {"gpus": [{"index": "0", "name": "H200"}], "git_commit": "c", "source_sha1": "s", "date_utc": date,
               "nccl": "NCCL: loaded %s, served by the part built against NCCL %s's headers" % (release, release)}
    runs = [{"name": n, "nranks": r, "status": st, "seconds": 1.0, "log_tail": ""} for n, r, st in runs]
    path.write_text(json.dumps({"kind": "gpu-check", "machine": machine, "runs": runs}))
    return str(path)


def merge(tmp_path, *reports):
    out = tmp_path / "all.json"
    r = subprocess.run([sys.executable, TOOL, "--out", str(out), *reports], capture_output=True, text=True)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_a_rerun_pass_keeps_the_failed_attempt(tmp_path):
    a = report(tmp_path / "a.json", "2026-12-04T10:00:00+00:00", "2.29.7",
               [("x", 2, "FAIL (exit 1)"), ("y", 1, "pass")])
    b = report(tmp_path / "b.json", "2026-12-04T11:00:00+00:00", "2.29.7", [("x", 2, "pass")])
    r, merged = merge(tmp_path, b, a)  # out of order on purpose: the dates decide
    assert r.returncode == 0, r.stderr
    runs = {(x["name"], x["nranks"]): x for x in merged["runs"]}
    assert runs[("x", 2)]["status"] == "pass" and runs[("x", 2)]["report"] == "b.json"
    assert [x["status"] for x in runs[("x", 2)]["attempts"]] == ["FAIL (exit 1)"]
    assert "attempts" not in runs[("y", 1)]
    assert [p["report"] for p in merged["parts"]] == ["a.json", "b.json"]
    assert "1 failed before they passed on a rerun" in r.stdout


def test_a_last_failure_fails_the_merge(tmp_path):
    a = report(tmp_path / "a.json", "2026-12-04T10:00:00+00:00", "2.29.7", [("x", 2, "pass")])
    b = report(tmp_path / "b.json", "2026-12-04T11:00:00+00:00", "2.29.7", [("x", 2, "FAIL (exit 1)")])
    r, merged = merge(tmp_path, a, b)
    assert r.returncode == 1 and merged["runs"][0]["status"] == "FAIL (exit 1)"


def test_releases_do_not_mix(tmp_path):
    a = report(tmp_path / "a.json", "2026-12-04T10:00:00+00:00", "2.29.7", [("x", 2, "pass")])
    b = report(tmp_path / "b.json", "2026-12-04T11:00:00+00:00", "2.30.7", [("y", 2, "pass")])
    r, merged = merge(tmp_path, a, b)
    assert r.returncode == 2 and merged is None and "one loaded NCCL release" in r.stderr


def test_a_merge_merges_again(tmp_path):
    # A merge is a part of a later one: its parts, its runs' reports and attempts carry over; gpu-sanitize's summary.
    a = report(tmp_path / "a.json", "2026-12-04T10:00:00+00:00", "2.29.7", [("x", 2, "FAIL (exit 1)")])
    b = report(tmp_path / "b.json", "2026-12-04T11:00:00+00:00", "2.29.7", [("x", 2, "pass"), ("y", 1, "pass")])
    r, first = merge(tmp_path, a, b)
    assert r.returncode == 0, r.stderr
    for run in first["runs"]:
        run["sanitize"] = "pass" if run["status"] == "pass" else "fail"
    (tmp_path / "ab.json").write_text(json.dumps(dict(first, kind="gpu-sanitize")))
    c = tmp_path / "c.json"
    report(c, "2026-12-05T10:00:00+00:00", "2.29.7", [("y", 1, "pass"), ("z", 1, "pass")])
    doc = json.loads(c.read_text())
    for run in doc["runs"]:
        run["sanitize"] = "pass"
    c.write_text(json.dumps(dict(doc, kind="gpu-sanitize")))
    r, merged = merge(tmp_path, str(c), str(tmp_path / "ab.json"))
    assert r.returncode == 0, r.stderr
    assert [p["report"] for p in merged["parts"]] == ["a.json", "b.json", "c.json"]
    runs = {(x["name"], x["nranks"]): x for x in merged["runs"]}
    assert runs[("x", 2)]["report"] == "b.json"
    assert [x["status"] for x in runs[("x", 2)]["attempts"]] == ["FAIL (exit 1)"]
    assert runs[("y", 1)]["report"] == "c.json" and [x["report"] for x in runs[("y", 1)]["attempts"]] == ["b.json"]
    assert merged["kind"] == "gpu-sanitize"
    assert merged["summary"] == {"pass": 3, "fail": 0, "inconclusive": 0, "not-run": 0}
