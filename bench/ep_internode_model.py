"""An analytic model of nccl_ep dispatch and combine across NVLink domains (issue 12, "Plan past the machines we
have"): expected bytes per rank on each link class, and the time those bytes take at given link rates, for N nodes
of G GPUs, each node one NVLink domain. A prediction, not a measurement: its Low-Latency bytes and times were
checked against one-GPU-node runs at their own rate, its High-Throughput rail bytes at one GPU a domain (where the
hierarchical protocol is the flat one built) too; the hierarchy's NVLink half is unvalidated (docs/PERFORMANCE.md,
"nccl_ep across nodes: analytic model").

    python3 bench/ep_internode_model.py [--nodes 2,4,8,16] [--gpus-per-node 8] [--experts 256] [--topk 8]
        [--hidden 7168] [--ht-tokens 4096] [--ll-tokens 128] [--modes ht,ll] [--dtypes bf16,fp8]
        [--ll-combine expert|rank|both] [--ll-dispatch rank|expert] [--node-limit M] [--rail-gbs 50] [--nvlink-gbs 296]
        [--ht-latency-us 25] [--ll-latency-us 12.7] [--no-compare] [--json FILE]

Routing: each token of a rank picks k distinct experts uniformly among E (with --node-limit M: first M of the N
domains uniformly, then k distinct experts uniformly among theirs); experts are spread evenly in contiguous blocks,
E_r = E / (N G) per rank, E_d = E / N per domain. Every rank has T tokens, so every rank's expectation is the same
and the expected bytes a rank receives on a link class equal the bytes it sends.

    P(a given domain holds >= 1 of the token's experts) p_dom  = 1 - C(E - E_d, k) / C(E, k)
    P(a given rank   holds >= 1 of the token's experts) p_rank = 1 - C(E - E_r, k) / C(E, k)
    (with --node-limit M: p = (M / N) (1 - C(M E_d - hosted, k) / C(M E_d, k)), hosted = E_d or E_r)

High-Throughput, hierarchical (issue 12): one rail row per (token, remote domain hit), to the rank with the sender's
local index there, which forwards it over NVLink to the other ranks of its domain that host the token's experts;
inside the sender's own domain a row goes over NVLink straight to each other rank hit. Rows per token of a rank:

    rail   = (N - 1) p_dom
    NVLink = (G - 1) p_rank                       direct, own domain
           + (N - 1) p_dom x (G - 1) p_rank / p_dom   forwarding the rows that arrive over the rail
           = N (G - 1) p_rank
    Combine mirrors dispatch (reduced inside the domain before the rail hop: one row per (token, remote domain)).

Low-Latency (DeepEP-style, no hierarchy): one row per (token, destination rank), straight to it.

    dispatch rail = (N - 1) G p_rank, NVLink = (G - 1) p_rank
    combine, one row per (token, expert) (DeepEP's owner-weighted API): rail = k (E - E_d) / E,
             NVLink = k (E_d - E_r) / E; per (token, rank) ("rank"): as dispatch.

Low-Latency as nccl_ep implements it across domains today (--ll-fixed-slices M): every call moves, to and from
every rank of another domain, fixed slices sized for M = max_tokens_per_rank rows whatever the routing
(docs/ARCHITECTURE.md, "Low-Latency across NVLink domains"; the byte counts follow nccl_ep's layoutGroup, which
ncclEpGroupGetInfo reports):

    dispatch per remote rank = header + M (rowStride + metaBytes + 8 slices)
    combine  per remote rank = M (rowStride + 8 slices), x min(top-k, E_r) with the owner-weighted combine
    (rowStride = 2H bf16 rows, slices = ceil(rowStride / 512), metaBytes = 16-aligned 12 + 12 k + 4 rowStride / 128,
     header = 16-aligned 12 + 4 E_r)

High-Throughput as nccl_ep implements it across domains today: flat, not hierarchical (a token goes over the rail
once per destination rank). An EXACT handle's eager calls send the rows the routing fills (--ht-flat: the expected
rows per (token, destination rank)); worst-case handles and captured calls send fixed slices of M =
max_tokens_per_rank rows to and from every rank of another domain (--ht-fixed-slices M; docs/ARCHITECTURE.md,
"High-Throughput across NVLink domains"):

    dispatch per remote rank = M (rowStride + metaBytes), metaBytes = 16-aligned 12 + 12 k + 4 max(1, rowStride / 128)
    combine  per remote rank = 8 M + M rowStride              (NVLink: the rows to the own domain's other ranks)

in rounds of C = rail_round_tokens slots (default 1024), a message per region and round, so that the exchange's
staging (--ht-staging: one outbox per remote rank, C rows of each region) stays C rows a peer:

    staging per rank = (N - 1) G x (count row + C (2 rowStride + metaBytes + 8)), each region 16-aligned

The hierarchical HT as built (relayed exchanges, the mixed one-GPU test mode, NCCL_EXT_HT_HIERARCHICAL=1;
--ht-hier-fixed M): M fixed rail rows to and from each other domain's rank of my index, whatever the routing:

    dispatch per remote domain = M hierRow, hierRow = 16-aligned rowStride + 20 + 4 G + 12 k + 4 max(1, rowStride / 128)
    combine  per remote domain = M (rowStride + 16)            (a partial and its tail; NVLink: the expected rows)

in rounds of C rail positions (--ht-staging prints its staging too: the rail rows of a round, out and in, for every
domain, and one inbox per rank for the handle's count rows; its outboxes, one per rank in the window, hold the count
row and whole combine slices):

    staging per rank = R x count row + 2 N C (hierRow + rowStride + 16)   (count row: R + E + chunks + 1 + N int32)

and the symmetric window (--ht-staging prints it too, ht_window_bytes), whose staging regions hold max_tokens rows
from every rank whatever the round:

    window per rank ~ R M (2 rowStride + metaBytes + 8)                (plus flags, count rows; hierarchical: outboxes)

Bytes = T x rows x row bytes (bf16: 2H; fp8: H + 4 H/128, the e4m3 payload and fp32 scales per 128 channels; plus
--meta-bytes per row, 0 by default). Time per op: rail bytes / rail rate and NVLink bytes / NVLink rate, combined
overlapped (the larger) and serial (the sum), plus a fixed latency per call. GB = 1e9 bytes.

Not modelled: congestion (NVSwitch, the network fabric, incast at a receiver), NIC efficiency below the given rate,
load imbalance (skewed routing, per-rank variance: these are expectations), launch and synchronisation overheads
beyond the one fixed term, the metadata and count exchanges, and the receivers' copies into their outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import comb

# --- Default rates and fixed costs, each from a measured or cited figure -------------------------------------------
# Rail: one 400 Gb/s NIC per GPU = 50 GB/s per direction (issue 12; shared/reference/ep-anchors.md §2.1, "ConnectX-7
# 400 Gb/s ~50 GB/s per direction", DeepEP docs/legacy.md).
RAIL_GBS = 50.0
# NVLink per GPU: DeepEP V1's intranode BF16 dispatch at 128 SMs on our 2 x H200 (NV18) moves about 58.5 MB across
# NVLink per direction in 197.9 us, "about 296 GB/s" (shared/reference/deepep-2xH200.md, "Byte-counting
# conventions"). The copy-engine peer copy on the same machine reached 391.4 GB/s (shared/reference/
# baseline_2xH200.jsonl, peer_copy_ce_0to1): pass --nvlink-gbs 391.4 for the link's own ceiling.
NVLINK_GBS = 296.0
# A fixed cost per High-Throughput call: about 25 us for nccl_ep HT on 2 x H200 at 132 SMs, the intercept of time
# against NVLink bytes from 4096 to 16384 tokens (docs/PERFORMANCE.md, "What limits the rest";
# bench/results/ep_bench-20261130T001005Z.json).
HT_LATENCY_US = 25.0
# A fixed cost per Low-Latency call: nccl_ep LL dispatch of 1 token on 1 H200, RANK_MAJOR bf16, 12.7 us (combine:
# 9.8 us) (docs/PERFORMANCE.md, Low-Latency section; bench/results/gpu-check-20261201T180653Z.json). No network
# round trip is in it.
LL_LATENCY_US = 12.7
# nccl_ep's default round of the flat HT exchange (ncclEpGroupConfig_t::rail_round_tokens, nccl_ep/src/views.h
# kDefaultRailRoundTokens): a layout constant of the library, not a measured figure.
DEFAULT_RAIL_ROUND_TOKENS = 1024
# DeepEP's own measured NVLink peak on H800 (~160 GB/s achievable of 200 nominal; ep-anchors.md §2.1, DeepEP#16 and
# docs/legacy.md): used beside the H200 rate when comparing with DeepEP V1's H800 numbers.
H800_NVLINK_GBS = 160.0

# --- Published internode numbers (shared/reference/ep-anchors.md §2.2, §2.3, §2.5) --------------------------------
# HT: GB/s in DeepEP's internode "RDMA" convention: (token, destination node) pairs x row bytes, the sender's own
# node included, over the time. 8 GPUs a node, hidden 7168, top-8, FP8 dispatch, BF16 combine.
PUBLISHED_HT = [
    {"system": "DeepEP V1 normal", "hw": "H800 + CX7", "nodes": 2, "tokens": 4096, "experts": 256,
     "node_limit": 4, "dispatch_gbs": 43.0, "combine_gbs": 43.0, "h800": True,
     "source": "ep-anchors.md 2.2 (DeepEP docs/legacy.md), EP16"},
    {"system": "DeepEP V1 normal", "hw": "H800 + CX7", "nodes": 4, "tokens": 4096, "experts": 256,
     "node_limit": 4, "dispatch_gbs": 58.0, "combine_gbs": 57.0, "h800": True,
     "source": "ep-anchors.md 2.2 (DeepEP docs/legacy.md), EP32"},
    {"system": "DeepEP V1 normal", "hw": "H800 + CX7", "nodes": 8, "tokens": 4096, "experts": 256,
     "node_limit": 4, "dispatch_gbs": 51.0, "combine_gbs": 50.0, "h800": True,
     "source": "ep-anchors.md 2.2 (DeepEP docs/legacy.md), EP64"},
    {"system": "DeepEP V2", "hw": "SM90 + CX7", "nodes": 2, "tokens": 8192, "experts": 256,
     "node_limit": 0, "dispatch_gbs": 90.0, "combine_gbs": 81.0, "h800": False,
     "source": "ep-anchors.md 2.3 (DeepEP README), EP 8x2, 12 SMs"},
    {"system": "DeepEP V2", "hw": "SM90 + CX7", "nodes": 4, "tokens": 8192, "experts": 256,
     "node_limit": 0, "dispatch_gbs": 61.0, "combine_gbs": 61.0, "h800": False,
     "source": "ep-anchors.md 2.3 (DeepEP README), EP 8x4, 6 SMs"},
]
# LL: DeepEP V1 low-latency kernels, H800 + CX7, pure RDMA, 128 tokens, hidden 7168, top-8, 256 experts, FP8
# dispatch, BF16 combine: latency in us. NCCL EP v0.1 (H100, BF16 dispatch and combine, same shape): GB/s over
# k x 2H bytes per token, turned into us here as 128 x 8 x 14336 B / GB/s (ep-anchors.md 2.5).
PUBLISHED_LL = [
    {"system": "DeepEP V1 LL", "hw": "H800 + CX7, pure RDMA", "nodes": n, "dispatch_dtype": "fp8",
     "dispatch_us": d, "combine_us": c, "source": "ep-anchors.md 2.2 (DeepEP docs/legacy.md), EP%d" % (8 * n)}
    for n, d, c in ((1, 77.0, 114.0), (2, 118.0, 195.0), (4, 155.0, 273.0), (8, 173.0, 314.0), (16, 192.0, 369.0),
                    (32, 194.0, 360.0))
] + [
    {"system": "NCCL EP v0.1 LL", "hw": "H100", "nodes": n, "dispatch_dtype": "bf16",
     "dispatch_us": 128 * 8 * 14336 / (d * 1e3), "combine_us": 128 * 8 * 14336 / (c * 1e3),
     "dispatch_gbs": d, "combine_gbs": c, "source": "ep-anchors.md 2.5 (nccl_ep README), %d GPUs" % (8 * n)}
    for n, d, c in ((2, 76.7, 73.0), (4, 53.6, 50.0), (8, 48.8, 43.8))
]


def row_bytes(dtype: str, hidden: int, meta: int = 0) -> int:
    """Bytes of one token row: bf16 = 2H; fp8 = H (e4m3) + 4 bytes (fp32 scale) per 128 channels; + meta."""
    if dtype == "bf16":
        return 2 * hidden + meta
    if dtype == "fp8":
        if hidden % 128:
            raise ValueError("fp8 rows need hidden %% 128 == 0 (one scale per 128 channels), got %d" % hidden)
        return hidden + 4 * (hidden // 128) + meta
    raise ValueError("dtype must be bf16 or fp8, got %r" % dtype)


def p_hit(pool: int, hosted: int, k: int) -> float:
    """P(k distinct experts drawn uniformly from `pool` include at least one of `hosted` given ones)."""
    if hosted <= 0:
        return 0.0
    return 1.0 - comb(pool - hosted, k) / comb(pool, k)  # comb(n, k) = 0 when k > n: every draw hits


def _check(nodes: int, gpus: int, experts: int, k: int, node_limit: int) -> int:
    if nodes < 1 or gpus < 1:
        raise ValueError("nodes and gpus per node must be >= 1")
    if experts % (nodes * gpus):
        raise ValueError("experts (%d) must split evenly over %d x %d ranks" % (experts, nodes, gpus))
    m = nodes if node_limit <= 0 else min(node_limit, nodes)
    if not 1 <= k <= m * (experts // nodes):
        raise ValueError("top-k %d must be in [1, %d]" % (k, m * (experts // nodes)))
    return m


def probabilities(nodes: int, gpus: int, experts: int, k: int, node_limit: int = 0) -> dict:
    """p_dom and p_rank for one given domain / rank, seen from any token (its own domain and rank included)."""
    m = _check(nodes, gpus, experts, k, node_limit)
    e_d, e_r = experts // nodes, experts // (nodes * gpus)
    chosen = m / nodes  # P(a given domain is among the token's m), 1 without a node limit
    return {"p_dom": chosen * p_hit(m * e_d, e_d, k), "p_rank": chosen * p_hit(m * e_d, e_r, k),
            "experts_per_domain": e_d, "experts_per_rank": e_r, "domains_per_token": m}


def ht_rows(nodes: int, gpus: int, experts: int, k: int, node_limit: int = 0) -> dict:
    """Expected rows per token of a rank, hierarchical High-Throughput dispatch (combine: the same, mirrored)."""
    p = probabilities(nodes, gpus, experts, k, node_limit)
    rail = (nodes - 1) * p["p_dom"]
    direct = (gpus - 1) * p["p_rank"]
    # Rows arriving over the rail = rows leaving (every rank alike); each is forwarded to the other ranks of this
    # domain hit, (G - 1) p_rank / p_dom of them given that the domain is hit.
    forward = (nodes - 1) * (gpus - 1) * p["p_rank"]
    return {"rail": rail, "nvlink_direct": direct, "nvlink_forward": forward, "nvlink": direct + forward,
            "domains_hit_incl_own": nodes * p["p_dom"], **p}


def ll_rows(nodes: int, gpus: int, experts: int, k: int, node_limit: int = 0, combine: str = "expert",
            all_rail: bool = False, dispatch: str = "rank") -> dict:
    """Expected rows per token of a rank, Low-Latency (no hierarchy: straight to each destination). dispatch and
    combine each "rank" (one row per (token, destination rank): our dispatch, NCCL EP's) or "expert" (one row per
    (token, expert): DeepEP V1's LL dispatch, and the owner-weighted combine of DeepEP's API, the default for
    combine). all_rail: the own domain's ranks are reached over the rail too (DeepEP's "pure RDMA" LL runs)."""
    p = probabilities(nodes, gpus, experts, k, node_limit)
    m = p["domains_per_token"]
    per_rank = ((nodes - 1) * gpus * p["p_rank"], (gpus - 1) * p["p_rank"])
    # Each of the k experts is (marginally) uniform over the m * E_d the token may pick from: it lies on the sender's
    # own rank, its own domain's other ranks, or another domain in proportion to their experts.
    pool = m * p["experts_per_domain"]
    own_dom = (m / nodes) * p["experts_per_domain"] / pool  # P(an expert of the token is in its own domain) = 1/N
    own_rank = (m / nodes) * p["experts_per_rank"] / pool
    per_expert = (k * (1 - own_dom), k * (own_dom - own_rank))
    kinds = {"rank": per_rank, "expert": per_expert}
    if dispatch not in kinds or combine not in kinds:
        raise ValueError("LL dispatch and combine rows must be rank or expert, got %r / %r" % (dispatch, combine))
    (d_rail, d_nvl), (c_rail, c_nvl) = kinds[dispatch], kinds[combine]
    if all_rail:
        d_rail, d_nvl, c_rail, c_nvl = d_rail + d_nvl, 0.0, c_rail + c_nvl, 0.0
    return {"dispatch_rail": d_rail, "dispatch_nvlink": d_nvl, "combine_rail": c_rail, "combine_nvlink": c_nvl, **p}


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def ll_fixed_slice_bytes(nodes: int, gpus: int, experts: int, k: int, hidden: int, max_tokens: int,
                         combine: str = "expert") -> dict:
    """Rail bytes per rank and call of nccl_ep's Low-Latency exchange across domains (fixed slices: see the module
    docstring), for bf16 rows of `hidden` columns in a group of max_token_bytes = 2 hidden and max_topk = k."""
    row = 2 * hidden
    slices = -(-row // 512)
    meta = _align(8 + 12 * k + 4 * max(1, row // 128) + 4, 16)
    header = _align(12 + 4 * (experts // (nodes * gpus)), 16)
    remote = (nodes - 1) * gpus
    cols = min(k, max(1, experts // (nodes * gpus))) if combine == "expert" else 1
    flags = max_tokens * 8 * slices  # a call's regions lie end to end, each 16-byte aligned: one message a peer
    dispatch = header + _align(flags, 16) + max_tokens * (row + meta)
    comb = _align(cols * flags, 16) + cols * max_tokens * row
    return {"dispatch_rail_bytes": remote * dispatch, "combine_rail_bytes": remote * comb,
            "dispatch_per_peer": dispatch, "combine_per_peer": comb, "remote_ranks": remote}


def ht_fixed_slice_bytes(nodes: int, gpus: int, hidden: int, k: int, max_tokens: int) -> dict:
    """Rail bytes per rank and call of nccl_ep's flat High-Throughput exchange across domains (fixed slices: see the
    module docstring), for a group of max_token_bytes = 2 hidden and max_topk = k."""
    row = 2 * hidden
    meta = _align(8 + 12 * k + 4 * max(1, row // 128) + 4, 16)
    remote = (nodes - 1) * gpus
    dispatch = max_tokens * (row + meta)
    comb = 8 * max_tokens + max_tokens * row  # a message per region (flags, rows): no padding between them
    return {"dispatch_rail_bytes": remote * dispatch, "combine_rail_bytes": remote * comb,
            "dispatch_per_peer": dispatch, "combine_per_peer": comb, "remote_ranks": remote}


def ht_staging_bytes(nodes: int, gpus: int, hidden: int, k: int, experts: int, max_tokens: int,
                     round_tokens: int = 0, recv_cap: int = 0) -> dict:
    """Device memory a rank holds for nccl_ep's flat High-Throughput exchange across domains (ncclEpGroupInfo_t::
    rail_staging_bytes): one outbox per rank of another domain, its regions 16-aligned one after another: the
    handle's count row (R + E + chunks + 1 int32, chunks of 32 tokens), then the dispatch rows and metadata and the
    combine flags and rows of one round's C slots, C = round_tokens (0: the library's default, 1024), at most
    max_tokens (one round). A receive cap (max_recv_rows_per_rank) adds a count per local expert to the count row
    and an inbox per rank of another domain (a round lands there, then is placed), which holds one kind's regions at
    a time: a round of dispatch rows and metadata, or of combine flags and rows, the larger. For a group of
    max_token_bytes = 2 hidden and max_topk = k."""
    row = 2 * hidden
    meta = _align(8 + 12 * k + 4 * max(1, row // 128) + 4, 16)
    ranks, remote = nodes * gpus, (nodes - 1) * gpus
    c = min(max_tokens, round_tokens or DEFAULT_RAIL_ROUND_TOKENS)
    count_row = 4 * (ranks + experts + -(-max_tokens // 32) + 1 + (experts // ranks if recv_cap else 0))
    outbox = sum(_align(b, 16) for b in (count_row, c * row, c * meta, 8 * c, c * row))
    inbox = 0
    if recv_cap:
        inbox = max(sum(_align(b, 16) for b in (c * row, c * meta)), sum(_align(b, 16) for b in (8 * c, c * row)))
    return {"rail_staging_bytes": remote * (outbox + inbox), "outbox_bytes": outbox, "inbox_bytes": inbox,
            "round_tokens": c, "rounds_fixed": -(-max_tokens // c), "remote_ranks": remote}


# The hierarchical combine's partial carries a tail (rail/view.h HierCombTail: the call's number, the position).
HIER_COMB_TAIL = 16


def _hier_row(row: int, gpus: int, k: int) -> int:
    """HierRow (nccl_ep): the row, then the call's number and the counts (16), the position (4), a slot per rank of the
    domain, expert ids, weights and indices per column, the fp8 scales; 16-aligned."""
    return _align(row + 20 + 4 * gpus + 12 * k + 4 * max(1, row // 128), 16)


def ht_hier_staging_bytes(nodes: int, gpus: int, hidden: int, k: int, experts: int, max_tokens: int,
                          round_tokens: int = 0) -> dict:
    """Device memory a rank holds for nccl_ep's hierarchical High-Throughput exchange (NCCL_EXT_HT_HIERARCHICAL=1,
    domains of several ranks): outside the window (ncclEpGroupInfo_t::rail_staging_bytes) one inbox per rank for the
    handle's count rows (R + E + chunks + 1 + N int32, 16-aligned) and the rail rows of one round of C positions,
    C = round_tokens (0: the library's default, 1024) at most max_tokens: dispatch rows and combine partials, each with
    its tail, out and in, for every domain (group.h railStagingBytes); in the window, one outbox per
    rank (the relays reduce their domain's combine rows there at any slot): the count row, max_tokens combine flags
    and rows. For a group of max_token_bytes = 2 hidden and max_topk = k."""
    row = 2 * hidden
    ranks = nodes * gpus
    c = min(max_tokens, round_tokens or DEFAULT_RAIL_ROUND_TOKENS)
    count_row = _align(4 * (ranks + experts + -(-max_tokens // 32) + 1 + nodes), 16)
    rail_rows = 2 * nodes * c * (_hier_row(row, gpus, k) + row + HIER_COMB_TAIL)
    outbox = count_row + _align(8 * max_tokens, 16) + _align(max_tokens * row, 16)
    return {"rail_staging_bytes": ranks * count_row + rail_rows, "window_outbox_bytes": ranks * outbox,
            "round_tokens": c, "rounds_fixed": -(-max_tokens // c)}


def ht_window_bytes(nodes: int, gpus: int, hidden: int, k: int, experts: int, max_tokens: int,
                    hierarchical: bool = False, recv_cap: int = 0) -> dict:
    """A rank's symmetric window in High-Throughput (ncclEpGroupInfo_t::window_bytes; group.cc layoutGroup): the
    flags and the handle's exchange rows, then one staging region per source for dispatch rows, their metadata and
    combine rows, max_tokens rows each (R x max_tokens x (2 rowStride + metaBytes + 8) in all), each region aligned;
    with the hierarchical HT also its outboxes (one per rank: the count row, max_tokens combine flags and rows). For
    a group of max_token_bytes = 2 hidden and max_topk = k. The staging regions grow with R x max_tokens whatever the
    round: the rail's rounds bound only what crosses the rail. A receive cap (max_recv_rows_per_rank; across
    domains the flat exchange's, not the hierarchical one's) gives the dispatch staging min(cap, R x max_tokens)
    rows, the combine staging max_tokens x min(R, k), and the exchange row a count per local expert more."""
    row = 2 * hidden
    ranks = nodes * gpus
    if recv_cap > 0 and hierarchical and nodes > 1 and gpus > 1:
        raise ValueError("recv_cap: the hierarchical exchange takes none")
    capped = recv_cap > 0
    meta = _align(8 + 12 * k + 4 * max(1, row // 128) + 4, 16)
    chunks = -(-max_tokens // 32)
    ints = ranks + experts + chunks + 1 + (nodes if hierarchical and nodes > 1 and gpus > 1 else 0)
    ints += experts // ranks if capped else 0
    off = 0
    for _ in range(4):  # barrier flags, dispatch and combine done flags, clean flags
        off = _align(off + 8 * ranks, 256)
    off = _align(off + 4 * ranks * ints, 4096)  # the exchange rows
    slots = ranks * max_tokens
    recv_rows = min(recv_cap, slots) if capped else slots
    comb_rows = max_tokens * min(ranks, k) if capped else slots
    off = _align(off + 8 * comb_rows, 256)  # combine flags (no Low-Latency header)
    off = _align(off, 4096)  # (no Low-Latency dispatch flags)
    staging_start = off
    for region in (recv_rows * row, recv_rows * meta, comb_rows * row):  # dispatch rows, metadata, combine rows
        off = _align(off + region, 4096)
    staging = off - staging_start
    off = _align(off, 256)  # (no owner regions in High-Throughput)
    off = _align(off, 4096)
    outboxes = 0
    if hierarchical and nodes > 1 and gpus > 1:
        count_row = _align(4 * ints, 16)
        outboxes = ranks * (count_row + _align(8 * max_tokens, 16) + _align(max_tokens * row, 16))
        off = _align(off, 4096) + outboxes
    return {"window_bytes": off, "staging_region_bytes": staging, "outbox_bytes": outboxes}


def ht_hier_fixed_bytes(nodes: int, gpus: int, hidden: int, k: int, max_tokens: int) -> dict:
    """Rail bytes per rank and call of nccl_ep's hierarchical High-Throughput exchange as built (relayed exchanges:
    see the module docstring): M fixed rows to and from each other domain's rank of my index, for a group of
    max_token_bytes = 2 hidden and max_topk = k (rail/view.h HierRow, rail/rail.cc hierMessageBytes)."""
    row = 2 * hidden
    hier_row = _hier_row(row, gpus, k)
    remote = nodes - 1
    dispatch, comb = max_tokens * hier_row, max_tokens * (row + HIER_COMB_TAIL)
    return {"dispatch_rail_bytes": remote * dispatch, "combine_rail_bytes": remote * comb,
            "dispatch_per_peer": dispatch, "combine_per_peer": comb, "remote_domains": remote}


def op_time(rail_bytes: float, nvlink_bytes: float, rail_gbs: float, nvlink_gbs: float, latency_us: float) -> dict:
    """Time of one op from its bytes per rank: overlapped (max over the link classes) and serial (sum)."""
    rail_us = rail_bytes / (rail_gbs * 1e3) if rail_bytes else 0.0  # bytes / (GB/s * 1e9) in us
    nvl_us = nvlink_bytes / (nvlink_gbs * 1e3) if nvlink_bytes else 0.0
    return {"rail_us": rail_us, "nvlink_us": nvl_us, "overlapped_us": max(rail_us, nvl_us) + latency_us,
            "serial_us": rail_us + nvl_us + latency_us, "latency_us": latency_us,
            "bound": "rail" if rail_us >= nvl_us and rail_us > 0 else ("nvlink" if nvl_us > 0 else "latency")}


def predict(mode: str, nodes: int, gpus: int, tokens: int, hidden: int, k: int, experts: int, dtype: str,
            rail_gbs: float = RAIL_GBS, nvlink_gbs: float = NVLINK_GBS, latency_us: float | None = None,
            node_limit: int = 0, ll_combine: str = "expert", meta_bytes: int = 0, all_rail: bool = False,
            ll_dispatch: str = "rank", ll_fixed_slices: int = 0, ht_fixed_slices: int = 0,
            ht_flat: bool = False, ht_hier_fixed: int = 0) -> list:
    """Predicted dispatch and combine for one configuration: a list of two dicts (op = dispatch, combine), bytes
    per rank out (= in). dtype is the dispatch row's; combine rows are bf16. ll_fixed_slices M > 0: the rail bytes of
    nccl_ep's Low-Latency exchange as implemented (fixed slices of M rows per remote rank; bf16 only);
    ht_fixed_slices M > 0: the same for High-Throughput's flat exchange (rail bytes fixed, NVLink only to the own
    domain's other ranks, as Low-Latency's rank dispatch). ht_flat: High-Throughput's flat exchange with an EXACT
    handle's eager calls, which send the rows the routing fills: a row per (token, destination rank) over the rail,
    the expected rows, not fixed slices. ht_hier_fixed M > 0: the hierarchical protocol's rail bytes as built
    (M fixed rows to and from each remote domain; NVLink rows the protocol's expected ones)."""
    if mode not in ("ht", "ll"):
        raise ValueError("mode must be ht or ll, got %r" % mode)
    if latency_us is None:
        latency_us = HT_LATENCY_US if mode == "ht" else LL_LATENCY_US
    d_row, c_row = row_bytes(dtype, hidden, meta_bytes), row_bytes("bf16", hidden, meta_bytes)
    if mode == "ht":
        r = ht_rows(nodes, gpus, experts, k, node_limit)
        if all_rail:
            raise ValueError("all_rail is a Low-Latency variant")
        per_op = {"dispatch": (r["rail"], r["nvlink"], d_row), "combine": (r["rail"], r["nvlink"], c_row)}
    else:
        r = ll_rows(nodes, gpus, experts, k, node_limit, ll_combine, all_rail, ll_dispatch)
        per_op = {"dispatch": (r["dispatch_rail"], r["dispatch_nvlink"], d_row),
                  "combine": (r["combine_rail"], r["combine_nvlink"], c_row)}
    fixed = None
    if ll_fixed_slices:
        if mode != "ll" or dtype != "bf16" or ll_fixed_slices < tokens:
            raise ValueError("ll_fixed_slices: Low-Latency bf16 with max_tokens >= tokens")
        fixed = ll_fixed_slice_bytes(nodes, gpus, experts, k, hidden, ll_fixed_slices, ll_combine)
    if ht_flat and mode != "ht":
        raise ValueError("ht_flat: a High-Throughput variant")
    if ht_fixed_slices:
        if mode != "ht" or ht_fixed_slices < tokens:
            raise ValueError("ht_fixed_slices: High-Throughput with max_tokens >= tokens")
        fixed = ht_fixed_slice_bytes(nodes, gpus, hidden, k, ht_fixed_slices)
    if ht_hier_fixed:
        if mode != "ht" or ht_hier_fixed < tokens or ht_fixed_slices or ht_flat:
            raise ValueError("ht_hier_fixed: High-Throughput's hierarchical exchange with max_tokens >= tokens")
        fixed = ht_hier_fixed_bytes(nodes, gpus, hidden, k, ht_hier_fixed)
    if ht_fixed_slices or ht_flat:
        flat = ll_rows(nodes, gpus, experts, k, node_limit, "rank", False, "rank")  # a row per (token, rank)
        per_op = {op: (flat["dispatch_rail"], flat["dispatch_nvlink"], row) for op, (_, _, row) in per_op.items()}
    out = []
    for op, (rail_rows, nvl_rows, row) in per_op.items():
        rail_b, nvl_b = tokens * rail_rows * row, tokens * nvl_rows * row
        if fixed:
            rail_b = fixed[op + "_rail_bytes"]
        rec = {"what": "ep_internode_model", "mode": mode, "op": op, "nodes": nodes, "gpus_per_node": gpus,
               "ranks": nodes * gpus, "tokens": tokens, "hidden": hidden, "topk": k, "experts": experts,
               "dtype": dtype if op == "dispatch" else "bf16", "row_bytes": row, "node_limit": node_limit,
               "ll_combine": ll_combine if mode == "ll" else None,
               "ll_dispatch": ll_dispatch if mode == "ll" else None, "all_rail": all_rail,
               "rail_rows_per_token": rail_rows, "nvlink_rows_per_token": nvl_rows,
               "rail_bytes": rail_b, "nvlink_bytes": nvl_b, "rail_gbs": rail_gbs, "nvlink_gbs": nvlink_gbs,
               "ll_fixed_slices": ll_fixed_slices if mode == "ll" else 0,
               "ht_fixed_slices": ht_fixed_slices if mode == "ht" else 0,
               "ht_hier_fixed": ht_hier_fixed if mode == "ht" else 0,
               "ht_protocol": None if mode != "ht" else "flat" if (ht_flat or ht_fixed_slices) else "hierarchical",
               "p_dom": r["p_dom"], "p_rank": r["p_rank"]}
        rec.update(op_time(rail_b, nvl_b, rail_gbs, nvlink_gbs, latency_us))
        out.append(rec)
    return out


def compare_published(nodes_list, rail_gbs: float, nvlink_gbs: float, ht_latency_us: float, ll_latency_us: float,
                      hidden: int = 7168, k: int = 8) -> list:
    """The published internode numbers for node counts in nodes_list (8 GPUs a node), each beside the model's
    prediction of the same configuration. HT: overlapped time, and GB/s in DeepEP's convention ((token, node)
    pairs, own node included, x row bytes / time), at nvlink_gbs and, for DeepEP V1 (H800), at 160 GB/s. LL: the
    model with NVLink inside a domain and with every peer over the rail (as DeepEP V1's published LL runs)."""
    rows = []
    for pub in PUBLISHED_HT:
        n = pub["nodes"]
        if n not in nodes_list:
            continue
        rates = [("model", nvlink_gbs)] + ([("model_h800", H800_NVLINK_GBS)] if pub["h800"] else [])
        hits = ht_rows(n, 8, pub["experts"], k, pub["node_limit"])["domains_hit_incl_own"]
        for op, dtype in (("dispatch", "fp8"), ("combine", "bf16")):
            conv_bytes = pub["tokens"] * hits * row_bytes(dtype, hidden)
            rec = {"what": "ep_internode_model_vs_published", "mode": "ht", "op": op, "nodes": n, "ranks": 8 * n,
                   "tokens": pub["tokens"], "dtype": dtype, "node_limit": pub["node_limit"],
                   "system": pub["system"], "hw": pub["hw"], "source": pub["source"],
                   "published_gbs": pub[op + "_gbs"], "published_us_derived": conv_bytes / (pub[op + "_gbs"] * 1e3),
                   "deepep_convention_bytes": conv_bytes}
            for key, nvl in rates:
                p = [x for x in predict("ht", n, 8, pub["tokens"], hidden, k, pub["experts"], dtype, rail_gbs, nvl,
                                        ht_latency_us, pub["node_limit"]) if x["op"] == op][0]
                rec[key + "_nvlink_gbs"] = nvl
                rec[key + "_us"] = p["overlapped_us"]
                rec[key + "_gbs"] = conv_bytes / (p["overlapped_us"] * 1e3)
            rows.append(rec)
    for pub in PUBLISHED_LL:
        n = pub["nodes"]
        if n not in nodes_list:
            continue
        for op in ("dispatch", "combine"):
            rec = {"what": "ep_internode_model_vs_published", "mode": "ll", "op": op, "nodes": n, "ranks": 8 * n,
                   "tokens": 128, "dtype": pub["dispatch_dtype"] if op == "dispatch" else "bf16",
                   "system": pub["system"], "hw": pub["hw"], "source": pub["source"],
                   "published_us": pub[op + "_us"]}
            if op + "_gbs" in pub:
                rec["published_gbs"] = pub[op + "_gbs"]
            # model: our scheme (dispatch one row per (token, rank), NVLink inside a domain); model_deepep: one row
            # per (token, expert) both ways, as DeepEP V1's LL kernels send, NVLink inside; model_deepep_all_rail:
            # the same with every peer over the rail ("pure RDMA").
            for key, ll_dispatch, all_rail in (("model", "rank", False), ("model_deepep", "expert", False),
                                               ("model_deepep_all_rail", "expert", True)):
                p = [x for x in predict("ll", n, 8, 128, hidden, k, 256, pub["dispatch_dtype"], rail_gbs, nvlink_gbs,
                                        ll_latency_us, 0, "expert", 0, all_rail, ll_dispatch) if x["op"] == op][0]
                rec[key + "_us"] = p["overlapped_us"]
            rows.append(rec)
    return rows


def _int_list(s: str) -> list:
    return [int(x) for x in s.split(",") if x.strip()]


def format_table(rows: list) -> str:
    head = ("mode op        dtype nodes x G  tokens  rail rows/tok  NVL rows/tok  rail MB   NVL MB   rail us    NVL us"
            "  overlap us  serial us  bound")
    lines = [head]
    for r in rows:
        lines.append("%-4s %-9s %-5s %5d x %-2d %6d  %13.3f  %12.3f  %7.2f  %7.2f  %8.1f  %8.1f  %10.1f  %9.1f  %s" % (
            r["mode"], r["op"] + ("" if r["mode"] == "ht" or r["op"] == "dispatch" else "/" + r["ll_combine"][0]),
            r["dtype"], r["nodes"], r["gpus_per_node"], r["tokens"], r["rail_rows_per_token"],
            r["nvlink_rows_per_token"], r["rail_bytes"] / 1e6, r["nvlink_bytes"] / 1e6, r["rail_us"], r["nvlink_us"],
            r["overlapped_us"], r["serial_us"], r["bound"]))
    return "\n".join(lines)


def format_compare(rows: list) -> str:
    lines = []
    ht = [r for r in rows if r["mode"] == "ht"]
    if ht:
        lines.append("HT vs published (GB/s in DeepEP's internode convention: (token, node) pairs incl. own node x row"
                     " bytes / time; us = those bytes / GB/s):")
        lines.append("  system             nodes op        tokens  published GB/s (us)   model GB/s (us)"
                     "   model@160 NVL GB/s (us)  source")
        for r in ht:
            h800 = ("%6.1f (%7.1f)" % (r["model_h800_gbs"], r["model_h800_us"])) if "model_h800_us" in r else "-"
            lines.append("  %-18s %5d %-9s %6d  %6.1f (%7.1f)      %6.1f (%7.1f)   %-22s   %s" % (
                r["system"], r["nodes"], r["op"], r["tokens"], r["published_gbs"], r["published_us_derived"],
                r["model_gbs"], r["model_us"], h800, r["source"]))
    ll = [r for r in rows if r["mode"] == "ll"]
    if ll:
        lines.append("LL vs published, 128 tokens (us, overlapped; ours: dispatch rows per (token, rank), combine per"
                     " (token, expert), NVLink inside a domain; DeepEP: rows per (token, expert) both ways, NVLink"
                     " inside / every peer over the rail):")
        lines.append("  system             nodes op        dtype  published us  model ours  model DeepEP  "
                     "DeepEP all-rail  source")
        for r in ll:
            lines.append("  %-18s %5d %-9s %-5s  %12.1f  %10.1f  %12.1f  %15.1f  %s" % (
                r["system"], r["nodes"], r["op"], r["dtype"], r["published_us"], r["model_us"],
                r["model_deepep_us"], r["model_deepep_all_rail_us"], r["source"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="2,4,8,16", help="comma-separated node (NVLink domain) counts")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node = ranks per NVLink domain")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per rank for both modes (overrides the two below)")
    ap.add_argument("--ht-tokens", type=int, default=4096)
    ap.add_argument("--ll-tokens", type=int, default=128)
    ap.add_argument("--modes", default="ht,ll")
    ap.add_argument("--dtypes", default="bf16,fp8", help="dispatch row dtypes (combine rows are bf16)")
    ap.add_argument("--ll-combine", choices=["expert", "rank", "both"], default="expert",
                    help="LL combine rows: per (token, expert) (DeepEP's API), per (token, rank), or both")
    ap.add_argument("--ll-dispatch", choices=["rank", "expert"], default="rank",
                    help="LL dispatch rows: per (token, rank) (ours, NCCL EP's) or per (token, expert) (DeepEP V1's)")
    ap.add_argument("--node-limit", type=int, default=0, help="domains a token may reach (0: any)")
    ap.add_argument("--ll-fixed-slices", type=int, default=0, metavar="M",
                    help="LL rail bytes of nccl_ep's exchange as implemented: fixed slices of M = max_tokens_per_rank "
                         "rows to every remote rank (bf16; 0: the expected rows)")
    ap.add_argument("--ht-fixed-slices", type=int, default=0, metavar="M",
                    help="HT rail bytes of nccl_ep's flat exchange as implemented: fixed slices of M = "
                         "max_tokens_per_rank rows to every remote rank (0: the hierarchical protocol's expected rows)")
    ap.add_argument("--ht-hier-fixed", type=int, default=0, metavar="M",
                    help="HT rail bytes of nccl_ep's hierarchical exchange as implemented (relayed exchanges, "
                         "NCCL_EXT_HT_HIERARCHICAL=1): M = max_tokens_per_rank fixed rows to every remote domain")
    ap.add_argument("--ht-flat", action="store_true",
                    help="HT rail rows of nccl_ep's flat exchange with EXACT handles (a row per (token, destination "
                         "rank), the expected rows) instead of the hierarchical protocol's")
    ap.add_argument("--ht-staging", default=None, metavar="C,C,...",
                    help="also print the HT exchanges' rail staging per GPU (the flat one's, ht_staging_bytes; with "
                         "several GPUs a node the hierarchical one's, ht_hier_staging_bytes) at --ht-tokens max "
                         "tokens for each round size C (0: one round of max_tokens)")
    ap.add_argument("--meta-bytes", type=int, default=0, help="extra bytes per row (flags, ids, weights)")
    ap.add_argument("--rail-gbs", type=float, default=RAIL_GBS, help="rail (NIC) GB/s per GPU per direction")
    ap.add_argument("--nvlink-gbs", type=float, default=NVLINK_GBS, help="NVLink GB/s per GPU per direction")
    ap.add_argument("--ht-latency-us", type=float, default=HT_LATENCY_US, help="fixed cost of an HT call")
    ap.add_argument("--ll-latency-us", type=float, default=LL_LATENCY_US, help="fixed cost of an LL call")
    ap.add_argument("--no-compare", action="store_true", help="do not print the published numbers")
    ap.add_argument("--json", default=None, help="append one JSON line per prediction to FILE")
    a = ap.parse_args(argv)
    if a.rail_gbs <= 0 or a.nvlink_gbs <= 0:
        ap.error("link rates must be > 0")
    nodes_list, modes = _int_list(a.nodes), [m for m in a.modes.split(",") if m]
    dtypes = [d for d in a.dtypes.split(",") if d]
    combines = ["expert", "rank"] if a.ll_combine == "both" else [a.ll_combine]
    rows = []
    try:
        for mode in modes:
            tokens = a.tokens if a.tokens is not None else (a.ht_tokens if mode == "ht" else a.ll_tokens)
            lat = a.ht_latency_us if mode == "ht" else a.ll_latency_us
            for dtype in dtypes:
                for comb_kind in (combines if mode == "ll" else ["expert"]):
                    for n in nodes_list:
                        preds = predict(mode, n, a.gpus_per_node, tokens, a.hidden, a.topk, a.experts, dtype,
                                        a.rail_gbs, a.nvlink_gbs, lat, a.node_limit, comb_kind, a.meta_bytes,
                                        False, a.ll_dispatch, a.ll_fixed_slices if mode == "ll" else 0,
                                        a.ht_fixed_slices if mode == "ht" else 0, a.ht_flat and mode == "ht",
                                        a.ht_hier_fixed if mode == "ht" else 0)
                        # Dispatch once per dtype; combine (bf16 whatever the dispatch dtype) once per kind.
                        rows.extend(p for p in preds if (p["op"] == "dispatch" and comb_kind == combines[0])
                                    or (p["op"] == "combine" and dtype == dtypes[0]))
    except ValueError as e:
        ap.error(str(e))
    rows.sort(key=lambda r: (modes.index(r["mode"]), r["op"] != "dispatch", r["dtype"] != dtypes[0],
                             r["ll_combine"] or "", r["nodes"]))
    print("ep_internode_model: top-%d of %d experts, hidden %d, %d GPUs a domain; rail %.1f GB/s, NVLink %.1f GB/s "
          "per GPU; fixed cost HT %.1f us, LL %.1f us; bytes per rank (out = in)"
          % (a.topk, a.experts, a.hidden, a.gpus_per_node, a.rail_gbs, a.nvlink_gbs, a.ht_latency_us,
             a.ll_latency_us))
    print(format_table(rows))
    staging = []
    if a.ht_staging is not None:
        max_tokens = a.tokens if a.tokens is not None else a.ht_tokens
        print("flat HT rail staging per GPU, max_tokens_per_rank %d (one outbox per rank of another domain):"
              % max_tokens)
        for n in nodes_list:
            cells = []
            for c in _int_list(a.ht_staging):
                b = ht_staging_bytes(n, a.gpus_per_node, a.hidden, a.topk, a.experts, max_tokens, c or max_tokens)
                staging.append({"what": "ep_internode_model_staging", "nodes": n, "gpus_per_node": a.gpus_per_node,
                                "hidden": a.hidden, "topk": a.topk, "experts": a.experts,
                                "max_tokens_per_rank": max_tokens, **b})
                cells.append("rounds of %d: %.3f GB" % (b["round_tokens"], b["rail_staging_bytes"] / 1e9))
            print("  %3d nodes x %d: %s" % (n, a.gpus_per_node, ", ".join(cells)))
        if a.gpus_per_node > 1:
            print("hierarchical HT rail staging per GPU, max_tokens_per_rank %d (rail rows of a round, inboxes of "
                  "the count rows; besides, outboxes in the window):" % max_tokens)
            for n in nodes_list:
                cells = []
                for c in _int_list(a.ht_staging):
                    b = ht_hier_staging_bytes(n, a.gpus_per_node, a.hidden, a.topk, a.experts, max_tokens,
                                              c or max_tokens)
                    staging.append({"what": "ep_internode_model_hier_staging", "nodes": n,
                                    "gpus_per_node": a.gpus_per_node, "hidden": a.hidden, "topk": a.topk,
                                    "experts": a.experts, "max_tokens_per_rank": max_tokens, **b})
                    cells.append("rounds of %d: %.3f GB" % (b["round_tokens"], b["rail_staging_bytes"] / 1e9))
                print("  %3d nodes x %d: %s; outboxes in the window %.3f GB" % (
                    n, a.gpus_per_node, ", ".join(cells), b["window_outbox_bytes"] / 1e9))
        print("HT window per GPU, max_tokens_per_rank %d (symmetric memory; its staging regions grow with ranks x "
              "max_tokens, whatever the round):" % max_tokens)
        for n in nodes_list:
            flat = ht_window_bytes(n, a.gpus_per_node, a.hidden, a.topk, a.experts, max_tokens)
            hier = ht_window_bytes(n, a.gpus_per_node, a.hidden, a.topk, a.experts, max_tokens, True)
            staging.append({"what": "ep_internode_model_window", "nodes": n, "gpus_per_node": a.gpus_per_node,
                            "hidden": a.hidden, "topk": a.topk, "experts": a.experts,
                            "max_tokens_per_rank": max_tokens, "window_bytes": flat["window_bytes"],
                            "hierarchical_window_bytes": hier["window_bytes"]})
            print("  %3d nodes x %d: %.3f GB (hierarchical: %.3f GB)" % (
                n, a.gpus_per_node, flat["window_bytes"] / 1e9, hier["window_bytes"] / 1e9))
    cmp_rows = []
    if not a.no_compare and a.gpus_per_node == 8 and a.experts == 256 and a.topk == 8 and a.hidden == 7168:
        cmp_rows = compare_published(nodes_list, a.rail_gbs, a.nvlink_gbs, a.ht_latency_us, a.ll_latency_us)
        if cmp_rows:
            print(format_compare(cmp_rows))
    if a.json:
        with open(a.json, "a") as f:
            for r in rows + staging + cmp_rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
