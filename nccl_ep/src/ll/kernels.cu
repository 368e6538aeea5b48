// LL dispatch and combine inside one NVLink domain (LSA): one kernel each, nothing on the host.
//
// Contract (tests/unit/ep_ll_reference.h is the model, bit for bit)
//   grid = `ctas` CTAs of kLlThreads; work is spread over all the grid's warps (global warp gw of nw), in units of
//   a row's slice (kLlSliceCols columns), so that even one token keeps ceil(H / 512) warps busy; every slice of a
//   staging row has its own flag.
//   Dispatch, call seq:
//   (1) every CTA waits until every peer consumed my rows of the previous dispatch (its done flag in my window);
//   (2) CTA 0 writes my header into every rank's window, header[me] = (rows for that rank, rows for each of its
//       local experts: the handle's totals), and releases its flag with seq;
//   (3) one warp per (token, slice): the slice goes once to every rank holding one of the token's experts, into
//       that rank's staging [me][slot] (slot: the token's position among my tokens for that rank), bf16 or e4m3 as
//       given, or quantised by the warp (128 columns a step, 4 a lane: block amax by shuffles, numeric.h's scale
//       and e4m3) with its blocks' scales; slice 0 also writes the metadata (local expert ids, weights, (source,
//       expert) indices, token); after __syncwarp lane r releases the slice's flag at destination r with seq, all
//       destinations in one round (cumulativity publishes every lane's stores);
//   (4) every CTA acquires every source's header (one thread each; the barrier hands the acquires to the CTA),
//       derives the EXPERT_MAJOR block starts (block (l, s) = the rows of l from sources before s) and the flat
//       list of rows, then one warp per (staged row, slice): every lane acquires the slice's flag and slice 0's
//       (the metadata's), the warp copies the slice to RANK_MAJOR row s * M + j, or to EXPERT_MAJOR row
//       l * R * M + block(l, s) + index for each local expert l, with its scales; slice 0's warp also writes ids,
//       weights and src_info and records the slot's token and expert rows for combine;
//   (5) CTA 0 writes the counts (layout info, and the handle's llRecvCount for combine); finishCall.
//   Combine, call seq: every CTA waits for the owners' done flags; one warp per (received slot (s, j), slice)
//   sends back:
//   kLlRankRows the input row s * M + j as is, kLlExpertWeighted sum_k w_k * row(e_k) in fp32 fma in column order
//   rounded to bf16, both into owner s's staging [me][j]; kLlOwnerWeighted each local expert's row as is into
//   [token][k] (all K rows, then lane k releases row k's flag); each published by its slice's flag. A plain call
//   (send and receive in one launch) of kLlRankRows or kLlOwnerWeighted skips the slots I receive from myself,
//   whose rows the owner reads in the input: nothing staged or waited for. Then one warp
//   per (own token, slice) acquires the flags it needs, lane r (or lane k) polling row r's (k's) and a __syncwarp
//   ordering that acquire before every lane's reads, and sums in fp32: the ranks' rows in rank order (+), or
//   w[t][k] * row in column order (fma); rounds to bf16. finishCall.
//   Every wait has the group's time budget; a failed CTA does not arrive and the group reports the error.
//   Asked for (recv_wait_cycles), each receive half adds, per source, the clock64 cycles its waits on that source's
//   flags spun (headers, rows), summed over the waiting threads (row waits: one lane a warp) (WaitClock).
//
// Banks: the staging (rows, metadata, headers, flags) is double-buffered; call seq uses bank seq & 1, so a sender
// waits until every peer consumed call seq - 2 (not seq - 1), and two send-only calls of a kind may be open. The
// send halves are numbered apart (sent[kind]) from the receive halves (calls[kind]); a kind's receive halves run
// in the order of their send halves (the host enforces it), so both count the same calls.
//
// Masks (enable_mask): each half snapshots the active ranks (bits) at its start and skips inactive ones when
// sending and receiving (a rank inactive in its own mask sends and receives nothing). A wait gives up once its
// peer is masked, and after the timeout masks the peer itself instead of failing. A receive half that had counted
// on a peer that is masked by its end (dispatch: a source whose header came; combine: every rank active at its
// start) reports kDevicePeerMasked once: that call's outputs are incomplete. combine's missing[t] counts the top-k
// experts on ranks inactive at the receive half's start.
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "common/numeric.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/ll/ll.h"

namespace ncclep {
namespace {

constexpr int kLlThreads = 512;
constexpr unsigned kAll = 0xffffffffu;

// The staging bank of call seq: the offset to add to the bank's regions (header, flags, rows, metadata).
__device__ __forceinline__ size_t bankOf(const GroupView& g, uint64_t seq) { return (seq & 1) * g.wl.bankBytes; }

// Header row written by source s in my window (or, with `r`, mine in rank r's window): flag, then int32 counts.
__device__ __forceinline__ size_t headerOff(const GroupView& g, size_t bank, int s) {
  return bank + g.wl.header + (size_t)s * g.wl.headerBytes;
}
__device__ __forceinline__ int* headerCounts(void* header) { return reinterpret_cast<int*>((char*)header + 8); }

struct WarpId {
  int gw, nw, lane;
  __device__ static WarpId of() {
    return WarpId{(int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), (int)(gridDim.x * (blockDim.x >> 5)),
                  (int)(threadIdx.x & 31)};
  }
};

// The token's slot towards rank r (-1: none), with lanes holding ranks r and r + 32: warp-uniform shuffles.
struct Slots {
  int lo, hi;
  __device__ static Slots load(const HandleView& h, int R, int t, int lane) {
    const int* row = h.sendSlot + (size_t)t * R;
    return Slots{lane < R ? row[lane] : -1, lane + 32 < R ? row[lane + 32] : -1};
  }
  __device__ int of(int r) const { return __shfl_sync(kAll, r < 32 ? lo : hi, r & 31); }
};

__device__ __forceinline__ bool isOn(uint64_t bits, int r) { return (bits >> r & 1) != 0; }

// Every thread of the CTA (barriers inside): the ranks active in my mask now, one bit each; none if I am masked
// myself; every rank without masks.
__device__ uint64_t activeRanks(const GroupView& g) {
  __shared__ unsigned long long bits;
  if (!g.mask) return ~0ull;
  __syncthreads();  // earlier readers of `bits` are done
  if (threadIdx.x == 0) {
    uint64_t b = 0;
    for (int r = 0; r < g.nRanks; r++)
      if (*reinterpret_cast<const volatile int*>(g.mask + r)) b |= 1ull << r;
    bits = isOn(b, g.rank) ? b : 0;
  }
  __syncthreads();
  return bits;
}

// The spinning part of waitOrMask (out of line, as waitFlagSlow; scalars only, so that the kernel's parameters stay
// out of local memory).
__device__ __noinline__ bool waitOrMaskSlow(int* mask, uint64_t timeoutNs, const uint64_t* flag, uint64_t seq,
                                            int peer) {
  const volatile int* on = mask + peer;
  const uint64_t start = ncclext::dev::globalTimerNs();
  for (uint32_t spin = 1;; spin++) {
    if (ncclext::dev::seqAtLeast(ncclext::dev::loadAcquire(flag), seq)) return true;
    if ((spin & 63) == 0) {
      if (*on == 0) return false;
      if (ncclext::dev::globalTimerNs() - start > timeoutNs) {
        atomicExch(mask + peer, 0);
        return false;
      }
    }
  }
}

// One thread waits until *flag >= seq. Without masks: waitFlagAtLeast (false: a timeout, recorded). With masks:
// false once `peer` is masked in my mask, or after the timeout, when this wait masks it (nothing recorded: the
// caller skips the peer; reportMasked tells whether the call had counted on it).
__device__ __forceinline__ bool waitOrMask(const GroupView& g, const uint64_t* flag, uint64_t seq, int peer,
                                           uint32_t site, uint32_t index) {
  if (!g.mask) return ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, g.rank}, peer, site, index);
  if (ncclext::dev::seqAtLeast(ncclext::dev::loadAcquire(flag), seq)) return true;
  return waitOrMaskSlow(g.mask, g.timeoutNs, flag, seq, peer);
}

