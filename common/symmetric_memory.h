// RAII for NCCL symmetric memory: one device communicator and one window of the same size on every rank.
//
// create() is COLLECTIVE over the communicator (every rank, same order as its other collective setup calls, one
// host thread per rank). It
//   1. creates the device communicator first: on NCCL 2.28 that is the call that fails cleanly
//      (ncclInvalidUsage) on a communicator without symmetric-memory support, where window registration would
//      instead hand back a handle that crashes a kernel;
//   2. checks with an all-gather that every rank asked for the same size (2.28 maps each peer with the local size)
//      and fails on every rank with the list of sizes if not;
//   3. allocates with ncclMemAlloc (cuMem/VMM memory; cudaMalloc memory cannot be registered), zero-fills it, and
//      registers it as a window.
// The destructor is LOCAL: the caller must make sure no peer still reads or writes this rank's window (a host
// collective or a device barrier) before destroying it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <memory>

namespace ncclext {

struct SymmetricMemoryOptions {
  size_t bytes = 0;          // per rank; rounded up to 4096
  int lsaBarrierCount = 1;   // NCCL LSA barriers in the device communicator (ours use flags in the window instead)
  int windowFlags = NCCL_WIN_COLL_SYMMETRIC;
};

class SymmetricMemory {
 public:
  static ncclResult_t create(ncclComm_t comm, const SymmetricMemoryOptions& opts, cudaStream_t stream,
                             std::unique_ptr<SymmetricMemory>* out);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  const ncclDevComm& devComm() const { return devComm_; }
  ncclWindow_t window() const { return window_; }  // a device pointer: pass to kernels, never dereference here
  void* localPtr() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  SymmetricMemory() = default;
  ncclComm_t comm_ = nullptr;
  ncclDevComm devComm_{};
  bool haveDevComm_ = false;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t window_ = nullptr;
};

// Host barrier over the communicator with a watchdog (an all-reduce of one word on `stream`): the quiesce point
// before local teardown. COLLECTIVE.
ncclResult_t hostBarrier(ncclComm_t comm, cudaStream_t stream, double timeoutSeconds);

}  // namespace ncclext
