#include "nccl_ep/src/group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/checks.h"
#include "common/env.h"
#include "common/topology.h"
#include "common/watchdog.h"
#include "nccl_ep/src/ll.h"

namespace {

size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The group's device state: u64 calls[2], arrivals[2], sent[2], sendArrivals[2] (the call numbers
// ncclEpMaskClean resets: the first kCountersBytes), barrierEpoch; then the mask, int32 [kMaxRanks].
constexpr size_t kCountersBytes = 8 * sizeof(uint64_t);
constexpr size_t kMaskOffset = 16 * sizeof(uint64_t);
constexpr size_t kStateBytes = kMaskOffset + ncclep::kMaxRanks * sizeof(int);

}  // namespace

namespace ncclep {

void layoutGroup(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* out,
                 bool htHierarchical, bool relayRail) {
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
  // LL combine staging also holds one row per (token, expert) of the owner: [maxTokens][maxTopk].
  w.combSlots = (int)std::max(regionRows, v.lowLatency ? (size_t)v.maxTokens * config.max_topk : 0);
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
  // Relayed exchanges over a rail of one index: the mixed test mode's (relayRail), and, for the hierarchical HT
  // (experimental), real ranks' too when their domains have several ranks (the Domain's rail; with one rank a domain
  // the hierarchical exchange is the flat one, which stays).
  const bool hier = htHierarchical && !v.lowLatency && topo.nDomains > 1;
  const bool relay = relayRail || (hier && topo.domainSize > 1);
  // The hierarchical HT's exchange rows also carry the writer's token count per destination domain (an EXACT
  // handle's eager calls size their rail messages by them: ncclEpGroup::railExchange).
  w.domainCounts = nRanks + config.num_experts + v.nChunks + 1;
  w.exchangeInts = w.domainCounts + (relay && hier ? topo.nDomains : 0);
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
  off = alignUp(off + regionRows * v.rowStride, 4096);
  w.dispMeta = off;
  off = alignUp(off + regionRows * v.meta.bytes, 4096);
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
  // Several domains: my slices of the staging regions by source, laid end to end in each outbox (ht.h), 16-byte
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
  const size_t slices[kRailRegions] = {firstSlice, v.lowLatency ? flagSlice : 0, rowSlice,
                                       (size_t)v.maxTokens * v.meta.bytes, flagSlice, rowSlice, mk * flagSlice,
                                       mk * rowSlice};
  // HT's flat exchange receives into the window (direct) and moves a call in rounds of roundSlots slots a peer, so
  // its outboxes' row regions hold that many rows (the handle's count row stays whole). The hierarchical HT moves
  // its rail rows in rounds of roundSlots positions; its outboxes hold the handle's count rows and whole combine
  // slices (its relays reduce them at any slot), no dispatch regions (its rail rows carry the dispatch).
  rv.direct = topo.nDomains > 1 && !v.lowLatency && !relay;
  rv.relay = relay;
  rv.hier = relay && hier;
  rv.roundSlots = rv.direct || rv.hier ? std::min(v.maxTokens, config.rail_round_tokens > 0
                                                                   ? config.rail_round_tokens
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
    rv.outOff[i] = outbox;
    outbox = alignUp(outbox + rv.outSlice[i], 16);
  }
  rv.outboxBytes = topo.nDomains > 1 ? outbox : 0;
  rv.inboxBytes = rv.hier ? alignUp(rv.outSlice[kRailHeader], 16) : rv.outboxBytes;
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
    NCCLEXT_ARG(false, "rail_staging_bytes_max %zu: below this group's rail staging in rounds of one row a peer, %zu "
                "bytes", budget, railStagingBytes(probe));
  }
  c.rail_round_tokens = lo;
  layoutGroup(c, topo, v, htHierarchical, relayRail);
  return ncclSuccess;
}

}  // namespace ncclep

ncclResult_t ncclEpGroup::deviceAlloc(void** ptr, size_t bytes) {
  if (config.alloc.alloc_fn) {
    NCCLEXT_USAGE(config.alloc.alloc_fn(ptr, bytes, config.alloc.context) == 0 && *ptr != nullptr,
                  "the allocator hook failed for %zu bytes", bytes);
    return ncclSuccess;
  }
  NCCLEXT_CUDA(cudaMalloc(ptr, bytes));
  return ncclSuccess;
}

void ncclEpGroup::freeNow(void* ptr) {
  if (config.alloc.free_fn) {
    NCCLEXT_WARN_ON(config.alloc.free_fn(ptr, config.alloc.context));
  } else {
    NCCLEXT_WARN_ON(cudaFree(ptr));
  }
}

void ncclEpGroup::deviceFree(void* ptr) {
  if (!ptr) return;
  if (domain && domain->isVirtual()) {
    retiredDevice_.push_back(ptr);
  } else {
    freeNow(ptr);
  }
}

void ncclEpGroup::hostFree(void* ptr) {
  if (!ptr) return;
  if (domain && domain->isVirtual()) {
    retiredHost_.push_back(ptr);
  } else {
    NCCLEXT_WARN_ON(cudaFreeHost(ptr));
  }
}

