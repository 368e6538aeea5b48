// RAII for NCCL symmetric memory: one device communicator and one window of the same size on every rank of an
// NVLink domain (common/domain.h).
//
// create() is COLLECTIVE over the domain (every rank, same order as its other collective setup calls, one host
// thread per rank). It
//   1. creates the device communicator first (through the loaded NCCL's table, common/nccl_abi.h): on NCCL 2.28
//      that is the call that fails cleanly (ncclInvalidUsage) on a communicator without symmetric-memory support,
//      where window registration would instead hand back a handle that crashes a kernel;
//   2. checks with an all-gather that every rank asked for the same size (2.28 maps each peer with the local size)
//      and fails on every rank with the list of sizes if not;
//   3. allocates with ncclMemAlloc (cuMem/VMM memory; cudaMalloc memory cannot be registered), zero-fills it, and
//      registers it as a window;
//   4. puts every domain rank's window base into a device table, through which kernels reach their peers
//      (dev::Peers, common/device/peers.h): NCCL's LSA addresses for real ranks, the all-gathered ncclMemAlloc
//      addresses for virtual ranks.
// The destructor is LOCAL: the caller must make sure no peer still reads or writes this rank's window (a host
// collective or a device barrier) before destroying it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "common/device/peers.h"
#include "common/domain.h"
#include "common/nccl_abi.h"

namespace ncclext {

struct SymmetricMemoryOptions {
  size_t bytes = 0;          // per rank; rounded up to 4096
  int lsaBarrierCount = 1;   // NCCL LSA barriers in the device communicator (ours use flags in the window instead)
  int windowFlags = NCCL_WIN_COLL_SYMMETRIC;
};

class SymmetricMemory {
 public:
  static ncclResult_t create(Domain& domain, const SymmetricMemoryOptions& opts, cudaStream_t stream,
                             std::unique_ptr<SymmetricMemory>* out);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  ncclWindow_t window() const { return window_; }
  // How kernels reach this domain's windows (the same kernel code for real and virtual ranks).
  dev::Peers peers() const { return dev::Peers{bases_, mine_, rank_}; }
  void* localPtr() const { return base_; }
  // The domain communicator was aborted (a peer is gone): the destructor then frees the memory without
  // deregistering the window or destroying the device communicator, which the abort already released and which
  // would otherwise wait for the dead peer.
  void abandon() { abandoned_ = true; }
  size_t bytes() const { return bytes_; }

 private:
  SymmetricMemory() = default;
  ncclComm_t comm_ = nullptr;
  const NcclAbi* abi_ = nullptr;  // the loaded NCCL's (common/nccl_abi.h)
  void* devComm_ = nullptr;       // abi_'s device communicator
  void* base_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t window_ = nullptr;
  char** bases_ = nullptr;  // device table of every domain rank's window base (dev::Peers)
  char* mine_ = nullptr;    // bases_[rank_]
  int rank_ = 0;                   // my rank in the domain
  bool abandoned_ = false;
};


}  // namespace ncclext
