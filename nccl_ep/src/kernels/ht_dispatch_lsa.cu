// HT dispatch inside one NVLink domain (LSA).
//
// Contract
//   grid = nSenders + nReceivers CTAs of kThreads; CTA j < nSenders is a sender, the others receivers (none with
//   one rank). Each role walks chunks c = j, j + n, ... of kChunkTokens source tokens.
//   Sender, chunk c: (1) waits until every peer acknowledged chunk c of the previous call (its staging rows are
//   free); (2) one warp per token writes the row once per other rank holding one of its experts, into that rank's
//   staging region [me][slot] over LSA with 16-byte stores, followed by the row's metadata (local expert ids,
//   weights, expert indices, fp8 scales); (3) after a CTA barrier, releases flag[c][me] = seq in every peer's window
//   (system scope: the barrier plus release cumulativity publish every row of the chunk).
//   Receiver, chunk c: first copies this rank's own tokens of chunk c that have a local expert to their final
//   output positions (FLAT row recvOffset[me] + slot, or one EXPERT_MAJOR row per local expert), so that senders
//   only push over NVLink (with one rank there are no receivers and the senders do it); then for every source s:
//   acquires flag[c][s] >= seq, copies rows [chunkPrefix[s][c],
//   chunkPrefix[s][c+1]) of staging region s to the output (FLAT: row recvOffset[s] + slot; EXPERT_MAJOR: one row
//   per local expert at zoneStart + srcExpOff[s] + index), records where each landed for combine, then releases
//   ack[c][me] in s's window.
//   A chunk with no rows for a peer is neither acked-for nor published by the sender, and the receiver does not
//   wait for it (both sides know it is empty from the exchanged prefixes); the receiver still acks every chunk.
//   Sequence numbers: seq = 1 + the chunk's counter in device memory, bumped by the one CTA owning the chunk in
//   that role, so replays of a captured graph stay in step; chunk ownership may differ between calls and ranks. Every wait has the group's time budget; a timed-out CTA
//   records the error word and returns (the host reports ncclRemoteError).
//   Pad rows of EXPERT_MAJOR zones are zero-filled by the senders (local memory).
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht.h"
#include "nccl_ep/src/kernels/ht_copy.cuh"

