"""bench/ep_model.py's expected hit counts against sampling the routing it assumes (CPU, no torch needed)."""

import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import ep_model  # noqa: E402


def _sample(nodes, gpus, experts, k, node_limit, draws, seed):
    rng = random.Random(seed)
    per_node, per_gpu = experts // nodes, experts // (nodes * gpus)
    m = nodes if node_limit <= 0 else min(node_limit, nodes)
    other_nodes = own_gpus = forward = arrivals = 0
    for _ in range(draws):
        chosen = rng.sample(range(nodes), m)
        pool = [e for n in chosen for e in range(n * per_node, (n + 1) * per_node)]
        picked = rng.sample(pool, k)
        node_of = {e // per_node for e in picked}
        gpus_hit = {e // per_gpu for e in picked}  # global GPU ids; the sender is GPU 0 of node 0
        other_nodes += len(node_of - {0})
        own_gpus += len({g for g in gpus_hit if g // gpus == 0} - {0})
        for n in node_of - {0}:  # the rail receiver is the GPU with the sender's local index (0) on node n
            arrivals += 1
            forward += len({g for g in gpus_hit if g // gpus == n} - {n * gpus})
    return other_nodes / draws, own_gpus / draws, forward / max(1, arrivals)


@pytest.mark.parametrize("nodes,gpus,experts,k,limit", [(2, 8, 256, 8, 0), (4, 8, 256, 8, 4), (8, 8, 256, 8, 4),
                                                       (16, 8, 256, 8, 0), (4, 2, 32, 3, 2)])
def test_expected_hits_match_sampling(nodes, gpus, experts, k, limit):
    h = ep_model.expected_hits(nodes, gpus, experts, k, limit)
    other, own, fwd = _sample(nodes, gpus, experts, k, limit, 20000, nodes * 131 + k)
    assert h["other_nodes"] == pytest.approx(other, rel=0.03, abs=0.01)
    assert h["own_node_gpus"] == pytest.approx(own, rel=0.03, abs=0.01)
    assert h["forward_per_arrival"] == pytest.approx(fwd, rel=0.03, abs=0.01)


def test_one_node_has_no_rail_traffic():
    r = ep_model.predict(1, 8, 4096, 7168, 8, 256, 7500, 14336, 340, 50, 25)
    assert r["dispatch"]["rail_bytes"] == 0 and r["dispatch"]["bound"] == "nvlink"
