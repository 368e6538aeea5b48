// Helpers of the HT kernels: thread teams, the start of a team's turn on a chunk, staging recycling, per-row
// publication, and warp-wide row copies with 16-byte vectors and several loads in flight. `src` of user inputs is
// read through the read-only path; rows that a peer wrote into this rank's window during the kernel are read with
// ld.global.cg (L2, never a stale L1 line).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device/sync.cuh"
#include "nccl_ep/src/ht.h"

namespace ncclep {

template <bool kFromPeer>
__device__ __forceinline__ int4 loadVec(const int4* p) {
  if constexpr (kFromPeer) return __ldcg(p);
  else return __ldg(p);
}

template <bool kFromPeer>
__device__ __forceinline__ void warpCopy(int lane, void* dst, const void* src, int bytes) {
  const int4* s = static_cast<const int4*>(src);
  int4* d = static_cast<int4*>(dst);
  const int n = bytes >> 4;
  constexpr int kUnroll = 8;  // 8 x 16 B in flight per lane, 4 KiB per warp
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
        "{\n .reg .pred in, out;\n setp.ne.s32 in, %1, 0;\n bar.red.or.pred out, %2, %3, in;\n selp.s32 %0, 1, 0, out;\n}"
        : "=r"(any)
        : "r"((int)p), "r"(barrier), "r"(size)
        : "memory");
    return any != 0;
  }
};

// All threads of the team: the sequence number of this call for a chunk (its counter in device memory + 1, read
// once into `shared` and handed to the team) and a cleared failure flag. The caller bumps the counter when done.
__device__ __forceinline__ uint64_t beginChunk(const Team& team, const uint64_t* counter, uint64_t* shared,
                                               int* failed) {
  if (team.tid == 0) {
    *shared = *counter + 1;
    *failed = 0;
  }
  team.sync();
  return *shared;
}

// All threads of a sending team, before its first write into any peer's staging in call `seq`: waits until every
// peer consumed all NC chunks of my rows of the previous call (the counter at `doneOff` + 8 r of my window, added to
// by r; see releaseConsumed). False on every thread if a wait failed.
__device__ inline bool waitPeersConsumed(const Team& team, const GroupView& g, size_t doneOff, uint64_t seq) {
  bool ok = true;
  for (int r = team.tid; r < g.nRanks; r += team.size) {
    if (r == g.rank) continue;
    const uint64_t* done = static_cast<const uint64_t*>(ncclGetLocalPointer(g.window, doneOff + (size_t)r * 8));
    if (!ncclext::dev::waitFlagAtLeast(done, (seq - 1) * (uint64_t)g.nChunks, {g.err, g.timeoutNs, g.rank}, r,
                                       ncclext::kSiteFlag, 0))
      ok = false;
  }
  return !team.syncOr(!ok);
}

// All threads of a receiving team, after its last chunk: adds the number of chunks it consumed to my counter in
// every peer's window (release: the team's reads of the peers' staging rows come before their next overwrite).
__device__ inline void releaseConsumed(const Team& team, const GroupView& g, size_t doneOff, int chunks) {
  team.sync();
  if (chunks == 0) return;
  for (int r = team.tid; r < g.nRanks; r += team.size) {
    if (r == g.rank) continue;
    ncclext::dev::addRelease(static_cast<uint64_t*>(ncclGetLsaPointer(g.window, doneOff + (size_t)g.rank * 8, r)),
                             (uint64_t)chunks);
  }
}

// One warp (all lanes, warp-uniform control flow), after it wrote a row (and its metadata) into a peer's staging:
// publishes it. __syncwarp orders every lane's stores before lane 0's system-scope release (cumulativity).
__device__ __forceinline__ void warpPublish(int lane, uint64_t* remoteFlag, uint64_t seq) {
  __syncwarp();
  if (lane == 0) ncclext::dev::storeRelease(remoteFlag, seq);
}

// One warp: every lane acquires the row's flag in my window (one coalesced load per poll), so each lane's later
// reads of the row are ordered after it. False after a timeout (recorded; `failed` set).
__device__ __forceinline__ bool warpAcquire(const GroupView& g, const uint64_t* flag, uint64_t seq, int peer, int row,
                                            int* failed) {
  if (ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, g.rank}, peer, ncclext::kSiteFlag, (uint32_t)row))
    return true;
  *failed = 1;
  return false;
}

__device__ __forceinline__ void warpZero(int lane, void* dst, int bytes) {
  int4* d = static_cast<int4*>(dst);
  for (int i = lane; i < (bytes >> 4); i += 32) d[i] = make_int4(0, 0, 0, 0);
}

}  // namespace ncclep