namespace ncclep {
namespace {

__device__ __forceinline__ int loadExpert(const HandleView& h, int t, int k) {
  const int e = h.topkIs64 ? (int)static_cast<const int64_t*>(h.topkIdx)[(size_t)t * h.topk + k]
                           : static_cast<const int*>(h.topkIdx)[(size_t)t * h.topk + k];
  return e;
}

struct Ctx {
  const GroupView& g;
  const HandleView& h;
  const DispatchCall& c;
  const int* d;  // derived
};

// Writes row metadata of received flat row `flatRow` (FLAT outputs, or the EXPERT_MAJOR fan-out) and the combine
// maps. `experts[k]` are local ids (-1: not here), `idx[k]` the (source, expert) indices, `w[k]` the weights.
// Called by one warp; `srcRow` is the token row (local input or staging).
template <bool kFromPeer>
__device__ void deliver(const Ctx& x, int lane, int s, int slot, const int* experts, const float* w, const int* idx,
                        const char* srcRow, const float* srcScales) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const DispatchCall& c = x.c;
  const int flatRow = x.d[h.dl.recvOffset + s] + slot;
  const int K = h.topk, MK = g.meta.maxTopk;
  if (h.layout == NCCL_EP_LAYOUT_FLAT) {
    warpCopy<kFromPeer>(lane, c.outTokens + (size_t)flatRow * c.rowBytes, srcRow, c.rowBytes);
    if (lane < K) {
      if (c.outIdx) c.outIdx[(size_t)flatRow * K + lane] = experts[lane];
      if (c.outWeights) c.outWeights[(size_t)flatRow * K + lane] = experts[lane] >= 0 ? w[lane] : 0.f;
    }
    if (c.outScales)
      for (int i = lane; i < c.nScales; i += 32)
        c.outScales[(size_t)flatRow * c.nScales + i] = kFromPeer ? __ldcg(srcScales + i) : __ldg(srcScales + i);
    return;
  }
  for (int k = 0; k < K; k++) {
    const int l = experts[k];
    int emRow = -1;
    if (l >= 0) {
      emRow = x.d[h.dl.zoneStart + l] + x.d[h.dl.srcExpOff + s * g.localExperts + l] + idx[k];
      warpCopy<kFromPeer>(lane, c.outTokens + (size_t)emRow * c.rowBytes, srcRow, c.rowBytes);
      if (lane == 0 && c.outWeights) c.outWeights[emRow] = w[k];
      if (c.outScales)
        for (int i = lane; i < c.nScales; i += 32)
          c.outScales[(size_t)emRow * c.nScales + i] = kFromPeer ? __ldcg(srcScales + i) : __ldg(srcScales + i);
    }
    if (lane == 0) {
      h.emPos[(size_t)flatRow * MK + k] = emRow;
      h.flatW[(size_t)flatRow * MK + k] = w[k];
    }
  }
}

// A chunk's metadata in shared memory: one coalesced load per chunk instead of a chain of dependent global loads
// per token before its copy can start.
struct ChunkStage {
  int slot[kChunkTokens][kMaxRanks];    // my tokens: sendSlot towards every rank
  int expert[kChunkTokens][kMaxTopk];   // my tokens: global expert ids (-1: none); staged rows: local ids
  int local[kChunkTokens][kMaxTopk];    // my tokens: local ids on this rank (-1 elsewhere)
  int idx[kChunkTokens][kMaxTopk];      // (source, expert) indices
  float w[kChunkTokens][kMaxTopk];      // weights
};

// All threads: stages my tokens [t0, t0 + n).
__device__ void stageTokens(const Ctx& x, ChunkStage* st, int t0, int n) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int R = g.nRanks, K = h.topk, me = g.rank, L = g.localExperts;
  for (int i = threadIdx.x; i < n * R; i += blockDim.x) st->slot[i / R][i % R] = h.sendSlot[(size_t)t0 * R + i];
  for (int i = threadIdx.x; i < n * K; i += blockDim.x) {
    const int j = i / K, k = i % K, t = t0 + j;
    int e = loadExpert(h, t, k);
    if (e >= g.numExperts) e = -1;  // reported by the handle kernels
    st->expert[j][k] = e;
    st->local[j][k] = e >= 0 && e / L == me ? e - me * L : -1;
    st->idx[j][k] = h.emIdx[(size_t)t * g.meta.maxTopk + k];
    st->w[j][k] = x.c.weights ? x.c.weights[(size_t)t * K + k] : 1.f;
  }
  __syncthreads();
}

// One warp: my own rows of staged token j (token t) to my output.
__device__ __forceinline__ void deliverOwn(const Ctx& x, const ChunkStage* st, int lane, int j, int t) {
  const int slot = st->slot[j][x.g.rank];
  if (slot < 0) return;
  const DispatchCall& c = x.c;
  deliver<false>(x, lane, x.g.rank, slot, st->local[j], st->w[j], st->idx[j], c.tokens + (size_t)t * c.rowBytes,
                 c.scales ? c.scales + (size_t)t * c.nScales : nullptr);
}

