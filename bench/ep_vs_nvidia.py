"""Ours beside NVIDIA's nccl-extensions, row by row, from the JSON lines of one run (issue 39's table).

  python3 bench/ep_vs_nvidia.py --ours OURS.jsonl [OURS.jsonl ...] --nvidia NVIDIA.jsonl [--json OUT.json]

OURS: ep_bench's lines (`--mode ht`: ep_dispatch / ep_combine rows, FLAT bf16) and ep_ll_bench's (`--mode ll`: rows
with "bench": "ep_ll", bf16 dispatch), 1 rank; NVIDIA: bench/baselines/baseline_nvidia_ep.py's lines. Rows are paired
on (mode, layout, operation, tokens, hidden, SMs for HT); a run's repeated row counts as the median of its medians.
Prints a markdown table (us, median of each side's calls; ours / nvidia below 1: ours faster) and, with --json, writes
the rows with their ratio. What is derived rather than timed is said in the row's "note":
  - HT dispatch + combine: ours is the sum of the two medians (ep_bench times them apart); NVIDIA's is timed as a pair;
  - HT handle update: ours is ep_bench's update alone (update_handle_us_median), or, from JSON without it, update +
    dispatch minus dispatch, both at 64 SMs (the group's default); one figure, paired with NVIDIA's update at each of
    its SM counts.
Exit status 1 when no row pairs up.
"""
import argparse
import json
import statistics
import sys


UPDATE_SMS = 64  # the SMs of ep_bench's update + dispatch timing (the group's default num_sms on a full GPU)


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def ours_rows(rows):
    """(key) -> list of us_median, and each key's note, from ep_bench and ep_ll_bench lines."""
    out, notes = {}, {}

    def put(key, us, note=""):
        out.setdefault(key, []).append(us)
        if note:
            notes[key] = note

    ht = {}
    for r in rows:
        if r.get("nranks", r.get("ranks")) != 1:
            continue
        if r.get("bench") == "ep_ll":
            if r.get("dispatch_dtype") != "bf16" or not r.get("pass", False):
                continue
            layout = r["layout"].lower()
            for op in ("dispatch", "combine", "dispatch_combine"):
                put(("ll", layout, op, r["tokens"], r["hidden"], 0), r[op + "_us"])
        elif r.get("what") in ("ep_dispatch", "ep_combine") and r.get("layout") == "flat" and r.get("dtype") == "bf16":
            if r.get("recv_cap") or r.get("zero_copy") or not r.get("pass", False):
                continue
            op = r["what"][3:]
            shape = (r["tokens"], r["hidden"], r["sms"])
            put(("ht", "flat", op) + shape, r["us_median"])
            ht.setdefault(shape, {}).setdefault(op, []).append(r)
    for shape, ops in ht.items():
        for d, c in zip(ops.get("dispatch", []), ops.get("combine", [])):
            put(("ht", "flat", "dispatch_combine") + shape, d["us_median"] + c["us_median"],
                "ours: dispatch median + combine median")
    # ep_bench times the update alone (update_handle_us_median), or, in its older JSON, only update + dispatch with
    # the group's default SMs (UPDATE_SMS): the update is then that minus the dispatch at those SMs, run by run.
    # NVIDIA's update rows, at any SM count of the shape, pair with it.
    for (t, h, sms), ops in ht.items():
        at = ht.get((t, h, UPDATE_SMS), {}).get("dispatch", [])
        for i, d in enumerate(ops.get("dispatch", [])):
            alone, upd = d.get("update_handle_us_median", 0), d.get("update_handle_plus_dispatch_us_median", 0)
            if alone:
                put(("ht", "flat", "update_handle", t, h, sms), alone, "ours: the update alone, timed")
            elif upd and i < len(at):
                put(("ht", "flat", "update_handle", t, h, sms), upd - at[i]["us_median"],
                    "ours: (update + dispatch) median - dispatch median, both at %d SMs" % UPDATE_SMS)
    return out, notes


def nvidia_rows(rows):
    out = {}
    for r in rows:
        if r.get("nranks") != 1 or not r.get("pass", False):
            continue
        op = r["what"][3:]
        key = (r["mode"], r["layout"], op, r["tokens"], r["hidden"], r["sms"] if r["mode"] == "ht" else 0)
        out.setdefault(key, []).append(r["us_median"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", nargs="+", required=True)
    p.add_argument("--nvidia", nargs="+", required=True)
    p.add_argument("--json")
    a = p.parse_args()
    ours_raw = load(a.ours)
    theirs_raw = load(a.nvidia)
    ours, notes = ours_rows(ours_raw)
    theirs = nvidia_rows(theirs_raw)
    keys = sorted(set(ours) & set(theirs), key=lambda k: (k[0] != "ll", k[1], k[3], k[4], k[5], k[2]))
    if not keys:
        print("ep_vs_nvidia: no row of ours pairs with one of NVIDIA's", file=sys.stderr)
        return 1
    rows = []
    print("| mode | layout | row | tokens x hidden | SMs | NVIDIA us | ours us | ours / NVIDIA |")
    print("|---|---|---|---|---|---|---|---|")
    for k in keys:
        mode, layout, op, t, h, sms = k
        o, n = statistics.median(ours[k]), statistics.median(theirs[k])
        row = {"mode": mode, "layout": layout, "what": "ep_" + op, "tokens": t, "hidden": h, "sms": sms,
               "ours_us": round(o, 2), "nvidia_us": round(n, 2), "ours_over_nvidia": round(o / n, 3),
               "ours_runs": len(ours[k]), "nvidia_runs": len(theirs[k]), "note": notes.get(k, "")}
        rows.append(row)
        print("| %s | %s | %s | %d x %d | %s | %.1f | %.1f | %.2f |" % (
            mode.upper(), layout.upper(), "dispatch + combine" if op == "dispatch_combine" else op.replace("_", " "),
            t, h, sms if mode == "ht" else "-", n, o, o / n))
    gpus = sorted({r.get("gpu", "") for r in ours_raw + theirs_raw} - {""})
    nv = sorted({r.get("nccl_version", "") for r in theirs_raw} - {""})
    print("GPU %s; NVIDIA's NCCL %s; unpaired: ours %d, NVIDIA %d" % (
        ", ".join(gpus), ", ".join(nv), len(set(ours) - set(theirs)), len(set(theirs) - set(ours))))
    if a.json:
        with open(a.json, "w") as f:
            impl = sorted({r.get("impl", "") for r in theirs_raw})
            json.dump({"kind": "ep_vs_nvidia", "gpus": gpus, "nvidia_impl": impl, "nvidia_nccl": nv,
                       "convention": "us: median of each side's timed calls, 1 rank; ours_over_nvidia < 1: ours faster",
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