// A receive half's wait cycles (the outputs' recv_wait_cycles; DeepEP's *_wait_recv_cost_stats): each wait that
// spins adds the clock64 cycles it spun to its source's entry in the CTA's shared array, and the CTA adds its totals
// to the caller's [nRanks] int64 at the end. A flag found set adds nothing; parallel waiters each add their own.
struct WaitClock {
  unsigned long long* perSource;  // shared [kMaxRanks]; NULL: not asked for

  // Every thread of the CTA (a barrier inside when asked for).
  __device__ static WaitClock start(const GroupView& g, unsigned long long* shared, const unsigned long long* out) {
    if (!out) return WaitClock{nullptr};
    for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x) shared[r] = 0;
    __syncthreads();
    return WaitClock{shared};
  }
  // waitOrMask, timed.
  __device__ __forceinline__ bool wait(const GroupView& g, const uint64_t* flag, uint64_t seq, int peer, uint32_t site,
                                       uint32_t index) const {
    if (!perSource || ncclext::dev::seqAtLeast(ncclext::dev::loadAcquire(flag), seq))
      return waitOrMask(g, flag, seq, peer, site, index);
    const long long t0 = clock64();
    const bool ok = waitOrMask(g, flag, seq, peer, site, index);
    atomicAdd(perSource + peer, (unsigned long long)(clock64() - t0));
    return ok;
  }
  // Every thread of the CTA: the CTA's totals into `out`.
  __device__ void finish(const GroupView& g, unsigned long long* out) const {
    if (!perSource) return;
    __syncthreads();
    for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x)
      if (perSource[r]) atomicAdd(out + r, perSource[r]);
  }
};

// One warp: every lane waits for the row's flag (as warpAcquire), agreeing on the outcome; lane 0's wait is timed.
__device__ __forceinline__ bool warpWaitOrMask(const GroupView& g, const WaitClock& clock, const uint64_t* flag,
                                               uint64_t seq, int peer, int row) {
  const WaitClock lane0{(threadIdx.x & 31) == 0 ? clock.perSource : nullptr};
  return __all_sync(kAll, lane0.wait(g, flag, seq, peer, ncclext::kSiteRow, (uint32_t)row));
}

// Every thread of the CTA, before its first write into any peer's bank of call seq: every active peer consumed
// what I wrote there in call seq - 2 (its done flag in my window). Without masks false on every thread after a
// timeout; with masks true, peers that did not answer in time masked (and dropped from *active).
__device__ bool waitBankFree(const GroupView& g, size_t doneOff, uint64_t seq, uint64_t* active) {
  bool ok = true;
  for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x) {
    // A rank of another domain needs no done flag: what I write for it goes to my outbox, and lands in its bank only
    // by its own copy after its exchange of call seq, which its stream runs after its receive half of seq - 2.
    if (r == g.rank || !isOn(*active, r) || !g.rail.local(r)) continue;
    const uint64_t* done = static_cast<const uint64_t*>(g.peers.local(doneOff + (size_t)r * 8));
    if (!waitOrMask(g, done, seq - 2, r, ncclext::kSiteFlag, 0)) ok = false;
  }
  const bool failed = __syncthreads_or(!ok);
  if (g.mask) {
    if (failed) *active &= activeRanks(g);
    return true;
  }
  return !failed;
}

// Thread 0 of each CTA, at the end of a receive half: a peer the call counted on (`included`) that is masked now
// makes the call's outputs incomplete: reported once (kDevicePeerMasked).
__device__ void reportMasked(const GroupView& g, uint64_t included, uint64_t seq) {
  if (!g.mask || threadIdx.x != 0) return;
  for (int r = 0; r < g.nRanks; r++)
    if (isOn(included, r) && *reinterpret_cast<const volatile int*>(g.mask + r) == 0) {
      ncclext::dev::recordError(g.err, ncclext::kDevicePeerMasked, g.rank, r, seq, 0, ncclext::kSiteRow, blockIdx.x,
                                0);
      return;
    }
}

// All threads of the CTA, at the end of a send-only half (call seq): the last CTA to arrive bumps the sent count.
// A CTA in which a wait failed does not arrive.
__device__ void finishSend(const GroupView& g, CallKind kind, uint64_t seq, bool failed) {
  if (__syncthreads_or(failed) || threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&g.sendArrivals[kind], 1ull) == gridDim.x - 1) {
    g.sendArrivals[kind] = 0;
    g.sent[kind] = seq;
  }
}

// ---- dispatch ----------------------------------------------------------------------------------------------------

// CTA 0: my header into every active rank's window, released with seq.
__device__ void sendHeaders(const GroupView& g, const HandleView& h, uint64_t seq, uint64_t active) {
  const int R = g.nRanks, L = g.localExperts, cols = R + g.numExperts;
  const int* totals = h.tileCount + (size_t)g.nChunks * cols;
  const size_t bank = bankOf(g, seq);
  for (int i = threadIdx.x; i < R * (1 + L); i += blockDim.x) {
    const int r = i / (1 + L), j = i % (1 + L);
    if (isOn(active, r))
      headerCounts(peerAt(g, headerOff(g, bank, g.rank), r))[j] = j == 0 ? totals[r] : totals[R + r * L + j - 1];
  }
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x)
    if (isOn(active, r))
      ncclext::dev::storeRelease(static_cast<uint64_t*>(peerAt(g, headerOff(g, bank, g.rank), r)), seq);
}