__device__ void sendChunk(const Ctx& x, ChunkStage* st, int chunk) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const DispatchCall& c = x.c;
  const int me = g.rank, R = g.nRanks, K = h.topk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  __shared__ int failed;
  const uint64_t seq = beginChunk(g.seq + chunk, &failed);
  // Rows of chunk c for rank r: the difference of my exclusive prefixes (tileCount rows c and c+1).
  const int cols = R + g.numExperts;
  auto rowsFor = [&](int r) { return h.tileCount[(size_t)(chunk + 1) * cols + r] - h.tileCount[(size_t)chunk * cols + r]; };
  // (1) Staging rows of chunk c in every peer are free once the peer acknowledged the previous call's chunk c
  //     (a chunk with no rows for a peer writes nothing there and needs no ack).
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    if (r == me || rowsFor(r) == 0) continue;
    const uint64_t* ack =
        static_cast<const uint64_t*>(ncclGetLocalPointer(g.window, g.wl.dispAcks + ((size_t)chunk * R + r) * 8));
    if (!ncclext::dev::waitFlagAtLeast(ack, seq - 1, {g.err, g.timeoutNs, me}, r, ncclext::kSiteFlag, chunk))
      failed = 1;
  }
  if (__syncthreads_or(failed)) return;
  // (2) Stage the chunk's metadata, then one warp per token.
  const int t0 = chunk * kChunkTokens, n = max(0, min(h.numTokens, t0 + kChunkTokens) - t0);
  stageTokens(x, st, t0, n);
  for (int j = warp; j < n; j += nWarps) {
    const int t = t0 + j;
    const int e = lane < K ? st->expert[j][lane] : -1;
    const float wt = lane < K ? st->w[j][lane] : 1.f;
    const int idxK = lane < K ? st->idx[j][lane] : -1;
    const char* row = c.tokens + (size_t)t * c.rowBytes;
    const float* scales = c.scales ? c.scales + (size_t)t * c.nScales : nullptr;
    for (int r = 0; r < R; r++) {
      const int slot = st->slot[j][r];
      if (slot < 0) continue;
      if (r == me) {
        if (c.nReceivers == 0) deliverOwn(x, st, lane, j, t);  // alone: nobody else copies my own rows
        continue;
      }
      const int local = e >= 0 && e / g.localExperts == r ? e - r * g.localExperts : -1;
      const size_t rowIndex = (size_t)me * g.maxTokens + slot;
      char* dst = static_cast<char*>(ncclGetLsaPointer(g.window, g.wl.dispRows + rowIndex * g.rowStride, r));
      char* meta = static_cast<char*>(ncclGetLsaPointer(g.window, g.wl.dispMeta + rowIndex * g.meta.bytes, r));
      warpCopy<false>(lane, dst, row, c.rowBytes);
      if (lane < K) {
        reinterpret_cast<int*>(meta + g.meta.expertOff())[lane] = local;
        reinterpret_cast<float*>(meta + g.meta.weightOff())[lane] = wt;
        reinterpret_cast<int*>(meta + g.meta.emIdxOff())[lane] = idxK;
      }
      if (scales)
        for (int i = lane; i < c.nScales; i += 32) reinterpret_cast<float*>(meta + g.meta.scaleOff())[i] = scales[i];
    }
  }
  // (3) Publish chunk c to every peer that has rows in it (receivers skip empty chunks without waiting).
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    if (r == me || rowsFor(r) == 0) continue;
    uint64_t* flag =
        static_cast<uint64_t*>(ncclGetLsaPointer(g.window, g.wl.dispFlags + ((size_t)chunk * R + me) * 8, r));
    ncclext::dev::storeRelease(flag, seq);
  }
  if (threadIdx.x == 0) g.seq[chunk] = seq;
}

