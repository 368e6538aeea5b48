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

}  // namespace ncclext
