// HT handle creation: routing bound once, on the GPU, with no host synchronisation.
//
// Contract
//   countKernel  grid = token tiles (kChunkTokens each; at least 1), block = kChunkTokens. Thread t reads token t's
//                top-k row, checks every id (an id outside [-1, E), or one an earlier column of the token already
//                names, is reported in the error word and ignored: routedExpert), and counts, per tile, tokens per
//                destination rank and (token, expert) pairs per expert.
//   scanKernel   one CTA per count column: exclusive prefix over tiles -> tileCount[c] = counts of tiles < c
//                (row NC holds the totals), for c in [0, NC].
//   slotKernel   grid = token tiles: sendSlot[t][r] = position of token t among this rank's tokens going to r (or
//                -1); emIdx[t][k] = position of t among this rank's tokens routed to expert topk[t][k] (or -1).
//   exchangeKernel one CTA: writes this rank's totals, per-expert counts and chunk prefix towards rank r into r's
//                exchange row, meets every rank in the flag barrier (release/acquire at system scope, with a
//                timeout), derives the receive layout (FLAT offsets by source, EXPERT_MAJOR zone starts and
//                (source, expert) offsets, chunk prefixes from every source), writes the optional layout-info
//                outputs and the number of peer chunks holding rows for me, and meets the ranks again so that no rank
//                overwrites exchange rows still being read. Low-Latency handles skip it (exchange off): their counts
//                travel with every dispatch (kernels/ll_lsa.cu). Across NVLink domains it runs in two halves: the
//                send half writes the rows (another domain's rank's into my outbox for it, peerAt); the host's rail
//                exchange brings every remote source's row into my window; the receive half meets
//                my domain's ranks and derives (the barriers span my domain only: another domain's rows are in
//                place by stream order, and its next rows reach my window only through my next exchange, which my
//                stream runs after this kernel). The hierarchical HT's rows end with the writer's tokens that hit
//                each domain (counted by the send half from sendSlot, as hierScanKernel counts its rail rows); an
//                EXACT handle's receive half copies mine and those of each other domain's rank of my index for my
//                domain into hostTotals, which size the rail messages of its eager calls.
//   railInboxKernel  Low-Latency across domains, after an exchange's NCCL group: each remote source's slices of the
//                exchange's regions, inbox -> my window (the kind's bank), 8 bytes a thread at a time (HT's flat
//                exchange receives into the window itself: RailView::direct).
//   railRelayKernel  the same in relay mode (HT over a rail of one index, RailView::relay): what each other domain's
//                rank of my index wrote for each rank r of my domain, inbox -> r's window (LSA), at that writer's
//                slices. Dispatch and combine first wait until every rank of my domain consumed the previous call
//                (its done flag, as a sender waits), then move slot by slot, the CTA's stores of a slot before its
//                flag's release (the row flag in the metadata for dispatch, the combine flag region for combine):
//                the receivers acquire the flags as they do LSA senders'. The handle's exchange rows need no flag
//                (their readers meet after this kernel in the domain's barrier).
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht.h"
#include "nccl_ep/src/kernels/ht_copy.cuh"

