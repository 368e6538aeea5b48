#!/usr/bin/env python3
"""Reads a compute-sanitizer log and counts the reports that are ours (exit 1 if any), after dropping those that
tools/sanitize_suppressions.txt attributes to NCCL: kernel reports are already excluded by kernel name on the
sanitizer's command line; an API-error report is NCCL's when the innermost host frame of its backtrace lies in a
module the list names (the CUDA call was made by NCCL's own host code, which handles the error itself).

Usage: sanitize_filter.py SUPPRESSIONS LOG   Prints one line per kept report and a summary. Standard library only.
"""
import re
import sys


def main():
    supp, log = sys.argv[1], sys.argv[2]
    modules = []
    for line in open(supp):
        f = line.split()
        if len(f) >= 2 and f[0] == "api":
            modules.append(f[1])
    blocks, cur = [], None
    for line in open(log, errors="replace"):
        m = re.match(r"^=========( +)(\S.*)$", line.rstrip("\n"))
        if not m:
            continue
        indent, text = len(m.group(1)), m.group(2)
        if indent == 1:  # a new report, or a summary line
            if text.startswith(("ERROR SUMMARY", "RACECHECK SUMMARY", "COMPUTE-SANITIZER", "Target application")):
                continue
            if re.match(r"(Program hit|Invalid|Race reported|Error:|Warning:|Barrier error|Leaked|Uninitialized)", text):
                cur = {"head": text, "frames": []}
                blocks.append(cur)
        elif cur is not None and "Host Frame:" in text:
            cur["frames"].append(text)
    kept, dropped = [], 0
    for b in blocks:
        inner = b["frames"][0] if b["frames"] else ""
        if b["head"].startswith("Program hit") and any(mod in inner for mod in modules):
            dropped += 1
        else:
            kept.append(b)
    for b in kept:
        print("ours: %s | %s" % (b["head"], b["frames"][0] if b["frames"] else "(no host frame)"))
    print("sanitizer reports: %d, attributed to NCCL by the suppression list: %d, ours: %d" %
          (len(blocks), dropped, len(kept)))
    return 1 if kept else 0


if __name__ == "__main__":
    sys.exit(main())