namespace {
void abortRail(ncclEpGroup* g, double seconds);
}  // namespace

ncclResult_t ncclEpGroup::create(ncclComm_t comm, const ncclEpGroupConfig_t& config,
                                 const ncclep::TestingModes& testing, ncclEpGroup** out) {
  std::unique_ptr<ncclEpGroup> g(new ncclEpGroup());
  g->comm = comm;
  g->config = config;
  g->testing = testing;
  const ncclep::ResolvedConfig resolved = ncclep::resolveConfig(config);
  g->timeoutSeconds = resolved.timeoutSeconds;
  // The domain and rail communicators (collective over `comm`), then the checks of several domains, which every rank
  // reaches with the same topology.
  ncclext::DomainOptions dopt;
  dopt.domainSize = config.lsa_domain_size;
  dopt.virt = testing.virtualDomain ? &testing.virtualDomain->domain : nullptr;
  dopt.virtualRank = testing.virtualRank;
  dopt.rail = testing.virtualRail;
  dopt.timeoutSeconds = g->timeoutSeconds;
  NCCLEXT_CHECK(ncclext::Domain::create(comm, dopt, &g->domain));
  const ncclext::Topology& topo = g->domain->topo();
  NCCLEXT_USAGE(topo.nDomains == 1 || !config.enable_mask || !testing.virtualRail,
                "enable_mask in the mixed test mode (virtual_rail) across %d NVLink domains: not supported (a relay "
                "sends what every rank of its domain wrote, masked or not)",
                topo.nDomains);
  const int rank = topo.rank, nRanks = topo.nRanks;
  int dev = 0;
  ncclext::setLogRank(rank);
  NCCLEXT_ARG(nRanks <= ncclep::kMaxRanks, "%d ranks: at most %d", nRanks, ncclep::kMaxRanks);
  NCCLEXT_ARG(config.num_experts % nRanks == 0, "num_experts %d is not a multiple of the %d ranks",
              config.num_experts, nRanks);
  NCCLEXT_CUDA(cudaGetDevice(&dev));
  NCCLEXT_CUDA(cudaDeviceGetAttribute(&g->smCount, cudaDevAttrMultiProcessorCount, dev));
  // Virtual ranks share the GPU: each gets its share of the SMs, so that every rank's kernels are resident at once
  // (a rank's CTAs spin on flags that the others' CTAs write).
  if (g->domain->isVirtual()) g->smCount = std::max(1, g->smCount / nRanks);
  g->numSms = config.num_sms > 0 ? std::min(config.num_sms, g->smCount) : std::min(64, g->smCount);

  // The kernels this group launches, loaded before any of them runs (ncclext::loadKernels says why).
  NCCLEXT_CHECK(ncclep::loadRouteKernels());
  if (config.algorithm == NCCL_EP_ALGO_LOW_LATENCY) {
    NCCLEXT_CHECK(ncclep::loadLlKernels());
  } else {
    NCCLEXT_CHECK(ncclep::loadDispatchKernels());
    NCCLEXT_CHECK(ncclep::loadCombineKernels());
  }

  // Window layout.
  ncclep::GroupView& v = g->view;
  NCCLEXT_CHECK(ncclep::layoutWithinBudget(resolved.config, topo, &v, resolved.htHierarchical,
                                           testing.virtualRail != nullptr));
  ncclep::WindowLayout& w = v.wl;
  ncclep::RailView& rv = v.rail;

  // Symmetric memory on the domain (collective).
  cudaStream_t stream = nullptr;
  NCCLEXT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclext::SymmetricMemoryOptions so;
  so.bytes = w.total;
  ncclResult_t res = ncclext::SymmetricMemory::create(*g->domain, so, stream, &g->mem);
  v.peers = res == ncclSuccess ? g->mem->peers() : ncclext::dev::Peers{};
  if (res == ncclSuccess) res = ncclext::DeviceStatus::create(&g->status);
  if (res == ncclSuccess) {
    v.err = g->status->sink();
    v.timeoutNs = (uint64_t)(g->timeoutSeconds * 1e9);
    res = g->deviceAlloc(&g->state, kStateBytes);
    if (res == ncclSuccess && cudaMemsetAsync(g->state, 0, kStateBytes, stream) != cudaSuccess)
      res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "group state: zero-fill failed");
    if (res == ncclSuccess && config.enable_mask) res = g->setMask(std::vector<int>(nRanks, 1).data(), stream);
    if (res == ncclSuccess && cudaStreamSynchronize(stream) != cudaSuccess)
      res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "group state: mask fill failed");
  }
  // The outboxes and the communicator their exchanges go over (every rank of comm, split once: the caller's own
  // traffic on comm never meets ours; relay: the domain's rail, the ranks of my index in every domain, likewise).
  if (res == ncclSuccess && rv.outboxBytes) {
    void* ob = nullptr;
    const size_t boxes = rv.outboxBytes * rv.boxes, inboxes = rv.direct ? 0 : rv.inboxBytes * rv.boxes;
    // The outboxes, then the inboxes; the hierarchical HT: the inboxes only (its outboxes are in the window); the
    // direct exchange: the outboxes only (it receives into the window).
    g->railBytes = g->railAllocBytes = ncclep::railBoxBytes(rv);
    res = g->deviceAlloc(&ob, g->railBytes);
    g->railAlloc = ob;
    rv.outbox = rv.hier ? static_cast<char*>(g->mem->localPtr()) + w.outboxes : static_cast<char*>(ob);
    rv.inbox = rv.hier ? static_cast<char*>(ob) : rv.direct ? nullptr : rv.outbox + boxes;
    // Zeroed: slots that no call wrote yet travel too (whole slices), and their flags must read as no call's
    // (relay mode copies them into a peer's window while it may be waiting on the slot's flag of a later call).
    if (res == ncclSuccess && (cudaMemsetAsync(rv.outbox, 0, boxes, stream) != cudaSuccess ||
                               (rv.inbox && cudaMemsetAsync(rv.inbox, 0, inboxes, stream) != cudaSuccess)))
      res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "the outboxes: zero-fill failed");
    // The hierarchical HT's rail rows of a round (dispatch: a row and its tail; combine: a partial row), out and in,
    // zeroed.
    if (res == ncclSuccess && rv.hier) {
      const size_t slots = (size_t)topo.nDomains * rv.roundSlots, dispBytes = slots * rv.hierRow.bytes(),
                   combBytes = slots * (size_t)v.rowStride;
      void* hb = nullptr;
      res = g->deviceAlloc(&hb, ncclep::hierRailRowBytes(v));
      g->hierAlloc = hb;
      g->railBytes += ncclep::hierRailRowBytes(v);
      rv.hierOut = static_cast<char*>(hb);
      rv.hierIn = rv.hierOut + dispBytes;
      rv.hierCombOut = rv.hierIn + dispBytes;
      rv.hierCombIn = rv.hierCombOut + combBytes;
      if (res == ncclSuccess && cudaMemsetAsync(hb, 0, ncclep::hierRailRowBytes(v), stream) != cudaSuccess)
        res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "the hierarchical rows: zero-fill failed");
    }
    // ncclEpMaskClean's rail barrier (railBarrier): 8 bytes out, 8 in from each rank.
    if (res == ncclSuccess && config.enable_mask) {
      const size_t bytes = 8 * ((size_t)nRanks + 1);
      res = g->deviceAlloc(&g->railBarrierBuf, bytes);
      if (res == ncclSuccess && cudaMemsetAsync(g->railBarrierBuf, 0, bytes, stream) != cudaSuccess)
        res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "the rail barrier: zero-fill failed");
    }
    if (res == ncclSuccess) {
      ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
      cc.blocking = 1;
      const ncclResult_t split = rv.relay
                                     ? ncclCommSplit(g->domain->railComm(), 0, topo.domainIndex, &g->railComm, &cc)
                                     : ncclCommSplit(comm, 0, rank, &g->railComm, &cc);
      if (split != ncclSuccess)
        res = ncclext::fail(split, __FILE__, __LINE__, "the rail communicator: ncclCommSplit: %s",
                            ncclGetErrorString(split));
    }
    if (res == ncclSuccess && rv.overlappable() && resolved.railOverlap) {
      if (cudaStreamCreateWithFlags(&g->sideStream, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&g->forkEvent, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&g->joinEvent, cudaEventDisableTiming) != cudaSuccess)
        res = ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "the overlapped exchange's stream and events");
    }
    if (rv.relay && g->domain->isVirtual()) {  // every virtual rank here, in the same order (VirtualDomain::newKey)
      g->relayFenceKey = testing.virtualDomain->domain.newKey(rank - rv.domainBase);
      g->relayFenced = true;
    }
    // Every pair of ranks in different domains connected now, while all are here: NCCL connects a pair at its first
    // point-to-point call, which blocks the host until the peer takes part, so that a peer that later skips a call
    // would hang the exchange's host call before the watchdog watches it.
    if (res == ncclSuccess) {
      // Relay: the rail's ranks are the domains (mine excluded).
      std::vector<char> remote(rv.relay ? topo.nDomains : nRanks, 0);
      for (int r = 0; r < (int)remote.size(); r++) remote[r] = rv.relay ? r != topo.domainIndex : !rv.local(r);
      ncclEpGroup* gp = g.get();
      const double seconds = g->timeoutSeconds;
      res = ncclext::connectPeers(g->railComm, remote, remote, gp, seconds, stream,
                                  [gp, seconds] { abortRail(gp, seconds); }, "ncclEpCreateGroup (the rail)");
      if (g->railAborted)
        res = ncclext::fail(ncclRemoteError, __FILE__, __LINE__,
                            "ncclEpCreateGroup: connecting to the ranks of the other NVLink domains did not finish "
                            "within %.1f s (a peer that died or never called ncclEpCreateGroup)",
                            seconds);
    }
  }
  cudaStreamDestroy(stream);
  NCCLEXT_CHECK(res);
  uint64_t* st = static_cast<uint64_t*>(g->state);
  v.calls = st;
  v.arrivals = reinterpret_cast<unsigned long long*>(st + 2);
  v.sent = st + 4;
  v.sendArrivals = reinterpret_cast<unsigned long long*>(st + 6);
  v.barrierEpoch = st + 8;
  v.mask = config.enable_mask ? reinterpret_cast<int*>(static_cast<char*>(g->state) + kMaskOffset) : nullptr;
  // Virtual ranks: nobody launches a kernel of this group before every rank is done with the calls above (some of
  // them wait for all work on the GPU).
  if (g->domain->isVirtual()) NCCLEXT_CHECK(g->domain->barrier());
  NCCLEXT_INFO("group: %d ranks, %d experts, %d tokens x %d bytes, top-%d, %d SMs, window %zu bytes, %s",
               nRanks, config.num_experts, config.max_tokens_per_rank, config.max_token_bytes, config.max_topk,
               g->numSms, w.total, ncclext::describeEnv(ncclext::env()).c_str());
  *out = g.release();
  return ncclSuccess;
}

