"""bench/ep_internode_model.py (CPU only): its expected bytes against a Monte Carlo count of the routing and the
schemes it assumes, its limits and symmetries, its command line, and its staging and window bytes against the
library's own layout, queried live (ncclEpGroupInfoQuery; needs torch, else that test is skipped)."""

import json
import math
import os
import random
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)
import ep_internode_model as m  # noqa: E402


class _Routing:
    """Seeded routing as the model assumes it: k distinct experts uniform among E (or, with a node limit M, among
    the experts of M uniformly chosen domains); experts in contiguous blocks, rank (d, l) = d * G + l."""

    def __init__(self, nodes, gpus, experts, k, node_limit, seed):
        self.n, self.g, self.k = nodes, gpus, k
        self.e_r, self.e_d = experts // (nodes * gpus), experts // nodes
        self.m = nodes if node_limit <= 0 else min(node_limit, nodes)
        self.rng = random.Random(seed)
        self.experts = experts

    def token(self):
        """(experts, ranks hit, domains hit) of one fresh token."""
        if self.m == self.n:
            ex = self.rng.sample(range(self.experts), self.k)
        else:
            doms = self.rng.sample(range(self.n), self.m)
            ex = [doms[i // self.e_d] * self.e_d + i % self.e_d for i in self.rng.sample(range(self.m * self.e_d),
                                                                                          self.k)]
        ranks = {e // self.e_r for e in ex}
        return ex, ranks, {r // self.g for r in ranks}


class _Mean:
    def __init__(self):
        self.n = self.s = self.s2 = 0

    def add(self, x):
        self.n, self.s, self.s2 = self.n + 1, self.s + x, self.s2 + x * x

    @property
    def mean(self):
        return self.s / self.n

    @property
    def se(self):
        var = max(0.0, self.s2 / self.n - self.mean ** 2)
        return math.sqrt(var / self.n)


def _close(mc, exact, rel=0.04):
    """Within `rel` of the exact value, or within 4 standard errors of the sample when that is wider (a few rare
    quantities at 16 domains); exact when the sample has no variance."""
    tol = max(rel * abs(exact), 4 * mc.se, 1e-12)
    assert abs(mc.mean - exact) <= tol, (mc.mean, exact, tol)


def _monte_carlo(nodes, gpus, experts, k, node_limit, tokens, seed):
    """Per-token counts for one rank r = (d0, l0) (the last domain, local index 1 where there is one): what it sends
    in HT and LL dispatch and combine, counted by replaying the schemes on sampled tokens."""
    rt = _Routing(nodes, gpus, experts, k, node_limit, seed)
    d0, l0 = nodes - 1, min(1, gpus - 1)
    r0 = d0 * gpus + l0
    c = {key: _Mean() for key in ("ht_rail", "ht_nvl", "ll_rail", "ll_nvl", "llc_rail", "llc_nvl")}
    for _ in range(4000):  # r0's own tokens (cheap: one draw each)
        ex, ranks, doms = rt.token()
        c["ht_rail"].add(len(doms - {d0}))
        direct = len({r for r in ranks if r // gpus == d0} - {r0})
        c["ht_nvl"].add(direct)  # HT NVLink out of r0: its direct sends (the forwarding is counted below)
        c["ll_rail"].add(len({r for r in ranks if r // gpus != d0}))
        c["ll_nvl"].add(direct)
        # LL combine, one row per (token, expert) that is not on r0, counted as rows r0 receives (= sends).
        c["llc_rail"].add(sum(1 for e in ex if e // rt.e_d != d0))
        c["llc_nvl"].add(sum(1 for e in ex if e // rt.e_d == d0 and e // rt.e_r != r0))
    # HT: tokens of r0's rail peers (d, l0), d != d0, arrive at r0 when they hit d0; r0 forwards each to the other
    # ranks of d0 hit. Counted per token of a peer, summed over the N - 1 peers, per token of r0's T.
    fwd = _Mean()
    rail_back = _Mean()
    for _ in range(tokens):
        f = back = 0
        for d in range(nodes):
            if d == d0:
                continue
            _, ranks, doms = rt.token()
            if d0 in doms:
                back += 1  # HT combine: one reduced row per (token, domain) back over the rail
                f += len({r for r in ranks if r // gpus == d0} - {r0})
        fwd.add(f)
        rail_back.add(back)
    # HT combine NVLink out of r0: one row per (token, r0) for every token of a rank (d, l), l != l0, that hits r0
    # (to its owner in d0, or to the forwarder (d0, l) for the other domains); per token slot of one rank.
    hits = _Mean()
    for _ in range(max(100, tokens // 4)):  # N (G - 1) tokens each: fewer slots keep the same precision
        h = 0
        for d in range(nodes):
            for lidx in range(gpus):
                if lidx == l0:
                    continue
                h += r0 in rt.token()[1]
        hits.add(h)
    return c, fwd, rail_back, hits


CASES = [  # nodes, gpus, experts, k, node_limit, token slots of the rail peers (N - 1 draws each)
    (2, 8, 256, 8, 0, 2000),
    (4, 8, 256, 8, 0, 1500),
    (16, 8, 256, 8, 0, 600),
    (8, 8, 256, 8, 4, 800),   # group-limited routing (DeepSeek-V3's top-4 nodes)
    (4, 2, 32, 1, 0, 4000),   # k = 1
    (1, 8, 64, 4, 0, 2000),   # one domain: no rail
    (2, 2, 16, 9, 0, 2000),   # k > E - E_d: every token hits every domain
    (2, 2, 8, 7, 0, 2000),    # k > E - E_r: every token hits every rank
    (4, 1, 256, 8, 0, 3000),  # one-GPU nodes (the one-GPU test mode): no NVLink
]


@pytest.mark.parametrize("nodes,gpus,experts,k,limit,tokens", CASES)
def test_expected_rows_match_monte_carlo(nodes, gpus, experts, k, limit, tokens):
    ht = m.ht_rows(nodes, gpus, experts, k, limit)
    ll = m.ll_rows(nodes, gpus, experts, k, limit, "expert")
    c, fwd, rail_back, hits = _monte_carlo(nodes, gpus, experts, k, limit, tokens, seed=1000 * nodes + 10 * k + gpus)
    _close(c["ht_rail"], ht["rail"])
    _close(c["ht_nvl"], ht["nvlink_direct"])
    _close(fwd, ht["nvlink_forward"])
    # Direct + forwarding, the NVLink figure the time uses.
    nvl = c["ht_nvl"].mean + fwd.mean
    assert abs(nvl - ht["nvlink"]) <= max(0.04 * ht["nvlink"], 4 * (c["ht_nvl"].se + fwd.se), 1e-12)
    # HT combine: the rail rows back and the NVLink rows out equal dispatch's (mirror).
    _close(rail_back, ht["rail"])
    _close(hits, ht["nvlink"])
    _close(c["ll_rail"], ll["dispatch_rail"])
    _close(c["ll_nvl"], ll["dispatch_nvlink"])
    _close(c["llc_rail"], ll["combine_rail"])
    _close(c["llc_nvl"], ll["combine_nvlink"])


def test_edge_cases_are_exact():
    # Every token hits every domain (k > E - E_d) and, in the second, every rank (k > E - E_r).
    assert m.probabilities(2, 2, 16, 9)["p_dom"] == 1.0
    r = m.ht_rows(2, 2, 8, 7)
    assert (r["p_dom"], r["p_rank"], r["rail"], r["nvlink"]) == (1.0, 1.0, 1.0, 2.0)
    # k = 1: one expert, one rank, one domain.
    r = m.ht_rows(4, 2, 32, 1)
    assert r["p_rank"] == pytest.approx(4 / 32) and r["p_dom"] == pytest.approx(8 / 32)
    assert r["rail"] == pytest.approx(3 / 4)


@pytest.mark.parametrize("mode", ["ht", "ll"])
def test_one_node_has_no_rail_bytes(mode):
    for dtype in ("bf16", "fp8"):
        for p in m.predict(mode, 1, 8, 4096, 7168, 8, 256, dtype):
            assert p["rail_bytes"] == 0 and p["rail_us"] == 0
            assert p["nvlink_bytes"] > 0 and p["bound"] == "nvlink"


def test_one_gpu_nodes_have_no_nvlink_bytes():
    for mode in ("ht", "ll"):
        for p in m.predict(mode, 4, 1, 4096, 7168, 8, 256, "bf16", rail_gbs=1.2, nvlink_gbs=1.0):
            assert p["nvlink_bytes"] == 0 and p["bound"] == "rail"


@pytest.mark.parametrize("nodes,gpus,experts,k", [(2, 8, 256, 8), (4, 8, 256, 8), (16, 8, 256, 8), (4, 2, 32, 3)])
def test_ht_combine_mirrors_dispatch(nodes, gpus, experts, k):
    d, c = m.predict("ht", nodes, gpus, 4096, 7168, k, experts, "bf16")
    assert (d["op"], c["op"]) == ("dispatch", "combine")
    for key in ("rail_bytes", "nvlink_bytes", "rail_us", "nvlink_us", "overlapped_us", "serial_us"):
        assert d[key] == c[key], key


@pytest.mark.parametrize("nodes,gpus,experts,k,limit", [(2, 8, 256, 8, 0), (4, 8, 256, 8, 0), (8, 8, 256, 8, 4),
                                                        (16, 8, 256, 8, 0), (4, 2, 32, 1, 0), (2, 4, 64, 16, 0)])
def test_ll_rail_bytes_at_least_ht(nodes, gpus, experts, k, limit):
    ht, ll = m.ht_rows(nodes, gpus, experts, k, limit), m.ll_rows(nodes, gpus, experts, k, limit, "rank")
    assert ll["dispatch_rail"] >= ht["rail"] - 1e-12
    assert ll["combine_rail"] >= ht["rail"] - 1e-12
    assert m.ll_rows(nodes, gpus, experts, k, limit, "expert")["combine_rail"] >= ll["combine_rail"] - 1e-12
    # One rank a domain: no hierarchy to gain, the two coincide.
    assert m.ll_rows(nodes, 1, experts, k, 0)["dispatch_rail"] == pytest.approx(m.ht_rows(nodes, 1, experts, k)["rail"])


def test_row_bytes():
    assert m.row_bytes("bf16", 7168) == 14336
    assert m.row_bytes("fp8", 7168) == 7168 + 4 * 56 == 7392
    assert m.row_bytes("fp8", 128) == 132
    assert m.row_bytes("bf16", 7168, meta=16) == 14352
    with pytest.raises(ValueError, match="one scale per 128 channels"):
        m.row_bytes("fp8", 100)
    with pytest.raises(ValueError):
        m.row_bytes("fp16", 128)


def test_time_combines_links_and_latency():
    t = m.op_time(50e6, 296e6, 50.0, 296.0, 25.0)
    assert t["rail_us"] == pytest.approx(1000.0) and t["nvlink_us"] == pytest.approx(1000.0)
    assert t["overlapped_us"] == pytest.approx(1025.0) and t["serial_us"] == pytest.approx(2025.0)
    p = m.predict("ht", 2, 8, 4096, 7168, 8, 256, "fp8")[0]
    assert p["overlapped_us"] == pytest.approx(max(p["rail_us"], p["nvlink_us"]) + m.HT_LATENCY_US)
    assert p["rail_bytes"] == pytest.approx(4096 * p["rail_rows_per_token"] * 7392)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError):
        m.ht_rows(3, 8, 256, 8)  # 256 experts over 24 ranks
    with pytest.raises(ValueError):
        m.ht_rows(2, 8, 256, 0)
    with pytest.raises(ValueError):
        m.ht_rows(8, 8, 256, 200, node_limit=4)  # more experts than 4 domains hold
    with pytest.raises(ValueError):
        m.predict("xx", 2, 8, 1, 128, 1, 16, "bf16")


def test_published_comparison_rows():
    rows = m.compare_published([2, 4, 8, 16], m.RAIL_GBS, m.NVLINK_GBS, m.HT_LATENCY_US, m.LL_LATENCY_US)
    systems = {(r["system"], r["nodes"], r["op"]) for r in rows}
    assert ("DeepEP V1 normal", 2, "dispatch") in systems and ("DeepEP V1 LL", 16, "combine") in systems
    assert ("DeepEP V2", 4, "combine") in systems and ("NCCL EP v0.1 LL", 8, "dispatch") in systems
    for r in rows:
        assert r["source"].startswith("ep-anchors.md") and r["model_us"] > 0


def test_cli_writes_json_lines(tmp_path, capsys):
    out = tmp_path / "model.jsonl"
    assert m.main(["--nodes", "2,4", "--json", str(out)]) == 0
    first = out.read_text().splitlines()
    # ht: 2 dtypes x 2 node counts dispatch + 2 combine; ll the same; then the published comparison rows.
    preds = [json.loads(x) for x in first if json.loads(x)["what"] == "ep_internode_model"]
    assert len(preds) == 12
    assert {(p["mode"], p["op"], p["dtype"]) for p in preds} >= {("ht", "dispatch", "fp8"), ("ll", "combine", "bf16")}
    assert any(json.loads(x)["what"] == "ep_internode_model_vs_published" for x in first)
    text = capsys.readouterr().out
    assert "overlap us" in text and "DeepEP V1 normal" in text
    # Appends; the one-GPU-node form of issue 12 runs (no published rows for one GPU a node).
    assert m.main(["--nodes", "2", "--gpus-per-node", "1", "--rail-gbs", "1.2", "--nvlink-gbs", "1",
                   "--modes", "ht", "--dtypes", "bf16", "--json", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[:len(first)] == first and len(lines) == len(first) + 2
    last = [json.loads(x) for x in lines[len(first):]]
    assert all(r["gpus_per_node"] == 1 and r["nvlink_bytes"] == 0 and r["rail_gbs"] == 1.2 for r in last)


def test_cli_as_a_script(tmp_path):
    out = tmp_path / "s.jsonl"
    res = subprocess.run([sys.executable, os.path.join(BENCH, "ep_internode_model.py"), "--nodes", "16",
                          "--modes", "ll", "--ll-combine", "both", "--no-compare", "--json", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted((r["op"], r["dtype"], r["ll_combine"]) for r in rows) == [
        ("combine", "bf16", "expert"), ("combine", "bf16", "rank"), ("dispatch", "bf16", "expert"),
        ("dispatch", "fp8", "expert")]
    exp, rank = sorted((r for r in rows if r["op"] == "combine"), key=lambda r: r["ll_combine"])
    assert exp["rail_bytes"] > rank["rail_bytes"]  # k rows a token against one per rank
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "ep_internode_model.py"), "--nodes", "3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "split evenly" in bad.stderr


def test_ht_fixed_slices_follow_the_library_layout():
    # nodes 2 x 1 GPU, top-2, hidden 256, max_tokens 4: row 512 B, metadata 64 B (12 + 24 + 16 scales, 16-aligned);
    # tests/unit/ep_api_test.cc (EpRail.HighThroughputFixedSliceBytesMatchTheModel) checks the same numbers.
    b = m.ht_fixed_slice_bytes(2, 1, 256, 2, 4)
    assert b["dispatch_per_peer"] == 4 * (512 + 64) == 2304
    assert b["combine_per_peer"] == 32 + 4 * 512 == 2080 and b["remote_ranks"] == 1
    assert m.ht_fixed_slice_bytes(2, 1, 256, 2, 3)["combine_per_peer"] == 24 + 3 * 512  # a message per region
    # In predict: fixed rail bytes, NVLink only to the own domain's other ranks; refused for LL or too few rows.
    d, c = m.predict("ht", 2, 1, 3, 256, 2, 4, "bf16", ht_fixed_slices=4)
    assert d["rail_bytes"] == 2304 and c["rail_bytes"] == 2080 and d["nvlink_bytes"] == 0 and d["ht_fixed_slices"] == 4
    two_gpus = m.predict("ht", 2, 2, 3, 256, 2, 8, "bf16", ht_fixed_slices=4)[0]
    assert two_gpus["rail_bytes"] == 2 * 2304 and two_gpus["nvlink_bytes"] > 0
    for bad in (dict(mode="ll"), dict(tokens=5)):
        args = dict(mode="ht", nodes=2, gpus=1, tokens=3, hidden=256, k=2, experts=4, dtype="bf16")
        args.update(bad)
        with pytest.raises(ValueError):
            m.predict(ht_fixed_slices=4, **args)


def test_ht_hier_fixed_follows_the_library_layout():
    # 2 domains of 2, top-2, hidden 256, max_tokens 4: a hierarchical rail row of 592 bytes (tests/unit/ep_api_test.cc,
    # EpRail.HierarchicalRowBytesMatchTheModel: HierRow), M of them to the one remote domain; combine M partials of a
    # row and a 16-byte tail.
    b = m.ht_hier_fixed_bytes(2, 2, 256, 2, 4)
    assert b["dispatch_per_peer"] == 4 * 592 and b["combine_per_peer"] == 4 * 528 and b["remote_domains"] == 1
    assert m.ht_hier_fixed_bytes(2, 6, 256, 2, 4)["dispatch_per_peer"] == 4 * 608  # 596, padded to 16
    assert m.ht_hier_fixed_bytes(4, 2, 256, 2, 4)["dispatch_rail_bytes"] == 3 * 4 * 592
    # The session-12 mixed run's shape (2 domains of 2, 512 tokens, hidden 7168, top-8): the library's
    # rail_*_domain_bytes (combine: 512 partials of 14336 bytes, each with its 16-byte tail).
    d, c = m.predict("ht", 2, 2, 512, 7168, 8, 256, "bf16", ht_hier_fixed=512)
    assert d["rail_bytes"] == 7634944 and c["rail_bytes"] == 512 * (14336 + 16) and d["ht_protocol"] == "hierarchical"
    assert d["nvlink_bytes"] == m.predict("ht", 2, 2, 512, 7168, 8, 256, "bf16")[0]["nvlink_bytes"]
    # The relayed flat exchange of the same run: fixed slices to each remote rank, as without a relay.
    d, c = m.predict("ht", 2, 2, 512, 7168, 8, 256, "bf16", ht_fixed_slices=512)
    assert d["rail_bytes"] == 15253504 and c["rail_bytes"] == 14688256
    for bad in (dict(mode="ll"), dict(tokens=5), dict(ht_fixed_slices=4), dict(ht_flat=True)):
        args = dict(mode="ht", nodes=2, gpus=2, tokens=3, hidden=256, k=2, experts=8, dtype="bf16")
        args.update(bad)
        with pytest.raises(ValueError):
            m.predict(ht_hier_fixed=4, **args)


def test_ll_fixed_slices_follow_the_library_layout():
    # nodes 2 x 1 GPU, 4 experts, top-2, hidden 256, max_tokens 4: row 512 B, one slice, metadata 64 B, header 32 B;
    # tests/unit/ep_api_test.cc (EpRail.FixedSliceBytesMatchTheModel) checks the same numbers against layoutGroup.
    b = m.ll_fixed_slice_bytes(2, 1, 4, 2, 256, 4, "expert")
    assert b["dispatch_per_peer"] == 32 + 4 * (512 + 64 + 8) == 2368
    assert b["combine_per_peer"] == 4 * (512 + 8) * 2 == 4160
    assert m.ll_fixed_slice_bytes(2, 1, 4, 2, 256, 4, "rank")["combine_per_peer"] == 2080
    assert m.ll_fixed_slice_bytes(2, 1, 2, 2, 256, 4, "expert")["combine_per_peer"] == 2080  # one expert a rank
    # Three rows: the flag slices (24 bytes) are padded to 16 before the next region of the same message.
    b3 = m.ll_fixed_slice_bytes(2, 1, 4, 2, 256, 3, "expert")
    assert b3["dispatch_per_peer"] == 32 + 32 + 3 * (512 + 64) == 1792
    assert b3["combine_per_peer"] == 48 + 2 * 3 * 512 == 3120
    assert m.ll_fixed_slice_bytes(2, 1, 4, 2, 256, 3, "rank")["combine_per_peer"] == 32 + 3 * 512 == 1568
    assert b["remote_ranks"] == 1 and b["dispatch_rail_bytes"] == 2368
    # In predict: the rail bytes are the fixed slices, whatever the tokens; refused for HT, fp8 or too few rows.
    d, c = m.predict("ll", 2, 1, 3, 256, 2, 4, "bf16", ll_fixed_slices=4)
    assert d["rail_bytes"] == 2368 and c["rail_bytes"] == 4160 and d["ll_fixed_slices"] == 4
    for bad in (dict(mode="ht"), dict(dtype="fp8"), dict(tokens=5)):
        args = dict(mode="ll", nodes=2, gpus=1, tokens=3, hidden=256, k=2, experts=4, dtype="bf16")
        args.update(bad)
        with pytest.raises(ValueError):
            m.predict(ll_fixed_slices=4, **args)


def test_ht_flat_rows_are_per_destination_rank():
    # One GPU a domain: flat and hierarchical are one protocol. Several: a token crosses the rail once per destination
    # rank (flat) instead of once per destination domain, so flat moves more, and its fixed slices more still.
    for nodes, gpus in ((2, 1), (4, 1)):
        hier, flat = (m.predict("ht", nodes, gpus, 512, 7168, 8, 256, "bf16", ht_flat=f)[0] for f in (False, True))
        assert flat["rail_bytes"] == pytest.approx(hier["rail_bytes"]) and flat["ht_protocol"] == "flat"
        assert hier["ht_protocol"] == "hierarchical"
    for nodes in (2, 4, 16):
        hier, flat = (m.predict("ht", nodes, 8, 4096, 7168, 8, 256, "bf16", ht_flat=f)[0] for f in (False, True))
        fixed = m.predict("ht", nodes, 8, 4096, 7168, 8, 256, "bf16", ht_fixed_slices=4096)[0]
        assert hier["rail_bytes"] < flat["rail_bytes"] < fixed["rail_bytes"], nodes
        rows = m.ll_rows(nodes, 8, 256, 8, 0, "rank", False, "rank")
        assert flat["rail_rows_per_token"] == rows["dispatch_rail"] and flat["nvlink_bytes"] > 0
    with pytest.raises(ValueError):
        m.predict("ll", 2, 1, 3, 256, 2, 4, "bf16", ht_flat=True)


def test_ht_staging_follows_the_library():
    # tests/unit/ep_api_test.cc (EpRail.HighThroughputStagingBytesMatchTheModel) checks the same numbers: 2 one-GPU
    # domains, 4 experts, top-2, hidden 256, 4 tokens; one round (the default, or a round of 4 or more), rounds of 3.
    for round_tokens, want in ((0, 4416), (4, 4416), (64, 4416), (3, 3328)):
        assert m.ht_staging_bytes(2, 1, 256, 2, 4, 4, round_tokens)["rail_staging_bytes"] == want, round_tokens
    b = m.ht_staging_bytes(8, 8, 7168, 8, 256, 4096)
    assert b["round_tokens"] == m.DEFAULT_RAIL_ROUND_TOKENS and b["rounds_fixed"] == 4 and b["remote_ranks"] == 56


def test_ht_hier_staging_follows_the_library():
    # tests/unit/ep_api_test.cc (EpRail.HierarchicalStagingBytesMatchTheModel) checks the same numbers: 2 domains of
    # 2, 8 experts, top-2, hidden 256, 4 tokens; one round (the default, or a round of 4), rounds of 3.
    for round_tokens, want in ((0, 18176), (4, 18176), (3, 13696)):
        b = m.ht_hier_staging_bytes(2, 2, 256, 2, 8, 4, round_tokens)
        assert b["rail_staging_bytes"] == want and b["window_outbox_bytes"] == 4 * 2144, round_tokens
    # Rounds bound the rail rows: at 4096 tokens, 8 nodes of 8, rounds of 256 hold a sixteenth of one round's rows
    # (the inboxes of the count rows beside them are kilobytes).
    whole, rounds = (m.ht_hier_staging_bytes(8, 8, 7168, 8, 256, 4096, c) for c in (4096, 256))
    assert rounds["rounds_fixed"] == 16 and whole["rounds_fixed"] == 1
    assert rounds["rail_staging_bytes"] < whole["rail_staging_bytes"] / 15


def test_ht_window_follows_the_library():
    # tests/unit/ep_api_test.cc (EpRail.WindowBytesMatchTheModel) checks the same numbers against layoutGroup.
    assert m.ht_window_bytes(2, 1, 256, 2, 4, 4)["window_bytes"] == 20480
    assert m.ht_window_bytes(2, 2, 256, 2, 8, 4)["window_bytes"] == 28672
    hier = m.ht_window_bytes(2, 2, 256, 2, 8, 4, hierarchical=True)
    assert hier["window_bytes"] == 37248 and hier["outbox_bytes"] == 4 * 2144
    # The staging regions grow with ranks x max_tokens: at 4096 tokens, 8 GPUs a node, twice the nodes, twice the
    # window (rounds do not change it).
    w = [m.ht_window_bytes(n, 8, 7168, 8, 256, 4096)["window_bytes"] for n in (2, 4, 8)]
    assert w[1] == pytest.approx(2 * w[0], rel=0.01) and w[2] == pytest.approx(2 * w[1], rel=0.01)


_ENV = ("NCCL_EXT_RAIL_ROUND_TOKENS", "NCCL_EXT_LSA_DOMAIN_SIZE")


@pytest.mark.skipif(any(os.environ.get(v) for v in _ENV), reason="the library's sizes here are the defaults'")
@pytest.mark.parametrize("nodes,gpus,tokens", [(2, 1, 512), (4, 1, 512), (2, 2, 512), (4, 2, 512), (2, 8, 4096),
                                               (8, 8, 4096)])
@pytest.mark.parametrize("round_tokens", [0, 128])
@pytest.mark.parametrize("hierarchical", [False, True])
def test_the_model_is_the_librarys_live_layout(nodes, gpus, tokens, round_tokens, hierarchical):
    """The rail staging and the window the model computes are what the library reports for the same group now
    (nccl.ep.query_group_info: ncclEpGroupInfoQuery, host arithmetic), flat and hierarchical, one round and rounds of
    128: a change of the library's layout fails here until the model follows it. Hidden 7168 bf16, top-8 of 256."""
    pytest.importorskip("torch")  # nccl.ep's config helper sizes rows with torch
    import nccl.ep as ep

    info = ep.query_group_info(nodes * gpus, gpus, num_experts=256, max_tokens_per_rank=tokens,
                               max_token_bytes=7168 * 2, max_topk=8, rail_round_tokens=round_tokens,
                               ht_hierarchical=hierarchical)
    hier = hierarchical and gpus > 1  # one GPU a domain: the hierarchical exchange is the flat one
    assert info["rail_hierarchical"] == int(hier)
    staging = m.ht_hier_staging_bytes if hier else m.ht_staging_bytes
    assert info["rail_staging_bytes"] == staging(nodes, gpus, 7168, 8, 256, tokens, round_tokens)["rail_staging_bytes"]
    assert info["window_bytes"] == m.ht_window_bytes(nodes, gpus, 7168, 8, 256, tokens, hier)["window_bytes"]