// The columns [lo, hi) of slice `sl` of a row of `hidden` columns: a warp's unit of work (kLlSliceCols columns), so
// that a token's row spreads over several warps. Every slice has its own flag (dispatch: of [source][slot][slice];
// combine: of the staging row and slice); slice 0's also covers the row's metadata.
struct Cols {
  int lo, hi;
  __device__ static Cols of(int sl, int hidden) {
    const int lo = sl * kLlSliceCols;
    return Cols{lo, min(hidden, lo + kLlSliceCols)};
  }
};
__device__ __forceinline__ int slicesOf(int hidden) { return (hidden + kLlSliceCols - 1) / kLlSliceCols; }

__device__ __forceinline__ uint64_t* dispFlag(const GroupView& g, size_t bank, size_t rowIndex, int sl, int rank) {
  return static_cast<uint64_t*>(peerAt(g, bank + g.wl.dispFlags + (rowIndex * g.wl.slices + sl) * 8, rank));
}
__device__ __forceinline__ uint64_t* combFlag(const GroupView& g, size_t bank, size_t at, int sl, int rank) {
  return static_cast<uint64_t*>(peerAt(g, bank + g.wl.combFlags + (at * g.wl.slices + sl) * 8, rank));
}
__device__ __forceinline__ uint64_t* ownerFlag(const GroupView& g, size_t bank, size_t at, int sl, int rank) {
  return static_cast<uint64_t*>(peerAt(g, bank + g.wl.ownerFlags + (at * g.wl.slices + sl) * 8, rank));
}

// Lane `lane`'s 4 columns (4 lane .. 4 lane + 3) of 128-column block b of a bf16 row, as floats into v; returns their
// largest magnitude, a NaN never winning (as numeric.h's fp8QuantizeRow and nvfp4QuantizeRow).
__device__ __forceinline__ float laneBf16(const char* row, int b, int lane, float (&v)[4]) {
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(row + (size_t)b * 256) + lane);
  const uint16_t bits[4] = {(uint16_t)(raw.x & 0xffff), (uint16_t)(raw.x >> 16), (uint16_t)(raw.y & 0xffff),
                            (uint16_t)(raw.y >> 16)};
  float amax = 0.0f;
  for (int i = 0; i < 4; i++) {
    v[i] = ncclext::bf16ToFloat(bits[i]);
    const float a = v[i] < 0 ? -v[i] : v[i];
    amax = a > amax ? a : amax;
  }
  return amax;
}

// One warp: columns `cols` of token t's row quantised to e4m3 into every destination's staging row, the blocks'
// scales into their metadata. Lane i holds columns 4 i .. 4 i + 3 of each block of 128.
__device__ void quantizeSlice(const GroupView& g, const LlDispatchCall& c, const Slots& slots, uint64_t active,
                              size_t bank, const char* row, Cols cols, int lane) {
  const int me = g.rank, R = g.nRanks;
  for (int b = cols.lo / 128; b < cols.hi / 128; b++) {
    float v[4];
    float amax = laneBf16(row, b, lane, v);
    for (int o = 16; o > 0; o >>= 1) {
      const float a = __shfl_xor_sync(kAll, amax, o);
      amax = a > amax ? a : amax;
    }
    const float scale = ncclext::fp8BlockScale(amax, c.roundScale != 0);
    // The hardware's conversion, two values at a time (numeric.h: equal to floatToE4m3 on every fp32).
    const uint32_t q = (uint32_t)ncclext::floatsToE4m3x2(v[0] / scale, v[1] / scale) |
                       (uint32_t)ncclext::floatsToE4m3x2(v[2] / scale, v[3] / scale) << 16;
    for (int r = 0; r < R; r++) {
      const int slot = slots.of(r);
      if (slot < 0 || !isOn(active, r)) continue;
      const size_t rowIndex = (size_t)me * g.maxTokens + slot;
      char* dst = static_cast<char*>(peerAt(g, bank + g.wl.dispRows + rowIndex * g.rowStride, r));
      reinterpret_cast<uint32_t*>(dst + (size_t)b * 128)[lane] = q;
      if (lane == 0) {
        char* meta = static_cast<char*>(peerAt(g, bank + g.wl.dispMeta + rowIndex * g.meta.bytes, r));
        if (c.ue8m0)  // a power of two (roundScale): its biased exponent is all of it
          reinterpret_cast<uint8_t*>(meta + g.meta.scaleOff())[b] = (uint8_t)(__float_as_uint(scale) >> 23);
        else
          reinterpret_cast<float*>(meta + g.meta.scaleOff())[b] = scale;
      }
    }
  }
}

// One warp: columns `cols` of token t's bf16 row as NVFP4 (common/numeric.h) into every destination's staging, the
// blocks' e4m3 scales into their metadata (byte b for block b of 16 columns). Lane i holds columns 4 i .. 4 i + 3 of
// each 128 (four lanes a block: its amax by two shuffles) and writes their two packed bytes.
__device__ void quantizeSliceFp4(const GroupView& g, const LlDispatchCall& c, const Slots& slots, uint64_t active,
                                 size_t bank, const char* row, Cols cols, int lane) {
  const int me = g.rank, R = g.nRanks;
  const float gs = __ldg(c.globalScale);
  for (int b = cols.lo / 128; b < cols.hi / 128; b++) {
    float v[4];
    float amax = laneBf16(row, b, lane, v);
    for (int o = 1; o < 4; o <<= 1) {  // the four lanes of the block of 16
      const float a = __shfl_xor_sync(kAll, amax, o);
      amax = a > amax ? a : amax;
    }
    const uint8_t scale = ncclext::nvfp4BlockScale(amax, gs);
    const float f = ncclext::nvfp4Factor(scale, gs);
    const uint16_t q = (uint16_t)(ncclext::floatToE2m1(v[0] * f) | ncclext::floatToE2m1(v[1] * f) << 4 |
                                  ncclext::floatToE2m1(v[2] * f) << 8 | ncclext::floatToE2m1(v[3] * f) << 12);
    for (int r = 0; r < R; r++) {
      const int slot = slots.of(r);
      if (slot < 0 || !isOn(active, r)) continue;
      const size_t rowIndex = (size_t)me * g.maxTokens + slot;
      char* dst = static_cast<char*>(peerAt(g, bank + g.wl.dispRows + rowIndex * g.rowStride, r));
      reinterpret_cast<uint16_t*>(dst + (size_t)b * 64)[lane] = q;
      if ((lane & 3) == 0) {
        char* meta = static_cast<char*>(peerAt(g, bank + g.wl.dispMeta + rowIndex * g.meta.bytes, r));
        reinterpret_cast<uint8_t*>(meta + g.meta.scaleOff())[b * 8 + lane / 4] = scale;
      }
    }
  }
}

// The scale words a slice of columns `cols` moves: those of its columns, or (scaleColsLog2 < 0: forwarded e4m3 with
// the caller's S words a row) all of the row's with its first slice and none with the others.
struct ScaleWords {
  int lo, hi;
  __device__ __forceinline__ static ScaleWords of(const LlDispatchCall& c, Cols cols) {
    if (c.scaleColsLog2 < 0) return {0, cols.lo == 0 ? c.nScales : 0};
    return {cols.lo >> c.scaleColsLog2, cols.hi >> c.scaleColsLog2};
  }
};

