// The views every kernel of nccl_ep takes by value: the group's (window layout, peers, device state, rail) and the
// handle's (routing bound once), with the limits and call kinds both modes share. Host code fills them (layout.h,
// group.cc, handle.cc); the modes' call structures are in ht/ht.h and ll/ll.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/device/peers.h"
#include "common/device_error.h"
#include "nccl_ep/src/rail/view.h"

namespace ncclep {

constexpr int kChunkTokens = 32;  // unit of work of a CTA (and of the exchanged prefixes)
constexpr int kMaxRanks = 64;
// ncclEpGroupConfig_t::rail_round_tokens's default (NCCL_EP_AUTO without NCCL_EXT_RAIL_ROUND_TOKENS).
constexpr int kDefaultRailRoundTokens = 1024;
constexpr int kMaxTopk = 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTokens = 16384;
constexpr int kThreads = 512;

// Error-word sites of nccl_ep (common/device_error.h numbers the shared ones).
// Bad-input reports: `index` the token, `peer` the column, `seen` the id; `expected` the limit (kSiteTopkIdx) or the
// earlier column holding the same id (kSiteTopkRepeat).
// The receive cap's (kSiteRecvCap, ERROR overflow, recorded on every rank): `rank` the lowest rank past the cap,
// `seen` its rows, `expected` the cap, `index` the rows past it.
// The hierarchical combine's refused partial (kSiteRelayPartial, kDeviceAborted): `peer` the relay, `index` the
// position, `expected` the call's number, `seen` the partial's.
enum EpErrorSite : uint32_t {
  kSiteTopkIdx = ncclext::kSiteLibraryBase + 1,
  kSiteTopkRepeat,
  kSiteRecvCap,
  kSiteRelayPartial
};

enum CallKind { kDispatch = 0, kCombine = 1 };

// Byte offsets in the group's symmetric window (identical on every rank).
struct WindowLayout {
  size_t barrierFlags;  // u64 [1][R]: the handle-exchange barrier
  size_t dispDone;      // u64 [R]: the last dispatch call whose rows from me rank r consumed (written by r)
  size_t combDone;      // u64 [R]: the same for combine
  size_t cleanFlags;    // LL: u64 [R]: the ncclEpMaskClean barrier, written by rank r (never reset)
  // The staging (combFlags .. combRows, after exchange): one bank in HT; two in LL, call seq using bank seq & 1
  // at these offsets + (seq & 1) * bankBytes.
  size_t combFlags;     // u64 [combSlots]: flag of combine staging row [r][slot] (LL: or [token][k]), written by r
  size_t exchange;      // int32 [R][exchangeInts]: row s written by source s
  size_t dispRows;      // [R][maxTokens][rowStride]: region s written by source s (HT with a receive cap:
                        // [recvCap][rowStride], source s's slot j at row recvOffset[s] + j, its FLAT row)
  size_t dispMeta;      // [R][maxTokens][metaBytes]: the row's flag first (capped: [recvCap][metaBytes])
  size_t combRows;      // [combSlots][rowStride]: HT and LL per (token, rank): [r][slot], written by expert rank
                        // r (HT with a receive cap: row combMine[r] + slot); LL per (token, expert): [token][k]
  size_t header;        // LL: [R][headerBytes]: row s written by source s (its flag, then its counts for me)
  size_t dispFlags;     // LL: u64 [R][maxTokens][slices]: flag of each slice of dispatch staging row [s][slot]
                        // (LL combine flags are [combSlots][slices] likewise)
  size_t ownerFlags;    // LL across domains: u64 [R][maxTokens][ownerCols][slices], the flags of ownerRows
  size_t ownerRows;     // LL across domains: [R][maxTokens][ownerCols][rowStride]: the owner-weighted combine's rows
                        // from another domain's rank s, for the slot j of my token it received and the c-th of the
                        // token's columns whose expert lives on s (inside my domain they go to combRows
                        // [token][k]); 0 bytes with one domain
  size_t bankBytes;     // LL: the second bank's distance from the first; HT: 0
  size_t outboxes;      // the hierarchical HT (RailView::hier): the outboxes, [R][outboxBytes], in the window so
                        // that a relay reads its domain's ranks' combine rows there; 0 otherwise
  size_t total;
  int exchangeInts;  // R + E + NC + 1: counts per rank, counts per expert, chunk prefix towards the reader; then,
                     // the hierarchical HT (RailView::hier), the writer's tokens per destination domain
  int domainCounts;  // where those domain counts start in a row (R + E + NC + 1; the row ends there without them)
  int nDomainCounts; // how many: the hierarchical HT's domains, else 0 (a capped row's retained counts follow)
  int retained;      // HT with a receive cap: where the row's L counts start, the writer's rows for each of the
                     // reader's experts that fit the cap (written only when some rank's rows overflow it); 0: none
  int headerBytes;   // LL: u64 flag, int32 rows for me, int32 rows for each of my local experts (16-byte aligned)
  int combSlots;     // rows of the combine staging: R x maxTokens (LL: at least maxTokens x maxTopk; HT with a
                     // receive cap: maxTokens x min(R, maxTopk), the most rows one rank's tokens send)
  int slices;        // LL: flags per staging row (ceil(max_token_bytes / kLlSliceCols): any row's slices); HT: 1
  int ownerCols;     // LL: min(max_topk, local experts), the most of a token's columns one rank can host
};

// Per-row metadata sent with every dispatched row: the row's flag (u64, released last), K local expert ids (-1: not
// here), K weights, K indices of the (source, expert) pair among the source's tokens for that expert, then the fp8
// scales, then (LL) the row's token index at its source.
struct MetaLayout {
  int maxTopk;
  int maxScales;
  size_t bytes;
  __host__ __device__ size_t flagOff() const { return 0; }
  __host__ __device__ size_t expertOff() const { return 8; }
  __host__ __device__ size_t weightOff() const { return 8 + 4 * (size_t)maxTopk; }
  __host__ __device__ size_t emIdxOff() const { return 8 + 8 * (size_t)maxTopk; }
  __host__ __device__ size_t scaleOff() const { return 8 + 12 * (size_t)maxTopk; }
  __host__ __device__ size_t tokenOff() const { return scaleOff() + 4 * (size_t)maxScales; }
};

// Handle-derived int32 arrays, one device block; offsets in ints.
struct DerivedLayout {
  int srcCount, recvOffset, expCount, zoneStart, srcExpOff, chunkPrefix, totals, peerChunks;
  // totals: [0] FLAT rows, [1] EXPERT_MAJOR rows (pads included); peerChunks: [0] chunks of the peers' tokens
  // that hold rows for me (1 + the last such chunk of any peer)
  // HT with a receive cap (GroupView::recvCap), [R] each: dispAt[r], where my rows start in r's dispatch staging
  // (the rows of the sources before me to r); combAt[s], where my rows for owner s start in s's combine staging (s's
  // rows to the ranks before me); combMine[r], where r's rows start in mine (my rows to the ranks before r). Then
  // dropped [1], my rows past the cap; overflow [1], whether some rank gets more rows than the cap (the exchange
  // kernel's receive half's answer, which its third part reads: by then the count rows may be a later handle's).
  // srcCount, expCount and totals count the rows delivered.
  int dispAt, combAt, combMine, dropped, overflow;
  int ints;
};

struct GroupView {
  ncclext::dev::Peers peers;  // the window of every rank of my domain (real: LSA; virtual ranks: addresses)
  RailView rail;              // several domains; with one, every rank is local
  WindowLayout wl;
  MetaLayout meta;
  int rank, nRanks, numExperts, localExperts, maxTokens, nChunks, rowStride;
  int lowLatency;  // the group's algorithm is NCCL_EP_ALGO_LOW_LATENCY
  // HT with max_recv_rows_per_rank (one domain): the dispatch staging's rows, min(cap, R x maxTokens); positions are
  // dense (DerivedLayout::dispAt, combAt, combMine) and rows at or past it are not sent. 0: no cap (staging by
  // source).
  int recvCap;
  int recvCapError;  // with recvCap: rows past it are an error (NCCL_EP_RECV_OVERFLOW_ERROR), not only dropped
  uint64_t* calls;               // u64 [2]: dispatch and combine calls completed on this rank
  unsigned long long* arrivals;  // [2]: CTAs of the running dispatch / combine kernel that finished
  uint64_t* sent;                // LL, u64 [2]: dispatch and combine calls whose send half ran on this rank
  unsigned long long* sendArrivals;  // LL [2]: CTAs of the running send-only half that finished
  int* mask;                     // LL with enable_mask: [R], 1 = active (kernels clear a peer that timed out); else NULL
  uint64_t* barrierEpoch;
  // HT: the dispatch call whose rows this rank reads in place in its window (DispatchCall::rowsInPlace; 0: none).
  // Its done flags are released by this rank's next HT dispatch or combine kernel (releaseHeld), not at its end.
  uint64_t* heldDispatch;
  ncclext::DeviceErrorSink err;
  uint64_t timeoutNs;
};

struct HandleView {
  int numTokens, topk, layout, align;  // layout: ncclEpLayout_t
  const void* topkIdx;
  int topkIs64;
  int* sendSlot;   // [maxTokens][R]
  int* emIdx;      // [maxTokens][maxTopk]
  int* tileCount;  // [NC + 1][R + E]
  int* derived;
  DerivedLayout dl;
  int* emPos;           // [maxFlatRows][maxTopk]: EXPERT_MAJOR row of each (received flat row, k); -1
  float* flatW;         // [maxFlatRows][maxTopk]: its weight
  // pinned mapped (EXACT sizing): [0] FLAT rows, [1] EM rows, then [2 + r] my rows to rank r, [2 + R + s] rows from
  // source s (what an eager call's rail exchange sends and receives; api.cc); the hierarchical HT (D domains) also
  // [2 + 2R + d] my tokens that hit domain d (my rail rows to it) and [2 + 2R + D + d] the tokens of domain d's rank
  // of my index that hit my domain (its rail rows to me, which I relay), -1 for my own domain, then
  // [2 + 2R + 2D] the most of those counts over every rank of my domain (the rounds of its eager calls: railRoundsOf)
  int64_t* hostTotals;
  // LL, written by dispatch for combine: rows received from each source, and the source token of each slot [s][j]
  // (emPos / flatW are indexed by slot s * maxTokens + j there).
  int* llRecvCount;  // [R]
  int* llToken;      // [R][maxTokens]
  // The hierarchical HT (RailView::hier), written by its dispatch for its combine: hierPos [maxTokens][domains], my
  // token's rail position in its stream to each other domain (-1: none); hierFwd [domains][maxTokens][domain size],
  // as a relay: the slot towards each rank of my domain of the row at each position from each other domain (-1).
  // hierTok [domains][maxTokens + 1]: the token at each rail position to each other domain, then the positions
  // given (hierScanKernel, the first round's; every round's pack reads it).
  int* hierPos;
  int* hierFwd;
  int* hierTok;
};

struct LayoutInfoOut {
  int* expertCounters;
  int* srcRankCounters;
  int* expertOffsets;
  int* recvTotal;
  int* recvDropped;  // HT: rows past the receive cap (0 without one)
};

// Where `offset` bytes into a remote rank's window (one of my slices of its staging, either bank) sits in my outbox
// for that rank: bytes from the outbox's start. False for any other offset (only my slices exist in an outbox, and
// of the direct exchange's row regions only a round's first roundSlots rows).
__host__ __device__ inline bool railOutboxOffset(const GroupView& g, size_t offset, size_t* out) {
  const RailView& rv = g.rail;
  const size_t bank = g.wl.bankBytes && offset >= rv.bankStart + g.wl.bankBytes ? g.wl.bankBytes : 0;
  const size_t rel = offset - bank;
  for (int i = 0; i < kRailRegions; i++) {
    const size_t mine = rv.base[i] + (size_t)g.rank * rv.slice[i];
    if (rel >= mine && rel < mine + rv.slice[i]) {
      if (rel - mine >= rv.outSlice[i]) return false;  // a slot past the outbox's round (a bug of the caller)
      *out = rv.outOff[i] + (rel - mine);
      return true;
    }
  }
  return false;
}

#ifdef __CUDACC__
// `offset` bytes into rank r's window: by LSA inside my domain (Peers numbers the domain's ranks from 0), else the
// same place in my outbox for r (RailView). Any offset towards a remote rank outside my slices is a bug: NULL.
__device__ __forceinline__ void* peerAt(const GroupView& g, size_t offset, int r) {
  const RailView& rv = g.rail;
  if (rv.local(r)) return g.peers.at(offset, r - rv.domainBase);
  size_t at = 0;
  return railOutboxOffset(g, offset, &at) ? rv.outbox + (size_t)rv.box(r) * rv.outboxBytes + at : nullptr;
}
// The direct exchange with a receive cap (RailView::capped), whose window positions are no source's slice: my entry
// `at` of row region i (its place in the call's round, roundSlotOf) in my outbox for remote rank r.
__device__ __forceinline__ char* capOutboxAt(const GroupView& g, int i, int r, int at) {
  const RailView& rv = g.rail;
  return rv.outbox + (size_t)rv.box(r) * rv.outboxBytes + rv.outOff[i] + (size_t)at * rv.slotBytes(i);
}
#endif

}  // namespace ncclep