ncclResult_t ncclEpGroup::setMask(const int* hostMask, cudaStream_t stream) {
  for (int r = 0; r < view.nRanks; r++) maskHost_[r] = hostMask[r] != 0;
  // From pageable memory (maskHost_ is a member): the copy has read it before cudaMemcpyAsync returns.
  NCCLEXT_CUDA(cudaMemcpyAsync(static_cast<char*>(state) + kMaskOffset, maskHost_, view.nRanks * sizeof(int),
                               cudaMemcpyHostToDevice, stream));
  return ncclSuccess;
}

// Across domains, ncclEpMaskClean's barrier with the ranks of other domains that my host mask marks active: 8 bytes
// each way with each, one NCCL group on the stream (it ends once every such rank has posted its own, i.e. reached
// the same point of its stream), watched like an exchange: a rank that never comes has the rail aborted.
ncclResult_t ncclEpGroup::railBarrier(cudaStream_t stream) {
  return inRailGroup(stream, "ncclEpMaskClean", [&](bool) {
    char* buf = static_cast<char*>(railBarrierBuf);
    ncclResult_t res = ncclSuccess;
    for (int r = 0; r < view.nRanks && res == ncclSuccess && maskHost_[view.rank]; r++) {
      if (view.rail.local(r) || !maskHost_[r]) continue;
      res = ncclSend(buf, 8, ncclUint8, r, railComm, stream);
      if (res == ncclSuccess) res = ncclRecv(buf + 8 * (size_t)(r + 1), 8, ncclUint8, r, railComm, stream);
    }
    return res;
  });
}