// Bytes of a row before column `col`, its columns `nibbles` 4-bit units each (4, 2 or 1: even products only, as every
// slice starts at a multiple of 128 columns). A shift, not a division: it runs for every slice of every row.
__device__ __forceinline__ size_t colBytes(int col, int nibbles) { return (size_t)col * (size_t)nibbles >> 1; }

// One warp per (token of mine, slice): the slice (and, slice 0, the metadata) into every active destination's
// staging, then the slice's flags.
__device__ void sendRows(const GroupView& g, const HandleView& h, const LlDispatchCall& c, uint64_t seq,
                         uint64_t active, const WarpId& w) {
  const int me = g.rank, R = g.nRanks, K = h.topk, MK = g.meta.maxTopk, lane = w.lane, S = slicesOf(c.hidden);
  const size_t bank = bankOf(g, seq);
  const bool forward = !c.quantize && !c.quantizeFp4;
  for (int item = w.gw; item < h.numTokens * S; item += w.nw) {
    const int t = item / S, sl = item % S;
    const Cols cols = Cols::of(sl, c.hidden);
    const Slots slots = Slots::load(h, R, t, lane);
    const char* row = c.tokens + (size_t)t * c.inRowBytes;
    const bool has = lane < K && sl == 0;
    // emIdx -1 marks what routing ignored (no expert, an id out of range, a repeat; reported at handle time).
    const int idx = has ? h.emIdx[(size_t)t * MK + lane] : -1;
    const int e = idx >= 0 ? loadExpert(h, t, lane) : -1;
    const float wt = has && c.weights ? c.weights[(size_t)t * K + lane] : 1.f;
    for (int r = 0; r < R; r++) {
      const int slot = slots.of(r);
      if (slot < 0 || !isOn(active, r)) continue;
      const size_t rowIndex = (size_t)me * g.maxTokens + slot;
      char* meta = static_cast<char*>(peerAt(g, bank + g.wl.dispMeta + rowIndex * g.meta.bytes, r));
      if (forward) {
        char* dst = static_cast<char*>(peerAt(g, bank + g.wl.dispRows + rowIndex * g.rowStride, r));
        const size_t lo = colBytes(cols.lo, c.inColNibbles), hi = colBytes(cols.hi, c.inColNibbles);
        warpCopy<false>(lane, dst + lo, row + lo, (int)(hi - lo));
        if (c.scales) {  // whole words: a slice starts at a multiple of 128 columns (H is a multiple of 128)
          const ScaleWords sw = ScaleWords::of(c, cols);
          for (int b = sw.lo + lane; b < sw.hi; b += 32)
            reinterpret_cast<float*>(meta + g.meta.scaleOff())[b] = __ldg(c.scales + (size_t)t * c.nScales + b);
        }
      }
      if (has) {
        reinterpret_cast<int*>(meta + g.meta.expertOff())[lane] = localExpert(g, e, r);
        reinterpret_cast<float*>(meta + g.meta.weightOff())[lane] = wt;
        reinterpret_cast<int*>(meta + g.meta.emIdxOff())[lane] = idx;
      }
      if (sl == 0 && lane == 0) *reinterpret_cast<int*>(meta + g.meta.tokenOff()) = t;
    }
    if (c.quantize) quantizeSlice(g, c, slots, active, bank, row, cols, lane);
    if (c.quantizeFp4) quantizeSliceFp4(g, c, slots, active, bank, row, cols, lane);
    __syncwarp();  // every lane's stores of every destination's slice before the releases
    // Lane r releases destination r's flag (and r + 32's): one round instead of one release per destination.
    if (slots.lo >= 0 && isOn(active, lane))
      ncclext::dev::storeRelease(dispFlag(g, bank, (size_t)me * g.maxTokens + slots.lo, sl, lane), seq);
    if (slots.hi >= 0 && isOn(active, lane + 32))
      ncclext::dev::storeRelease(dispFlag(g, bank, (size_t)me * g.maxTokens + slots.hi, sl, lane + 32), seq);
  }
}

// What each receiving CTA derives from the headers, in shared memory.
struct RecvCounts {
  int rowStart[kMaxRanks + 1];  // prefix over sources of their row counts: the flat list of staged rows
  int block[kMaxExperts];       // [l * R + s]: start of block (l, s) in zone l
  int expertCount[kMaxExperts]; // [l]
};

// The whole CTA: acquires every active source's header, then the counts (0 for the others). Returns the sources
// whose header came (every active one without masks), or 0 on every thread after a timeout without masks (*ok
// false).
__device__ uint64_t acquireHeaders(const GroupView& g, const WaitClock& clock, RecvCounts* rc, uint64_t seq,
                                   bool* ok) {
  __shared__ unsigned long long came;
  const int R = g.nRanks, L = g.localExperts;
  const size_t bank = bankOf(g, seq);
  const uint64_t active = activeRanks(g);
  if (threadIdx.x == 0) came = active;
  __syncthreads();
  bool waited = true;
  for (int s = threadIdx.x; s < R; s += blockDim.x) {
    if (!isOn(active, s)) continue;
    const uint64_t* flag = static_cast<const uint64_t*>(g.peers.local(headerOff(g, bank, s)));
    if (!clock.wait(g, flag, seq, s, ncclext::kSiteHeader, s)) {
      waited = false;
      atomicAnd(&came, ~(1ull << s));
    }
  }
  *ok = !__syncthreads_or(!waited) || g.mask;
  if (!*ok) return 0;
  const uint64_t from = came;
  auto count = [&](int s, int j) {
    return isOn(from, s) ? __ldcg(headerCounts(g.peers.local(headerOff(g, bank, s))) + j) : 0;
  };
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    int run = 0;
    for (int s = 0; s < R; s++) {
      rc->block[l * R + s] = run;
      run += count(s, 1 + l);
    }
    rc->expertCount[l] = run;
  }
  if (threadIdx.x == 0) {
    int run = 0;
    for (int s = 0; s < R; s++) {
      rc->rowStart[s] = run;
      run += count(s, 0);
    }
    rc->rowStart[R] = run;
  }
  __syncthreads();
  return from;
}

// Source of flat row i of the staged rows (warp-uniform: every lane scans the same shared counts).
__device__ __forceinline__ int sourceOf(const int* rowStart, int R, int i) {
  int s = 0;
  while (s + 1 < R && rowStart[s + 1] <= i) s++;
  return s;
}

// One warp: the slice's columns of a staged row (and its blocks' scales) to output row `row`.
__device__ __forceinline__ void copySlice(const LlDispatchCall& c, int lane, size_t row, const char* src,
                                          const float* scales, Cols cols) {
  const size_t lo = colBytes(cols.lo, c.outColNibbles), hi = colBytes(cols.hi, c.outColNibbles);
  warpCopy<true>(lane, c.outTokens + row * c.outRowBytes + lo, src + lo, (int)(hi - lo));
  if (c.outScales) {  // 32-bit words, bit for bit (NVFP4: four e4m3 scales each)
    const ScaleWords sw = ScaleWords::of(c, cols);
    for (int b = sw.lo + lane; b < sw.hi; b += 32) c.outScales[row * c.nScales + b] = __ldcg(scales + b);
  }
}

