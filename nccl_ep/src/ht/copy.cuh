// Helpers of the HT kernels: thread teams, call numbers and the end of a call, staging recycling, per-row
// publication, and warp-wide row copies with 16-byte vectors and several loads in flight. `src` of user inputs is
// read through the read-only path; rows that a peer wrote into this rank's window during the kernel are read with
// ld.global.cg (L2, never a stale L1 line).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device/sync.cuh"
#include "nccl_ep/src/views.h"

namespace ncclep {

// Entry (t, k) of the handle's routing, as given (int32 or int64).
__device__ __forceinline__ int loadExpert(const HandleView& h, int t, int k) {
  return h.topkIs64 ? (int)static_cast<const int64_t*>(h.topkIdx)[(size_t)t * h.topk + k]
                    : static_cast<const int*>(h.topkIdx)[(size_t)t * h.topk + k];
}

// The i-th domain other than `mine` (i in [0, domains - 1)): the relays' and the hierarchical HT's items.
__device__ __forceinline__ int otherDomain(int i, int mine) { return i < mine ? i : i + 1; }

// Expert `e` (global id, -1: none) as a local id on rank r, or -1 when r does not host it.
__device__ __forceinline__ int localExpert(const GroupView& g, int e, int r) {
  return e >= 0 && e / g.localExperts == r ? e - r * g.localExperts : -1;
}

template <bool kFromPeer>
__device__ __forceinline__ int4 loadVec(const int4* p) {
  if constexpr (kFromPeer)
    return __ldcg(p);
  else
    return __ldg(p);
}

template <bool kFromPeer>
__device__ __forceinline__ void warpCopy(int lane, void* dst, const void* src, int bytes) {
  const int4* s = static_cast<const int4*>(src);
  int4* d = static_cast<int4*>(dst);
  const int n = bytes >> 4;
  constexpr int kUnroll = 4;  // 4 x 16 B in flight per lane, 2 KiB per warp (8 measured no faster and spills more)
  int i = lane;
  for (; i + 32 * (kUnroll - 1) < n; i += 32 * kUnroll) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) v[u] = loadVec<kFromPeer>(s + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) d[i + 32 * u] = v[u];
  }
  for (; i < n; i += 32) d[i] = loadVec<kFromPeer>(s + i);
}

// A team of threads of one CTA that synchronises on its own named barrier: the whole CTA (barrier 0, as
// __syncthreads), or one half of it. bar.sync / bar.red order the memory accesses of the participating threads as
// __syncthreads does.
struct Team {
  int tid, size, barrier;
  __device__ static Team wholeCta() { return Team{(int)threadIdx.x, (int)blockDim.x, 0}; }
  // Half `half` (0, 1) of the CTA, on named barrier 1 + half.
  __device__ static Team halfCta(int half) {
    const int n = (int)blockDim.x / 2;
    return Team{(int)threadIdx.x - half * n, n, 1 + half};
  }
  __device__ int warp() const { return tid >> 5; }
  __device__ int nWarps() const { return size >> 5; }
  __device__ void sync() const { asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(size) : "memory"); }
  // Barrier that returns whether `p` was true on any thread of the team.
  __device__ bool syncOr(bool p) const {
    int any;
    asm volatile(
        "{\n .reg .pred in, out;\n setp.ne.s32 in, %1, 0;\n bar.red.or.pred out, %2, %3, in;\n selp.s32 %0, 1, 0, "
        "out;\n}"
        : "=r"(any)
        : "r"((int)p), "r"(barrier), "r"(size)
        : "memory");
    return any != 0;
  }
};

// The call's number (1 + the calls of this kind completed so far), read by every thread at the start of a kernel.
__device__ __forceinline__ uint64_t callNumber(const GroupView& g, CallKind kind) { return g.calls[kind] + 1; }

// All threads of a sending team, before its first write into any peer's staging in call `seq`: waits until every
// peer consumed what I wrote there in the previous call (its done flag in my window, see finishCall). False on every
// thread of the team if a wait failed.
__device__ inline bool waitPeersConsumed(const Team& team, const GroupView& g, size_t doneOff, uint64_t seq) {
  bool ok = true;
  for (int r = team.tid; r < g.nRanks; r += team.size) {
    // A rank of another domain needs no done flag: what I write for it goes to my outbox, which my previous
    // exchange (before this kernel on my stream) has sent, and lands in its window only by its own copy after its
    // exchange of this call, which its stream runs after its receive half of the previous one.
    if (r == g.rank || !g.rail.local(r)) continue;
    const uint64_t* done = static_cast<const uint64_t*>(g.peers.local(doneOff + (size_t)r * 8));
    if (!ncclext::dev::waitFlagAtLeast(done, seq - 1, {g.err, g.timeoutNs, g.rank}, r, ncclext::kSiteFlag, 0))
      ok = false;
  }
  return !team.syncOr(!ok);
}