namespace ncclep {
namespace {

// The expert id of (t, k) as routing uses it: -1 for "none", for ids outside [-1, E) and for an id that an earlier
// column of the same token already names (O(K) loads, in the handle kernels only). With `report`, the first
// bad id is recorded (countKernel); the other kernels see the same -1 (slotKernel writes emIdx -1, which dispatch
// reads as "none"), so counts, slots and rows stay consistent whatever the input.
__device__ __forceinline__ int routedExpert(const GroupView& g, const HandleView& h, int t, int k, bool report) {
  const int e = loadExpert(h, t, k);
  if (e == -1) return -1;
  if (e < -1 || e >= g.numExperts) {
    if (report)
      ncclext::dev::recordError(g.err, ncclext::kDeviceBadInput, g.rank, k, (uint64_t)g.numExperts,
                                (uint64_t)(int64_t)e, kSiteTopkIdx, (uint32_t)t, 0);
    return -1;
  }
  for (int j = 0; j < k; j++) {
    if (loadExpert(h, t, j) == e) {  // the raw id: a repeat of a repeat still names the first column
      if (report)
        ncclext::dev::recordError(g.err, ncclext::kDeviceBadInput, g.rank, k, (uint64_t)j, (uint64_t)e,
                                  kSiteTopkRepeat, (uint32_t)t, 0);
      return -1;
    }
  }
  return e;
}

__global__ void countKernel(GroupView g, HandleView h) {
  extern __shared__ int counts[];  // [R + E]
  const int cols = g.nRanks + g.numExperts;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  const int t = blockIdx.x * kChunkTokens + threadIdx.x;
  if (t < h.numTokens) {
    uint64_t mask = 0;
    for (int k = 0; k < h.topk; k++) {
      const int e = routedExpert(g, h, t, k, true);
      if (e < 0) continue;
      atomicAdd(&counts[g.nRanks + e], 1);
      mask |= 1ull << (e / g.localExperts);
    }
    for (int r = 0; r < g.nRanks; r++)
      if (mask >> r & 1) atomicAdd(&counts[r], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < cols; i += blockDim.x) h.tileCount[(size_t)blockIdx.x * cols + i] = counts[i];
}

__global__ void scanKernel(GroupView g, HandleView h, int usedTiles) {
  __shared__ int buf[2][kMaxTokens / kChunkTokens + 1];
  const int cols = g.nRanks + g.numExperts, col = blockIdx.x, n = g.nChunks + 1;
  for (int c = threadIdx.x; c < n; c += blockDim.x) buf[0][c] = c > 0 && c - 1 < usedTiles ? h.tileCount[(size_t)(c - 1) * cols + col] : 0;
  __syncthreads();
  int cur = 0;
  for (int step = 1; step < n; step <<= 1) {
    for (int c = threadIdx.x; c < n; c += blockDim.x) buf[cur ^ 1][c] = buf[cur][c] + (c >= step ? buf[cur][c - step] : 0);
    __syncthreads();
    cur ^= 1;
  }
  for (int c = threadIdx.x; c < n; c += blockDim.x) h.tileCount[(size_t)c * cols + col] = buf[cur][c];
}

__global__ void slotKernel(GroupView g, HandleView h) {
  __shared__ int tileExperts[kChunkTokens * kMaxTopk];
  __shared__ uint64_t tileMask[kChunkTokens];
  const int cols = g.nRanks + g.numExperts;
  const int t0 = blockIdx.x * kChunkTokens, i = threadIdx.x, t = t0 + i;
  const bool valid = t < h.numTokens;
  uint64_t mask = 0;
  for (int k = 0; k < h.topk; k++) {
    const int e = valid ? routedExpert(g, h, t, k, false) : -1;
    tileExperts[i * h.topk + k] = e;
    if (e >= 0) mask |= 1ull << (e / g.localExperts);
  }
  tileMask[i] = mask;
  __syncthreads();
  if (!valid) return;
  const int* base = h.tileCount + (size_t)blockIdx.x * cols;
  for (int r = 0; r < g.nRanks; r++) {
    int slot = -1;
    if (mask >> r & 1) {
      slot = base[r];
      for (int j = 0; j < i; j++) slot += (int)(tileMask[j] >> r & 1);
    }
    h.sendSlot[(size_t)t * g.nRanks + r] = slot;
  }
  for (int k = 0; k < h.topk; k++) {
    const int e = tileExperts[i * h.topk + k];
    int idx = -1;
    if (e >= 0) {
      idx = base[g.nRanks + e];
      for (int j = 0; j < i; j++)
        for (int kk = 0; kk < h.topk; kk++) idx += tileExperts[j * h.topk + kk] == e;
    }
    h.emIdx[(size_t)t * g.meta.maxTopk + k] = idx;
  }
}

__global__ void exchangeKernel(GroupView g, HandleView h, LayoutInfoOut info, int phase) {
  ncclext::dev::CoopCta cta;
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, NC = g.nChunks, me = g.rank;
  const int cols = R + E;
  const int* totals = h.tileCount + (size_t)NC * cols;
  const RailView& rv = g.rail;
  const int nDomainCounts = g.wl.exchangeInts - g.wl.domainCounts;  // the hierarchical HT's: one per domain
  // (1) My row into every rank's exchange area (another domain's rank's: into my outbox for it).
  if (phase != kHtReceiveHalf) {
    // The hierarchical HT: how many of my tokens hit each domain (a slot towards any of its ranks: hierScanKernel's
    // test), the rail rows my dispatch sends there.
    __shared__ int domainHits[kMaxRanks];
    for (int d = 0; d < nDomainCounts; d++) {
      int hits = 0;
      for (int t0 = 0; t0 < h.numTokens; t0 += blockDim.x) {
        const int t = t0 + (int)threadIdx.x;
        bool hit = false;
        for (int rl = 0; t < h.numTokens && rl < rv.domainSize; rl++)
          hit = hit || h.sendSlot[(size_t)t * R + d * rv.domainSize + rl] >= 0;
        hits += __syncthreads_count(hit);
      }
      if (threadIdx.x == 0) domainHits[d] = hits;
    }
    __syncthreads();
    for (int r = 0; r < R; r++) {
      int* row = static_cast<int*>(peerAt(g, g.wl.exchange + (size_t)me * g.wl.exchangeInts * sizeof(int), r));
      for (int i = threadIdx.x; i < R + E; i += blockDim.x) row[i] = totals[i];
      for (int c = threadIdx.x; c <= NC; c += blockDim.x) row[R + E + c] = h.tileCount[(size_t)c * cols + r];
      for (int d = threadIdx.x; d < nDomainCounts; d += blockDim.x) row[g.wl.domainCounts + d] = domainHits[d];
    }
    // Across domains the release that publishes these rows to my domain is the receive half's barrier, a later
    // kernel: each thread's stores are made visible at system scope before this kernel can end.
    if (phase == kHtSendHalf) {
      __threadfence_system();
      return;
    }
  }
  // (2) Meet every rank of my domain (its stores released, theirs acquired).
  ncclext::dev::LsaBarrier bar{g.peers,          g.wl.barrierFlags, g.barrierEpoch,         me - rv.domainBase,
                               rv.domainSize,    rv.domainBase,     {g.err, g.timeoutNs, me}};
  if (!ncclext::dev::lsaBarrierSync(cta, bar, 0)) return;
  // (3) Derive my receive layout.
  const int* rows = static_cast<const int*>(g.peers.local(g.wl.exchange));
  const DerivedLayout& dl = h.dl;
  int* d = h.derived;
  if (threadIdx.x == 0) {
    int off = 0;
    for (int s = 0; s < R; s++) {
      const int n = rows[(size_t)s * g.wl.exchangeInts + me];
      d[dl.srcCount + s] = n;
      d[dl.recvOffset + s] = off;
      off += n;
    }
    d[dl.totals + 0] = off;
  }
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    int run = 0;
    for (int s = 0; s < R; s++) {
      d[dl.srcExpOff + s * L + l] = run;
      run += rows[(size_t)s * g.wl.exchangeInts + R + me * L + l];
    }
    d[dl.expCount + l] = run;
  }
  for (int i = threadIdx.x; i < R * (NC + 1); i += blockDim.x) {
    const int s = i / (NC + 1), c = i % (NC + 1);
    d[dl.chunkPrefix + i] = rows[(size_t)s * g.wl.exchangeInts + R + E + c];
  }
  // 1 + the last chunk of any peer holding rows for me: the chunks that dispatch receivers and combine senders walk.
  __shared__ int peerChunks;
  if (threadIdx.x == 0) peerChunks = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < R * NC; i += blockDim.x) {
    const int s = i / NC, c = i % NC;
    const int* prefix = rows + (size_t)s * g.wl.exchangeInts + R + E;
    if (s != me && prefix[c + 1] > prefix[c]) atomicMax(&peerChunks, c + 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) d[dl.peerChunks] = peerChunks;
  if (threadIdx.x == 0) {
    int pos = 0;
    const int a = h.align;
    for (int l = 0; l < L; l++) {
      d[dl.zoneStart + l] = pos;
      pos += (d[dl.expCount + l] + a - 1) / a * a;
    }
    d[dl.zoneStart + L] = pos;
    d[dl.totals + 1] = pos;
    const bool em = h.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR;
    if (info.recvTotal) info.recvTotal[0] = em ? pos : d[dl.totals + 0];
    if (h.hostTotals) {
      h.hostTotals[0] = d[dl.totals + 0];
      h.hostTotals[1] = pos;
    }
  }
  if (h.hostTotals) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      h.hostTotals[2 + r] = totals[r];
      h.hostTotals[2 + R + r] = d[dl.srcCount + r];
    }
    // The hierarchical HT: my rail rows to each other domain, and the rows its rank of my index sends me (whose row
    // reached my window by my own relay).
    const int myDomain = me / rv.domainSize, myIndex = me - rv.domainBase;
    int64_t* rail = h.hostTotals + 2 + 2 * (size_t)R;
    for (int dd = threadIdx.x; dd < nDomainCounts; dd += blockDim.x) {
      const int* mine = rows + (size_t)me * g.wl.exchangeInts + g.wl.domainCounts;
      const int* theirs = rows + (size_t)(dd * rv.domainSize + myIndex) * g.wl.exchangeInts + g.wl.domainCounts;
      rail[dd] = dd == myDomain ? -1 : mine[dd];
      rail[nDomainCounts + dd] = dd == myDomain ? -1 : theirs[myDomain];
    }
    // And the most rail rows any rank of my domain sends to or receives from one domain: every rank of my domain
    // takes that many rounds (ht.h railRoundsOf), so that they make the same launch fences (virtual ranks).
    if (threadIdx.x == 0 && nDomainCounts > 0) {
      int most = 0;
      for (int p = 0; p < rv.domainSize; p++)
        for (int dd = 0; dd < nDomainCounts; dd++) {
          if (dd == myDomain) continue;
          const int out = rows[(size_t)(rv.domainBase + p) * g.wl.exchangeInts + g.wl.domainCounts + dd];
          const int in = rows[(size_t)(dd * rv.domainSize + p) * g.wl.exchangeInts + g.wl.domainCounts + myDomain];
          most = max(most, max(out, in));
        }
      rail[2 * nDomainCounts] = most;
    }
  }
  __syncthreads();
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    if (info.expertCounters) info.expertCounters[l] = d[dl.expCount + l];
    if (info.expertOffsets) info.expertOffsets[l] = d[dl.zoneStart + l];
  }
  for (int s = threadIdx.x; s < R; s += blockDim.x)
    if (info.srcRankCounters) info.srcRankCounters[s] = d[dl.srcCount + s];
  // (4) Nobody overwrites an exchange row (next handle) before every rank has read it.
  ncclext::dev::lsaBarrierSync(cta, bar, 0);
}

