// HT combine inside one NVLink domain (LSA).
//
// Contract
//   grid = nSenders + nReceivers CTAs of kThreads (no senders with one rank). Roles walk chunks of the OWNER's
//   tokens, as in dispatch.
//   Sender (expert rank), chunk c, for every owner s != me: (1) waits for s's ack of chunk c from the previous call;
//   (2) one warp per row: the rows of s's chunk c are my received flat rows recvOffset[s] + [chunkPrefix[s][c],
//   chunkPrefix[s][c+1]); FLAT sends each row as is, EXPERT_MAJOR first sums the row's local experts' rows weighted
//   by the dispatched top-k weights (fp32); the result goes to s's combine staging [me][slot] over LSA; (3) after a
//   CTA barrier, releases flag[c][me] in s's window.
//   Receiver (owner), chunk c: acquires flag[c][r] from every peer r, then one warp per token sums in fp32 the rows
//   of every rank that received it (its own contribution read in place, the peers' from staging) and writes the
//   output dtype; tokens routed nowhere get zeros. Then releases ack[c][me] in every peer's window.
//   Empty chunks are skipped as in dispatch (no ack wait, no flag, no wait; the receiver acks every chunk).
//   Dtypes: bf16, fp16, fp32 (template). Sequence numbers and timeouts as in dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht.h"
#include "nccl_ep/src/kernels/ht_copy.cuh"

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

// Adds vector `i` of my contribution for received flat row `flatRow`: the row itself (FLAT) or its local
// experts' rows weighted by the dispatched top-k weights (EXPERT_MAJOR). Inputs are the caller's tensor.
template <typename T>
__device__ __forceinline__ void addMine(const Ctx& x, int flatRow, int i, float* acc) {
  const int4* in = reinterpret_cast<const int4*>(x.c.in);
  const int vecs = x.c.rowBytes >> 4;
  if (x.h.layout == NCCL_EP_LAYOUT_FLAT) {
    Vec<T>::add(acc, __ldg(in + (size_t)flatRow * vecs + i), 1.f);
    return;
  }
  const int MK = x.g.meta.maxTopk;
  for (int k = 0; k < x.h.topk; k++) {
    const int emRow = x.h.emPos[(size_t)flatRow * MK + k];
    if (emRow >= 0) Vec<T>::add(acc, __ldg(in + (size_t)emRow * vecs + i), x.h.flatW[(size_t)flatRow * MK + k]);
  }
}

