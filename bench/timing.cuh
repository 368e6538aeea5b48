// The benchmarks' timing: medians of CUDA-event intervals, one call each (bench/*.cu).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <vector>

namespace ncclext {
namespace bench {

// The median of `v` (0 for none): the upper middle of an even count.
inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median microseconds of `fn` (which enqueues one call on `stream` and returns true when it was enqueued), each
// call between its own pair of events, after `warm` untimed calls. A call that fails sets *failed.
template <typename F>
double timeCalls(cudaStream_t stream, int warm, int iters, F fn, bool* failed) {
  std::vector<cudaEvent_t> ev(2 * iters);
  for (cudaEvent_t& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < warm; i++) *failed |= !fn();
  for (int i = 0; i < iters; i++) {
    cudaEventRecord(ev[2 * i], stream);
    *failed |= !fn();
    cudaEventRecord(ev[2 * i + 1], stream);
  }
  *failed |= cudaStreamSynchronize(stream) != cudaSuccess;
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; i++) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  return median(ms) * 1e3;
}

// The rail baseline of the benchmarks across NVLink domains: one NCCL group moving `bytes` to and from every rank of
// `remote` on `comm` (from send + i * stride, into recv + i * stride for the i-th), what an exchange moves without
// its calls. True when enqueued.
inline bool railSendRecv(ncclComm_t comm, const std::vector<int>& remote, void* send, void* recv, size_t stride,
                         size_t bytes, cudaStream_t stream) {
  bool ok = ncclGroupStart() == ncclSuccess;
  for (size_t i = 0; i < remote.size(); i++) {
    ok = ok && ncclSend(static_cast<char*>(send) + i * stride, bytes, ncclUint8, remote[i], comm, stream) == ncclSuccess;
    ok = ok && ncclRecv(static_cast<char*>(recv) + i * stride, bytes, ncclUint8, remote[i], comm, stream) == ncclSuccess;
  }
  return ncclGroupEnd() == ncclSuccess && ok;
}

}  // namespace bench
}  // namespace ncclext