// Low-Latency's regions: every slice and offset a multiple of 8 bytes.
__global__ void __launch_bounds__(kThreads) railInboxKernel(GroupView g, int kind, int ownerWeighted) {
  const RailView& rv = g.rail;
  // The bank of the kind's last send half, which ran before on the stream (the receive half reading it comes after).
  const size_t bank = (g.sent[kind] & 1) * g.wl.bankBytes;
  char* window = static_cast<char*>(g.peers.local(bank));
  const RailRegions regions = rv.regionsOf(kind, ownerWeighted != 0);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
  for (int s = 0; s < g.nRanks; s++) {
    if (rv.local(s)) continue;
    for (int i = regions.first; i <= regions.last; i++) {
      const uint64_t* from = reinterpret_cast<const uint64_t*>(rv.inbox + (size_t)rv.box(s) * rv.inboxBytes +
                                                               rv.outOff[i]);
      uint64_t* to = reinterpret_cast<uint64_t*>(window + rv.base[i] + (size_t)s * rv.slice[i]);
      for (size_t k = tid; k < rv.slice[i] / 8; k += nt) to[k] = from[k];
    }
  }
}

// `bytes` (a multiple of 8) from `from` to `to` by the CTA, 8 bytes a thread at a time.
__device__ __forceinline__ void ctaCopy8(void* to, const void* from, size_t bytes) {
  for (size_t k = threadIdx.x; k < bytes / 8; k += blockDim.x)
    static_cast<uint64_t*>(to)[k] = static_cast<const uint64_t*>(from)[k];
}

