// Helpers of the HT kernels: the start of a CTA's turn on a chunk, and warp-wide row copies with 16-byte vectors and several loads in flight. `src` of user inputs is read through the
// read-only path; rows that a peer wrote into this rank's window during the kernel are read with ld.global.cg
// (L2, never a stale L1 line).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// All threads of the CTA: the sequence number of this call for a chunk (its counter in device memory + 1, read once
// and shared) and a cleared failure flag. The counter is bumped by the caller when it is done with the chunk.
__device__ __forceinline__ uint64_t beginChunk(const uint64_t* counter, int* failed) {
  __shared__ uint64_t seq;
  if (threadIdx.x == 0) {
    seq = *counter + 1;
    *failed = 0;
  }
  __syncthreads();
  return seq;
}

__device__ __forceinline__ void warpZero(int lane, void* dst, int bytes) {
  int4* d = static_cast<int4*>(dst);
  for (int i = lane; i < (bytes >> 4); i += 32) d[i] = make_int4(0, 0, 0, 0);
}

}  // namespace ncclep