ncclResult_t ncclEpGroup::maskClean(cudaStream_t stream) {
  const uint64_t epoch = ++cleans_;
  // Each barrier: my domain's active ranks on the device, then the other domains' over the rail.
  NCCLEXT_CHECK(ncclep::launchLlCleanBarrier(view, 2 * epoch - 1, stream));
  NCCLEXT_CHECK(railBarrier(stream));
  // Every flag of the calls (done flags; each bank's row, header and slice flags) and the call numbers.
  char* base = static_cast<char*>(mem->localPtr());
  const ncclep::WindowLayout& w = view.wl;
  NCCLEXT_CUDA(cudaMemsetAsync(base + w.dispDone, 0, w.cleanFlags - w.dispDone, stream));
  for (int bank = 0; bank < 2; bank++)
    NCCLEXT_CUDA(cudaMemsetAsync(base + w.combFlags + bank * w.bankBytes, 0, w.dispRows - w.combFlags, stream));
  NCCLEXT_CUDA(cudaMemsetAsync(state, 0, kCountersBytes, stream));
  // Across domains the outboxes (and inboxes) carry flags too, whole slices into the peers' windows: zeroed, so
  // that none of a call numbered before the reset can pass for a later one.
  if (railAlloc) NCCLEXT_CUDA(cudaMemsetAsync(railAlloc, 0, railAllocBytes, stream));
  NCCLEXT_CHECK(ncclep::launchLlCleanBarrier(view, 2 * epoch, stream));
  return railBarrier(stream);
}

namespace {

// The watchdog's action on an exchange past its budget: abort the rail communicator (its NCCL kernels end, and a host
// call blocked in NCCL on it returns), then every later call fails. As nccl_m2n's abortExchanges: an enqueue that
// does not let the lock go within a second is blocked inside NCCL, which ncclCommAbort from another thread ends.
void abortRail(ncclEpGroup* g, double seconds) {
  std::unique_lock<std::timed_mutex> lock(g->railMu, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(1));
  if (g->railAborted) return;
  char msg[400];
  snprintf(msg, sizeof(msg),
           "across NVLink domains: a rail exchange timed out (not finished within %.1f s: a peer of another domain "
           "that died or never calls): the group's rail communicator was aborted; destroy the group",
           seconds);
  g->railWhy = msg;
  g->railAborted = true;
  ncclComm_t c = g->railComm;
  if (g->railCaptured) {
    std::thread([c] { ncclCommAbort(c); }).detach();
  } else {
    ncclCommAbort(c);
  }
}

}  // namespace

