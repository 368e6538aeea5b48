"""tools/docs_check.py on a fake repository: one doc per kind of finding, each reported, and a clean doc passes."""
import importlib.util
import os

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "docs_check.py")


@pytest.fixture(scope="module")
def docs_check():
    spec = importlib.util.spec_from_file_location("docs_check", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# doc name under docs/ -> (text, the kinds it must raise, in line order)
DOCS = {
    "session.md": ("# S\n\nThe fence holds since session 18.\n", ["session", "since"]),
    "session_wrapped.md": ("# S\n\nMeasured in sessions\n3 and 4.\n", ["session"]),
    "since.md": ("# S\n\nSince the window is symmetric, no copy is needed.\n", ["since"]),
    "was_before.md": ("# S\n\nThe limit was 4 ranks before the rail.\n", ["was-before"]),
    "previously.md": ("# S\n\nPreviously the kernel spun.\n", ["previously"]),
    "no_longer.md": ("# S\n\nThe host no longer waits.\n", ["no-longer"]),
    "used_to.md": ("# S\n\nDispatch used to launch twice the CTAs.\n", ["used-to"]),
    "stamp.md": ("# S\n\nAs measured (-061537Z, -20261201T0838Z).\n", ["stamp", "stamp"]),
    "hash_table.md": ("# S\n\n| shape | fa0925b | c673cd5 |\n|---|---|---|\n| 1 | 2 | 3 |\n", ["hash-column"]),
    "link.md": ("# S\n\nSee [the plan](MISSING.md#steps) and [ok](clean.md).\n", ["broken-link"]),
    "path.md": ("# S\n\nRun `tools/missing.py` and `bench/nothing/`; `tools/real.py:12` exists.\n",
                ["missing-path", "missing-path"]),
    "clean.md": ("# Clean\n\nThe window is symmetric, so no copy is needed; see [the tool](../tools/real.py#L3),\n"
                 "[here](#clean), [web](https://example.com/x.md), `tools/real.py:main`, `tools/`, `docs/clean.md,`,\n"
                 "`bench/results/gpu-check-20261202T061537Z.json` and `tools/*.py` (a glob, not checked).\n"
                 "It is used to size the staging; each fix was seen failing: `bench/results/before-fixes-0838Z.txt`.\n"
                 "\n"
                 "| shape | before | after |\n|---|---|---|\n| deadbeef | 1 | 2 |\n\n"
                 "```\n# history inside a code block is not prose: since session 18, used to, -061537Z\n```\n", []),
}


@pytest.fixture()
def repo(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "real.py").write_text("pass\n")
    (tmp_path / "bench" / "results" / "archive").mkdir(parents=True)
    for name in ("gpu-check-20261202T061537Z.json", "before-fixes-0838Z.txt"):
        (tmp_path / "bench" / "results" / name).write_text("{}\n")
    for name, (text, _) in DOCS.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "README.md").write_text("# R\n\nResults: [index](bench/results/README.md), "
                                        "`bench/results/gpu-check-20261202T061537Z.json`.\n")
    (tmp_path / "bench" / "results" / "README.md").write_text("# Results\n\n[a](gpu-check-20261202T061537Z.json)\n")
    # Never checked: the changelog and the archive narrate history by design.
    (tmp_path / "CHANGELOG.md").write_text("Since session 3 the fence was slow before.\n")
    (tmp_path / "bench" / "results" / "archive" / "README.md").write_text("since session 1\n")
    return tmp_path


def test_every_kind_is_reported_and_the_clean_doc_passes(docs_check, repo):
    findings, checked = docs_check.check(str(repo))
    by_doc = {}
    for doc, line, kind, message in findings:
        by_doc.setdefault(doc, []).append(kind)
    for name, (_, kinds) in DOCS.items():
        assert by_doc.get("docs/" + name, []) == kinds, (name, by_doc.get("docs/" + name))
    assert by_doc["README.md"] == ["result-file"]
    assert "bench/results/README.md" not in by_doc
    assert not any(doc in ("CHANGELOG.md", "bench/results/archive/README.md") for doc in by_doc)
    assert checked == len(DOCS) + 2


def test_lines_and_exit_status(docs_check, repo, capsys):
    assert docs_check.main(["--root", str(repo)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "docs/session_wrapped.md:3: [session] a numbered session of past work: Measured in sessions 3 and 4." in out
    assert any(line.startswith("docs/hash_table.md:3: [hash-column]") for line in out)
    assert any(line.startswith("docs/link.md:3: [broken-link] link target does not exist: MISSING.md#steps")
               for line in out)
    assert out[-1] == "docs_check: %d findings in %d files (%d files checked)" % (
        sum(len(k) for _, k in DOCS.values()) + 1, len([k for _, k in DOCS.values() if k]) + 1, len(DOCS) + 2)


def test_a_clean_repository_exits_zero(docs_check, repo, capsys):
    for name, (_, kinds) in DOCS.items():
        if kinds:
            (repo / "docs" / name).unlink()
    (repo / "README.md").write_text("# R\n\nResults: [index](bench/results/README.md).\n")
    assert docs_check.main(["--root", str(repo)]) == 0
    assert capsys.readouterr().out.strip() == "docs_check: 0 findings in 0 files (3 files checked)"
