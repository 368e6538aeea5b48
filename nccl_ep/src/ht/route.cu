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
//                travel with every dispatch (ll/kernels.cu). Across NVLink domains it runs in two halves: the
//                send half writes the rows (another domain's rank's into my outbox for it, peerAt); the host's rail
//                exchange brings every remote source's row into my window; the receive half meets
//                my domain's ranks and derives (the barriers span my domain only: another domain's rows are in
//                place by stream order, and its next rows reach my window only through my next exchange, which my
//                stream runs after this kernel). The hierarchical HT's rows end with the writer's tokens that hit
//                each domain (counted by the send half from sendSlot, as hierScanKernel counts its rail rows); an
//                EXACT handle's receive half copies mine and those of each other domain's rank of my index for my
//                domain into hostTotals, which size the rail messages of its eager calls.
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht/cap.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/ht/ht.h"

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

// Every thread of the CTA: the inclusive scan of a[0, n) in shared memory (Hillis-Steele, a barrier a step), b the
// second buffer; returns the buffer that holds it. A barrier after the writes of a must come first.
__device__ const int* scanCta(int* a, int* b, int n) {
  for (int step = 1; step < n; step <<= 1) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) b[i] = a[i] + (i >= step ? a[i - step] : 0);
    __syncthreads();
    int* done = b;
    b = a;
    a = done;
  }
  return a;
}

__global__ void scanKernel(GroupView g, HandleView h, int usedTiles) {
  __shared__ int buf[2][kMaxTokens / kChunkTokens + 1];
  const int cols = g.nRanks + g.numExperts, col = blockIdx.x, n = g.nChunks + 1;
  for (int c = threadIdx.x; c < n; c += blockDim.x)
    buf[0][c] = c > 0 && c - 1 < usedTiles ? h.tileCount[(size_t)(c - 1) * cols + col] : 0;
  __syncthreads();
  const int* sums = scanCta(buf[0], buf[1], n);
  for (int c = threadIdx.x; c < n; c += blockDim.x) h.tileCount[(size_t)c * cols + col] = sums[c];
}

// One warp a tile (kChunkTokens == 32: lane i is the tile's token i). A token's slot towards r counts the tile's
// earlier tokens going to r (a ballot), its (token, expert) index the tile's earlier tokens naming the expert (a bit
// per token in expertTokens[e]: routedExpert leaves an expert at most once in a token's row).
__global__ void slotKernel(GroupView g, HandleView h) {
  static_assert(kChunkTokens == 32, "slotKernel: a tile is one warp");
  __shared__ int tileExperts[kChunkTokens * kMaxTopk];
  __shared__ unsigned expertTokens[kMaxExperts];  // bit j: the tile's token j names the expert
  const int cols = g.nRanks + g.numExperts;
  const int t0 = blockIdx.x * kChunkTokens, i = threadIdx.x, t = t0 + i;
  const bool valid = t < h.numTokens;
  const unsigned before = (1u << i) - 1;  // the tile's tokens ahead of mine
  for (int e = i; e < g.numExperts; e += kChunkTokens) expertTokens[e] = 0;
  __syncwarp();
  uint64_t mask = 0;
  for (int k = 0; k < h.topk; k++) {
    const int e = valid ? routedExpert(g, h, t, k, false) : -1;
    tileExperts[i * h.topk + k] = e;
    if (e >= 0) {
      mask |= 1ull << (e / g.localExperts);
      atomicOr(&expertTokens[e], 1u << i);
    }
  }
  __syncwarp();
  const int* base = h.tileCount + (size_t)blockIdx.x * cols;
  for (int r = 0; r < g.nRanks; r++) {  // every lane ballots, a token past the tile's end with no rank
    const bool to = mask >> r & 1;
    const unsigned going = __ballot_sync(0xffffffffu, to);
    if (valid) h.sendSlot[(size_t)t * g.nRanks + r] = to ? base[r] + __popc(going & before) : -1;
  }
  if (!valid) return;
  for (int k = 0; k < h.topk; k++) {
    const int e = tileExperts[i * h.topk + k];
    h.emIdx[(size_t)t * g.meta.maxTopk + k] = e >= 0 ? base[g.nRanks + e] + __popc(expertTokens[e] & before) : -1;
  }
}

