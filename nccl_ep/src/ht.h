// High-Throughput (HT) mode inside one NVLink (LSA) domain: the structures host code and kernels share, and the
// launch entry points of the three kernel families (kernels/ht_route.cu, ht_dispatch_lsa.cu, ht_combine_lsa.cu).
//
// Tokens are cut into chunks of kChunkTokens in source order; a chunk is the unit of work of a team of threads, and
// a call walks only the chunks that hold rows (the handle knows how many). Signalling is per row: a sender warp
// writes a row (and its metadata) into the receiver's staging, then release-stores the call's number into that
// row's flag, so the receiver copies (dispatch) or reduces (combine) each row as soon as it lands. Calls are
// numbered per group and kind in device memory: every CTA reads the number at its start, and the last CTA to finish
// bumps it and tells every peer (a release store of the number into the peer's window) that this rank consumed all
// the peer wrote into its staging in that call; a sender writes nothing into a peer's staging before the peer
// consumed the previous call, so handles with different routings may alternate on one group, and CUDA graph replays
// keep counting.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/device/peers.h"
#include "common/device_error.h"

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
enum EpErrorSite : uint32_t { kSiteTopkIdx = ncclext::kSiteLibraryBase + 1, kSiteTopkRepeat };

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
  size_t dispRows;      // [R][maxTokens][rowStride]: region s written by source s
  size_t dispMeta;      // [R][maxTokens][metaBytes]: the row's flag first
  size_t combRows;      // [combSlots][rowStride]: HT and LL per (token, rank): [r][slot], written by expert rank
                        // r; LL per (token, expert): [token][k]
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
  int headerBytes;   // LL: u64 flag, int32 rows for me, int32 rows for each of my local experts (16-byte aligned)
  int combSlots;     // rows of the combine staging: R x maxTokens (LL: at least maxTokens x maxTopk)
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
  int srcCount, recvOffset, expCount, zoneStart, srcExpOff, chunkPrefix, totals, peerChunks, ints;
  // totals: [0] FLAT rows, [1] EXPERT_MAJOR rows (pads included); peerChunks: [0] chunks of the peers' tokens
  // that hold rows for me (1 + the last such chunk of any peer)
};

// Across NVLink domains (docs/ARCHITECTURE.md, "Low-Latency across NVLink domains" and "High-Throughput across NVLink
// domains"). A rank reaches the windows of its own domain by LSA; for a rank of another domain its kernels write,
// instead of that rank's window, its outbox for that rank: the slices of the staging regions that are this rank's in
// every window (regions indexed by source: the header row, the dispatch rows, metadata and slice flags, the combine
// rows and slice flags of [source][slot]), laid end to end. Between the send half and the receive half of a call the
// host sends each remote rank its outbox span with ncclSend, and receives each remote rank's into my inbox (the same
// layout, by source) with ncclRecv, in one NCCL group on the stream; then a kernel copies each
// remote source's slices from the inbox into that source's slices of the call's bank (chosen on the device from the
// call's number, so that CUDA graph replays alternate the banks as the kernels do): the receive half then finds
// every remote row and flag in place. High-Throughput uses the same regions by source (its row flags live in the
// metadata, so it has no slice flags), and one more exchange: the handle's count rows (kRailHeader's place), between
// the halves of the exchange kernel (kernels/ht_route.cu). It has one bank, so its flat exchange receives each
// region's slice straight into my window (RailView::direct: a message per region, no inbox and no copy).
constexpr int kRailRegions = 8;
enum RailRegion {
  kRailHeader = 0,  // LL: the header row; HT: the handle's exchange row (WindowLayout::exchange)
  kRailDispFlags,   // LL only
  kRailDispRows,
  kRailDispMeta,
  kRailCombFlags,  // combine, one row per (token, rank): [source][slot]
  kRailCombRows,
  kRailOwnerFlags,  // LL, the owner-weighted combine to another domain: [source][slot][c] (WindowLayout::ownerRows)
  kRailOwnerRows
};
// The exchanges of a group across domains: a dispatch, a combine (CallKind), and HT's handle creation.
constexpr int kRailHandle = 2;
// The regions an exchange moves: [first, last] of its kind (the owner-weighted combine: its own two).
struct RailRegions {
  int first, last;
  __host__ __device__ static RailRegions of(int kind, bool ownerWeighted) {
    if (kind == 0) return {kRailHeader, kRailDispMeta};
    return ownerWeighted ? RailRegions{kRailOwnerFlags, kRailOwnerRows} : RailRegions{kRailCombFlags, kRailCombRows};
  }
};