// One warp per (staged row, slice): acquire, lay out; slice 0 also writes the row's ids, weights and src_info and
// records it for combine. False after a timeout.
__device__ bool receiveRows(const GroupView& g, const HandleView& h, const LlDispatchCall& c, const WaitClock& clock,
                            const RecvCounts* rc, uint64_t seq, const WarpId& w) {
  const int R = g.nRanks, M = g.maxTokens, K = h.topk, MK = g.meta.maxTopk, lane = w.lane, S = slicesOf(c.hidden);
  const bool rankMajor = h.layout == NCCL_EP_LAYOUT_RANK_MAJOR;
  const size_t bank = bankOf(g, seq);
  for (int item = w.gw; item < rc->rowStart[R] * S; item += w.nw) {
    const int i = item / S, sl = item % S;
    const int s = sourceOf(rc->rowStart, R, i), j = i - rc->rowStart[s];
    const size_t rowIndex = (size_t)s * M + j;
    // The slice's flag, then slice 0's (the metadata's), in my window. With masks a row that does not come is
    // skipped (its source is masked: the call reports it).
    if (!warpWaitOrMask(g, clock, dispFlag(g, bank, rowIndex, sl, g.rank), seq, s, j) ||
        (sl != 0 && !warpWaitOrMask(g, clock, dispFlag(g, bank, rowIndex, 0, g.rank), seq, s, j))) {
      if (!g.mask) return false;
      continue;
    }
    const char* meta = static_cast<const char*>(g.peers.local(bank + g.wl.dispMeta + rowIndex * g.meta.bytes));
    const bool has = lane < K;
    const int id = has ? __ldcg(reinterpret_cast<const int*>(meta + g.meta.expertOff()) + lane) : -1;
    const float wt = has ? __ldcg(reinterpret_cast<const float*>(meta + g.meta.weightOff()) + lane) : 0.f;
    const int idx = has ? __ldcg(reinterpret_cast<const int*>(meta + g.meta.emIdxOff()) + lane) : -1;
    const int token = __ldcg(reinterpret_cast<const int*>(meta + g.meta.tokenOff()));
    const float* scales = reinterpret_cast<const float*>(meta + g.meta.scaleOff());
    const char* row = static_cast<const char*>(g.peers.local(bank + g.wl.dispRows + rowIndex * g.rowStride));
    const Cols cols = Cols::of(sl, c.hidden);
    const bool first = sl == 0;
    if (rankMajor) {
      copySlice(c, lane, rowIndex, row, scales, cols);
      if (first && has && c.outIdx) c.outIdx[rowIndex * K + lane] = id >= 0 ? id + c.idBase : -1;
      if (first && has && c.outWeights) c.outWeights[rowIndex * K + lane] = id >= 0 ? wt : 0.f;
      if (first && lane == 0 && c.outSrcInfo) c.outSrcInfo[rowIndex] = token;
    } else {
      for (int k = 0; k < K; k++) {
        const int l = __shfl_sync(kAll, id, k);
        const float wk = __shfl_sync(kAll, wt, k);
        const int ik = __shfl_sync(kAll, idx, k);
        int emRow = -1;
        if (l >= 0) {
          emRow = l * R * M + rc->block[l * R + s] + ik;
          copySlice(c, lane, (size_t)emRow, row, scales, cols);
          if (first && lane == 0 && c.outWeights) c.outWeights[emRow] = wk;
          if (first && lane == 0 && c.outSrcInfo) c.outSrcInfo[emRow] = s * M + token;
        }
        if (first && lane == 0) {
          h.emPos[rowIndex * MK + k] = emRow;
          h.flatW[rowIndex * MK + k] = wk;
        }
      }
    }
    if (first && lane == 0) h.llToken[rowIndex] = token;
  }
  return true;
}

// CTA 0, after the headers: the counts for the caller (layout info) and for combine.
__device__ void writeCounts(const GroupView& g, const HandleView& h, const LlDispatchCall& c, const RecvCounts* rc) {
  const int R = g.nRanks, L = g.localExperts;
  const LayoutInfoOut& info = c.info;
  for (int s = threadIdx.x; s < R; s += blockDim.x) {
    const int n = rc->rowStart[s + 1] - rc->rowStart[s];
    h.llRecvCount[s] = n;
    if (info.srcRankCounters) info.srcRankCounters[s] = n;
  }
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    if (info.expertCounters) info.expertCounters[l] = rc->expertCount[l];
    if (info.expertOffsets) info.expertOffsets[l] = l * R * g.maxTokens;
  }
  if (threadIdx.x == 0 && info.recvTotal) {
    int rows = rc->rowStart[R];
    if (h.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR) {
      rows = 0;
      for (int l = 0; l < L; l++) rows += rc->expertCount[l];
    }
    info.recvTotal[0] = rows;
  }
}

// The two calls' kernels are named so that profilers find them as DeepEP's: "dispatch" and "combine" in the name
// (DeepEP's tests and dashboards look kernels up by those words).
__global__ void __launch_bounds__(kLlThreads) dispatchLowLatencyKernel(GroupView g, HandleView h, LlDispatchCall c) {
  __shared__ RecvCounts rc;
  __shared__ unsigned long long waitCycles[kMaxRanks];
  const WarpId w = WarpId::of();
  bool ok = true;
  if (c.phases & kLlSend) {
    const uint64_t seq = g.sent[kDispatch] + 1;
    uint64_t active = activeRanks(g);
    ok = waitBankFree(g, g.wl.dispDone, seq, &active);
    if (ok && isOn(active, g.rank)) {
      if (blockIdx.x == 0) sendHeaders(g, h, seq, active);
      sendRows(g, h, c, seq, active, w);
    }
    if (!(c.phases & kLlReceive)) {  // send-only: the call stays open until ncclEpComplete's half
      finishSend(g, kDispatch, seq, !ok);
      return;
    }
  }
  const uint64_t seq = g.calls[kDispatch] + 1;  // a whole call: the send half's number too
  const WaitClock clock = WaitClock::start(g, waitCycles, c.waitCycles);
  uint64_t from = 0;
  if (ok) from = acquireHeaders(g, clock, &rc, seq, &ok);
  if (ok) {
    if (blockIdx.x == 0) writeCounts(g, h, c, &rc);
    ok = receiveRows(g, h, c, clock, &rc, seq, w);
  }
  if (ok) reportMasked(g, from, seq);
  clock.finish(g, c.waitCycles);
  finishCall(g, kDispatch, g.wl.dispDone, seq, !ok, (c.phases & kLlSend) ? g.sent + kDispatch : nullptr);
}