// The receive cap's part of the exchange kernel (every thread of its CTA; `rows` holds every rank's counts towards
// every rank, row s being s's totals): my dense positions (DerivedLayout dispAt, combAt, combMine) and whether any
// rank gets more rows than the cap, the same answer on every rank. Returns where my experts' counts start in a row
// (g.wl.retained when some rank overflows: the counts of the rows that fit), or -1 after a failed barrier. Across
// domains (RailView::capped) the counts that fit reach another domain's ranks only by a second rail exchange: there
// it returns -2 once it wrote them, and the exchange kernel's third part (kHtRetainedHalf) meets and goes on.
__device__ int capLayout(const GroupView& g, const HandleView& h, const int* rows, ncclext::dev::CoopCta& cta,
                         ncclext::dev::LsaBarrier& bar) {
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, me = g.rank, cap = g.recvCap;
  const DerivedLayout& dl = h.dl;
  int* d = h.derived;
  bool overflow = false;
  const int stride = g.wl.exchangeInts;
  auto count = [rows, stride](int s, int r) { return rows[(size_t)s * stride + r]; };
  __shared__ int firstOver;  // the lowest rank past the cap (R: none)
  if (threadIdx.x == 0) firstOver = R;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const CapOffsets o = capOffsets(count, R, me, r);
    d[dl.dispAt + r] = o.dispAt;
    d[dl.combAt + r] = o.combAt;
    d[dl.combMine + r] = o.combMine;
    if (o.total > cap) {
      overflow = true;
      atomicMin(&firstOver, r);
    }
  }
  const bool anyOver = __syncthreads_or(overflow);
  if (threadIdx.x == 0) d[dl.overflow] = anyOver;
  if (!anyOver) return R + me * L;
  // ERROR: every rank records the same overflow (the lowest rank past the cap, from the counts every rank holds),
  // so that every rank's call fails alike: one that failed alone (an EXACT handle's creation) would leave its peers
  // waiting for its rows until the timeout.
  if (threadIdx.x == 0 && g.recvCapError) {
    const int total = capOffsets(count, R, me, firstOver).total;
    ncclext::dev::recordError(g.err, ncclext::kDeviceBadInput, firstOver, me, (uint64_t)cap, (uint64_t)total,
                              kSiteRecvCap, (uint32_t)(total - cap), 0);
  }
  // Some rank drops rows: its EXPERT_MAJOR zones must count only the rows that fit. The rows past the cap are each
  // source's last (positions grow with the source, then the slot), so a source's rows that fit for an expert are
  // the first of its (source, expert) indices: I count mine (slot below the cap's room at r), write them into r's
  // row, and meet every rank again before reading the counts written for me.
  __shared__ int room[kMaxRanks];
  __shared__ int kept[kMaxExperts];
  for (int r = threadIdx.x; r < R; r += blockDim.x) room[r] = cap - d[dl.dispAt + r];
  for (int e = threadIdx.x; e < E; e += blockDim.x) kept[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < h.numTokens * h.topk; i += blockDim.x) {
    const int t = i / h.topk, k = i % h.topk;
    if (h.emIdx[(size_t)t * g.meta.maxTopk + k] < 0) continue;  // ignored by routing (slotKernel)
    const int e = loadExpert(h, t, k), r = e / L;
    if (h.sendSlot[(size_t)t * R + r] < room[r]) atomicAdd(&kept[e], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * L; i += blockDim.x) {
    const int r = i / L, l = i % L;
    int* row = static_cast<int*>(peerAt(g, g.wl.exchange + (size_t)me * g.wl.exchangeInts * sizeof(int), r));
    row[g.wl.retained + l] = kept[i];
  }
  if (g.rail.capped) {
    __threadfence_system();  // as the send half's rows: released by the third part's barrier, a later kernel
    return -2;
  }
  if (!ncclext::dev::lsaBarrierSync(cta, bar, 0)) return -1;
  return g.wl.retained;
}

__device__ void finishLayout(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, const int* rows,
                             int retainedAt, ncclext::dev::CoopCta& cta, ncclext::dev::LsaBarrier& bar);

