// HT combine inside one NVLink domain (LSA).
//
// Contract
//   grid = nSenders + nReceivers CTAs of kThreads (no senders with one rank). Roles walk chunks of the OWNER's
//   tokens, as in dispatch.
//   Sender (expert rank): before its first chunk, waits until every owner consumed all of my staging rows of the
//   previous call (the owner's done flag in my window, waitPeersConsumed). Chunk c, for every owner s != me, one warp
//   per row: the rows of s's chunk c are my received flat rows recvOffset[s] + [chunkPrefix[s][c],
//   chunkPrefix[s][c+1]); FLAT sends each row as is, EXPERT_MAJOR first sums the row's local experts' rows weighted by
//   the dispatched top-k weights (fp32); the result goes to s's combine staging [me][slot] over LSA, then (after
//   __syncwarp) lane 0 release-stores the call's sequence number into that row's flag in s's window.
//   Receiver (owner), chunk c: one warp per token acquires the flag of each peer row it needs, then sums in fp32,
//   from the bias row (c.bias, if any) or 0, the part of every rank that received the token, in DeepEP V2's order (see
//   reduceToken): the peers' from staging, its own FLAT row in place, its own EXPERT_MAJOR experts' weighted sum
//   rounded to the dtype through the output row first; it writes the output dtype (tokens routed nowhere get the
//   bias, or zeros). Then every CTA meets in finishCall, whose last arrival release-stores the call's number into my
//   done flag in every peer's window.
//   Dtypes: bf16, fp16, fp32 (template). Sequence numbers and timeouts as in dispatch.
//   Across NVLink domains (c.phase) as dispatch: the send half's senders write another domain's owner's rows and
//   flags into my outbox for it (the flat exchange: the round's slots only, c.roundLo / roundSlots, and a later
//   round nothing else; overlapped, c.localOnly's send half writes my domain's owners' rows on another stream);
//   after the rail exchange (every round's) the receive half's receivers reduce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht/cap.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/ht/ht.h"

