// The one kernel-launch helper: every launch goes through it and a failure comes back as an ncclResult_t with the
// kernel's name and shape in the message. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/checks.h"

namespace ncclext {

// How a grid is launched. Cooperative: all its CTAs are resident at once or it does not start (CUDA refuses a grid
// that cannot be; capturable: the attribute is valid for graph kernel nodes), for kernels whose CTAs wait on one
// another and whose grid may take every SM.
enum class Launch { kPlain, kCooperative };

template <typename... KernelArgs, typename... Args>
ncclResult_t launchKernel(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smemBytes,
                          Launch how, cudaStream_t stream, Args&&... args) {
  if (smemBytes > 48 * 1024) {
    NCCLEXT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemBytes));
  }
  cudaLaunchAttribute cooperative = {};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smemBytes;
  cfg.stream = stream;
  if (how == Launch::kCooperative) {
    cfg.attrs = &cooperative;
    cfg.numAttrs = 1;
  }
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) {
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%slaunch of %s (grid %u, block %u, smem %zu) failed: %s",
                how == Launch::kCooperative ? "cooperative " : "", name, grid.x, block.x, smemBytes,
                cudaGetErrorString(e));
  }
  return ncclSuccess;
}

template <typename... KernelArgs, typename... Args>
ncclResult_t launchKernel(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smemBytes,
                          cudaStream_t stream, Args&&... args) {
  return launchKernel(name, kernel, grid, block, smemBytes, Launch::kPlain, stream, std::forward<Args>(args)...);
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