// The hierarchical dispatch's rail row (relay mode with NCCL_EXT_HT_HIERARCHICAL=1): one per (token, destination
// domain), at the token's position q in its source's stream to that domain: the row (rowStride bytes), then a tail
// with what the relay needs to write each hit rank's staging row as the source would have (hierPackKernel,
// railRelayKernel): the call's number (rows of earlier calls are stale), the source's top-k and scale counts, the
// row's position q (a round's message holds the positions of that round: a row left from an earlier round of the
// same call has another), the token's slot towards each rank of the domain (-1: none), its global expert ids (-1:
// none or ignored), weights and (source, expert) indices per column, and its fp8 scales.
struct HierRow {
  size_t rowStride = 0;
  int domainSize = 0, maxTopk = 0, maxScales = 0;
  __host__ __device__ size_t seqOff() const { return rowStride; }
  __host__ __device__ size_t countsOff() const { return rowStride + 8; }  // int32 top-k, int32 scales
  __host__ __device__ size_t posOff() const { return rowStride + 16; }    // int32 q
  __host__ __device__ size_t slotOff() const { return rowStride + 20; }
  __host__ __device__ size_t expertOff() const { return slotOff() + 4 * (size_t)domainSize; }
  __host__ __device__ size_t weightOff() const { return expertOff() + 4 * (size_t)maxTopk; }
  __host__ __device__ size_t idxOff() const { return weightOff() + 4 * (size_t)maxTopk; }
  __host__ __device__ size_t scaleOff() const { return idxOff() + 4 * (size_t)maxTopk; }
  __host__ __device__ size_t bytes() const { return (scaleOff() + 4 * (size_t)maxScales + 15) / 16 * 16; }
};