namespace ncclep {
namespace {

// Two 16-bit floats: their pair type and its conversions.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  __device__ static float2 toFloat2(T2 v) { return __bfloat1622float2(v); }
  __device__ static T2 fromFloats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <>
struct Pair<__half> {
  using T2 = __half2;
  __device__ static float2 toFloat2(T2 v) { return __half22float2(v); }
  __device__ static T2 fromFloats(float a, float b) { return __floats2half2_rn(a, b); }
};

// 16 bytes of T <-> floats (bf16 and fp16 here, fp32 below).
template <typename T>
struct Vec {
  static constexpr int kN = 8;
  using T2 = typename Pair<T>::T2;
  __device__ static void add(float* acc, int4 v, float w) {
    const T2* p = reinterpret_cast<const T2*>(&v);
    for (int i = 0; i < 4; i++) {
      const float2 f = Pair<T>::toFloat2(p[i]);
      acc[2 * i] += w * f.x;
      acc[2 * i + 1] += w * f.y;
    }
  }
  __device__ static int4 pack(const float* acc) {
    int4 v;
    T2* p = reinterpret_cast<T2*>(&v);
    for (int i = 0; i < 4; i++) p[i] = Pair<T>::fromFloats(acc[2 * i], acc[2 * i + 1]);
    return v;
  }
};
template <>
struct Vec<float> {
  static constexpr int kN = 4;
  __device__ static void add(float* acc, int4 v, float w) {
    const float* p = reinterpret_cast<const float*>(&v);
    for (int i = 0; i < 4; i++) acc[i] += w * p[i];
  }
  __device__ static int4 pack(const float* acc) {
    int4 v;
    float* p = reinterpret_cast<float*>(&v);
    for (int i = 0; i < 4; i++) p[i] = acc[i];
    return v;
  }
};

struct Ctx {
  const GroupView& g;
  const HandleView& h;
  const CombineCall& c;
  const int* d;
};

constexpr int kU = 4;  // vectors per lane per step of a reduction: kU loads per source row in flight

// EXPERT_MAJOR: where received flat row `flatRow`'s local experts' rows are. Lane k < K gets entry k's row in the
// caller's tensor (-1: none) and its dispatched weight; one coalesced load per row.
struct ExpertRows {
  int row;
  float w;
};
__device__ __forceinline__ ExpertRows expertRows(const Ctx& x, int flatRow, int lane) {
  const size_t at = (size_t)flatRow * x.g.meta.maxTopk + lane;
  if (lane >= x.h.topk) return {-1, 0.f};
  return {x.h.emPos[at], x.h.flatW[at]};
}

// One warp: adds vectors i0 + 32 u (u < kU) of the weighted local experts' rows of one token (see expertRows) to
// `acc`, kU loads in flight per expert.
template <typename T>
__device__ __forceinline__ void addExperts(const Ctx& x, ExpertRows er, int i0, float (*acc)[Vec<T>::kN]) {
  const int4* in = reinterpret_cast<const int4*>(x.c.in);
  const int vecs = x.c.rowBytes >> 4;
  for (int k = 0; k < x.h.topk; k++) {
    const int row = __shfl_sync(0xffffffffu, er.row, k);
    const float w = __shfl_sync(0xffffffffu, er.w, k);
    if (row < 0) continue;
    int4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; u++)
      if (i0 + 32 * u < vecs) v[u] = __ldg(in + (size_t)row * vecs + i0 + 32 * u);
#pragma unroll
    for (int u = 0; u < kU; u++)
      if (i0 + 32 * u < vecs) Vec<T>::add(acc[u], v[u], w);
  }
}

// One warp: the rows of owner s's chunk c that this rank holds (its received flat rows recvOffset[s] + slot), each
// into s's staging [me][slot] over LSA and published by its flag.
template <typename T>
__device__ void sendChunk(const Ctx& x, int chunk, uint64_t seq, int warp, int nWarps, int lane) {
  const GroupView& g = x.g;
  const int me = g.rank, R = g.nRanks, NC = g.nChunks;
  for (int k = 1; k < R; k++) {
    const int s = (me + k) % R;
    if (x.c.remoteOnly && g.rail.local(s)) continue;  // a later round: another domain's owners only
    if (x.c.localOnly && !g.rail.local(s)) continue;  // my domain's owners only (the rounds write the others)
    const int* prefix = x.d + x.h.dl.chunkPrefix + s * (NC + 1);
    const int lo = prefix[chunk], hi = prefix[chunk + 1];
    const int base = x.d[x.h.dl.recvOffset + s];
    for (int slot = lo + warp; slot < hi; slot += nWarps) {
      if (capDrops(base, slot, g.recvCap)) break;  // this and later rows were past the receive cap: not here
      const int at = roundSlotOf(g.rail, s, slot, x.c.roundLo, x.c.roundSlots);
      if (at < 0) continue;  // another round's row
      const size_t rowIndex = g.recvCap ? (size_t)(x.d[x.h.dl.combAt + s] + slot) : (size_t)me * g.maxTokens + at;
      // (a receive cap and s in another domain: my outbox's entry of the round, which s's scatter places)
      const bool boxed = g.rail.capped && !g.rail.local(s);
      char* dst = boxed ? capOutboxAt(g, kRailCombRows, s, at)
                        : static_cast<char*>(peerAt(g, g.wl.combRows + rowIndex * g.rowStride, s));
      if (x.h.layout == NCCL_EP_LAYOUT_FLAT) {
        warpCopy<false>(lane, dst, x.c.in + (size_t)(base + slot) * x.c.rowBytes, x.c.rowBytes);
      } else {
        const ExpertRows er = expertRows(x, base + slot, lane);
        const int vecs = x.c.rowBytes >> 4;
        // Warp-uniform trip count: addExperts shuffles across the whole warp (a lane-dependent bound left some
        // lanes out of the shuffle and hung the warp on rows of fewer than 32 x kU vectors).
        for (int i0 = lane; i0 - lane < vecs; i0 += 32 * kU) {
          float acc[kU][Vec<T>::kN] = {};
          addExperts<T>(x, er, i0, acc);
#pragma unroll
          for (int u = 0; u < kU; u++)
            if (i0 + 32 * u < vecs) reinterpret_cast<int4*>(dst)[i0 + 32 * u] = Vec<T>::pack(acc[u]);
        }
      }
      warpPublish(lane,
                  boxed ? reinterpret_cast<uint64_t*>(capOutboxAt(g, kRailCombFlags, s, at))
                        : static_cast<uint64_t*>(peerAt(g, g.wl.combFlags + rowIndex * 8, s)),
                  seq);
    }
  }
}

// Adds bias row t's vector i (the call's dtype or fp32) to acc: the owner's sum starts from it.
template <typename T>
__device__ __forceinline__ void addBias(const CombineCall& c, int t, int vecs, int i, float* acc) {
  if (c.biasF32) {
    const float4* b = reinterpret_cast<const float4*>(c.bias) + ((size_t)t * vecs + i) * (Vec<T>::kN / 4);
#pragma unroll
    for (int j = 0; j < Vec<T>::kN / 4; j++) {
      const float4 f = __ldg(b + j);
      acc[4 * j] += f.x;
      acc[4 * j + 1] += f.y;
      acc[4 * j + 2] += f.z;
      acc[4 * j + 3] += f.w;
    }
  } else {
    Vec<T>::add(acc, __ldg(reinterpret_cast<const int4*>(c.bias) + (size_t)t * vecs + i), 1.f);
  }
}

// One warp: token t of the owner. Acquires the flag of every peer row it needs, then sums in fp32 from the bias (or
// 0) each rank's row (kU vectors per lane per step) and writes the output dtype. The ranks come in DeepEP V2's order:
// rank r at the last top-k column of t that r hosts, columns in order (with no bias and two ranks or fewer, any
// order gives the same bits: rank order); every rank's row holds its part rounded to the output dtype
// (EXPERT_MAJOR: my own experts' weighted sum is rounded through the output row first, as the peers round theirs
// into my staging). False after a failed wait.
template <typename T>
__device__ bool reduceToken(const Ctx& x, int t, uint64_t seq, int lane) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int me = g.rank, R = g.nRanks;
  // The token's slot towards every rank (-1: none): lane r holds rank r's, lane r - 32 of the second word rank r's.
  const int* slotRow = h.sendSlot + (size_t)t * R;
  const int slotLo = lane < R ? slotRow[lane] : -1, slotHi = lane + 32 < R ? slotRow[lane + 32] : -1;
  auto slotOf = [&](int r) { return __shfl_sync(0xffffffffu, r < 32 ? slotLo : slotHi, r & 31); };
  // The ranks that hold a row for t (bit r). From 0 and with at most two of them, their order changes no bit (an
  // fp32 sum of two from 0 commutes): they go in rank order, and the token's top-k ids are not read. Else, lane
  // k < K: column k's expert (loaded with the slots, before the waits below; ids out of range, which the handle
  // reported, count as none).
  const uint64_t holders = (uint64_t)__ballot_sync(0xffffffffu, slotLo >= 0) |
                           (uint64_t)__ballot_sync(0xffffffffu, slotHi >= 0) << 32;
  const bool byColumn = x.c.bias != nullptr || __popcll(holders) > 2;
  const int expert = (byColumn || x.c.missing) && lane < h.topk ? loadExpert(h, t, lane) : -1;
  const char* staging = static_cast<const char*>(g.peers.local(g.wl.combRows));
  const uint64_t* flags = static_cast<const uint64_t*>(g.peers.local(g.wl.combFlags));
  // With a receive cap: the token's row at rank r was dropped (past the cap there; DerivedLayout::dispAt, whose
  // entry for me is recvOffset[me]), else where r's row for it is in my staging (combMine).
  auto dropped = [&](int r, int slot) { return g.recvCap && capDrops(x.d[h.dl.dispAt + r], slot, g.recvCap); };
  auto stagingRow = [&](int r, int slot) {
    return g.recvCap ? (size_t)(x.d[h.dl.combMine + r] + slot) : (size_t)r * g.maxTokens + slot;
  };
  for (int r = 0; r < R; r++) {
    const int slot = slotOf(r);
    if (r != me && slot >= 0 && !dropped(r, slot) && !warpAcquire(g, flags + stagingRow(r, slot), seq, r, slot))
      return false;
  }
  // Lane k < K: the rank hosting column k's expert (-1: none); lastCols: the columns no later column shares a rank
  // with, whose ranks are summed in column order (byColumn), else the holders in rank order.
  const int colRank = expert >= 0 && expert < g.numExperts ? expert / g.localExperts : -1;
  const unsigned sameRank = __match_any_sync(0xffffffffu, colRank);
  const unsigned lastCols = __ballot_sync(0xffffffffu, colRank >= 0 && (sameRank >> lane) == 1u);
  const uint64_t order = byColumn ? (uint64_t)lastCols : holders;
  if (x.c.missing) {  // lane k: whether column k's expert (kept by routing: no repeat) sits where the row was dropped
    const bool miss = colRank >= 0 && h.emIdx[(size_t)t * g.meta.maxTopk + lane] >= 0 &&
                      dropped(colRank, h.sendSlot[(size_t)t * R + colRank]);
    const int n = __popc(__ballot_sync(0xffffffffu, miss));
    if (lane == 0) x.c.missing[t] = n;
  }
  const int mySlot = slotOf(me);
  const int myRow = mySlot >= 0 && !dropped(me, mySlot) ? x.d[h.dl.recvOffset + me] + mySlot : -1;
  const bool flat = h.layout == NCCL_EP_LAYOUT_FLAT;
  const int vecs = x.c.rowBytes >> 4;
  int4* out = reinterpret_cast<int4*>(x.c.out + (size_t)t * x.c.rowBytes);
  // My own part: FLAT, my received row as given; EXPERT_MAJOR, my experts' rows weighted and summed in column order
  // into the output row (each lane's own vectors, read back by the same lane below).
  const int4* mine = flat ? reinterpret_cast<const int4*>(x.c.in) + (size_t)myRow * vecs : out;
  if (!flat && myRow >= 0) {
    const ExpertRows er = expertRows(x, myRow, lane);
    for (int i0 = lane; i0 - lane < vecs; i0 += 32 * kU) {  // warp-uniform: addExperts shuffles
      float acc[kU][Vec<T>::kN] = {};
      addExperts<T>(x, er, i0, acc);
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i0 + 32 * u < vecs) out[i0 + 32 * u] = Vec<T>::pack(acc[u]);
    }
  }
  for (int i0 = lane; i0 - lane < vecs; i0 += 32 * kU) {  // warp-uniform: slotOf shuffles
    float acc[kU][Vec<T>::kN] = {};
    if (x.c.bias) {
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i0 + 32 * u < vecs) addBias<T>(x.c, t, vecs, i0 + 32 * u, acc[u]);
    }
    for (uint64_t m = order; m != 0; m &= m - 1) {  // warp-uniform (ballots)
      const int bit = __ffsll((long long)m) - 1;
      const int r = byColumn ? __shfl_sync(0xffffffffu, colRank, bit) : bit;
      const int slot = slotOf(r);
      int4 v[kU];
      if (r == me) {
        if (myRow < 0) continue;
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (i0 + 32 * u < vecs) v[u] = mine[i0 + 32 * u];  // plain loads: EXPERT_MAJOR wrote them just now
      } else {
        if (slot < 0 || dropped(r, slot)) continue;
        const int4* row = reinterpret_cast<const int4*>(staging + stagingRow(r, slot) * g.rowStride);
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (i0 + 32 * u < vecs) v[u] = __ldcg(row + i0 + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i0 + 32 * u < vecs) Vec<T>::add(acc[u], v[u], 1.f);
    }
#pragma unroll
    for (int u = 0; u < kU; u++)
      if (i0 + 32 * u < vecs) out[i0 + 32 * u] = Vec<T>::pack(acc[u]);
  }
  return true;
}