// Every thread of a CTA: call `seq`'s done flag (at doneOff, my row) into every peer of my domain's window (another
// domain's ranks need none: see waitBankFree, LL).
__device__ inline void releaseDoneFlags(const GroupView& g, size_t doneOff, uint64_t seq) {
  for (int r = threadIdx.x; r < g.nRanks; r += blockDim.x)
    if (r != g.rank && g.rail.local(r))
      ncclext::dev::storeRelease(static_cast<uint64_t*>(peerAt(g, doneOff + (size_t)g.rank * 8, r)), seq);
}

// All threads of the CTA, at the end of a dispatch or combine kernel (call `seq`; `doneOff`: that kind's done
// flags). The last CTA to arrive bumps the call counter and release-stores `seq` into my done flag in every peer's
// window: every CTA's reads of the peers' staging rows come before it (barrier, system fence, arrival atomic), so
// the peers may overwrite them. A CTA in which a wait failed does not arrive: the group then reports the error and
// its counters stop.
// `sentToo` (LL, a call run whole): also this kind's sent count (LL numbers the send halves apart).
// `hold` (HT dispatch whose rows stay in my window, DispatchCall::rowsInPlace): the rows are still to be read, so
// the done flags wait for this rank's next HT kernel (releaseHeld); the call's number goes to heldDispatch instead.
__device__ inline void finishCall(const GroupView& g, CallKind kind, size_t doneOff, uint64_t seq, bool failed,
                                  uint64_t* sentToo = nullptr, bool hold = false) {
  if (__syncthreads_or(failed)) return;
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(&g.arrivals[kind], 1ull) == gridDim.x - 1;
    if (last) {
      __threadfence_system();
      g.arrivals[kind] = 0;
      g.calls[kind] = seq;
      if (sentToo) *sentToo = seq;
      if (hold) *g.heldDispatch = seq;
    }
  }
  // The barrier hands thread 0's answer to the CTA (no shared variable: racecheck reported one written here and read
  // after __syncthreads in kernels whose halves had synchronised on named barriers a different number of times).
  if (!__syncthreads_or(last) || hold) return;
  releaseDoneFlags(g, doneOff, seq);
}

// Every thread of CTA 0 of an HT dispatch or combine kernel, first thing (the others return at once): releases the
// done flags of a dispatch whose rows this rank read in place in its window (finishCall's `hold`), so that the peers
// may write it again. The kernels that read those rows ran before this one on the stream (or were ordered before it
// by the caller): they happen before the system fence and the releases below. Clearing heldDispatch comes before
// CTA 0's arrival in this kernel's finishCall, which the CTA that stores a new held call observes first.
__device__ inline void releaseHeld(const GroupView& g) {
  if (blockIdx.x != 0) return;
  const uint64_t held = *g.heldDispatch;
  __syncthreads();  // every thread read it before thread 0 clears it
  if (held == 0) return;
  __threadfence_system();
  releaseDoneFlags(g, g.wl.dispDone, held);
  if (threadIdx.x == 0) *g.heldDispatch = 0;
}

// One warp (all lanes, warp-uniform control flow), after it wrote a row (and its metadata) into a peer's staging:
// publishes it. __syncwarp orders every lane's stores before lane 0's system-scope release (cumulativity).
__device__ __forceinline__ void warpPublish(int lane, uint64_t* remoteFlag, uint64_t seq) {
  __syncwarp();
  if (lane == 0) ncclext::dev::storeRelease(remoteFlag, seq);
}

// One warp: every lane acquires the row's flag in my window (one coalesced load per poll), so each lane's later
// reads of the row are ordered after it. False on every lane after a timeout (recorded) on any lane: the answer is
// warp-uniform, since the warp's next steps shuffle across all lanes. Callers keep the outcome in a register and
// agree on it at their team barrier (racecheck flagged a shared failure flag written here and read by other warps
// before that barrier).
__device__ __forceinline__ bool warpAcquire(const GroupView& g, const uint64_t* flag, uint64_t seq, int peer, int row,
                                            uint32_t site = ncclext::kSiteFlag) {
  const bool ok = ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, g.rank}, peer, site, (uint32_t)row);
  return __all_sync(0xffffffffu, ok);
}

__device__ __forceinline__ void warpZero(int lane, void* dst, int bytes) {
  int4* d = static_cast<int4*>(dst);
  for (int i = lane; i < (bytes >> 4); i += 32) d[i] = make_int4(0, 0, 0, 0);
}

}  // namespace ncclep