struct RailView {
  int domainBase = 0, domainSize = 0;  // my domain's ranks: [domainBase, domainBase + domainSize)
  int highThroughput = 0;              // the group's mode: which regions each exchange moves (regionsOf)
  // Relay (HT over a rail of one index: the mixed test mode, ncclEpTestingConfig_t::virtual_rail): the exchange goes
  // only to the rank with my index in each other domain, which copies what I wrote for each rank of its domain into
  // that rank's window (railRelayKernel). The outboxes are the same (rank r's at r * outboxBytes: a domain's ranks
  // are one block); inbox[D * domainSize + r] holds what domain D's rank of my index wrote for my domain's rank r.
  int relay = 0;
  // Relay mode's hierarchical HT (NCCL_EXT_HT_HIERARCHICAL=1): a rail row per (token, destination domain) each way
  // instead of one per rank, in rounds of roundSlots rail positions: hierOut[D][q - lo] (D = every domain, mine
  // unused) holds my dispatch rows for domain D at the positions q of the round starting at lo; hierIn[D][i]:
  // domain D's rank of my index's rows for my domain in the round, expanded by railRelayKernel.
  int hier = 0;
  HierRow hierRow;
  char* hierOut = nullptr;
  char* hierIn = nullptr;
  // Its combine: hierCombOut[D][q - lo] (rowStride bytes each), the sum, over my domain's ranks, of their rows for
  // the token at position q of domain D's rank of my index (a relay's partial); hierCombIn[D][q - lo]: the partial
  // for my token at my position q towards domain D, from its relay.
  char* hierCombOut = nullptr;
  char* hierCombIn = nullptr;
  // Direct (HT, flat exchange): NCCL receives each remote source's slices straight into my window, region by
  // region (HT has one bank, and its window addresses are the same in every call and replay): no inbox, no copy.
  // A call then moves its rows in rounds of roundSlots slots per peer (ncclEpGroupConfig_t::rail_round_tokens):
  // round k's send half writes the rows of slots [k x roundSlots, (k + 1) x roundSlots) towards each remote rank at
  // slot - k x roundSlots of my outbox for it, whose row regions hold roundSlots rows (outSlice), and the exchange
  // receives them at their own slots of the window. The hierarchical HT moves its rail rows in rounds of roundSlots
  // positions (above). Otherwise (LL, the relay) roundSlots is maxTokens: one round.
  int direct = 0;
  int roundSlots = 0;
  int boxes = 0;                       // the outboxes (and inboxes) a rank has: box(r) for r of another domain
  char* outbox = nullptr;              // [boxes][outboxBytes]: rank r's at box(r) * outboxBytes
  char* inbox = nullptr;               // [boxes][inboxBytes]: what remote rank r sent me, in its outbox's layout;
                                       // NULL when direct
  size_t outboxBytes = 0;
  // An inbox's bytes: outboxBytes, but the hierarchical HT's only take the handle's count rows (the first region,
  // its dispatch and combine going through the rail rows above).
  size_t inboxBytes = 0;
  size_t bankStart = 0;                // the first bank's start (WindowLayout::combFlags)
  size_t base[kRailRegions];           // region i of a bank (offsets in bank 0)
  size_t slice[kRailRegions];          // one source's slice of region i: source s's at base[i] + s * slice[i]
  size_t outOff[kRailRegions];         // where my slice of region i sits in an outbox
  size_t outSlice[kRailRegions];       // its size there: slice[i], or roundSlots rows of it (direct's row regions),
                                       // or none (the hierarchical HT's dispatch regions: its rail rows carry them)

  __host__ __device__ bool local(int r) const { return (unsigned)(r - domainBase) < (unsigned)domainSize; }
  // Whether NCCL_EXT_RAIL_OVERLAP=1 gives the group a side stream (ncclEpGroup::sideStream): the HT exchanges whose
  // send half has NVLink work of its own that no round waits for (the flat one's rows to my domain; the
  // hierarchical one's whole send half, which writes only my domain's rows).
  bool overlappable() const { return direct || hier; }
  // Remote rank r's outbox (and inbox): relay mode keeps every rank's place (inbox[D * domainSize + r] is by
  // domain and rank); the flat exchange has one per rank of another domain, in rank order, my domain's skipped.
  __host__ __device__ int box(int r) const { return relay || r < domainBase ? r : r - domainSize; }
  // The regions exchange `kind` (kDispatch, kCombine, kRailHandle) moves in this group's mode.
  __host__ __device__ RailRegions regionsOf(int kind, bool ownerWeighted) const {
    if (!highThroughput) return RailRegions::of(kind, ownerWeighted);
    if (kind == kRailHandle) return {kRailHeader, kRailHeader};
    return kind == 0 ? RailRegions{kRailDispRows, kRailDispMeta} : RailRegions{kRailCombFlags, kRailCombRows};
  }
  // What a call's exchange moves to (and from) each remote rank, as one message: its regions' slices, from the
  // first's start to the last's end in the outbox (with the few bytes that align each slice to 16).
  size_t spanOf(RailRegions regions) const { return outOff[regions.last] + slice[regions.last] - outOff[regions.first]; }
  // Bytes of one slot of row region i (not the header's).
  __host__ __device__ size_t slotBytes(int i) const { return outSlice[i] / (size_t)roundSlots; }
  // Where the direct exchange's round that starts at slot `lo` lands source s's slice of row region i in my window:
  // its slot lo there (the round's rows are at the outbox slice's start).
  __host__ __device__ size_t roundInto(int i, int s, int64_t lo) const {
    return base[i] + (size_t)s * slice[i] + (size_t)lo * slotBytes(i);
  }
  // What a call moves to each remote rank with fixed slices, each way: the span (LL), or the regions' slices (HT,
  // direct: a message per region and round).
  size_t callBytes(RailRegions regions) const {
    if (!direct) return spanOf(regions);
    size_t bytes = 0;
    for (int i = regions.first; i <= regions.last; i++) bytes += slice[i];
    return bytes;
  }
};

