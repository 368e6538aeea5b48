// The rail's view of the window (the exchange across NVLink domains): the regions a call moves, the outboxes and
// inboxes, the hierarchical HT's rail rows and the rounds. Plain data the kernels take inside GroupView
// (nccl_ep/src/views.h); rail/rail.h is the host side that moves them.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ncclep {

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
// the halves of the exchange kernel (ht/route.cu). It has one bank, so its flat exchange receives each
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

// The hierarchical combine's rail row: the relay's partial (rowStride bytes), then this tail, written by the relay's
// reduce for every position it computed: the call's number and the position (a partial the reduce did not write this
// call, because its wait failed, keeps an earlier call's number or another round's position: the source's scatter
// refuses it and records the relay as the failed peer, where it summed stale rows), and whether no rank of the relay's
// domain kept the token (no rows: the partial is zero and its bytes are not written).
struct HierCombTail {
  uint64_t seq;
  int32_t pos;
  int32_t empty;
};
constexpr size_t kHierCombTailBytes = sizeof(HierCombTail);
static_assert(kHierCombTailBytes == 16, "the combine tail keeps the next partial 16-byte aligned");
// A combine rail row's bytes: the partial, then its tail (the relay's reduce, the source's scatter, the layout).
__host__ __device__ inline size_t hierCombRowBytes(size_t rowStride) { return rowStride + kHierCombTailBytes; }

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
  // Its combine: hierCombOut[D][q - lo] (rowStride bytes each, then a HierCombTail), the sum, over my domain's ranks,
  // of their rows for the token at position q of domain D's rank of my index (a relay's partial); hierCombIn[D][q -
  // lo]: the partial for my token at my position q towards domain D, from its relay.
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
  // The direct exchange with a receive cap (ncclEpGroupConfig_t::max_recv_rows_per_rank): the window's staging is
  // laid out by position, which a fixed slice cannot take, so a call's rows of each round land in my inbox for
  // their source (inOff) and launchCapScatter (ht/cap.cu) places each delivered row at its position.
  // The handle's count rows still go straight into the window.
  int capped = 0;
  int roundSlots = 0;
  int boxes = 0;                       // the outboxes (and inboxes) a rank has: box(r) for r of another domain
  char* outbox = nullptr;              // [boxes][outboxBytes]: rank r's at box(r) * outboxBytes
  char* inbox = nullptr;               // [boxes][inboxBytes]: what remote rank r sent me, in its outbox's layout;
                                       // NULL when direct without a cap
  size_t outboxBytes = 0;
  // An inbox's bytes: outboxBytes, but the hierarchical HT's only take the handle's count rows (the first region,
  // its dispatch and combine going through the rail rows above).
  size_t inboxBytes = 0;
  size_t bankStart = 0;                // the first bank's start (WindowLayout::combFlags)
  size_t base[kRailRegions];           // region i of a bank (offsets in bank 0)
  size_t slice[kRailRegions];          // one source's slice of region i: source s's at base[i] + s * slice[i]
  size_t outOff[kRailRegions];         // where my slice of region i sits in an outbox
  // With a receive cap (capped): where region i's round lands in an inbox. A call moves one kind's regions, and its
  // scatter empties the inbox before the next call's exchange (the stream's order), so a dispatch's regions and a
  // combine's share the inbox's bytes, each kind's from its start: inboxBytes is the larger kind's.
  size_t inOff[kRailRegions];
  size_t outSlice[kRailRegions];       // its size there: slice[i], or roundSlots rows of it (direct's row regions),
                                       // or none (the hierarchical HT's dispatch regions: its rail rows carry them)

  __host__ __device__ bool local(int r) const { return (unsigned)(r - domainBase) < (unsigned)domainSize; }
  // Whether NCCL_EXT_RAIL_OVERLAP=1 gives the group a side stream (Rail::sideStream): the HT exchanges whose
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

// The rounds a call's exchange takes on a rank (Rail::rounds). The direct exchange: enough for its most
// rows to or from one rank of another domain, from `counts` (an EXACT handle's eager call, HandleView::hostTotals
// + 2: [r] my rows to r, [R + r] r's rows to me) or, NULL, maxTokens (fixed slices). The hierarchical HT: enough for
// the most rail rows any rank of my domain sends to or receives from one other domain (`counts` [2R + 2D], counted
// by the handle; my own are [2R + d], my tokens that hit domain d, and [2R + D + d], those of d's rank of my index
// that hit mine), so that the ranks of a domain take the same rounds (Rail::relayFence), or maxTokens. 1 otherwise.
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
// (railRoundsOf covers every round with rows). The receive cap's scatter (ht/cap.cu) counts a round's entries with
// it too, from the same counts.
__host__ __device__ inline int64_t railRoundRows(const RailView& rv, int round, int64_t filled) {
  const int64_t n = filled - (int64_t)round * rv.roundSlots;
  return n < 0 ? 0 : n < rv.roundSlots ? n : rv.roundSlots;
}

// The place of my row for rank r at `slot` in a call's round (DispatchCall, CombineCall: roundLo, roundSlots): the
// slot itself inside my domain or without rounds, else slot - roundLo; -1 when the round does not carry it.
__host__ __device__ inline int roundSlotOf(const RailView& rv, int r, int slot, int roundLo, int roundSlots) {
  if (roundSlots == 0 || rv.local(r)) return slot;
  return slot >= roundLo && slot - roundLo < roundSlots ? slot - roundLo : -1;
}

}  // namespace ncclep
