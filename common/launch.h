// The one kernel-launch helper: every launch goes through it and a failure comes back as an ncclResult_t with the
// kernel's name and shape in the message. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/checks.h"

namespace ncclext {

template <typename... KernelArgs, typename... Args>
ncclResult_t launchKernel(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smemBytes,
                          cudaStream_t stream, Args&&... args) {
  if (smemBytes > 48 * 1024) {
    NCCLEXT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemBytes));
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smemBytes;
  cfg.stream = stream;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) {
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "launch of %s (grid %u, block %u, smem %zu) failed: %s",
                name, grid.x, block.x, smemBytes, cudaGetErrorString(e));
  }
  return ncclSuccess;
}

// Loads kernels now (cudaFuncGetAttributes forces a lazily loaded function in), so that their first launch never
// waits for the context to go idle: under CUDA's lazy loading that wait can deadlock kernels that spin for each
// other, e.g. the ranks of one process (the one-GPU virtual mode). Called once per group or plan creation.
template <typename... Kernels>
ncclResult_t loadKernels(const char* what, Kernels... kernels) {
  cudaFuncAttributes attr;
  for (const void* k : {reinterpret_cast<const void*>(kernels)...}) {
    const cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e != cudaSuccess)
      return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "loading the %s kernels failed: %s", what,
                  cudaGetErrorString(e));
  }
  return ncclSuccess;
}

}  // namespace ncclext
