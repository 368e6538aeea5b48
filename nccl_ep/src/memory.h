// A group's device memory outside its window (handles' arrays, the group's state, the rail's staging): the caller's
// allocator hook (ncclEpGroupConfig_t::alloc) or cudaMalloc.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "nccl_ep/include/nccl_ep.h"

namespace ncclep {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  // `retire`: virtual ranks, which share the GPU: a cudaFree or cudaFreeHost waits for every kernel on it, peers'
  // kernels that wait for this rank's next call included, so free() and freeHost() keep the memory until the
  // group's teardown frees it between two barriers (freeRetired). Real ranks free at once.
  DeviceMemory(const ncclEpAllocConfig_t& hook, bool retire) : hook_(hook), retire_(retire) {}
  ncclResult_t alloc(void** ptr, size_t bytes);
  void free(void* ptr);
  void freeHost(void* ptr);  // pinned host memory (cudaHostAlloc)
  void freeNow(void* ptr);
  void freeRetired();

 private:
  ncclEpAllocConfig_t hook_{};
  bool retire_ = false;
  std::vector<void*> retiredDevice_, retiredHost_;
};

}  // namespace ncclep
