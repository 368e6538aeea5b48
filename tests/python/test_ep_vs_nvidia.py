"""bench/ep_vs_nvidia.py pairs ep_bench's rows with NVIDIA's baseline rows (CPU, no GPU): which rows pair, the
ratio, the derived HT rows and their notes, and exit 1 when nothing pairs."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "ep_vs_nvidia.py")


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def ll(layout, tokens, d, c, pair, dtype="bf16"):
    return {"bench": "ep_ll", "pass": True, "ranks": 1, "layout": layout, "dispatch_dtype": dtype, "tokens": tokens,
            "hidden": 7168, "dispatch_us": d, "combine_us": c, "dispatch_combine_us": pair}


def ht(what, sms, us, upd=0.0, **kw):
    return dict({"what": what, "pass": True, "dtype": "bf16", "layout": "flat", "tokens": 4096, "hidden": 7168,
                 "nranks": 1, "sms": sms, "us_median": us, "update_handle_plus_dispatch_us_median": upd,
                 "recv_cap": 0, "zero_copy": 0}, **kw)


def nv(what, mode, layout, tokens, us, sms=0):
    return {"what": what, "pass": True, "mode": mode, "layout": layout, "tokens": tokens, "hidden": 7168, "sms": sms,
            "nranks": 1, "us_median": us, "impl": "nvidia-nccl-extensions-0.1.0", "nccl_version": "2.30.7"}


def run(tmp_path, ours, theirs):
    out = tmp_path / "vs.json"
    p = subprocess.run([sys.executable, TOOL, "--ours", write(tmp_path / "o.jsonl", ours), "--nvidia",
                        write(tmp_path / "n.jsonl", theirs), "--json", str(out)], capture_output=True, text=True)
    return p, (json.load(open(out))["rows"] if out.exists() else None)


def test_rows_pair_with_their_ratio_and_notes(tmp_path):
    ours = [ll("EXPERT_MAJOR", 128, 20.0, 30.0, 50.0), ll("EXPERT_MAJOR", 128, 22.0, 34.0, 56.0),  # two runs
            ll("EXPERT_MAJOR", 128, 9.0, 9.0, 18.0, dtype="fp8_e4m3"),  # not bf16: left out
            ht("ep_dispatch", 16, 100.0, upd=130.0), ht("ep_combine", 16, 140.0),
            ht("ep_dispatch", 64, 60.0, upd=130.0), ht("ep_combine", 64, 50.0),
            ht("ep_dispatch", 16, 1.0, recv_cap=4096)]  # a capped row: left out
    theirs = [nv("ep_combine", "ll", "expert_major", 128, 25.0),
              nv("ep_dispatch_combine", "ht", "flat", 4096, 480.0, 16),
              nv("ep_update_handle", "ht", "flat", 4096, 180.0, 16), nv("ep_dispatch", "ll", "rank_major", 128, 5.0)]
    p, rows = run(tmp_path, ours, theirs)
    assert p.returncode == 0, p.stderr
    got = {(r["mode"], r["what"]): r for r in rows}
    assert set(got) == {("ll", "ep_combine"), ("ht", "ep_dispatch_combine"), ("ht", "ep_update_handle")}
    assert got[("ll", "ep_combine")]["ours_us"] == 32.0 and got[("ll", "ep_combine")]["ours_runs"] == 2
    assert got[("ll", "ep_combine")]["ours_over_nvidia"] == round(32.0 / 25.0, 3)
    assert got[("ht", "ep_dispatch_combine")]["ours_us"] == 240.0
    assert got[("ht", "ep_dispatch_combine")]["note"].startswith("ours: dispatch median + combine median")
    assert got[("ht", "ep_update_handle")]["ours_us"] == 70.0  # 130 - the dispatch at 64 SMs, not at 16
    assert got[("ht", "ep_update_handle")]["note"].endswith("both at 64 SMs")
    assert "| LL | EXPERT_MAJOR | combine | 128 x 7168 | - | 25.0 | 32.0 | 1.28 |" in p.stdout


def test_the_update_alone_when_timed(tmp_path):
    ours = [ht("ep_dispatch", 32, 60.0, upd=130.0, update_handle_us_median=66.0), ht("ep_combine", 32, 50.0)]
    p, rows = run(tmp_path, ours, [nv("ep_update_handle", "ht", "flat", 4096, 180.0, 32)])  # (no 64-SM row)
    assert p.returncode == 0, p.stderr
    assert rows[0]["ours_us"] == 66.0 and rows[0]["note"] == "ours: the update alone, timed"


def test_nothing_pairs_is_an_error(tmp_path):
    p, rows = run(tmp_path, [ll("RANK_MAJOR", 1, 1.0, 1.0, 2.0)], [nv("ep_combine", "ll", "expert_major", 128, 25.0)])
    assert p.returncode == 1 and rows is None
    assert "no row of ours pairs" in p.stderr