// No CTA barrier inside either role's loop: warps take rows (senders) or tokens (receivers) of the CTA's chunks
// independently, and the CTA meets once at the end (finishCall). Senders walk the peers' chunks that hold rows here;
// receivers walk my own tokens' chunks.
template <typename T>
__global__ void __launch_bounds__(kThreads) combineKernel(GroupView g, HandleView h, CombineCall c) {
  releaseHeld(g);
  Ctx x{g, h, c, h.derived};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  const bool sender = (int)blockIdx.x < c.nSenders;
  const int first = sender ? blockIdx.x : blockIdx.x - c.nSenders, stride = sender ? c.nSenders : c.nReceivers;
  const uint64_t seq = callNumber(g, kCombine);
  bool ok = true;  // this thread's outcome; finishCall agrees on the CTA's
  if (sender && c.phase != kHtReceiveHalf) {
    // A later round writes only my outboxes, which the previous round's exchange has sent (my stream's order).
    ok = c.remoteOnly || waitPeersConsumed(Team::wholeCta(), g, g.wl.combDone, seq);
    if (ok)
      for (int chunk = first; chunk < x.d[h.dl.peerChunks]; chunk += stride)
        sendChunk<T>(x, chunk, seq, warp, nWarps, lane);
  } else if (!sender && c.phase != kHtSendHalf) {
    const int chunks = (h.numTokens + kChunkTokens - 1) / kChunkTokens;
    for (int chunk = first; chunk < chunks && ok; chunk += stride) {
      const int t0 = chunk * kChunkTokens, t1 = min(h.numTokens, t0 + kChunkTokens);
      for (int t = t0 + warp; t < t1 && ok; t += nWarps) ok = reduceToken<T>(x, t, seq, lane);
    }
  }
  if (c.phase == kHtSendHalf) return;  // a failed wait is in the error word; the receive half ends the call
  finishCall(g, kCombine, g.wl.combDone, seq, !ok);
}

