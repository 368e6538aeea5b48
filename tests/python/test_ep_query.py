"""nccl.ep.query_group_info on the CPU (ncclEpGroupInfoQuery: host arithmetic, the library loaded, no GPU): what a
group would report before it exists, against the model of bench/ep_internode_model.py at production sizes and
against what ep_bench's groups reported on one H200. Needs torch (skipped without it)."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import nccl.ep as ep  # noqa: E402  (after torch: one libnccl in the process, torch's)

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)
import ep_internode_model as m  # noqa: E402

_ENV = ("NCCL_EXT_RAIL_ROUND_TOKENS", "NCCL_EXT_LSA_DOMAIN_SIZE", "NCCL_EXT_HT_HIERARCHICAL")
pytestmark = pytest.mark.skipif(any(os.environ.get(v) for v in _ENV), reason="the expected sizes are the defaults")


def _query(nodes, gpus, tokens, **kwargs):
    args = dict(num_experts=256, max_tokens_per_rank=tokens, hidden=7168, max_topk=8)
    args.update(kwargs)
    return ep.query_group_info(nodes * gpus, gpus, **args)


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_the_window_and_the_rail_staging_at_scale_are_the_models(nodes):
    info = _query(nodes, 8, 4096)
    assert info["n_domains"] == nodes and info["domain_size"] == 8
    assert info["window_bytes"] == m.ht_window_bytes(nodes, 8, 7168, 8, 256, 4096)["window_bytes"]
    want = m.ht_staging_bytes(nodes, 8, 7168, 8, 256, 4096)["rail_staging_bytes"] if nodes > 1 else 0
    assert info["rail_staging_bytes"] == want
    assert info["rail_round_tokens"] == (m.DEFAULT_RAIL_ROUND_TOKENS if nodes > 1 else 4096)


@pytest.mark.parametrize("gpus", [8, 16, 32, 64])
def test_a_receive_cap_sizes_the_window_as_the_model(gpus):
    # One NVLink domain of `gpus`, a cap of twice a rank's mean load under uniform top-8 routing (the table
    # nccl_ext_info prints): the library's window is the model's, and past 16 GPUs it is several times smaller.
    local, miss = 256 // gpus, 1.0
    for i in range(8):
        miss *= (256 - local - i) / (256 - i)
    cap = int(2 * gpus * 4096 * (1 - miss))
    whole, capped = _query(1, gpus, 4096), _query(1, gpus, 4096, max_recv_rows_per_rank=cap)
    assert capped["window_bytes"] == m.ht_window_bytes(1, gpus, 7168, 8, 256, 4096, recv_cap=cap)["window_bytes"]
    assert whole["window_bytes"] / capped["window_bytes"] >= {8: 1.0, 16: 1.5, 32: 2.8, 64: 5.4}[gpus]


def test_a_receive_cap_across_domains_is_the_models():
    # 8 nodes of 8 GPUs, the cap of the 64-GPU row above (twice a rank's mean load): the window is the model's and
    # 5.4x smaller; the rail staging (an inbox beside each outbox, half its size) is the model's, 1.5x the uncapped.
    miss = 1.0
    for i in range(8):
        miss *= (252 - i) / (256 - i)
    cap = int(2 * 64 * 4096 * (1 - miss))
    whole, capped = _query(8, 8, 4096), _query(8, 8, 4096, max_recv_rows_per_rank=cap)
    assert capped["window_bytes"] == m.ht_window_bytes(8, 8, 7168, 8, 256, 4096, recv_cap=cap)["window_bytes"]
    assert whole["window_bytes"] / capped["window_bytes"] > 5.4
    staging = m.ht_staging_bytes(8, 8, 7168, 8, 256, 4096, recv_cap=cap)["rail_staging_bytes"]
    assert capped["rail_staging_bytes"] == staging
    assert capped["rail_staging_bytes"] == pytest.approx(1.5 * whole["rail_staging_bytes"], rel=0.01)


def test_a_receive_cap_is_refused_where_it_cannot_hold():
    with pytest.raises(ep.NcclInvalidUsage, match="across NVLink domains the receive cap takes the flat exchange"):
        _query(2, 8, 4096, max_recv_rows_per_rank=1000, ht_hierarchical=True)
    with pytest.raises(ep.NcclInvalidUsage, match="belongs to the High-Throughput mode"):
        _query(1, 8, 128, algorithm="low_latency", max_recv_rows_per_rank=1000)
    with pytest.raises(ep.NcclInvalidArgument, match="recv_overflow='ignore': expected one of drop, error"):
        _query(1, 8, 4096, max_recv_rows_per_rank=1000, recv_overflow="ignore")
    with pytest.raises(ep.NcclInvalidArgument, match="max_recv_rows_per_rank -5 < 0"):
        _query(1, 8, 4096, max_recv_rows_per_rank=-5)


def test_groups_past_64_ranks_are_refused():
    # nccl_ep's groups take at most 64 ranks (views.h kMaxRanks): 16 nodes of 8 are beyond them today.
    with pytest.raises(ep.NcclInvalidArgument, match="n_ranks 128 not in"):
        _query(16, 8, 4096)


def test_a_staging_budget_picks_the_round():
    whole = _query(2, 8, 4096)["rail_staging_bytes"]
    info = _query(2, 8, 4096, rail_staging_bytes_max=whole // 4)
    larger = _query(2, 8, 4096, rail_round_tokens=info["rail_round_tokens"] + 1)
    assert info["rail_staging_bytes"] <= whole // 4 < larger["rail_staging_bytes"]
    with pytest.raises(ep.NcclInvalidArgument, match="rail_staging_bytes_max 1000"):
        _query(2, 8, 4096, rail_staging_bytes_max=1000)
    with pytest.raises(ep.NcclInvalidArgument, match="not a multiple"):
        ep.query_group_info(3, 1, num_experts=256, max_tokens_per_rank=8, hidden=64)


def test_what_ep_bench_groups_reported_on_a_gpu():
    # gpu-check-20261203T193135Z.json: ep_ht_bench[nodes] (one-GPU nodes: LSA teams of one), 512 tokens a rank.
    with open(os.path.join(BENCH, "results", "gpu-check-20261203T193135Z.json")) as f:
        runs = json.load(f)["runs"]
    seen = 0
    for run in runs:
        if run["name"] != "ep_ht_bench[nodes]":
            continue
        for row in run["results"]:
            info = ep.query_group_info(row["nranks"], 1, num_experts=row["experts"],
                                       max_tokens_per_rank=row["max_tokens_per_rank"], hidden=row["hidden"],
                                       max_topk=row["topk"])
            for key in ("window_bytes", "rail_staging_bytes", "rail_round_tokens", "rail_messages_per_domain"):
                assert info[key] == row[key], (key, row["nranks"])
            assert info["rail_dispatch_bytes"] == row["rail_fixed_bytes_per_peer"] or row["what"] != "ep_dispatch"
            seen += 1
    assert seen == 8


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_low_latency_rail_slices_are_the_models(nodes):
    # The Low-Latency exchange's fixed per-peer messages (128 tokens, hidden 7168 bf16, top-8 of 256): the model's
    # ll_fixed_slice_bytes, the rank-row combine and the owner-weighted (expert) combine.
    info = _query(nodes, 8, 128, algorithm="low_latency")
    expert = m.ll_fixed_slice_bytes(nodes, 8, 256, 8, 7168, 128)
    rank = m.ll_fixed_slice_bytes(nodes, 8, 256, 8, 7168, 128, combine="rank")
    assert info["rail_dispatch_bytes"] == expert["dispatch_per_peer"]
    assert info["rail_combine_owner_bytes"] == expert["combine_per_peer"]
    assert info["rail_combine_bytes"] == rank["combine_per_peer"]
    assert info["rail_messages_per_domain"] == 8 and info["rail_staging_bytes"] > 0


_OVERLAP_QUERY = """
import json, torch, nccl.ep as ep
args = dict(num_experts=256, max_tokens_per_rank=512, hidden=7168, max_topk=8)
print(json.dumps([ep.query_group_info(16, 8, **args), ep.query_group_info(8, 8, **args),
                  ep.query_group_info(16, 8, algorithm="low_latency", **dict(args, max_tokens_per_rank=128))]))