// ---- combine -----------------------------------------------------------------------------------------------------

// 8 bf16 of a 16-byte vector, added (+) or weighted (fma) into fp32 accumulators: the reference's operations.
__device__ __forceinline__ void addBf16(float* acc, int4 v) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(&v);
  for (int i = 0; i < 4; i++) {
    acc[2 * i] += ncclext::bf16ToFloat((uint16_t)(p[i] & 0xffff));
    acc[2 * i + 1] += ncclext::bf16ToFloat((uint16_t)(p[i] >> 16));
  }
}
__device__ __forceinline__ void fmaBf16(float* acc, int4 v, float w) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(&v);
  for (int i = 0; i < 4; i++) {
    acc[2 * i] = __fmaf_rn(w, ncclext::bf16ToFloat((uint16_t)(p[i] & 0xffff)), acc[2 * i]);
    acc[2 * i + 1] = __fmaf_rn(w, ncclext::bf16ToFloat((uint16_t)(p[i] >> 16)), acc[2 * i + 1]);
  }
}
__device__ __forceinline__ int4 packBf16(const float* acc) {
  int4 v;
  uint32_t* p = reinterpret_cast<uint32_t*>(&v);
  for (int i = 0; i < 4; i++)
    p[i] = (uint32_t)ncclext::floatToBf16(acc[2 * i]) | (uint32_t)ncclext::floatToBf16(acc[2 * i + 1]) << 16;
  return v;
}

// Rows a combine warp reads at once: the loads of kLlBatch rows (each lane's vector of each) are all issued before
// the first is used, so that a warp waits for one load latency per batch instead of one per row. The arithmetic
// keeps its order (column k after column k - 1): only the loads move.
constexpr int kLlBatch = 4;
constexpr int kLlSliceVecsPerLane = kLlSliceCols / 8 / 32;  // a slice's bf16 vectors a lane: 2

// Whether the owner reads its own rows where they lie, in the call's input, so that its send warps skip the slots it
// receives from itself: kLlRankRows and kLlOwnerWeighted, whose rows are input rows (kLlExpertWeighted's is the
// sender's weighted sum: staged as any), and only in a whole call (send and receive in one launch: a split call's
// input need not outlive its send half). sendSlot and reduceToken both ask it, so they agree.
__device__ __forceinline__ bool ownRowsInPlace(const LlCombineCall& c) {
  return c.phases == (kLlSend | kLlReceive) && c.mode != kLlExpertWeighted;
}

// One warp: slice `sl` of received slot (s, j) back to its owner s. A slice of bf16 columns is `vecs` 16-byte
// vectors from vector `v0`.
__device__ void sendSlot(const GroupView& g, const HandleView& h, const LlCombineCall& c, int s, int j, int sl,
                         uint64_t seq, int lane) {
  const int me = g.rank, M = g.maxTokens, K = h.topk, MK = g.meta.maxTopk, rowVecs = c.rowBytes >> 4;
  const Cols cols = Cols::of(sl, c.rowBytes / 2);
  const int v0 = cols.lo / 8, vecs = (cols.hi - cols.lo) / 8;
  const size_t slotIndex = (size_t)s * M + j, bank = bankOf(g, seq);
  const int4* in = reinterpret_cast<const int4*>(c.in);
  auto stagingRow = [&](size_t at) {
    return static_cast<int4*>(peerAt(g, bank + g.wl.combRows + at * g.rowStride, s)) + v0;
  };
  if (c.mode == kLlRankRows) {
    if (s == me && ownRowsInPlace(c)) return;  // reduceToken reads it in the input
    const size_t at = (size_t)me * M + j;
    warpCopy<false>(lane, stagingRow(at), in + slotIndex * rowVecs + v0, vecs * 16);
    warpPublish(lane, combFlag(g, bank, at, sl, s), seq);
    return;
  }
  const int pos = lane < K ? h.emPos[slotIndex * MK + lane] : -1;
  if (c.mode == kLlOwnerWeighted) {
    if (s == me && ownRowsInPlace(c)) return;  // reduceToken reads them in the input
    // Inside my domain into the owner's [token][k]; towards another domain into my slice of its ownerRows, at
    // [me][j][c], c: column k's place among the token's columns whose expert is mine (the owner finds it from its
    // token's slot towards me and the same count).
    const int token = h.llToken[slotIndex];
    const bool remote = !g.rail.local(s);
    const int C = g.wl.ownerCols;
    const unsigned mineCols = remote ? __ballot_sync(kAll, pos >= 0) : 0u;  // remote: warp-uniform (s is)
    auto ownerAt = [&](int k) { return ((size_t)me * M + j) * C + __popc(mineCols & ((1u << k) - 1)); };
    auto rowAt = [&](int k) {
      if (!remote) return stagingRow((size_t)token * MK + k);
      return static_cast<int4*>(peerAt(g, bank + g.wl.ownerRows + ownerAt(k) * g.rowStride, s)) + v0;
    };
    // kLlBatch rows at a time, every lane's vectors of them loaded before any is stored (the copy of one row after
    // another waited for a load per row).
    for (int k0 = 0; k0 < K; k0 += kLlBatch) {
      int4 v[kLlBatch][kLlSliceVecsPerLane];
      int p[kLlBatch];
#pragma unroll
      for (int b = 0; b < kLlBatch; b++) {
        p[b] = k0 + b < K ? __shfl_sync(kAll, pos, k0 + b) : -1;  // warp-uniform condition: the shuffle is whole
#pragma unroll
        for (int u = 0; u < kLlSliceVecsPerLane; u++)
          if (p[b] >= 0 && lane + 32 * u < vecs) v[b][u] = __ldg(in + (size_t)p[b] * rowVecs + v0 + lane + 32 * u);
      }
#pragma unroll
      for (int b = 0; b < kLlBatch; b++) {
        if (p[b] < 0) continue;
        int4* dst = rowAt(k0 + b);
#pragma unroll
        for (int u = 0; u < kLlSliceVecsPerLane; u++)
          if (lane + 32 * u < vecs) dst[lane + 32 * u] = v[b][u];
      }
    }
    // Every row's slice, then their flags at once: lane k releases row k's (cumulativity after __syncwarp, as
    // warpPublish's lane 0 does for one row).
    __syncwarp();
    if (pos >= 0) {
      uint64_t* flag = remote ? ownerFlag(g, bank, ownerAt(lane), sl, s)
                              : combFlag(g, bank, (size_t)token * MK + lane, sl, s);
      ncclext::dev::storeRelease(flag, seq);
    }
    return;
  }
  // kLlExpertWeighted: sum_k w_k * row(e_k), fma in column order, rounded to bf16.
  const float wt = lane < K ? h.flatW[slotIndex * MK + lane] : 0.f;
  const size_t at = (size_t)me * M + j;
  int4* dst = stagingRow(at);
  for (int i0 = 0; i0 < vecs; i0 += 32) {  // warp-uniform trip count: the loop shuffles
    const int i = i0 + lane;
    float acc[8] = {};
    for (int k0 = 0; k0 < K; k0 += kLlBatch) {  // a batch's loads first, then its fmas in column order
      int4 v[kLlBatch];
      int p[kLlBatch];
      float wk[kLlBatch];
#pragma unroll
      for (int b = 0; b < kLlBatch; b++) {
        const bool has = k0 + b < K;  // warp-uniform
        p[b] = has ? __shfl_sync(kAll, pos, k0 + b) : -1;
        wk[b] = has ? __shfl_sync(kAll, wt, k0 + b) : 0.f;
        if (p[b] >= 0 && i < vecs) v[b] = __ldg(in + (size_t)p[b] * rowVecs + v0 + i);
      }
#pragma unroll
      for (int b = 0; b < kLlBatch; b++)
        if (p[b] >= 0 && i < vecs) fmaBf16(acc, v[b], wk[b]);
    }
    if (i < vecs) dst[i] = packBf16(acc);
  }
  warpPublish(lane, combFlag(g, bank, at, sl, s), seq);
}