// The hierarchical combine's reduce (RailView::hier), as a relay, after the send half: one CTA per (other domain d,
// rail position q of the round) the handle's dispatch forwarded (hierFwd): the token of domain d's rank s of my
// index at that position came to each rank of my domain with a slot; every such rank's combine row for it sits in
// that rank's outbox for s (in the window): acquired by its flag there, summed in rank order in fp32, written as
// one partial row (the call's dtype) into hierCombOut[d][q - c.roundLo], then its tail (the call's number and q; a
// position no rank kept: the tail alone, marked empty). A CTA whose wait failed stops: the positions it did not reach
// keep an earlier tail, which their source refuses. The rows' outboxes are not overwritten before this call ends
// here: their next combine's send half waits for my done flag of this one.
template <typename T>
__global__ void __launch_bounds__(kThreads) hierReduceKernel(GroupView g, HandleView h, CombineCall c) {
  releaseHeld(g);  // (none across domains today: the window's rows are capped groups', one domain)
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  const int M = g.maxTokens, vecs = c.rowBytes >> 4, span = min(c.roundSlots, M - c.roundLo);
  const uint64_t seq = callNumber(g, kCombine);
  for (int64_t it = blockIdx.x; it < (int64_t)(nDomains - 1) * span; it += gridDim.x) {
    const int q = c.roundLo + (int)(it % span), dd = (int)(it / span), d = otherDomain(dd, myDomain);
    const int s = d * G + myIndex;
    const int* fwd = h.hierFwd + ((size_t)d * M + q) * G;
    const size_t box = g.wl.outboxes + (size_t)s * rv.outboxBytes;
    bool any = false, ok = true;
    for (int rl = 0; rl < G; rl++) {
      const int slot = fwd[rl];
      if (slot < 0) continue;
      any = true;
      const uint64_t* flag =
          static_cast<const uint64_t*>(g.peers.at(box + rv.outOff[kRailCombFlags] + (size_t)slot * 8, rl));
      if (!ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, g.rank}, rv.domainBase + rl,
                                         ncclext::kSiteFlag, (uint32_t)slot))
        ok = false;
    }
    if (__syncthreads_or(!ok)) return;
    char* partial = rv.hierCombOut + ((size_t)d * rv.roundSlots + (q - c.roundLo)) * hierCombRowBytes(g.rowStride);
    if (threadIdx.x == 0) {
      HierCombTail* tail = reinterpret_cast<HierCombTail*>(partial + g.rowStride);
      tail->seq = seq;
      tail->pos = q;
      tail->empty = any ? 0 : 1;
    }
    if (!any) continue;
    int4* out = reinterpret_cast<int4*>(partial);
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
      float acc[Vec<T>::kN] = {};
      for (int rl = 0; rl < G; rl++) {
        const int slot = fwd[rl];
        if (slot < 0) continue;
        const int4* row = static_cast<const int4*>(
            g.peers.at(box + rv.outOff[kRailCombRows] + (size_t)slot * g.rowStride, rl));
        Vec<T>::add(acc, __ldcg(row + i), 1.f);
      }
      out[i] = Vec<T>::pack(acc);
    }
  }
}

