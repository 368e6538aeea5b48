// High-Throughput (HT) mode inside one NVLink (LSA) domain: the structures host code and kernels share, and the
// launch entry points of the three kernel families (kernels/ht_route.cu, ht_dispatch_lsa.cu, ht_combine_lsa.cu).
//
// Tokens are cut into chunks of kChunkTokens in source order; chunk c of every source is the unit of signalling:
// a sender releases flag[c][src] in the receiver's window after writing chunk c's rows, the receiver acquires it,
// consumes the rows and releases ack[c][dst] in the sender's window so that the sender may overwrite the staging
// rows on the next call. Every call signals every chunk (empty ones too), so per-chunk sequence counters in device
// memory stay in lockstep across ranks, calls and CUDA graph replays.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>

#include "common/device_error.h"

namespace ncclep {

constexpr int kChunkTokens = 32;  // signalling unit: small enough that receivers overlap senders
constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTokens = 16384;
constexpr int kThreads = 512;

// Error-word sites of nccl_ep (common/device_error.h numbers the shared ones).
enum EpErrorSite : uint32_t { kSiteTopkIdx = ncclext::kSiteLibraryBase + 1 };

// Byte offsets in the group's symmetric window (identical on every rank).
struct WindowLayout {
  size_t barrierFlags;  // u64 [1][R]: the handle-exchange barrier
  size_t dispFlags;     // u64 [NC][R]: flag[c][src], written by src
  size_t dispAcks;      // u64 [NC][R]: ack[c][dst], written by dst
  size_t combFlags;
  size_t combAcks;
  size_t exchange;      // int32 [R][exchangeInts]: row s written by source s
  size_t dispRows;      // [R][maxTokens][rowStride]: region s written by source s
  size_t dispMeta;      // [R][maxTokens][metaBytes]
  size_t combRows;      // [R][maxTokens][rowStride]: region r written by expert rank r
  size_t total;
  int exchangeInts;     // R + E + NC + 1: counts per rank, counts per expert, chunk prefix towards the reader
};

// Per-row metadata sent with every dispatched row: K local expert ids (-1: not here), K weights, K indices of the
// (source, expert) pair among the source's tokens for that expert, then the fp8 scales.
struct MetaLayout {
  int maxTopk;
  int maxScales;
  size_t bytes;
  __host__ __device__ size_t expertOff() const { return 0; }
  __host__ __device__ size_t weightOff() const { return 4 * (size_t)maxTopk; }
  __host__ __device__ size_t emIdxOff() const { return 8 * (size_t)maxTopk; }
  __host__ __device__ size_t scaleOff() const { return 12 * (size_t)maxTopk; }
};

// Handle-derived int32 arrays, one device block; offsets in ints.
struct DerivedLayout {
  int srcCount, recvOffset, expCount, zoneStart, srcExpOff, chunkPrefix, totals, ints;
  // totals: [0] FLAT rows, [1] EXPERT_MAJOR rows (pads included)
};

struct GroupView {
  ncclWindow_t window;
  WindowLayout wl;
  MetaLayout meta;
  int rank, nRanks, numExperts, localExperts, maxTokens, nChunks, rowStride;
  uint64_t* seq;        // u64 [4][NC]: dispatch send, dispatch recv, combine send, combine recv
  uint64_t* barrierEpoch;
  ncclext::DeviceErrorWord* err;
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
  int* emPos;      // [maxFlatRows][maxTopk]: EXPERT_MAJOR row of each (received flat row, k); -1
  float* flatW;    // [maxFlatRows][maxTopk]: its weight
  int64_t* hostTotals;  // pinned mapped: [0] FLAT rows, [1] EM rows (EXACT sizing)
};

struct LayoutInfoOut {
  int* expertCounters;
  int* srcRankCounters;
  int* expertOffsets;
  int* recvTotal;
};

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
};

struct CombineCall {
  const char* in;
  char* out;
  int rowBytes;
  int dtype;  // ncclDataType_t
  int nSenders, nReceivers;
};

// Host entry points (one per kernel family); each enqueues on `stream` and returns an error code.
ncclResult_t launchRoute(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, cudaStream_t stream);
ncclResult_t launchDispatch(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream);
ncclResult_t launchCombine(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);

}  // namespace ncclep
