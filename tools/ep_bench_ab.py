#!/usr/bin/env python3
"""An A/B of ep_bench between two builds run in one call: the ratio new/old of each row's medians.

  tools/ep_bench_ab.py --new new.jsonl --old old.jsonl

Each file holds one or more runs of `ep_bench` (--mode ht and --mode ll, any rank count and one-GPU mode) of one
build; a row is identified by everything but its timings, and its value is the median of that row's medians over
the runs (with three runs or more, one run's spike does not move it). Prints, per metric, the number of rows and
min / median / max of new / old, then every row; exits 1 when a row of the old build is missing from the new one, or
a row failed (rows only the new build has, e.g. a format it added, are listed and compared with nothing).
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

# The metrics compared, by benchmark: High-Throughput rows (ep_dispatch, ep_combine) and Low-Latency rows (ep_ll).
HT_METRICS = ("us_median",)
LL_METRICS = ("dispatch_us", "combine_us", "dispatch_combine_us")
HT_KEY = ("what", "dtype", "layout", "tokens", "hidden", "topk", "experts", "nranks", "sms", "one_gpu")
LL_KEY = ("layout", "dispatch_dtype", "tokens", "hidden", "topk", "experts", "ranks", "sms", "mode", "domains")


def load(path):
    """{(kind, metric, key): [medians]} and the number of failed rows."""
    rows, failed = defaultdict(list), 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            failed += not d.get("pass", True)
            if d.get("bench") == "ep_ll":
                kind, metrics, key = "ll", LL_METRICS, LL_KEY
            elif d.get("what") in ("ep_dispatch", "ep_combine"):
                kind, metrics, key = "ht", HT_METRICS, HT_KEY
            else:
                continue
            ident = tuple(d.get(k) for k in key)
            for m in metrics:
                if m in d:
                    rows[(kind, m, ident)].append(float(d[m]))
    return rows, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", required=True)
    ap.add_argument("--old", required=True)
    args = ap.parse_args()
    new, newFailed = load(args.new)
    old, oldFailed = load(args.old)
    missing = sorted(set(new) ^ set(old), key=str)
    ratios = defaultdict(list)
    lines = []
    for k in sorted(set(new) & set(old), key=str):
        a, b = statistics.median(new[k]), statistics.median(old[k])
        r = a / b if b > 0 else float("nan")
        ratios[k[:2]].append(r)
        lines.append(f"{k[0]} {k[1]} {k[2]} new {a:.2f} old {b:.2f} new/old {r:.3f}")
    for (kind, metric), rs in sorted(ratios.items()):
        print(f"{kind} {metric} rows {len(rs)} new/old min {min(rs):.3f} median {statistics.median(rs):.3f} "
              f"max {max(rs):.3f}")
    print("\n".join(lines))
    for k in missing:
        print(f"only in {'new' if k in new else 'old'}: {k}")
    if newFailed or oldFailed:
        print(f"failed rows: new {newFailed}, old {oldFailed}")
    lost = [k for k in missing if k in old]
    return 1 if lost or newFailed or oldFailed else 0


if __name__ == "__main__":
    sys.exit(main())
