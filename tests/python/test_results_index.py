"""tools/results_index.py on a fake repository: two result files, one cited by a doc."""
import importlib.util
import json
import os
import shutil
import subprocess

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "results_index.py")
CITED = "gpu-check-20261202T061537Z.json"
UNCITED = "m2n_fp8-20261203T0846Z.log"


@pytest.fixture(scope="module")
def results_index():
    spec = importlib.util.spec_from_file_location("results_index", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def repo(tmp_path):
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    machine = {"gpus": [{"index": "0", "name": "NVIDIA H200"}, {"index": "1", "name": "NVIDIA H200"}],
               "git_commit": "1ea7a4e194024adbc555fe22b0739ba12781146c", "git_dirty": True,
               "nccl": "NCCL: loaded 2.29.7, served by the part built against NCCL 2.29.2's headers"}
    runs = [{"name": "ep_ll", "nranks": 2, "status": "pass", "results": [{"test": "ep_ll", "mode": "real GPUs"}]},
            {"name": "ep_ll[virtual]", "nranks": 2, "status": "FAIL (exit 1)", "results": []}]
    (results / CITED).write_text(json.dumps({"kind": "gpu-check", "machine": machine, "runs": runs}))
    (results / UNCITED).write_text("\n# Session 15, one H200 (real GPU, 1 rank), tree at 85b10f2: m2n_bench --case "
                                   "to_fp8\nexecute_us 12\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "PERF.md").write_text("Measured in `bench/results/%s`.\n" % CITED)
    # A near miss is no citation: the stamp alone, and a longer name that starts with the uncited file's stem.
    (tmp_path / "README.md").write_text("See -0846Z and m2n_fp8-20261203T0846Z-old.log.\n")
    return tmp_path


def rows(text):
    return [line for line in text.splitlines() if line.startswith("| [")]


def test_the_table(results_index, repo, capsys):
    assert results_index.main(["--root", str(repo)]) == 0
    assert "2 files, 1 cited, 1 uncited" in capsys.readouterr().out
    text = (repo / "bench" / "results" / "README.md").read_text()
    assert text.startswith(results_index.HEADER)
    assert "tools/results_index.py" in text and "archive/" in text
    assert rows(text) == [
        "| [%s](%s) | gpu-check: 2 runs, 1 not passed, NCCL 2.29.7 | 1ea7a4e (dirty) | 2 x NVIDIA H200 "
        "| real GPUs, one-GPU modes | [docs/PERF.md](../../docs/PERF.md) |" % (CITED, CITED),
        "| [%s](%s) | one H200 (real GPU, 1 rank), tree at 85b10f2: m2n_bench --case to_fp8 | 85b10f2 "
        "| 1 x NVIDIA H200 | real GPUs | - |" % (UNCITED, UNCITED)]


def test_uncited(results_index, repo, capsys):
    assert results_index.main(["--root", str(repo), "--uncited"]) == 0
    assert capsys.readouterr().out.splitlines() == [UNCITED]
    (repo / "docs" / "M2N.md").write_text("fp8: m2n_fp8-20261203T0846Z.\n")  # the name without its extension cites
    assert results_index.main(["--root", str(repo), "--uncited"]) == 0
    assert capsys.readouterr().out == ""


def test_check(results_index, repo, capsys):
    index = repo / "bench" / "results" / "README.md"
    assert results_index.main(["--root", str(repo), "--check"]) == 1  # no index yet
    assert results_index.main(["--root", str(repo)]) == 0
    assert results_index.main(["--root", str(repo), "--check"]) == 0
    index.write_text(index.read_text().replace("2 x NVIDIA H200", "1 x NVIDIA H200"))
    assert results_index.main(["--root", str(repo), "--check"]) == 1
    assert results_index.main(["--root", str(repo)]) == 0
    (repo / "docs" / "M2N.md").write_text("fp8: `bench/results/%s`.\n" % UNCITED)  # a new citation changes the index
    assert results_index.main(["--root", str(repo), "--check"]) == 1


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_archive(results_index, repo, capsys):
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    assert results_index.main(["--root", str(repo), "--archive"]) == 0
    assert (repo / "bench" / "results" / "archive" / UNCITED).exists()
    assert not (repo / "bench" / "results" / UNCITED).exists()
    assert [r.split("]")[0][3:] for r in rows((repo / "bench" / "results" / "README.md").read_text())] == [CITED]
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert "R  bench/results/%s -> bench/results/archive/%s" % (UNCITED, UNCITED) in status