// Low-Latency's relay: one CTA per (other domain, rank of mine), whole slices in the call's bank: the data (rows,
// metadata, the header's counts), then every flag word (slice flags), then the header's flag, each released after a
// CTA barrier: a receiver acquires the header first, then each row's slice flags, as from an LSA sender.
__device__ void relayLowLatency(const GroupView& g, int kind, bool ownerWeighted) {
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  const uint64_t seq = g.sent[kind];  // this call's send half, which ran before on my stream
  const size_t bank = (seq & 1) * g.wl.bankBytes;
  // Every rank of my domain consumed call seq - 2, the last one of this bank (as a sender waits: waitBankFree):
  // waitPeersConsumed's wait for the call before `seq - 1`.
  const size_t doneOff = kind == kDispatch ? g.wl.dispDone : g.wl.combDone;
  if (!waitPeersConsumed(Team::wholeCta(), g, doneOff, seq - 1)) return;
  const RailRegions regions = rv.regionsOf(kind, ownerWeighted);
  auto isFlags = [](int i) { return i == kRailDispFlags || i == kRailCombFlags || i == kRailOwnerFlags; };
  for (int it = blockIdx.x; it < (nDomains - 1) * G; it += gridDim.x) {
    const int r = it % G, dd = it / G, d = otherDomain(dd, myDomain), writer = d * G + myIndex;
    const char* sub = rv.inbox + (size_t)(d * G + r) * rv.inboxBytes;
    auto to = [&](int i) {
      return static_cast<char*>(g.peers.at(bank + rv.base[i] + (size_t)writer * rv.slice[i], r));
    };
    auto from = [&](int i) { return sub + rv.outOff[i]; };
    for (int i = regions.first; i <= regions.last; i++) {
      if (isFlags(i)) continue;
      const size_t skip = i == kRailHeader ? 8 : 0;  // the header's flag word goes last
      ctaCopy8(to(i) + skip, from(i) + skip, rv.slice[i] - skip);
    }
    __syncthreads();
    for (int i = regions.first; i <= regions.last; i++) {
      if (!isFlags(i)) continue;
      uint64_t* t = reinterpret_cast<uint64_t*>(to(i));
      const uint64_t* f = reinterpret_cast<const uint64_t*>(from(i));
      for (size_t k = threadIdx.x; k < rv.slice[i] / 8; k += blockDim.x) ncclext::dev::storeRelease(t + k, f[k]);
    }
    __syncthreads();
    if (regions.first == kRailHeader && threadIdx.x == 0)
      ncclext::dev::storeRelease(reinterpret_cast<uint64_t*>(to(kRailHeader)),
                                 *reinterpret_cast<const uint64_t*>(from(kRailHeader)));
    __syncthreads();
  }
}