// One warp: the number of token t's top-k experts on ranks inactive in `active` (their rows are not in the sum).
__device__ int missingExperts(const GroupView& g, const HandleView& h, int t, uint64_t active, int lane) {
  const bool valid = lane < h.topk && h.emIdx[(size_t)t * g.meta.maxTopk + lane] >= 0;
  const bool miss = valid && !isOn(active, loadExpert(h, t, lane) / g.localExperts);
  return __popc(__ballot_sync(kAll, miss));
}

// One warp: slice `sl` of own token t, summed from my staging: the rows of active ranks (with masks, a row that
// does not come is left out: its rank is masked, and the call reports it). False after a timeout without masks.
__device__ bool reduceToken(const GroupView& g, const HandleView& h, const LlCombineCall& c, const WaitClock& clock,
                            int t, int sl, uint64_t seq, uint64_t active, int lane) {
  const int R = g.nRanks, M = g.maxTokens, K = h.topk, MK = g.meta.maxTopk;
  const Cols cols = Cols::of(sl, c.rowBytes / 2);
  const int v0 = cols.lo / 8, vecs = (cols.hi - cols.lo) / 8;
  const size_t bank = bankOf(g, seq);
  const char* staging = static_cast<const char*>(g.peers.local(bank + g.wl.combRows));
  auto stagingRow = [&](size_t at) { return reinterpret_cast<const int4*>(staging + at * g.rowStride) + v0; };
  int4* out = reinterpret_cast<int4*>(c.out + (size_t)t * c.rowBytes) + v0;
  if (sl == 0 && c.missing) {
    const int n = missingExperts(g, h, t, active, lane);
    if (lane == 0) c.missing[t] = n;
  }
  if (c.mode == kLlOwnerWeighted) {
    // Column k is delivered where routing kept it (emIdx >= 0) and its rank is active; its row sits at [t][k], or,
    // from another domain's rank r, at ownerRows [r][j][c] (j: my token's slot towards r; c: the kept columns
    // before k whose expert also lives on r, as the sender counts them). With ownRowsInPlace, a column of my own
    // experts is read where it lies, in the call's input at the row dispatch gave it (emPos of my slot towards me):
    // nothing is staged or waited for.
    const bool kept = lane < K && h.emIdx[(size_t)t * MK + lane] >= 0;
    const float wt = lane < K ? c.weights[(size_t)t * K + lane] : 0.f;
    const int owner = kept ? loadExpert(h, t, lane) / g.localExperts : -1;
    const bool on = kept && isOn(active, owner);
    const bool remote = on && !g.rail.local(owner);
    // (A column of mine without an input row, which only a misused handle could give, is left out, not read.)
    const int ownPos = on && owner == g.rank && ownRowsInPlace(c)
                           ? max(-1, h.emPos[((size_t)g.rank * M + h.sendSlot[(size_t)t * R + g.rank]) * MK + lane])
                           : -2;  // -2: not read in place (staged, waited for)
    const bool own = ownPos >= 0;
    int before = 0;
    if (__any_sync(kAll, remote))  // only across domains: not on the single-domain path
      for (int k2 = 0; k2 < K; k2++) {  // warp-uniform: the loop shuffles
        const int o2 = __shfl_sync(kAll, owner, k2);
        before += k2 < lane && owner >= 0 && o2 == owner;
      }
    const size_t at = own      ? (size_t)ownPos  // the input row
                      : remote ? ((size_t)owner * M + h.sendSlot[(size_t)t * R + owner]) * g.wl.ownerCols + before
                               : (size_t)t * MK + lane;  // lane k's row in its region
    unsigned colsOn = __ballot_sync(kAll, on && ownPos != -1);
    const unsigned remoteCols = __ballot_sync(kAll, remote), ownCols = __ballot_sync(kAll, own);
    // Lane k waits for row k's flag; the rows that did not come are left out (with masks) or fail the call.
    const unsigned late = __ballot_sync(
        kAll, on && ownPos == -2 &&
                  !clock.wait(g, remote ? ownerFlag(g, bank, at, sl, g.rank) : combFlag(g, bank, at, sl, g.rank), seq,
                              owner, ncclext::kSiteRow, (uint32_t)t));
    if (late && !g.mask) return false;
    colsOn &= ~late;
    __syncwarp();  // lane k's acquire before every lane's reads of row k (bar.warp.sync orders memory in the warp)
    const char* owned = static_cast<const char*>(g.peers.local(bank + g.wl.ownerRows));
    const int4* in = reinterpret_cast<const int4*>(c.in);
    const int rowVecs = c.rowBytes >> 4;
    for (int i0 = 0; i0 < vecs; i0 += 32) {
      const int i = i0 + lane;
      float acc[8] = {};
      for (int k0 = 0; k0 < K; k0 += kLlBatch) {  // a batch's loads first, then its fmas in column order
        int4 v[kLlBatch];
        float wk[kLlBatch];
#pragma unroll
        for (int b = 0; b < kLlBatch; b++) {
          const int k = k0 + b;
          const bool has = k < K;  // warp-uniform
          wk[b] = has ? __shfl_sync(kAll, wt, k) : 0.f;
          const unsigned long long ak = has ? __shfl_sync(kAll, (unsigned long long)at, k) : 0ull;
          // (k < K <= 32 before the shifts)
          const int4* remoteRow = reinterpret_cast<const int4*>(owned + ak * g.rowStride) + v0;
          const int4* row = has && (ownCols >> k & 1)      ? in + ak * rowVecs + v0
                            : has && (remoteCols >> k & 1) ? remoteRow
                                                           : stagingRow(ak);
          if (has && (colsOn >> k & 1) && i < vecs) v[b] = __ldcg(row + i);
        }
#pragma unroll
        for (int b = 0; b < kLlBatch; b++)
          if (k0 + b < K && (colsOn >> (k0 + b) & 1) && i < vecs) fmaBf16(acc, v[b], wk[b]);
      }
      if (i < vecs) out[i] = packBf16(acc);
    }
    return true;
  }
  const Slots slots = Slots::load(h, R, t, lane);
  // With ownRowsInPlace (kLlRankRows here) my own row for t is read where it lies, the input's row (me, slot): not
  // staged, not waited for (a bitwise copy before, so the same sum).
  const bool ownInPlace = ownRowsInPlace(c);
  // Lane r waits for rank r's row (and r + 32's), all at once; the ranks whose row for t came, as bits.
  auto came = [&](int r, int slot) {
    return slot >= 0 && isOn(active, r) &&
           ((r == g.rank && ownInPlace) ||
            clock.wait(g, combFlag(g, bank, (size_t)r * M + slot, sl, g.rank), seq, r, ncclext::kSiteRow,
                       (uint32_t)slot));
  };
  auto expected = [&](int r, int slot) { return slot >= 0 && isOn(active, r); };
  const bool loCame = came(lane, slots.lo), hiCame = came(lane + 32, slots.hi);
  const uint64_t ranksOn = (uint64_t)__ballot_sync(kAll, loCame) | (uint64_t)__ballot_sync(kAll, hiCame) << 32;
  const bool late = (expected(lane, slots.lo) && !loCame) || (expected(lane + 32, slots.hi) && !hiCame);
  if (__any_sync(kAll, late) && !g.mask) return false;
  __syncwarp();  // lane r's acquire before every lane's reads of rank r's row (bar.warp.sync orders memory in the warp)
  const int4* in = reinterpret_cast<const int4*>(c.in);
  const int rowVecs = c.rowBytes >> 4;
  for (int i0 = 0; i0 < vecs; i0 += 32) {
    const int i = i0 + lane;
    float acc[8] = {};
    for (int r = 0; r < R; r++) {  // rank order
      const int slot = slots.of(r);
      if (!isOn(ranksOn, r) || i >= vecs) continue;
      const size_t at = (size_t)r * M + slot;
      addBf16(acc, __ldcg((r == g.rank && ownInPlace ? in + at * rowVecs + v0 : stagingRow(at)) + i));
    }
    if (i < vecs) out[i] = packBf16(acc);
  }
  return true;
}

