#!/usr/bin/env python3
"""Reads a compute-sanitizer log and counts the reports that are ours (exit 1 if any), after dropping those that
tools/sanitize_suppressions.txt attributes to NCCL: kernel reports are already excluded by kernel name on the
sanitizer's command line; an API-error report is NCCL's when the innermost host frame of its backtrace lies in a
module the list names (the CUDA call was made by NCCL's own host code, which handles the error itself), or when it
is an error the list names (api-code: a code and a regular expression) and its text names the NCCL function that
raises that error (where several threads report at once, as virtual ranks do, compute-sanitizer prints backtraces
whose names are shuffled between fields and frames, so the innermost frame says nothing).

Reports compute-sanitizer left unprinted (past its --print-limit) cannot be attributed and count as ours.

Usage: sanitize_filter.py SUPPRESSIONS LOG   Prints one line per kept report and a summary. Standard library only.
"""
import re
import sys


def main():
    supp, log = sys.argv[1], sys.argv[2]
    modules, codes = [], []
    for line in open(supp):
        f = line.split()
        if len(f) >= 2 and f[0] == "api":
            modules.append(f[1])
        elif len(f) >= 3 and f[0] == "api-code":
            codes.append((re.compile(r"\berror %s\b" % re.escape(f[1])), re.compile(f[2])))
    blocks, cur, unprinted = [], None, 0
    for line in open(log, errors="replace"):
        m = re.match(r"^=========( +)(\S.*)$", line.rstrip("\n"))
        if not m:
            continue
        indent, text = len(m.group(1)), m.group(2)
        u = re.match(r"ERROR SUMMARY: (\d+) errors? (was|were) not printed", text)
        if u:  # past the print limit: reports nobody can attribute, so they count as ours
            unprinted += int(u.group(1))
            continue
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
        text = "\n".join([b["head"]] + b["frames"])
        nccl = any(mod in inner for mod in modules) or any(
            code.search(b["head"]) and names.search(text) for code, names in codes)
        if b["head"].startswith("Program hit") and nccl:
            dropped += 1
        else:
            kept.append(b)
    for b in kept:
        print("ours: %s | %s" % (b["head"], b["frames"][0] if b["frames"] else "(no host frame)"))
    if unprinted:
        print("ours: %d reports compute-sanitizer did not print (its --print-limit): not attributable" % unprinted)
    print("sanitizer reports: %d, attributed to NCCL by the suppression list: %d, ours: %d" %
          (len(blocks) + unprinted, dropped, len(kept) + unprinted))
    return 1 if kept or unprinted else 0


if __name__ == "__main__":
    sys.exit(main())