// The hierarchical dispatch's relay (RailView::hier), after the done flags: one CTA per (other domain, rail
// position of round `round`); a row of this call at this position is written into the staging of every rank of my
// domain its tail names, at the source's slot towards that rank, with the metadata the source would have written
// for it (expert ids local to that rank, weights, indices, scales), its flag released last after a CTA barrier.
// The first round also marks every later position unforwarded (a later round, if any, overwrites its own): the
// combine's reduce then reads no forwarding record of an earlier call, whatever rounds this one takes.
__device__ void relayHierarchical(const GroupView& g, int* hierFwd, int round) {
  const RailView& rv = g.rail;
  const HierRow& hr = rv.hierRow;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  const uint64_t seq = callNumber(g, kDispatch);
  const int M = g.maxTokens, C = rv.roundSlots, lo = round * C;
  const int span = round == 0 ? M : min(C, M - lo);  // positions [lo, lo + span) of each other domain
  for (int64_t it = blockIdx.x; it < (int64_t)(nDomains - 1) * span; it += gridDim.x) {
    const int q = lo + (int)(it % span), dd = (int)(it / span), d = otherDomain(dd, myDomain);
    const int writer = d * G + myIndex;
    int* fwd = hierFwd + ((size_t)d * M + q) * G;
    if (q - lo >= C) {  // the first round: a position of a later round
      for (int rl = threadIdx.x; rl < G; rl += blockDim.x) fwd[rl] = -1;
      continue;
    }
    const char* in = rv.hierIn + ((size_t)d * C + (q - lo)) * hr.bytes();
    const bool current = *reinterpret_cast<const uint64_t*>(in + hr.seqOff()) == seq &&
                         *reinterpret_cast<const int*>(in + hr.posOff()) == q;
    // The handle's forwarding record for its combine: each rank's slot for this position (-1 for a stale row).
    for (int rl = threadIdx.x; rl < G; rl += blockDim.x)
      fwd[rl] = current ? reinterpret_cast<const int*>(in + hr.slotOff())[rl] : -1;
    if (!current) continue;  // not a row of this call at this position
    const int K = reinterpret_cast<const int*>(in + hr.countsOff())[0];
    const int nScales = reinterpret_cast<const int*>(in + hr.countsOff())[1];
    for (int rl = 0; rl < G; rl++) {
      const int slot = reinterpret_cast<const int*>(in + hr.slotOff())[rl];
      if (slot < 0) continue;
      const int r = rv.domainBase + rl;
      const size_t rowIndex = (size_t)writer * M + slot;
      ctaCopy8(g.peers.at(g.wl.dispRows + rowIndex * g.rowStride, rl), in, hr.rowStride);
      char* meta = static_cast<char*>(g.peers.at(g.wl.dispMeta + rowIndex * g.meta.bytes, rl));
      for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const int e = reinterpret_cast<const int*>(in + hr.expertOff())[k];
        reinterpret_cast<int*>(meta + g.meta.expertOff())[k] = localExpert(g, e, r);
        reinterpret_cast<float*>(meta + g.meta.weightOff())[k] = reinterpret_cast<const float*>(in + hr.weightOff())[k];
        reinterpret_cast<int*>(meta + g.meta.emIdxOff())[k] = reinterpret_cast<const int*>(in + hr.idxOff())[k];
      }
      for (int i = threadIdx.x; i < nScales; i += blockDim.x)
        reinterpret_cast<float*>(meta + g.meta.scaleOff())[i] = reinterpret_cast<const float*>(in + hr.scaleOff())[i];
      __syncthreads();
      if (threadIdx.x == 0) ncclext::dev::storeRelease(reinterpret_cast<uint64_t*>(meta + g.meta.flagOff()), seq);
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads) railRelayKernel(GroupView g, int kind, int ownerWeighted, int* hierFwd,
                                                            int round) {
  if (g.lowLatency) {
    relayLowLatency(g, kind, ownerWeighted != 0);
    return;
  }
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  if (kind != kRailHandle) {
    const size_t doneOff = kind == kDispatch ? g.wl.dispDone : g.wl.combDone;
    if (!waitPeersConsumed(Team::wholeCta(), g, doneOff, callNumber(g, static_cast<CallKind>(kind)))) return;
  }
  if (kind == kDispatch && rv.hier) {
    relayHierarchical(g, hierFwd, round);
    return;
  }
  // Items: (other domain, rank of mine, slot); the handle's exchange row is one slot of its whole slice.
  const int slots = kind == kRailHandle ? 1 : g.maxTokens;
  const int64_t items = (int64_t)(nDomains - 1) * G * slots;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int j = (int)(it % slots), r = (int)(it / slots % G), dd = (int)(it / slots / G);
    const int d = otherDomain(dd, myDomain);
    const int writer = d * G + myIndex;  // the rank of domain d whose slices these are
    const char* sub = rv.inbox + (size_t)(d * G + r) * rv.inboxBytes;
    auto dst = [&](int region, size_t slotBytes) {
      return static_cast<char*>(
          g.peers.at(rv.base[region] + (size_t)writer * rv.slice[region] + (size_t)j * slotBytes, r));
    };
    auto src = [&](int region, size_t slotBytes) { return sub + rv.outOff[region] + (size_t)j * slotBytes; };
    if (kind == kRailHandle) {  // int32 rows: 4 bytes a thread
      const size_t bytes = rv.slice[kRailHeader];
      const uint32_t* from = reinterpret_cast<const uint32_t*>(src(kRailHeader, 0));
      uint32_t* to = reinterpret_cast<uint32_t*>(dst(kRailHeader, 0));
      for (size_t k = threadIdx.x; k < bytes / 4; k += blockDim.x) to[k] = from[k];
      continue;
    }
    const size_t row = (size_t)g.rowStride;
    uint64_t* flagTo;
    const uint64_t* flagFrom;
    if (kind == kDispatch) {  // the row, then the metadata after its flag (the flag's 8 bytes lead the metadata)
      const size_t meta = g.meta.bytes;
      ctaCopy8(dst(kRailDispRows, row), src(kRailDispRows, row), row);
      ctaCopy8(dst(kRailDispMeta, meta) + 8, src(kRailDispMeta, meta) + 8, meta - 8);
      flagTo = reinterpret_cast<uint64_t*>(dst(kRailDispMeta, meta));
      flagFrom = reinterpret_cast<const uint64_t*>(src(kRailDispMeta, meta));
    } else {  // combine: the row, then its flag
      ctaCopy8(dst(kRailCombRows, row), src(kRailCombRows, row), row);
      flagTo = reinterpret_cast<uint64_t*>(dst(kRailCombFlags, 8));
      flagFrom = reinterpret_cast<const uint64_t*>(src(kRailCombFlags, 8));
    }
    // Every thread's stores of the slot before the flag: the barrier, then thread 0's system-scope release
    // (cumulative over what the barrier ordered before it).
    __syncthreads();
    if (threadIdx.x == 0) ncclext::dev::storeRelease(flagTo, *flagFrom);
    __syncthreads();  // the next slot's stores after this release (not needed for order; keeps the CTA in step)
  }
}

}  // namespace

