#include "nccl_ep/src/layout.h"

#include <algorithm>

#include "common/checks.h"
#include "common/env.h"
#include "nccl_ep/src/ll/ll.h"

namespace ncclep {

void layoutGroup(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* out, bool htHierarchical,
                 bool relayRail) {
  GroupView& v = *out;
  const int rank = topo.rank, nRanks = topo.nRanks;
  v.rank = rank;
  v.nRanks = nRanks;
  v.numExperts = config.num_experts;
  v.localExperts = config.num_experts / nRanks;
  v.maxTokens = config.max_tokens_per_rank;
  v.nChunks = (config.max_tokens_per_rank + kChunkTokens - 1) / kChunkTokens;
  v.rowStride = config.max_token_bytes;
  v.lowLatency = config.algorithm == NCCL_EP_ALGO_LOW_LATENCY;
  v.meta.maxTopk = config.max_topk;
  v.meta.maxScales = std::max(1, config.max_token_bytes / 128);
  v.meta.bytes = alignUp(v.meta.tokenOff() + 4, 16);
  WindowLayout& w = v.wl;
  const size_t regionRows = (size_t)nRanks * v.maxTokens;
  // Relayed exchanges over a rail of one index: the mixed test mode's (relayRail), and, for the hierarchical HT
  // (experimental), real ranks' too when their domains have several ranks (the Domain's rail; with one rank a domain
  // the hierarchical exchange is the flat one, which stays).
  const bool hier = htHierarchical && !v.lowLatency && topo.nDomains > 1;
  const bool relay = relayRail || (hier && topo.domainSize > 1);
  // HT's receive cap (one domain, or across domains the direct exchange; layoutWithinBudget refuses relayed ones):
  // dense staging positions, the dispatch staging's rows capped, the combine staging's the most rows one rank's
  // tokens send (a token goes to at most min(R, K) ranks).
  const bool capped = !v.lowLatency && config.max_recv_rows_per_rank > 0 && !relay;
  v.recvCap = capped ? (int)std::min(regionRows, (size_t)config.max_recv_rows_per_rank) : 0;
  v.recvCapError = capped && config.recv_overflow != NCCL_EP_RECV_OVERFLOW_DROP;
  const size_t dispRowsCount = capped ? (size_t)v.recvCap : regionRows;
  // LL combine staging also holds one row per (token, expert) of the owner: [maxTokens][maxTopk].
  w.combSlots = capped ? v.maxTokens * std::min(nRanks, config.max_topk)
                       : (int)std::max(regionRows, v.lowLatency ? (size_t)v.maxTokens * config.max_topk : 0);
  w.headerBytes = v.lowLatency ? (int)alignUp(12 + 4 * (size_t)v.localExperts, 16) : 0;
  w.slices = v.lowLatency ? (config.max_token_bytes + kLlSliceCols - 1) / kLlSliceCols : 1;
  size_t off = 0;
  w.barrierFlags = off;
  off = alignUp(off + (size_t)nRanks * 8, 256);
  w.dispDone = off;
  off = alignUp(off + (size_t)nRanks * 8, 256);
  w.combDone = off;
  off = alignUp(off + (size_t)nRanks * 8, 256);
  w.cleanFlags = off;
  off = alignUp(off + (size_t)nRanks * 8, 256);
  // The hierarchical HT's exchange rows also carry the writer's token count per destination domain (an EXACT
  // handle's eager calls size their rail messages by them: Rail::exchange).
  w.domainCounts = nRanks + config.num_experts + v.nChunks + 1;
  w.nDomainCounts = relay && hier ? topo.nDomains : 0;
  w.exchangeInts = w.domainCounts + w.nDomainCounts;
  w.retained = capped ? w.exchangeInts : 0;
  w.exchangeInts += capped ? v.localExperts : 0;
  w.exchange = off;
  off = alignUp(off + (size_t)nRanks * w.exchangeInts * 4, 4096);
  // The staging bank (LL: two of them, so that two send-only calls of a kind may be open at once).
  const size_t bankStart = off;
  w.combFlags = off;
  off = alignUp(off + (size_t)w.combSlots * w.slices * 8, 256);
  w.header = off;
  off = alignUp(off + (size_t)nRanks * w.headerBytes, 256);
  w.dispFlags = off;
  off = alignUp(off + (v.lowLatency ? regionRows * w.slices * 8 : 0), 4096);
  w.dispRows = off;
  off = alignUp(off + dispRowsCount * v.rowStride, 4096);
  w.dispMeta = off;
  off = alignUp(off + dispRowsCount * v.meta.bytes, 4096);
  w.combRows = off;
  off = alignUp(off + (size_t)w.combSlots * v.rowStride, 4096);
  // Across domains (LL): the owner-weighted combine's rows from other domains, by (source, slot, column).
  w.ownerCols = std::min(config.max_topk, std::max(1, v.localExperts));
  const size_t ownerRowsCount = v.lowLatency && topo.nDomains > 1 ? regionRows * w.ownerCols : 0;
  w.ownerFlags = off;
  off = alignUp(off + ownerRowsCount * w.slices * 8, 256);
  w.ownerRows = off;
  off = alignUp(off + ownerRowsCount * v.rowStride, 4096);
  w.bankBytes = v.lowLatency ? off - bankStart : 0;
  w.total = off + w.bankBytes;
  // Several domains: my slices of the staging regions by source, laid end to end in each outbox (rail/view.h), 16-byte
  // aligned (the kernels' widest store) and no more, so that a call's regions form one span that the exchange sends
  // as one message per peer (RailView::spanOf).
  RailView& rv = v.rail;
  rv.domainBase = topo.domainIndex * topo.domainSize;
  rv.domainSize = topo.domainSize;
  rv.bankStart = bankStart;
  // High-Throughput: no slice flags (its row flags are in the metadata) and no owner regions; its first region is
  // the handle's exchange row instead of LL's header row.
  rv.highThroughput = !v.lowLatency;
  const size_t flagSlice = (size_t)v.maxTokens * w.slices * 8, rowSlice = (size_t)v.maxTokens * v.rowStride;
  const size_t mk = topo.nDomains > 1 && v.lowLatency ? (size_t)w.ownerCols : 0;  // owner regions: LL across domains
  const size_t first = v.lowLatency ? w.header : w.exchange;
  const size_t firstSlice = v.lowLatency ? (size_t)w.headerBytes : (size_t)w.exchangeInts * 4;
  const size_t bases[kRailRegions] = {first,       w.dispFlags, w.dispRows,   w.dispMeta,
                                      w.combFlags, w.combRows,  w.ownerFlags, w.ownerRows};
  const size_t slices[kRailRegions] = {firstSlice,     v.lowLatency ? flagSlice : 0,
                                       rowSlice,       (size_t)v.maxTokens * v.meta.bytes,
                                       flagSlice,      rowSlice,
                                       mk * flagSlice, mk * rowSlice};
  // HT's flat exchange receives into the window (direct) and moves a call in rounds of roundSlots slots a peer, so
  // its outboxes' row regions hold that many rows (the handle's count row stays whole). The hierarchical HT moves
  // its rail rows in rounds of roundSlots positions; its outboxes hold the handle's count rows and whole combine
  // slices (its relays reduce them at any slot), no dispatch regions (its rail rows carry the dispatch).
  rv.direct = topo.nDomains > 1 && !v.lowLatency && !relay;
  rv.relay = relay;
  rv.hier = relay && hier;
  rv.capped = rv.direct && capped;
  rv.roundSlots = rv.direct || rv.hier ? std::min(v.maxTokens, config.rail_round_tokens > 0 ? config.rail_round_tokens
                                                                                            : kDefaultRailRoundTokens)
                                       : v.maxTokens;
  size_t outbox = 0;
  for (int i = 0; i < kRailRegions; i++) {
    rv.base[i] = bases[i];
    rv.slice[i] = slices[i];
    const bool dispatchRegion = i == kRailDispFlags || i == kRailDispRows || i == kRailDispMeta;
    rv.outSlice[i] = i == kRailHeader ? slices[i]
                     : rv.hier        ? (dispatchRegion ? 0 : slices[i])
                                      : slices[i] / (size_t)v.maxTokens * (size_t)rv.roundSlots;
    rv.outOff[i] = rv.inOff[i] = outbox;  // (an inbox of the outbox's layout, but with a receive cap: below)
    outbox = alignUp(outbox + rv.outSlice[i], 16);
  }
  rv.outboxBytes = topo.nDomains > 1 ? outbox : 0;
  rv.inboxBytes = rv.hier ? alignUp(rv.outSlice[kRailHeader], 16) : rv.outboxBytes;
  if (rv.capped) {  // each kind's regions from the inbox's start (RailView::inOff)
    size_t inbox = 0;
    for (const int kind : {0, 1}) {
      const RailRegions regions = rv.regionsOf(kind, false);
      size_t at = 0;
      for (int i = regions.first; i <= regions.last; i++) {
        rv.inOff[i] = at;
        at = alignUp(at + rv.outSlice[i], 16);
      }
      inbox = std::max(inbox, at);
    }
    rv.inboxBytes = inbox;
  }
  // The hierarchical HT's relays read their domain's outboxes: those then live in the window.
  rv.boxes = topo.nDomains == 1 ? 0 : relay ? nRanks : nRanks - topo.domainSize;
  w.outboxes = 0;
  if (rv.hier) {
    rv.hierRow.rowStride = (size_t)v.rowStride;
    rv.hierRow.domainSize = topo.domainSize;
    rv.hierRow.maxTopk = v.meta.maxTopk;
    rv.hierRow.maxScales = v.meta.maxScales;
    w.outboxes = alignUp(w.total, 4096);
    w.total = w.outboxes + (size_t)nRanks * rv.outboxBytes;
  }
}

ResolvedConfig resolveConfig(const ncclEpGroupConfig_t& config) {
  const ncclext::Env& env = ncclext::env();
  auto onOff = [](int field, int fromEnv) { return field == NCCL_EP_AUTO ? fromEnv != 0 : field == 1; };
  ResolvedConfig r;
  r.config = config;
  if (config.rail_round_tokens == NCCL_EP_AUTO) r.config.rail_round_tokens = env.railRoundTokens;
  r.htHierarchical = onOff(config.ht_hierarchical, env.htHierarchical);
  r.railOverlap = onOff(config.rail_overlap, env.railOverlap);
  r.timeoutSeconds = config.timeout_ns ? config.timeout_ns * 1e-9 : env.timeoutSeconds;
  return r;
}

ncclResult_t layoutWithinBudget(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* v,
                                bool htHierarchical, bool relayRail) {
  layoutGroup(config, topo, v, htHierarchical, relayRail);
  NCCLEXT_USAGE(config.max_recv_rows_per_rank == 0 || v->lowLatency || v->recvCap > 0,
                "max_recv_rows_per_rank %d: across NVLink domains the receive cap takes the flat exchange (this "
                "group's is relayed%s)",
                config.max_recv_rows_per_rank, v->rail.hier ? ": the hierarchical High-Throughput exchange" : "");
  const size_t budget = config.rail_staging_bytes_max;
  if (budget == 0 || topo.nDomains == 1 || railStagingBytes(*v) <= budget) return ncclSuccess;
  const bool rounds = v->rail.direct || v->rail.hier;
  NCCLEXT_ARG(rounds, "rail_staging_bytes_max %zu: this group's rail staging is fixed at %zu bytes (%s)", budget,
              railStagingBytes(*v),
              v->lowLatency ? "Low-Latency: per-peer slices of max_tokens_per_rank rows" : "relayed");
  // The staging grows with the round: the largest round in [1, the configured one) that fits, by bisection.
  ncclEpGroupConfig_t c = config;
  GroupView probe;
  int lo = 0, hi = v->rail.roundSlots;  // staging(lo rows) fits (0: none known), staging(hi rows) does not
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    c.rail_round_tokens = mid;
    layoutGroup(c, topo, &probe, htHierarchical, relayRail);
    if (railStagingBytes(probe) <= budget) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) {
    c.rail_round_tokens = 1;
    layoutGroup(c, topo, &probe, htHierarchical, relayRail);
    NCCLEXT_ARG(false,
                "rail_staging_bytes_max %zu: below this group's rail staging in rounds of one row a peer, %zu "
                "bytes",
                budget, railStagingBytes(probe));
  }
  c.rail_round_tokens = lo;
  layoutGroup(c, topo, v, htHierarchical, relayRail);
  return ncclSuccess;
}

}  // namespace ncclep