__device__ void receiveChunk(const Ctx& x, ChunkStage* st, int chunk) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int me = g.rank, R = g.nRanks, NC = g.nChunks, K = h.topk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  uint64_t* recvSeq = g.seq + NC;
  __shared__ int failed;
  const uint64_t seq = beginChunk(recvSeq + chunk, &failed);
  // My own tokens of chunk c: local copies, no waiting (senders only push rows to peers).
  const int t0 = chunk * kChunkTokens, n = max(0, min(h.numTokens, t0 + kChunkTokens) - t0);
  stageTokens(x, st, t0, n);
  for (int j = warp; j < n; j += nWarps) deliverOwn(x, st, lane, j, t0 + j);
  __syncthreads();  // the stage is reused below
  for (int k = 1; k < R; k++) {
    const int s = (me + k) % R;
    const int* prefix = x.d + h.dl.chunkPrefix + s * (NC + 1);
    const int lo = prefix[chunk], hi = prefix[chunk + 1];
    if (threadIdx.x == 0 && hi > lo) {  // an empty chunk is never published: nothing to wait for
      const uint64_t* flag =
          static_cast<const uint64_t*>(ncclGetLocalPointer(g.window, g.wl.dispFlags + ((size_t)chunk * R + s) * 8));
      if (!ncclext::dev::waitFlagAtLeast(flag, seq, {g.err, g.timeoutNs, me}, s, ncclext::kSiteFlag, chunk)) failed = 1;
    }
    if (__syncthreads_or(failed)) return;
    // Stage the rows' metadata (at most kChunkTokens rows per source and chunk), then one warp per row.
    const char* metaBase =
        static_cast<const char*>(ncclGetLocalPointer(g.window, g.wl.dispMeta + (size_t)s * g.maxTokens * g.meta.bytes));
    for (int i = threadIdx.x; i < (hi - lo) * K; i += blockDim.x) {
      const int j = i / K, k2 = i % K;
      const char* meta = metaBase + (size_t)(lo + j) * g.meta.bytes;
      st->expert[j][k2] = __ldcg(reinterpret_cast<const int*>(meta + g.meta.expertOff()) + k2);
      st->w[j][k2] = __ldcg(reinterpret_cast<const float*>(meta + g.meta.weightOff()) + k2);
      st->idx[j][k2] = __ldcg(reinterpret_cast<const int*>(meta + g.meta.emIdxOff()) + k2);
    }
    __syncthreads();
    for (int j = warp; j < hi - lo; j += nWarps) {
      const size_t rowIndex = (size_t)s * g.maxTokens + lo + j;
      const char* row = static_cast<const char*>(ncclGetLocalPointer(g.window, g.wl.dispRows + rowIndex * g.rowStride));
      const char* meta = metaBase + (size_t)(lo + j) * g.meta.bytes;
      deliver<true>(x, lane, s, lo + j, st->expert[j], st->w[j], st->idx[j], row,
                    reinterpret_cast<const float*>(meta + g.meta.scaleOff()));
    }
    // Rows of (s, c) consumed: s may overwrite them next call. Empty chunks are acknowledged too, so that the ack
    // always carries this call's sequence number.
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t* ack =
          static_cast<uint64_t*>(ncclGetLsaPointer(g.window, g.wl.dispAcks + ((size_t)chunk * R + me) * 8, s));
      ncclext::dev::storeRelease(ack, seq);
    }
  }
  if (threadIdx.x == 0) recvSeq[chunk] = seq;
}

__global__ void __launch_bounds__(kThreads, 2) dispatchKernel(GroupView g, HandleView h, DispatchCall c) {
  Ctx x{g, h, c, h.derived};
  __shared__ ChunkStage stage;
  if ((int)blockIdx.x < c.nSenders) {
    // Zero the EXPERT_MAJOR pad rows (and their weights) of this rank's output.
    if (h.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR) {
      const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
      for (int l = blockIdx.x; l < g.localExperts; l += c.nSenders) {
        const int lo = x.d[h.dl.zoneStart + l] + x.d[h.dl.expCount + l], hi = x.d[h.dl.zoneStart + l + 1];
        for (int row = lo + warp; row < hi; row += nWarps) {
          warpZero(lane, c.outTokens + (size_t)row * c.rowBytes, c.rowBytes);
          if (lane == 0 && c.outWeights) c.outWeights[row] = 0.f;
          if (c.outScales)
            for (int i = lane; i < c.nScales; i += 32) c.outScales[(size_t)row * c.nScales + i] = 0.f;
        }
      }
    }
    for (int chunk = blockIdx.x; chunk < g.nChunks; chunk += c.nSenders) sendChunk(x, &stage, chunk);
  } else {
    const int j = blockIdx.x - c.nSenders;
    for (int chunk = j; chunk < g.nChunks; chunk += c.nReceivers) receiveChunk(x, &stage, chunk);
  }
}

}  // namespace

ncclResult_t launchDispatch(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream) {
  return ncclext::launchKernel("ht dispatchKernel", dispatchKernel, dim3(c.nSenders + c.nReceivers), dim3(kThreads), 0,
                               stream, g, h, c);
}

}  // namespace ncclep