template <typename T>
__device__ void sendChunk(const Ctx& x, int chunk) {
  const GroupView& g = x.g;
  const int me = g.rank, R = g.nRanks, NC = g.nChunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  uint64_t* sendSeq = g.seq + 2 * NC;
  __shared__ int failed;
  const uint64_t seq = beginChunk(sendSeq + chunk, &failed);
  for (int k = 1; k < R; k++) {
    const int s = (me + k) % R;
    const int* prefix = x.d + x.h.dl.chunkPrefix + s * (NC + 1);
    const int lo = prefix[chunk], hi = prefix[chunk + 1];
    if (hi == lo) continue;  // nothing of s's chunk c is here: no ack needed, nothing to publish
    if (threadIdx.x == 0) {
      const uint64_t* ack =
          static_cast<const uint64_t*>(ncclGetLocalPointer(g.window, g.wl.combAcks + ((size_t)chunk * R + s) * 8));
      if (!ncclext::dev::waitFlagAtLeast(ack, seq - 1, {g.err, g.timeoutNs, me}, s, ncclext::kSiteFlag, chunk))
        failed = 1;
    }
    if (__syncthreads_or(failed)) return;
    const int base = x.d[x.h.dl.recvOffset + s];
    for (int slot = lo + warp; slot < hi; slot += nWarps) {
      char* dst = static_cast<char*>(
          ncclGetLsaPointer(g.window, g.wl.combRows + ((size_t)me * g.maxTokens + slot) * g.rowStride, s));
      if (x.h.layout == NCCL_EP_LAYOUT_FLAT) {
        warpCopy<false>(lane, dst, x.c.in + (size_t)(base + slot) * x.c.rowBytes, x.c.rowBytes);
      } else {
        for (int i = lane; i < (x.c.rowBytes >> 4); i += 32) {
          float acc[Vec<T>::kN] = {};
          addMine<T>(x, base + slot, i, acc);
          reinterpret_cast<int4*>(dst)[i] = Vec<T>::pack(acc);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t* flag =
          static_cast<uint64_t*>(ncclGetLsaPointer(g.window, g.wl.combFlags + ((size_t)chunk * R + me) * 8, s));
      ncclext::dev::storeRelease(flag, seq);
    }
  }
  if (threadIdx.x == 0) sendSeq[chunk] = seq;
}

template <typename T>
__device__ void receiveChunk(const Ctx& x, int (*stagedSlots)[kMaxRanks], int chunk) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int me = g.rank, R = g.nRanks, NC = g.nChunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  uint64_t* recvSeq = g.seq + 3 * NC;
  __shared__ int failed;
  const uint64_t seq = beginChunk(recvSeq + chunk, &failed);
  const int cols = R + g.numExperts;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    // Only peers holding rows of my chunk c publish it (my prefixes towards r, tileCount rows c and c+1).
    if (r == me || h.tileCount[(size_t)(chunk + 1) * cols + r] == h.tileCount[(size_t)chunk * cols + r]) continue;
    const uint64_t* flag =
        static_cast<const uint64_t*>(ncclGetLocalPointer(g.window, g.wl.combFlags + ((size_t)chunk * R + r) * 8));
    if (!ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, me}, r, ncclext::kSiteFlag, chunk)) failed = 1;
  }
  if (__syncthreads_or(failed)) return;
  const int t0 = chunk * kChunkTokens, t1 = min(h.numTokens, t0 + kChunkTokens);
  const int vecs = x.c.rowBytes >> 4;
  // The chunk's slots in shared memory: one coalesced load instead of a dependent load per token.
  for (int i = threadIdx.x; i < max(0, t1 - t0) * R; i += blockDim.x)
    stagedSlots[i / R][i % R] = h.sendSlot[(size_t)t0 * R + i];
  __syncthreads();
  const char* staging = static_cast<const char*>(ncclGetLocalPointer(g.window, g.wl.combRows));
  constexpr int kU = 4;  // vectors per lane per step: kU loads per source in flight
  for (int t = t0 + warp; t < t1; t += nWarps) {
    const int* slots = stagedSlots[t - t0];
    const int myRow = slots[me] >= 0 ? x.d[h.dl.recvOffset + me] + slots[me] : -1;
    int4* out = reinterpret_cast<int4*>(x.c.out + (size_t)t * x.c.rowBytes);
    for (int i0 = lane; i0 < vecs; i0 += 32 * kU) {
      float acc[kU][Vec<T>::kN] = {};
      for (int r = 0; r < R; r++) {
        const int slot = slots[r];
        if (slot < 0 || r == me) continue;
        const int4* row = reinterpret_cast<const int4*>(staging + ((size_t)r * g.maxTokens + slot) * g.rowStride);
        int4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (i0 + 32 * u < vecs) v[u] = __ldcg(row + i0 + 32 * u);
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (i0 + 32 * u < vecs) Vec<T>::add(acc[u], v[u], 1.f);
      }
      if (myRow >= 0) {
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (i0 + 32 * u < vecs) addMine<T>(x, myRow, i0 + 32 * u, acc[u]);
      }
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i0 + 32 * u < vecs) out[i0 + 32 * u] = Vec<T>::pack(acc[u]);
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    if (r == me) continue;
    uint64_t* ack = static_cast<uint64_t*>(ncclGetLsaPointer(g.window, g.wl.combAcks + ((size_t)chunk * R + me) * 8, r));
    ncclext::dev::storeRelease(ack, seq);
  }
  if (threadIdx.x == 0) recvSeq[chunk] = seq;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) combineKernel(GroupView g, HandleView h, CombineCall c) {
  Ctx x{g, h, c, h.derived};
  __shared__ int stagedSlots[kChunkTokens][kMaxRanks];
  if ((int)blockIdx.x < c.nSenders) {
    for (int chunk = blockIdx.x; chunk < g.nChunks; chunk += c.nSenders) sendChunk<T>(x, chunk);
  } else {
    const int j = blockIdx.x - c.nSenders;
    for (int chunk = j; chunk < g.nChunks; chunk += c.nReceivers) receiveChunk<T>(x, stagedSlots, chunk);
  }
}

}  // namespace

ncclResult_t launchCombine(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream) {
  const dim3 grid(c.nSenders + c.nReceivers), block(kThreads);
  switch (c.dtype) {
    case ncclBfloat16:
      return ncclext::launchKernel("ht combineKernel<bf16>", combineKernel<__nv_bfloat16>, grid, block, 0, stream, g, h, c);
    case ncclFloat16:
      return ncclext::launchKernel("ht combineKernel<fp16>", combineKernel<__half>, grid, block, 0, stream, g, h, c);
    case ncclFloat32:
      return ncclext::launchKernel("ht combineKernel<fp32>", combineKernel<float>, grid, block, 0, stream, g, h, c);
    default:
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__, "combine: dtype %d not supported", c.dtype);
  }
}

}  // namespace ncclep
