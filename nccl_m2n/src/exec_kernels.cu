#include "nccl_m2n/src/exec_kernels.h"

#include <algorithm>

#include "common/launch.h"

namespace ncclm2n {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxCtas = 1024;
constexpr int kPointersPerLaunch = 480;  // 480 x 8 bytes of parameters, under the classic 4 KB limit

struct PointerBatch {
  int64_t first;
  int count;
  const void* p[kPointersPerLaunch];
};

__global__ void setPointersKernel(const void** arr, PointerBatch b) {
  for (int i = threadIdx.x; i < b.count; i += blockDim.x) arr[b.first + i] = b.p[i];
}

// One CTA per segment at a time; the CTA's threads take its elements.
__global__ void copyKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                           char* const* dst) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const MoveSegment g = segs[s];
    const MoveDesc& d = descs[g.desc];
    for (int64_t i = threadIdx.x; i < g.elements; i += blockDim.x) copyLocalElement(d, g.firstElement + i, src, dst);
  }
}

__global__ void packKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                           char* stage) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const MoveSegment g = segs[s];
    for (int64_t i = threadIdx.x; i < g.elements; i += blockDim.x) packElement(descs, g, i, src, stage);
  }
}

__global__ void unpackKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* stage,
                             char* const* dst) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const MoveSegment g = segs[s];
    for (int64_t i = threadIdx.x; i < g.elements; i += blockDim.x) unpackElement(descs, g, i, stage, dst);
  }
}

unsigned gridFor(int64_t segments) { return (unsigned)std::max<int64_t>(1, std::min<int64_t>(segments, kMaxCtas)); }

}  // namespace

ncclResult_t launchSetPointers(const void** arr, const void* const* host, int64_t n, cudaStream_t stream) {
  for (int64_t first = 0; first < n; first += kPointersPerLaunch) {
    PointerBatch b;
    b.first = first;
    b.count = (int)std::min<int64_t>(kPointersPerLaunch, n - first);
    for (int i = 0; i < b.count; i++) b.p[i] = host ? host[first + i] : nullptr;
    NCCLEXT_CHECK(ncclext::launchKernel("m2n setPointers", setPointersKernel, dim3(1), dim3(128), 0, stream, arr, b));
  }
  return ncclSuccess;
}

ncclResult_t launchCopies(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                          char* const* dst, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n copy", copyKernel, dim3(gridFor(n)), dim3(kThreads), 0, stream, descs, segs, n,
                               src, dst);
}

ncclResult_t launchPack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                        char* stage, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n pack", packKernel, dim3(gridFor(n)), dim3(kThreads), 0, stream, descs, segs, n,
                               src, stage);
}

ncclResult_t launchUnpack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* stage,
                          char* const* dst, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n unpack", unpackKernel, dim3(gridFor(n)), dim3(kThreads), 0, stream, descs,
                               segs, n, stage, dst);
}

}  // namespace ncclm2n
