#!/usr/bin/env python3
"""tools/docs_check.py [--root DIR]: checks the docs for history markers and broken links.

Docs: README.md, docs/*.md, python/README.md, tests/README.md, bench/README.md, bench/results/README.md and
examples/**/*.md (never CHANGELOG.md, nothing under bench/results/archive/). Findings, one line each as
`path:line: [kind] message`: numbered sessions, "since", "was ... before", "previously", "no longer", "used to" and
bare result-file stamps such as "-061537Z" (outside fenced code blocks); result files named in README.md; commit
hashes as table column headings; relative Markdown links and backticked repository paths that do not exist.
Exit status 0 without findings, else 1. Standard library only.
"""
import argparse
import glob
import os
import re
import sys

# (kind, pattern, message): phrases that narrate history; docs describe the present. Matched on the text with fenced
# code blocks blanked, so a phrase wrapped over two lines is found (reported on the line where it starts).
HISTORY = [
    ("session", re.compile(r"\bsessions?\s+\d+", re.I), "a numbered session of past work"),
    ("since", re.compile(r"\bsince\b", re.I), "'since' (describe the present; rephrase a causal 'since' too)"),
    ("was-before", re.compile(r"\bwas\b(?:(?!\n[ \t]*\n)[^.]){0,60}?(?<![/-])\bbefore\b(?!-)", re.I),
     "'was ... before'"),
    ("previously", re.compile(r"\bpreviously\b", re.I), "'previously'"),
    ("no-longer", re.compile(r"\bno\s+longer\b", re.I), "'no longer'"),
    ("used-to", re.compile(r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused\s+to\b", re.I),
     "'used to'"),
    ("stamp", re.compile(r"(?<![\w./])-(?:\d{8}T)?\d{4,6}Z\b"),
     "a bare result-file stamp (name the whole file, or the result, not a fragment)"),
]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_ROOTS = ("docs/", "bench/", "tools/", "tests/", "python/", "nccl_ep/", "nccl_m2n/", "common/", "examples/",
              "cmake/")
RESULT_REF = re.compile(r"bench/results/([^\s`)\]\[|,;'\"<>]*)")
SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
HASH = re.compile(r"\b[0-9a-f]{7,12}\b")


def doc_files(root):
    """The checked docs, relative to root, sorted."""
    names = ["README.md", "python/README.md", "tests/README.md", "bench/README.md", "bench/results/README.md"]
    names += [os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md"))]
    names += [os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "examples", "**", "*.md"),
                                                          recursive=True)]
    out = set()
    for n in names:
        n = n.replace(os.sep, "/")
        if os.path.basename(n) == "CHANGELOG.md" or n.startswith("bench/results/archive/"):
            continue
        if os.path.isfile(os.path.join(root, n)):
            out.add(n)
    return sorted(out)


def fenced_lines(lines):
    """The set of 0-based line numbers inside fenced code blocks, fence lines included."""
    inside, fence, out = False, None, set()
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if inside:
            out.add(i)
            if m and m.group(1) == fence:
                inside = False
        elif m:
            inside, fence = True, m.group(1)
            out.add(i)
    return out


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def excerpt(text, start, end, width=30):
    """The match text[start:end] with up to width characters of context each side from its own lines, on one line."""
    first, last = text.rfind("\n", 0, start) + 1, text.find("\n", end)
    last = len(text) if last < 0 else last
    a, b = max(first, start - width), min(last, end + width)
    return "%s%s%s" % ("..." if a > first else "", " ".join(text[a:b].split()), "..." if b < last else "")


def history(lines, fenced):
    prose = "\n".join("" if i in fenced else line for i, line in enumerate(lines))
    found = []
    for kind, rx, message in HISTORY:
        for m in rx.finditer(prose):
            found.append((line_of(prose, m.start()), kind, "%s: %s" % (message, excerpt(prose, m.start(), m.end()))))
    return found


def result_refs(lines):
    found = []
    for i, line in enumerate(lines):
        for m in RESULT_REF.finditer(line):
            name = m.group(1).rstrip(".:")
            if name and name not in ("README.md", "archive", "archive/"):
                found.append((i + 1, "result-file", "README.md names a result file: bench/results/%s "
                              "(cite it from docs/, or link bench/results/README.md)" % name))
    return found


def hash_headers(lines):
    found = []
    for i in range(1, len(lines)):
        if not SEPARATOR.match(lines[i]) or "|" not in lines[i - 1] + lines[i]:
            continue
        hashes = [h for h in HASH.findall(lines[i - 1]) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
        if hashes:
            found.append((i, "hash-column", "a commit hash as a table column heading: %s (name what the column "
                          "measures)" % ", ".join(hashes)))
    return found


def backticked_path(span):
    """The repository path a code span names, or None if it names none (by the rules in the module docstring)."""
    if not span.startswith(PATH_ROOTS) or any(c in span for c in " *<${"):
        return None
    path = span.rstrip(":,")
    m = re.match(r"^([^:]*\.[A-Za-z0-9]+):", path)
    if m:
        path = m.group(1)
    return path.split("#", 1)[0]


def links(root, doc, lines):
    found = []
    here = os.path.dirname(os.path.join(root, doc))
    for i, line in enumerate(lines):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^(https?:|mailto:)", target, re.I):
                continue
            path = target.split("#", 1)[0]
            if not path:
                continue
            full = os.path.join(root, path.lstrip("/")) if path.startswith("/") else os.path.join(here, path)
            if not os.path.exists(full):
                found.append((i + 1, "broken-link", "link target does not exist: %s" % target))
        for m in CODE_SPAN.finditer(line):
            path = backticked_path(m.group(1))
            if path is None:
                continue
            full = os.path.join(root, path)
            ok = os.path.isdir(full) if path.endswith("/") else os.path.exists(full)
            if not ok:
                found.append((i + 1, "missing-path", "`%s` does not exist%s" % (
                    m.group(1), " (as a folder)" if path.endswith("/") else "")))
    return found


def check(root):
    """[(doc, line, kind, message)] for every checked doc under root, and the number of docs checked."""
    findings = []
    docs = doc_files(root)
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            lines = f.read().split("\n")
        found = history(lines, fenced_lines(lines)) + hash_headers(lines) + links(root, doc, lines)
        if doc == "README.md":
            found += result_refs(lines)
        findings += [(doc, line, kind, message) for line, kind, message in sorted(found)]
    return findings, len(docs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository root (default: the one this script is in)")
    a = ap.parse_args(argv)
    findings, checked = check(a.root)
    for doc, line, kind, message in findings:
        print("%s:%d: [%s] %s" % (doc, line, kind, message))
    files = len({f[0] for f in findings})
    print("docs_check: %d findings in %d files (%d files checked)" % (len(findings), files, checked))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
