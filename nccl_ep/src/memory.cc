#include "nccl_ep/src/memory.h"

#include "common/checks.h"

namespace ncclep {

ncclResult_t DeviceMemory::alloc(void** ptr, size_t bytes) {
  if (hook_.alloc_fn) {
    NCCLEXT_USAGE(hook_.alloc_fn(ptr, bytes, hook_.context) == 0 && *ptr != nullptr,
                  "the allocator hook failed for %zu bytes", bytes);
    return ncclSuccess;
  }
  NCCLEXT_CUDA(cudaMalloc(ptr, bytes));
  return ncclSuccess;
}

void DeviceMemory::freeNow(void* ptr) {
  if (!ptr) return;
  if (hook_.free_fn) {
    NCCLEXT_WARN_ON(hook_.free_fn(ptr, hook_.context));
  } else {
    NCCLEXT_WARN_ON(cudaFree(ptr));
  }
}

void DeviceMemory::free(void* ptr) {
  if (!ptr) return;
  if (retire_) {
    retiredDevice_.push_back(ptr);
  } else {
    freeNow(ptr);
  }
}

void DeviceMemory::freeHost(void* ptr) {
  if (!ptr) return;
  if (retire_) {
    retiredHost_.push_back(ptr);
  } else {
    NCCLEXT_WARN_ON(cudaFreeHost(ptr));
  }
}

void DeviceMemory::freeRetired() {
  for (void* p : retiredDevice_) freeNow(p);
  for (void* p : retiredHost_) NCCLEXT_WARN_ON(cudaFreeHost(p));
  retiredDevice_.clear();
  retiredHost_.clear();
}

}  // namespace ncclep