struct GroupView {
  ncclext::dev::Peers peers;  // the window of every rank of my domain (real: LSA; virtual ranks: addresses)
  RailView rail;              // several domains; with one, every rank is local
  WindowLayout wl;
  MetaLayout meta;
  int rank, nRanks, numExperts, localExperts, maxTokens, nChunks, rowStride;
  int lowLatency;  // the group's algorithm is NCCL_EP_ALGO_LOW_LATENCY
  uint64_t* calls;               // u64 [2]: dispatch and combine calls completed on this rank
  unsigned long long* arrivals;  // [2]: CTAs of the running dispatch / combine kernel that finished
  uint64_t* sent;                // LL, u64 [2]: dispatch and combine calls whose send half ran on this rank
  unsigned long long* sendArrivals;  // LL [2]: CTAs of the running send-only half that finished
  int* mask;                     // LL with enable_mask: [R], 1 = active (kernels clear a peer that timed out); else NULL
  uint64_t* barrierEpoch;
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
};

// Which part of a High-Throughput kernel runs. Inside one domain a call (and a handle's exchange) runs whole; across
// domains its send half, the rail exchange, then its receive half (api.cc).
enum HtPhase { kHtWhole = 0, kHtSendHalf = 1, kHtReceiveHalf = 2 };

struct DispatchCall {
  const char* tokens;
  const float* weights;  // [T][K] or NULL
  const float* scales;   // [T][nScales] or NULL
  char* outTokens;
  float* outWeights;
  int* outIdx;
  float* outScales;
  int rowBytes, nScales;
  int nSenders, nReceivers;
  int phase;  // HtPhase
  // HT's flat exchange in rounds (RailView::direct): roundSlots > 0 makes a send half write, towards another
  // domain's ranks, only the rows of slots [roundLo, roundLo + roundSlots), at slot - roundLo of my outbox for the
  // rank; remoteOnly (a round after the first) makes it write nothing else (no rows to my domain, no waits, no pad
  // rows). Zero: every slot, everything (inside one domain; relayed exchanges). The hierarchical HT's kernels
  // (hierPackKernel, hierReduceKernel, hierScatterKernel) take the rail positions [roundLo, roundLo + roundSlots)
  // instead; its send half runs whole, in the first round. localOnly: the reverse of remoteOnly, a send half that
  // writes only my domain's rows, with the pad rows and the waits (the overlapped flat exchange runs it on a stream
  // of the group's beside the rounds, which are then all remoteOnly: ncclEpGroup::sideStream).
  int roundLo, roundSlots, remoteOnly, localOnly;
};

struct CombineCall {
  const char* in;
  char* out;
  int rowBytes;
  int dtype;  // ncclDataType_t
  int nSenders, nReceivers;
  int phase;  // HtPhase
  int roundLo, roundSlots, remoteOnly, localOnly;  // as DispatchCall's (the combine's rows towards their owners)
};