__global__ void exchangeKernel(GroupView g, HandleView h, LayoutInfoOut info, int phase) {
  ncclext::dev::CoopCta cta;
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, NC = g.nChunks, me = g.rank;
  const int cols = R + E;
  const int* totals = h.tileCount + (size_t)NC * cols;
  const RailView& rv = g.rail;
  const int nDomainCounts = g.wl.nDomainCounts;  // the hierarchical HT's: one per domain
  // (1) My row into every rank's exchange area (another domain's rank's: into my outbox for it).
  if (phase == kHtWhole || phase == kHtSendHalf) {
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
  const int* rows = static_cast<const int*>(g.peers.local(g.wl.exchange));
  const DerivedLayout& dl = h.dl;
  int* d = h.derived;
  if (phase == kHtRetainedHalf) {
    // The receive cap across domains, where some rank overflowed (the receive half said so; every rank did): meet
    // my domain's ranks once more (the counts that fit, which they wrote and, through the second rail exchange,
    // the other domains' ranks), then the rest of the receive half.
    if (!d[dl.overflow] || !ncclext::dev::lsaBarrierSync(cta, bar, 0)) return;
    finishLayout(g, h, info, rows, g.wl.retained, cta, bar);
    return;
  }
  if (!ncclext::dev::lsaBarrierSync(cta, bar, 0)) return;
  // (3) Derive my receive layout.
  const int cap = g.recvCap;  // 0: no cap
  if (threadIdx.x == 0) {
    int off = 0;
    for (int s = 0; s < R; s++) {
      const int n = rows[(size_t)s * g.wl.exchangeInts + me];
      d[dl.srcCount + s] = cap ? capDelivered(n, off, cap) : n;  // the rows delivered
      d[dl.recvOffset + s] = off;
      off += n;
    }
    const int dropped = cap ? max(0, off - cap) : 0;
    d[dl.totals + 0] = off - dropped;
    d[dl.dropped] = dropped;
    if (info.recvDropped) info.recvDropped[0] = dropped;
  }
  // Where my experts' counts start in a row: all of them, or (a receive cap some rank overflows) those that fit.
  int retainedAt = R + me * L;
  if (cap) {
    retainedAt = capLayout(g, h, rows, cta, bar);
    if (retainedAt < 0) return;
  }
  finishLayout(g, h, info, rows, retainedAt, cta, bar);
}

// The rest of the exchange kernel's receive half, from where my experts' counts start in a row (`retainedAt`).
__device__ void finishLayout(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, const int* rows,
                             int retainedAt, ncclext::dev::CoopCta& cta, ncclext::dev::LsaBarrier& bar) {
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, NC = g.nChunks, me = g.rank;
  const int cols = R + E;
  const int* totals = h.tileCount + (size_t)NC * cols;
  const RailView& rv = g.rail;
  const int nDomainCounts = g.wl.nDomainCounts;
  const DerivedLayout& dl = h.dl;
  int* d = h.derived;
  // zoneScan[0][l]: expert l's EXPERT_MAJOR zone, its rows rounded up to the alignment; scanned below.
  __shared__ int zoneScan[2][kMaxExperts];
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    int run = 0;
    for (int s = 0; s < R; s++) {
      d[dl.srcExpOff + s * L + l] = run;
      run += rows[(size_t)s * g.wl.exchangeInts + retainedAt + l];
    }
    d[dl.expCount + l] = run;
    zoneScan[0][l] = (run + h.align - 1) / h.align * h.align;
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
  // The zones' starts: the scan over the CTA, shifted by one (one thread walking the L experts through global
  // memory was slow at 1 rank and 256 experts).
  const int* zoneEnds = scanCta(zoneScan[0], zoneScan[1], L);
  for (int l = threadIdx.x; l < L; l += blockDim.x) d[dl.zoneStart + l] = l > 0 ? zoneEnds[l - 1] : 0;
  if (threadIdx.x == 0) {
    const int pos = zoneEnds[L - 1];
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
    // (with a receive cap, the rows delivered both ways: the rail's messages carry those)
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      h.hostTotals[2 + r] = g.recvCap ? capDelivered(totals[r], d[dl.dispAt + r], g.recvCap) : totals[r];
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
    // takes that many rounds (rail/view.h railRoundsOf), so that they make the same launch fences (virtual ranks).
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

}  // namespace

ncclResult_t loadRouteKernels() {
  return ncclext::loadKernels("handle", countKernel, scanKernel, slotKernel, exchangeKernel);
}

ncclResult_t launchRoute(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, bool exchange, int phase,
                         cudaStream_t stream) {
  if (phase == kHtReceiveHalf || phase == kHtRetainedHalf)
    return ncclext::launchKernel("ht exchangeKernel", exchangeKernel, dim3(1), dim3(kThreads), 0, stream, g, h, info,
                                 phase);
  const int tiles = (h.numTokens + kChunkTokens - 1) / kChunkTokens;
  const size_t smem = sizeof(int) * (g.nRanks + g.numExperts);
  NCCLEXT_CHECK(ncclext::launchKernel("ht countKernel", countKernel, dim3(tiles > 0 ? tiles : 1), dim3(kChunkTokens),
                                      smem, stream, g, h));
  NCCLEXT_CHECK(ncclext::launchKernel("ht scanKernel", scanKernel, dim3(g.nRanks + g.numExperts), dim3(1024), 0, stream,
                                      g, h, tiles));
  if (tiles > 0)
    // (one warp a CTA: slotKernel's ballots and lane bits take lane i as the tile's token i)
    NCCLEXT_CHECK(ncclext::launchKernel("ht slotKernel", slotKernel, dim3(tiles), dim3(kChunkTokens), 0, stream, g, h));
  if (!exchange) return ncclSuccess;  // LL: the counts travel with dispatch
  return ncclext::launchKernel("ht exchangeKernel", exchangeKernel, dim3(1), dim3(kThreads), 0, stream, g, h, info,
                               phase);
}

}  // namespace ncclep