int ncclEpGroup::railRounds(const int64_t* counts, cudaStream_t stream) const {
  if (!railComm) return 1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  return ncclep::railRoundsOf(view.rail, view.nRanks, view.maxTokens,
                              capture == cudaStreamCaptureStatusNone ? counts : nullptr);
}

ncclResult_t ncclEpGroup::inRailGroup(cudaStream_t stream, const char* what,
                                      const std::function<ncclResult_t(bool captured)>& body) {
  if (!railComm) return ncclSuccess;
  if (railAborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", railWhy.c_str());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  const bool captured = capture != cudaStreamCaptureStatusNone;
  if (captured) railCaptured = true;
  std::lock_guard<std::timed_mutex> lock(railMu);
  if (railAborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", railWhy.c_str());
  NCCLEXT_NCCL(ncclGroupStart());
  const ncclResult_t res = body(captured);
  const ncclResult_t ended = ncclGroupEnd();
  if (res != ncclSuccess || ended != ncclSuccess)
    return ncclext::fail(res != ncclSuccess ? res : ended, __FILE__, __LINE__,
                         "%s across NVLink domains: NCCL point-to-point: %s", what, ncclGetLastError(railComm));
  if (!captured) {  // a replay runs later, unwatched
    const double seconds = timeoutSeconds;
    ncclext::watchStream(this, seconds, stream, [this, seconds] { abortRail(this, seconds); });
  }
  return ncclSuccess;
}

ncclResult_t ncclEpGroup::railExchange(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts,
                                       int* hierFwd, int round) {
  const ncclep::RailView& rv = view.rail;
  const bool hierCall = rv.hier && kind != ncclep::kRailHandle;
  if (!railComm) return ncclSuccess;
  const char* what = kind == ncclep::kDispatch ? "dispatch" : kind == ncclep::kCombine ? "combine" : "handle";
  // A captured call moves the fixed slices: its replays must not depend on this call's counts.
  NCCLEXT_CHECK(inRailGroup(stream, what, [&](bool captured) {
    return railMessages(kind, ownerWeighted, stream, captured ? nullptr : counts, round);
  }));
  if (!rv.relay) return rv.direct ? ncclSuccess : ncclep::launchRailInbox(view, kind, ownerWeighted, stream);
  if (hierCall && kind == ncclep::kCombine) return ncclSuccess;  // the source's scatter follows (api.cc)
  NCCLEXT_CHECK(ncclep::launchRailRelay(view, kind, ownerWeighted, hierFwd, round, stream));
  relayFence(stream);
  return ncclSuccess;
}

ncclResult_t ncclEpGroup::railMessages(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts,
                                       int round) {
  const ncclep::RailView& rv = view.rail;
  const ncclep::RailRegions regions = rv.regionsOf(kind, ownerWeighted);
  const int R = view.nRanks;
  ncclResult_t res = ncclSuccess;
  const bool hierCall = rv.hier && kind != ncclep::kRailHandle;
  if (hierCall) {
    // The hierarchical HT: to each other domain D's rank of my index (rail rank D), dispatch: my rail rows for D;
    // combine: my partials for its sources (as their relay); from it the same for my domain, one message each way,
    // the round's positions [round x roundSlots, + roundSlots) from the start of the round's rows. An EXACT
    // handle's eager call moves the rows its routing fills (positions 0.. in token order: my tokens that hit D out,
    // and back as partials; its tokens that hit my domain in, and back), no message where there are none;
    // otherwise the fixed messages. Rows past the ones sent are stale (an earlier call's number, or another
    // position: the relay skips them), and a source reads only the partials of its own positions.
    const int G = rv.domainSize, myDomain = view.rank / G, D = R / G;
    const bool dispatch = kind == ncclep::kDispatch, sized = counts != nullptr;
    const size_t bytes = hierMessageBytes(kind), row = ncclep::hierRowBytes(view, kind);
    const int64_t* rail = counts ? counts + 2 * (size_t)R : nullptr;  // hostTotals: ht.h, HandleView
    char* out = dispatch ? rv.hierOut : rv.hierCombOut;
    char* in = dispatch ? rv.hierIn : rv.hierCombIn;
    for (int d = 0; d < D && res == ncclSuccess; d++) {
      if (d == myDomain) continue;
      const int64_t mine = sized ? rail[d] : view.maxTokens, its = sized ? rail[D + d] : view.maxTokens;
      const size_t toD = (size_t)ncclep::railRoundRows(rv, round, dispatch ? mine : its) * row;
      const size_t fromD = (size_t)ncclep::railRoundRows(rv, round, dispatch ? its : mine) * row;
      if (toD > 0) res = ncclSend(out + (size_t)d * bytes, toD, ncclUint8, d, railComm, stream);
      if (fromD > 0 && res == ncclSuccess)
        res = ncclRecv(in + (size_t)d * bytes, fromD, ncclUint8, d, railComm, stream);
    }
  } else if (rv.relay) {
    // To the rank of my index in each other domain D (rail rank D): what I wrote for each of its ranks, one message
    // per rank in rank order; from it, what it wrote for each rank of mine, into inbox[D * G + r] (matched in the
    // same order). Whole fixed spans: a relay does not know another pair's counts.
    const int G = rv.domainSize, myDomain = view.rank / G;
    const size_t from = rv.outOff[regions.first], bytes = rv.spanOf(regions);
    for (int d = 0; d < R / G && res == ncclSuccess; d++) {
      if (d == myDomain) continue;
      for (int r = 0; r < G && res == ncclSuccess; r++) {
        const size_t box = (size_t)(d * G + r);
        res = ncclSend(rv.outbox + box * rv.outboxBytes + from, bytes, ncclUint8, d, railComm, stream);
        if (res == ncclSuccess)
          res = ncclRecv(rv.inbox + box * rv.inboxBytes + from, bytes, ncclUint8, d, railComm, stream);
      }
    }
  } else if (rv.direct) {
    // High-Throughput: a message per region and direction, from my outbox for remote rank r (box(r)) straight into
    // r's slice of my window: a rank of another domain writes there only through this exchange, which my stream
    // runs after my receive half of the previous call read it, and before this call's receive half reads it. Round
    // k moves the slots [k x roundSlots, + roundSlots), which its send half wrote from the outbox's start: an EXACT
    // handle's eager call the rows its routing fills (slots are dense from 0; what my peer sends me is what I
    // count from it), no message where there are none; otherwise whole slices (stale slots of earlier calls travel
    // too and are never read: a receiver reads only this call's rows). The handle's count row goes whole.
    const bool sized = counts != nullptr, dispatch = kind == ncclep::kDispatch;
    const int64_t lo = (int64_t)round * rv.roundSlots;
    char* window = static_cast<char*>(mem->localPtr());
    for (int r = 0; r < R && res == ncclSuccess; r++) {
      if (rv.local(r)) continue;
      const int64_t out =
          ncclep::railRoundRows(rv, round, !sized ? view.maxTokens : dispatch ? counts[r] : counts[R + r]);
      const int64_t in =
          ncclep::railRoundRows(rv, round, !sized ? view.maxTokens : dispatch ? counts[R + r] : counts[r]);
      for (int i = regions.first; i <= regions.last && res == ncclSuccess; i++) {
        const bool whole = kind == ncclep::kRailHandle;
        const size_t sendBytes = whole ? rv.slice[i] : (size_t)out * rv.slotBytes(i);
        const size_t recvBytes = whole ? rv.slice[i] : (size_t)in * rv.slotBytes(i);
        char* from = rv.outbox + (size_t)rv.box(r) * rv.outboxBytes + rv.outOff[i];
        char* into = window + (whole ? rv.base[i] + (size_t)r * rv.slice[i] : rv.roundInto(i, r, lo));
        if (sendBytes > 0) res = ncclSend(from, sendBytes, ncclUint8, r, railComm, stream);
        if (recvBytes > 0 && res == ncclSuccess) res = ncclRecv(into, recvBytes, ncclUint8, r, railComm, stream);
      }
    }
  } else {
    // Low-Latency: one message each way per remote rank (a message has a fixed cost of its own, milliseconds over
    // sockets: docs/PERFORMANCE.md): the call's regions lie end to end in the outbox, and land in my inbox. With
    // enable_mask, none to or from a rank my host mask marks inactive, and none at all when it marks me (the
    // kernels send such ranks nothing and read nothing of theirs; every rank applies the same mask update).
    const size_t from = rv.outOff[regions.first], bytes = rv.spanOf(regions);
    const bool masks = view.mask != nullptr;
    for (int r = 0; r < R && res == ncclSuccess; r++) {
      if (rv.local(r) || (masks && (!maskHost_[r] || !maskHost_[view.rank]))) continue;
      const size_t box = (size_t)rv.box(r);
      res = ncclSend(rv.outbox + box * rv.outboxBytes + from, bytes, ncclUint8, r, railComm, stream);
      if (res == ncclSuccess)
        res = ncclRecv(rv.inbox + box * rv.inboxBytes + from, bytes, ncclUint8, r, railComm, stream);
    }
  }
  return res;
}

// Virtual ranks share the GPU's hardware queues, which start work in order: my next kernel, queued behind one that
// waits for my domain's ranks (a relay, the hierarchical combine's reduce), must not sit in a queue ahead of a
// lagging peer's kernel that the waiting one needs. The fence: every rank enqueued its waiting kernel, so its
// earlier ones, before anyone enqueues what depends on one (as nccl_m2n's launch fences; an expired one is skipped
// from then on, the kernels' own timeouts report the absent rank). Not in a capture (replays have no fences).
void ncclEpGroup::relayFence(cudaStream_t stream) {
  if (!relayFenced || relayFenceLost) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  if (capture == cudaStreamCaptureStatusNone)
    relayFenceLost = testing.virtualDomain->domain.fence(view.rank - view.rail.domainBase, relayFenceKey,
                                                         timeoutSeconds) != ncclSuccess;
}

ncclEpGroup::~ncclEpGroup() {
  ncclext::Watchdog::instance().removeOwner(this);  // after it, no action of the watchdog touches the group
  if (railComm && !railAborted) {
    // NCCL's destruction waits for the graphs that captured work on the communicator: on a thread of its own then.
    ncclComm_t c = railComm;
    if (railCaptured)
      std::thread([c] { ncclCommDestroy(c); }).detach();
    else
      NCCLEXT_WARN_ON(ncclCommDestroy(c));
  }
  if (sideStream) NCCLEXT_WARN_ON(cudaStreamDestroy(sideStream));
  if (forkEvent) NCCLEXT_WARN_ON(cudaEventDestroy(forkEvent));
  if (joinEvent) NCCLEXT_WARN_ON(cudaEventDestroy(joinEvent));
  if (railAlloc) freeNow(railAlloc);
  if (hierAlloc) freeNow(hierAlloc);
  if (railBarrierBuf) freeNow(railBarrierBuf);
  if (state) freeNow(state);
  for (void* p : retiredDevice_) freeNow(p);
  for (void* p : retiredHost_) NCCLEXT_WARN_ON(cudaFreeHost(p));
}

ncclResult_t ncclEpGroup::destroy(ncclEpGroup* g) {
  // (1) No peer reads or writes my window after this.
  ncclResult_t res = g->domain->barrier();
  ncclext::VirtualDomain* virt = g->testing.virtualDomain ? &g->testing.virtualDomain->domain : nullptr;
  const int rank = g->view.rank - g->view.rail.domainBase;  // in the virtual domain (mixed: not the world rank)
  const double timeout = g->timeoutSeconds;
  if (res == ncclSuccess && g->relayFenced && virt) virt->forget(g->relayFenceKey);  // every rank is past its fences
  // (2) Free. A failed barrier means a peer is gone: the domain communicator is aborted first (no teardown call may
  // wait for the dead peer), and the window is then freed without its collective deregistration.
  if (res != ncclSuccess && g->domain->abort() && g->mem) g->mem->abandon();
  delete g;
  // (3) Virtual ranks: no rank goes on to launch kernels while another still frees (a free waits for all of them).
  if (virt && res == ncclSuccess) res = virt->barrier(rank, timeout);
  return res;
}

ncclResult_t ncclEpGroup::asyncError(const char* what) {
  if (railAborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s: %s", what, railWhy.c_str());
  ncclext::DeviceErrorWord w;
  if (!status || !status->read(&w)) return ncclSuccess;
  if (w.code == ncclext::kDevicePeerMasked) {  // reported once: the group goes on without the peer
    status->reset();
    return ncclext::describeDeviceError(w, what);
  }
  if (w.code == ncclext::kDeviceBadInput && (w.site == ncclep::kSiteTopkIdx || w.site == ncclep::kSiteTopkRepeat)) {
    status->reset();
    if (w.site == ncclep::kSiteTopkRepeat)
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                           "%s: topk_idx[%u][%d] = %lld repeats topk_idx[%u][%llu]: a token names each expert at most "
                           "once (the repeat was ignored)",
                           what, w.index, w.peer, (long long)(int64_t)w.seen, w.index, (unsigned long long)w.expected);
    return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                         "%s: topk_idx[%u][%d] = %lld is not an expert id in [-1, %llu) (it was ignored)", what, w.index,
                         w.peer, (long long)(int64_t)w.seen, (unsigned long long)w.expected);
  }
  return status->check(what);
}

ncclResult_t ncclEpHandle::create(ncclEpGroup* group, ncclEpLayout_t layout, int topk,
                                  const ncclEpHandleConfig_t& config, ncclEpHandle** out) {
  std::unique_ptr<ncclEpHandle> h(new ncclEpHandle());
  h->group = group;
  h->layout = layout;
  h->config = config;
  h->topk = topk;
  const ncclep::GroupView& g = group->view;
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, NC = g.nChunks, MK = g.meta.maxTopk;
  const int align = std::max(1, config.dispatch_output_per_expert_alignment);
  h->maxFlatRows = (int64_t)R * g.maxTokens;
  if (g.lowLatency) {  // fixed layouts: RANK_MAJOR [R][M], EXPERT_MAJOR [L][R x M]
    h->maxRecvRows = layout == NCCL_EP_LAYOUT_RANK_MAJOR ? h->maxFlatRows : h->maxFlatRows * L;
  } else {
    h->maxRecvRows = layout == NCCL_EP_LAYOUT_FLAT ? h->maxFlatRows
                                                   : h->maxFlatRows * std::min(topk, L) + (int64_t)L * (align - 1);
  }
  ncclep::DerivedLayout& dl = h->view.dl;
  int n = 0;
  dl.srcCount = n;
  n += R;
  dl.recvOffset = n;
  n += R;
  dl.expCount = n;
  n += L;
  dl.zoneStart = n;
  n += L + 1;
  dl.srcExpOff = n;
  n += R * L;
  dl.chunkPrefix = n;
  n += R * (NC + 1);
  dl.totals = n;
  n += 2;
  dl.peerChunks = n;
  n += 1;
  dl.ints = n;
  // One device block: sendSlot, emIdx, tileCount, derived, emPos, flatW, llRecvCount, llToken, and for the
  // hierarchical HT hierPos, hierFwd and hierTok.
  const size_t hierDomains = g.rail.hier ? (size_t)(R / g.rail.domainSize) : 0;
  const size_t sizes[] = {(size_t)g.maxTokens * R * 4, (size_t)g.maxTokens * MK * 4, (size_t)(NC + 1) * (R + E) * 4,
                          (size_t)dl.ints * 4,         (size_t)h->maxFlatRows * MK * 4, (size_t)h->maxFlatRows * MK * 4,
                          (size_t)R * 4,               (size_t)h->maxFlatRows * 4,
                          (size_t)g.maxTokens * hierDomains * 4,
                          hierDomains * g.maxTokens * (size_t)g.rail.domainSize * 4,
                          hierDomains * ((size_t)g.maxTokens + 1) * 4};
  constexpr int kArrays = sizeof(sizes) / sizeof(sizes[0]);
  size_t offsets[kArrays], total = 0;
  for (int i = 0; i < kArrays; i++) {
    offsets[i] = total;
    total = alignUp(total + sizes[i], 256);
  }
  NCCLEXT_CHECK(group->deviceAlloc(&h->block, total));
  char* b = static_cast<char*>(h->block);
  ncclep::HandleView& v = h->view;
  v.topk = topk;
  v.layout = layout;
  v.align = align;
  v.sendSlot = reinterpret_cast<int*>(b + offsets[0]);
  v.emIdx = reinterpret_cast<int*>(b + offsets[1]);
  v.tileCount = reinterpret_cast<int*>(b + offsets[2]);
  v.derived = reinterpret_cast<int*>(b + offsets[3]);
  v.emPos = reinterpret_cast<int*>(b + offsets[4]);
  v.flatW = reinterpret_cast<float*>(b + offsets[5]);
  v.llRecvCount = reinterpret_cast<int*>(b + offsets[6]);
  v.llToken = reinterpret_cast<int*>(b + offsets[7]);
  v.hierPos = hierDomains ? reinterpret_cast<int*>(b + offsets[8]) : nullptr;
  v.hierFwd = hierDomains ? reinterpret_cast<int*>(b + offsets[9]) : nullptr;
  v.hierTok = hierDomains ? reinterpret_cast<int*>(b + offsets[10]) : nullptr;
  void* host = nullptr;
  const size_t hostInts = 2 + 2 * (size_t)R + (hierDomains ? 2 * hierDomains + 1 : 0);  // HandleView::hostTotals
  NCCLEXT_CUDA(cudaHostAlloc(&host, hostInts * sizeof(int64_t), cudaHostAllocMapped | cudaHostAllocPortable));
  h->hostTotals = static_cast<int64_t*>(host);
  std::fill(h->hostTotals, h->hostTotals + hostInts, -1);
  if (config.sizing == NCCL_EP_SIZING_EXACT) {
    void* dev = nullptr;
    NCCLEXT_CUDA(cudaHostGetDevicePointer(&dev, host, 0));
    v.hostTotals = static_cast<int64_t*>(dev);
  }
  // Virtual ranks: no peer's route kernels may wait for mine while an allocation above waits for the GPU.
  if (group->domain->isVirtual()) NCCLEXT_CHECK(group->domain->barrier());
  *out = h.release();
  return ncclSuccess;
}

ncclEpHandle::~ncclEpHandle() {
  if (pendingKind >= 0) {  // its send-only call is abandoned
    std::deque<ncclEpHandle*>& q = group->pending[pendingKind];
    q.erase(std::remove(q.begin(), q.end(), this), q.end());
  }
  group->deviceFree(block);
  group->hostFree(hostTotals);
}

ncclResult_t ncclEpHandle::bind(const ncclEpTensor_t& topkIdx, const ncclEpLayoutInfo_t* info, cudaStream_t stream) {
  view.numTokens = (int)topkIdx.sizes[0];
  view.topkIdx = topkIdx.data;
  view.topkIs64 = topkIdx.datatype == ncclInt64 || topkIdx.datatype == ncclUint64;
  const ncclep::LayoutInfoOut out = layoutInfoOut(info);
  if (group->view.lowLatency) {  // the counts travel with every dispatch
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, false, ncclep::kHtWhole, stream));
  } else if (!group->railComm) {
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtWhole, stream));
  } else {  // across domains: the exchange kernel's halves around the rail exchange of the count rows
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtSendHalf, stream));
    NCCLEXT_CHECK(group->railExchange(ncclep::kRailHandle, false, stream));
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtReceiveHalf, stream));
  }
  if (config.sizing == NCCL_EP_SIZING_EXACT) {
    // The caller reads the error word through group->asyncError (input errors get their own message there).
    NCCLEXT_CHECK(ncclext::waitStream(stream, group->timeoutSeconds, "handle creation"));
  }
  return ncclSuccess;
}