// The rounds a call's exchange takes on a rank (ncclEpGroup::railRounds). The direct exchange: enough for its most
// rows to or from one rank of another domain, from `counts` (an EXACT handle's eager call, HandleView::hostTotals
// + 2: [r] my rows to r, [R + r] r's rows to me) or, NULL, maxTokens (fixed slices). The hierarchical HT: enough for
// the most rail rows any rank of my domain sends to or receives from one other domain (`counts` [2R + 2D], counted
// by the handle; my own are [2R + d], my tokens that hit domain d, and [2R + D + d], those of d's rank of my index
// that hit mine), so that the ranks of a domain take the same rounds (relayFence), or maxTokens. 1 otherwise.
inline int railRoundsOf(const RailView& rv, int nRanks, int maxTokens, const int64_t* counts) {
  if (!rv.direct && !rv.hier) return 1;
  int64_t most = counts ? 0 : maxTokens;
  if (counts && rv.direct) {
    for (int r = 0; r < nRanks; r++)
      if (!rv.local(r)) most = std::max(most, std::max(counts[r], counts[nRanks + r]));
  } else if (counts) {
    most = counts[2 * (size_t)nRanks + 2 * (size_t)(nRanks / rv.domainSize)];
  }
  return (int)std::max<int64_t>(1, (most + rv.roundSlots - 1) / rv.roundSlots);
}
// The rows round `round` moves of a pair's `filled` rows (slots towards a peer; the hierarchical HT: rail positions
// towards a domain): those past the round's first, at most roundSlots. Both ranks of a pair compute it from the
// same count, so a message exists on both sides or on neither whatever each rank's own number of rounds
// (railRoundsOf covers every round with rows).
inline int64_t railRoundRows(const RailView& rv, int round, int64_t filled) {
  return std::max<int64_t>(0, std::min<int64_t>(filled - (int64_t)round * rv.roundSlots, rv.roundSlots));
}

// The place of my row for rank r at `slot` in a call's round (DispatchCall, CombineCall: roundLo, roundSlots): the
// slot itself inside my domain or without rounds, else slot - roundLo; -1 when the round does not carry it.
__host__ __device__ inline int roundSlotOf(const RailView& rv, int r, int slot, int roundLo, int roundSlots) {
  if (roundSlots == 0 || rv.local(r)) return slot;
  return slot >= roundLo && slot - roundLo < roundSlots ? slot - roundLo : -1;
}

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
#endif

// Each family's kernels loaded now (group creation; see ncclext::loadKernels).
ncclResult_t loadRouteKernels();
ncclResult_t loadDispatchKernels();
ncclResult_t loadCombineKernels();

// Host entry points (one per kernel family); each enqueues on `stream` and returns an error code.
// `exchange` false (Low-Latency handles): the local kernels only, no exchange between ranks. `phase` (HtPhase): the
// whole handle, or (across domains) the local kernels and the exchange kernel's send half, or its receive half only.
ncclResult_t launchRoute(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, bool exchange, int phase,
                         cudaStream_t stream);
// Low-Latency across domains, after an exchange's NCCL group: copies every remote source's slices of exchange `kind`
// (kDispatch, kCombine) from the inbox into its slices of my window, in the bank of the kind's last send half.
ncclResult_t launchRailInbox(const GroupView& g, int kind, bool ownerWeighted, cudaStream_t stream);
// Relay mode (RailView::relay): instead, what each other domain's rank of my index wrote for each rank r of my
// domain, from the inbox into r's window at that writer's slices (LSA), flags last (kernels/ht_route.cu). The
// hierarchical dispatch: the rail rows of round `round` (positions from round x roundSlots), each into the staging
// of the ranks of my domain it names; the first round also marks every position past it unforwarded (hierFwd).
ncclResult_t launchRailRelay(const GroupView& g, int kind, bool ownerWeighted, int* hierFwd, int round,
                             cudaStream_t stream);
// The hierarchical dispatch (RailView::hier), after the send half: my rail rows for each other domain at the
// positions of the call's round (c.roundLo, c.roundSlots), in token order, into hierOut; the first round
// (c.roundLo 0) first gives my tokens their positions (HandleView::hierPos, hierTok) (kernels/ht_dispatch_lsa.cu).
ncclResult_t launchHierPack(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream);
// Its combine (kernels/ht_combine_lsa.cu): after the send half, as a relay, the partial of every row of my domain's
// ranks for each other domain's source of my index (hierCombOut); after the exchange, as a source, each partial
// into the staging of the first rank of its domain the token hit, zero rows into the others' (flags set), so that
// the receive half sums as it does. Each for the positions of the call's round (c.roundLo, c.roundSlots).
ncclResult_t launchHierReduce(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);
ncclResult_t launchHierScatter(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);
ncclResult_t launchDispatch(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream);
ncclResult_t launchCombine(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);

}  // namespace ncclep
