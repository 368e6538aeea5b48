#!/usr/bin/env python3
"""tools/gpu_check_merge.py --out FILE PART.json...: one gpu-check report from the parts of one check
(GPU_CHECK_PART) and its reruns, all on one NCCL release. A part may be an earlier merge (its own parts and attempts
carry over), and gpu-sanitize reports get the summary of their rows' verdicts.

Every run is keyed by (name, ranks); its status is that of its latest attempt (by the report's date), and the
earlier attempts stay listed under "attempts" (status, report, and the failure's log tail), so a run that failed once
and passed on a rerun reads as such, not as a clean pass. "parts" lists every report with the tree that ran it
(git commit, source_sha1) and its date. Refuses reports of different loaded NCCL releases or GPUs. Exit status 0 if
every run's latest attempt passed, else 1. Standard library only.
"""
import argparse
import json
import os
import re
import sys


def loaded(machine):
    m = re.search(r"loaded (\S+?),", machine.get("nccl", ""))
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    reports = []
    for path in a.reports:
        with open(path) as f:
            reports.append((os.path.basename(path), json.load(f)))
    # An earlier merge dates from its latest part.
    reports.sort(key=lambda r: r[1]["machine"].get("date_utc") or max(p["date_utc"] for p in r[1]["parts"]))
    releases = {loaded(d["machine"]) for _, d in reports}
    gpus = {json.dumps(d["machine"]["gpus"], sort_keys=True) for _, d in reports}
    if len(releases) != 1 or None in releases or len(gpus) != 1:
        print("gpu_check_merge: the reports must share one loaded NCCL release and one GPU set: %s" % sorted(
            map(str, releases)), file=sys.stderr)
        return 2
    runs, order = {}, []
    for name, d in reports:
        for run in d["runs"]:
            key = (run["name"], run["nranks"])
            attempt = dict(run, report=run["report"] if "parts" in d else name)
            if key in runs:
                prev = runs[key]
                history = prev.pop("attempts", [])
                history.append({k: prev[k] for k in ("status", "report", "seconds", "log_tail") if k in prev})
                attempt["attempts"] = history
            else:
                order.append(key)
            runs[key] = attempt
    merged = {
        "kind": reports[-1][1].get("kind", "gpu-check"),
        "machine": dict(reports[-1][1]["machine"]),
        "parts": [p for name, d in reports for p in (d["parts"] if "parts" in d else [{
            "report": name, "git_commit": d["machine"]["git_commit"], "source_sha1": d["machine"]["source_sha1"],
            "date_utc": d["machine"]["date_utc"], "runs": len(d["runs"])}])],
        "runs": [runs[k] for k in order],
    }
    merged["machine"].pop("date_utc", None)  # each part has its own, under "parts"
    if merged["kind"] == "gpu-sanitize":
        merged["summary"] = {v: sum(runs[k].get("sanitize") == v for k in order)
                             for v in ("pass", "fail", "inconclusive", "not-run")}
    with open(a.out, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    failed = [k for k in order if runs[k]["status"] != "pass"]
    retried = [k for k in order if any(x["status"] != "pass" for x in runs[k].get("attempts", []))]
    print("%s: NCCL %s, %d runs from %d reports, %d failed, %d failed before they passed on a rerun%s" % (
        a.out, releases.pop(), len(order), len(reports), len(failed), len(retried),
        "".join("\n  rerun: %s (%d ranks): %s, then %s" % (k[0], k[1], "; ".join(x["status"] for x in runs[k]["attempts"]),
                                                     runs[k]["status"])
                for k in retried)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