__global__ void __launch_bounds__(kLlThreads, 1) combineLowLatencyKernel(GroupView g, HandleView h, LlCombineCall c) {
  __shared__ int rowStart[kMaxRanks + 1];
  __shared__ unsigned long long waitCycles[kMaxRanks];
  const int R = g.nRanks, S = slicesOf(c.rowBytes / 2);
  const WarpId w = WarpId::of();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int s = 0; s < R; s++) {
      rowStart[s] = run;
      run += h.llRecvCount[s];
    }
    rowStart[R] = run;
  }
  bool ok = true;
  if (c.phases & kLlSend) {
    const uint64_t seq = g.sent[kCombine] + 1;
    uint64_t active = activeRanks(g);
    ok = waitBankFree(g, g.wl.combDone, seq, &active);  // its barrier publishes rowStart
    if (ok && isOn(active, g.rank))
      for (int item = w.gw; item < rowStart[R] * S; item += w.nw) {
        const int i = item / S, s = sourceOf(rowStart, R, i);
        if (isOn(active, s)) sendSlot(g, h, c, s, i - rowStart[s], item % S, seq, w.lane);
      }
    if (!(c.phases & kLlReceive)) {  // send-only: the call stays open until ncclEpComplete's half
      finishSend(g, kCombine, seq, !ok);
      return;
    }
  }
  const uint64_t seq = g.calls[kCombine] + 1;  // a whole call: the send half's number too
  const uint64_t active = ok ? activeRanks(g) : 0;
  const WaitClock clock = WaitClock::start(g, waitCycles, c.waitCycles);
  for (int item = w.gw; ok && item < h.numTokens * S; item += w.nw)
    ok = reduceToken(g, h, c, clock, item / S, item % S, seq, active, w.lane);
  if (__syncthreads_and(ok)) reportMasked(g, active, seq);
  clock.finish(g, c.waitCycles);
  finishCall(g, kCombine, g.wl.combDone, seq, !ok, (c.phases & kLlSend) ? g.sent + kCombine : nullptr);
}

// One CTA: ncclEpMaskClean's barrier at `epoch` among me and the ranks of my domain active in my mask (a rank that
// does not arrive within the timeout is masked); the other domains' meet over the rail (Rail::maskBarrier).
__global__ void __launch_bounds__(kLlThreads) llCleanBarrierKernel(GroupView g, uint64_t epoch) {
  uint64_t active = 1ull << g.rank;
  for (int r = 0; r < g.nRanks; r++)
    if ((!g.mask || *reinterpret_cast<const volatile int*>(g.mask + r)) && g.rail.local(r)) active |= 1ull << r;
  __threadfence_system();  // this rank's earlier writes into peers' windows before its arrival
  for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x)
    if (isOn(active, r))
      ncclext::dev::storeRelease(static_cast<uint64_t*>(peerAt(g, g.wl.cleanFlags + (size_t)g.rank * 8, r)), epoch);
  for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x)
    if (isOn(active, r))
      waitOrMask(g, static_cast<const uint64_t*>(g.peers.local(g.wl.cleanFlags + (size_t)r * 8)), epoch, r,
                 ncclext::kSiteBarrier, 0);
  __syncthreads();
}

}  // namespace

ncclResult_t loadLlKernels() {
  return ncclext::loadKernels("Low-Latency", dispatchLowLatencyKernel, combineLowLatencyKernel, llCleanBarrierKernel);
}

ncclResult_t launchLlDispatch(const GroupView& g, const HandleView& h, const LlDispatchCall& c, int ctas,
                              bool cooperative, cudaStream_t stream) {
  return ncclext::launchKernel("dispatchLowLatencyKernel", dispatchLowLatencyKernel, dim3(ctas), dim3(kLlThreads), 0,
                               cooperative ? ncclext::Launch::kCooperative : ncclext::Launch::kPlain, stream, g, h, c);
}

ncclResult_t launchLlCombine(const GroupView& g, const HandleView& h, const LlCombineCall& c, int ctas,
                             bool cooperative, cudaStream_t stream) {
  return ncclext::launchKernel("combineLowLatencyKernel", combineLowLatencyKernel, dim3(ctas), dim3(kLlThreads), 0,
                               cooperative ? ncclext::Launch::kCooperative : ncclext::Launch::kPlain, stream, g, h, c);
}

ncclResult_t launchLlCleanBarrier(const GroupView& g, uint64_t epoch, cudaStream_t stream) {
  return ncclext::launchKernel("ll cleanBarrierKernel", llCleanBarrierKernel, dim3(1), dim3(kLlThreads), 0, stream, g,
                               epoch);
}

}  // namespace ncclep