// The hierarchical combine's scatter, as a source, after the round's exchange (same stream: the partials are in
// hierCombIn): for each of my tokens and each other domain d it went to at a position q of the round (hierPos), the
// partial (hierCombIn[d][q - c.roundLo]) goes into my combine staging at the first rank of d that received it, zero
// rows at the others, each with its flag, so that the receive half sums the token's rows as it does (the partial
// once, the zeros exactly). A partial whose tail is not this call's at q (its relay's reduce failed before it) is
// refused: the error names the relay, and its rows' flags stay unset, so that the receive half stops on the error
// instead of summing stale rows.
__global__ void __launch_bounds__(kThreads) hierScatterKernel(GroupView g, HandleView h, CombineCall c) {
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, nDomains = g.nRanks / G, M = g.maxTokens, R = g.nRanks;
  const int vecs = c.rowBytes >> 4;
  const uint64_t seq = callNumber(g, kCombine);
  char* window = static_cast<char*>(g.peers.local(0));
  for (int64_t it = blockIdx.x; it < (int64_t)h.numTokens * nDomains; it += gridDim.x) {
    const int t = (int)(it / nDomains), d = (int)(it % nDomains);
    if (d == myDomain) continue;
    const int q = h.hierPos[(size_t)t * nDomains + d] - c.roundLo;
    if (q < 0 || q >= c.roundSlots) continue;  // no position, or another round's
    const char* in = rv.hierCombIn + ((size_t)d * rv.roundSlots + q) * hierCombRowBytes(g.rowStride);
    const HierCombTail tail = *reinterpret_cast<const HierCombTail*>(in + g.rowStride);
    if (tail.seq != seq || tail.pos != q + c.roundLo) {
      if (threadIdx.x == 0)
        ncclext::dev::recordError(g.err, ncclext::kDeviceAborted, g.rank, d * G + (g.rank - rv.domainBase), seq,
                                  tail.seq, kSiteRelayPartial, (uint32_t)(q + c.roundLo), 0);
      continue;
    }
    const int4* partial = reinterpret_cast<const int4*>(in);
    bool first = !tail.empty;
    for (int rl = 0; rl < G; rl++) {
      const int r = d * G + rl, slot = h.sendSlot[(size_t)t * R + r];
      if (slot < 0) continue;
      int4* row = reinterpret_cast<int4*>(window + g.wl.combRows + ((size_t)r * M + slot) * g.rowStride);
      for (int i = threadIdx.x; i < vecs; i += blockDim.x) row[i] = first ? partial[i] : make_int4(0, 0, 0, 0);
      first = false;
      __syncthreads();
      if (threadIdx.x == 0)
        ncclext::dev::storeRelease(reinterpret_cast<uint64_t*>(window + g.wl.combFlags + ((size_t)r * M + slot) * 8),
                                   seq);
    }
  }
}

}  // namespace

