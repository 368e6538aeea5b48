// The benchmarks' timing: medians of CUDA-event intervals, one call each (bench/*.cu).
#pragma once

#include <cuda_runtime.h>

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

}  // namespace bench
}  // namespace ncclext
