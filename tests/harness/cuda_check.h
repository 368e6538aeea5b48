// A test's own CUDA calls: a failed one is counted in the calling thread's tCudaErrors (the virtual ranks are threads
// of one process; any error fails the rank) and, the first five, printed.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace ncclext {
namespace harness {

inline thread_local int tCudaErrors = 0;

inline bool cudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  if (tCudaErrors++ < 5) fprintf(stderr, "CUDA error in the test: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace harness
}  // namespace ncclext