ncclResult_t loadCombineKernels() {
  return ncclext::loadKernels("HT combine", combineKernel<__nv_bfloat16>, combineKernel<__half>, combineKernel<float>,
                              hierReduceKernel<__nv_bfloat16>, hierReduceKernel<__half>, hierReduceKernel<float>,
                              hierScatterKernel);
}

namespace {

// A combine-family kernel of the call's dtype: kernels[] and names[] in the order bf16, fp16, fp32.
using CombineFamilyKernel = void (*)(GroupView, HandleView, CombineCall);
ncclResult_t launchForDtype(const CombineFamilyKernel (&kernels)[3], const char* const (&names)[3], dim3 grid,
                            const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream) {
  const int i = c.dtype == ncclBfloat16 ? 0 : c.dtype == ncclFloat16 ? 1 : c.dtype == ncclFloat32 ? 2 : -1;
  if (i < 0) return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__, "combine: dtype %d not supported", c.dtype);
  return ncclext::launchKernel(names[i], kernels[i], grid, dim3(kThreads), 0, stream, g, h, c);
}

}  // namespace

ncclResult_t launchCombine(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream) {
  return launchForDtype({combineKernel<__nv_bfloat16>, combineKernel<__half>, combineKernel<float>},
                        {"ht combineKernel<bf16>", "ht combineKernel<fp16>", "ht combineKernel<fp32>"},
                        dim3(c.nSenders + c.nReceivers), g, h, c, stream);
}

ncclResult_t launchHierReduce(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream) {
  return launchForDtype({hierReduceKernel<__nv_bfloat16>, hierReduceKernel<__half>, hierReduceKernel<float>},
                        {"ht hierReduceKernel<bf16>", "ht hierReduceKernel<fp16>", "ht hierReduceKernel<fp32>"},
                        dim3(64), g, h, c, stream);
}

ncclResult_t launchHierScatter(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream) {
  return ncclext::launchKernel("ht hierScatterKernel", hierScatterKernel, dim3(64), dim3(kThreads), 0, stream, g, h, c);
}

}  // namespace ncclep