ncclResult_t loadRouteKernels() {
  return ncclext::loadKernels("handle", countKernel, scanKernel, slotKernel, exchangeKernel, railInboxKernel,
                              railRelayKernel);
}

ncclResult_t launchRailRelay(const GroupView& g, int kind, bool ownerWeighted, int* hierFwd, int round,
                             cudaStream_t stream) {
  return ncclext::launchKernel("railRelayKernel", railRelayKernel, dim3(64), dim3(kThreads), 0, stream, g, kind,
                               ownerWeighted ? 1 : 0, hierFwd, round);
}

ncclResult_t launchRailInbox(const GroupView& g, int kind, bool ownerWeighted, cudaStream_t stream) {
  return ncclext::launchKernel("railInboxKernel", railInboxKernel, dim3(64), dim3(kThreads), 0, stream, g, kind,
                               ownerWeighted ? 1 : 0);
}

ncclResult_t launchRoute(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, bool exchange, int phase,
                         cudaStream_t stream) {
  if (phase == kHtReceiveHalf)
    return ncclext::launchKernel("ht exchangeKernel", exchangeKernel, dim3(1), dim3(kThreads), 0, stream, g, h, info,
                                 phase);
  const int tiles = (h.numTokens + kChunkTokens - 1) / kChunkTokens;
  const size_t smem = sizeof(int) * (g.nRanks + g.numExperts);
  NCCLEXT_CHECK(ncclext::launchKernel("ht countKernel", countKernel, dim3(tiles > 0 ? tiles : 1), dim3(kChunkTokens),
                                      smem, stream, g, h));
  NCCLEXT_CHECK(ncclext::launchKernel("ht scanKernel", scanKernel, dim3(g.nRanks + g.numExperts), dim3(1024), 0, stream,
                                      g, h, tiles));
  if (tiles > 0)
    NCCLEXT_CHECK(ncclext::launchKernel("ht slotKernel", slotKernel, dim3(tiles), dim3(kChunkTokens), 0, stream, g, h));
  if (!exchange) return ncclSuccess;  // LL: the counts travel with dispatch
  return ncclext::launchKernel("ht exchangeKernel", exchangeKernel, dim3(1), dim3(kThreads), 0, stream, g, h, info,
                               phase);
}

}  // namespace ncclep