"""


@pytest.mark.parametrize("hierarchical", ["0", "1"])
def test_the_overlap_takes_the_flat_and_the_hierarchical_exchange(hierarchical):
    # NCCL_EXT_RAIL_OVERLAP=1 (read once per process: a child process) gives an HT group across domains its side
    # stream, flat or hierarchical (its whole send half beside the rounds); one domain and Low-Latency have none.
    env = dict(os.environ, NCCL_EXT_RAIL_OVERLAP="1", NCCL_EXT_HT_HIERARCHICAL=hierarchical)
    out = subprocess.run([sys.executable, "-c", _OVERLAP_QUERY], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    across, inside, low_latency = json.loads(out.stdout.strip().splitlines()[-1])
    assert across["n_domains"] == 2 and across["rail_hierarchical"] == int(hierarchical)
    assert across["rail_overlapped"] == 1
    assert inside["n_domains"] == 1 and inside["rail_overlapped"] == 0
    assert low_latency["n_domains"] == 2 and low_latency["rail_overlapped"] == 0


_SWITCHES = """
import json, sys
import torch  # noqa: F401 (one libnccl in the process, torch's)
import nccl.ep as ep
out = {}
for hier in (None, True, False):
    for overlap in (None, True, False):
        info = ep.query_group_info(8, 4, num_experts=64, max_tokens_per_rank=256, hidden=1024,
                                   ht_hierarchical=hier, rail_overlap=overlap)
        out["%s/%s" % (hier, overlap)] = [info["rail_hierarchical"], info["rail_overlapped"]]
print(json.dumps(out))
"""


@pytest.mark.parametrize("env_on", [False, True])
def test_a_config_switch_wins_over_the_environment_which_fills_only_what_is_left(env_on):
    """env.h's one rule, for the hierarchical HT and the rail overlap (2 domains of 4 ranks): True / False decide
    whatever the environment says; None takes NCCL_EXT_HT_HIERARCHICAL / NCCL_EXT_RAIL_OVERLAP, else off."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV + ("NCCL_EXT_RAIL_OVERLAP",)}
    if env_on:
        env.update(NCCL_EXT_HT_HIERARCHICAL="1", NCCL_EXT_RAIL_OVERLAP="1")
    r = subprocess.run([sys.executable, "-c", _SWITCHES], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for key, (hier, overlapped) in got.items():
        h, o = key.split("/")
        assert hier == {"None": int(env_on), "True": 1, "False": 0}[h], (key, got)
        assert overlapped == {"None": int(env_on), "True": 1, "False": 0}[o], (key, got)
