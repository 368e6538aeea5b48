#include "common/symmetric_memory.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"

namespace ncclext {
namespace {

ncclDevCommRequirements makeRequirements(int lsaBarrierCount) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  ncclDevCommRequirements reqs;  // 2.28 has no initializer: zero means "none of it"
  memset(&reqs, 0, sizeof(reqs));
#endif
  reqs.lsaBarrierCount = lsaBarrierCount;
  reqs.lsaMultimem = false;  // NVLink multicast stays off, always (docs/ARCHITECTURE.md)
  // No GIN resource of any kind: on 2.28 asking for one switches GIN on, which fails on a node without a GIN NIC.
  return reqs;
}

// All-gathers one 64-bit value per rank through a small device buffer.
ncclResult_t allGatherU64(ncclComm_t comm, cudaStream_t stream, uint64_t mine, std::vector<uint64_t>* all) {
  int nRanks = 0;
  NCCLEXT_NCCL(ncclCommCount(comm, &nRanks));
  uint64_t* d = nullptr;
  NCCLEXT_CUDA(cudaMallocAsync(&d, sizeof(uint64_t) * (nRanks + 1), stream));
  ncclResult_t res = ncclSuccess;
  all->assign(nRanks, 0);
  if (cudaMemcpyAsync(d, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      ncclAllGather(d, d + 1, 1, ncclUint64, comm, stream) != ncclSuccess ||
      cudaMemcpyAsync(all->data(), d + 1, sizeof(uint64_t) * nRanks, cudaMemcpyDeviceToHost, stream) != cudaSuccess) {
    res = fail(ncclSystemError, __FILE__, __LINE__, "size agreement all-gather failed: %s", ncclGetLastError(comm));
  }
  cudaFreeAsync(d, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess && res == ncclSuccess) {
    res = fail(ncclUnhandledCudaError, __FILE__, __LINE__, "size agreement all-gather: stream failed");
  }
  return res;
}

}  // namespace

ncclResult_t SymmetricMemory::create(ncclComm_t comm, const SymmetricMemoryOptions& opts, cudaStream_t stream,
                                     std::unique_ptr<SymmetricMemory>* out) {
  NCCLEXT_ARG(comm != nullptr && out != nullptr, "symmetric memory: comm or out is NULL");
  NCCLEXT_ARG(opts.bytes > 0, "symmetric memory: size 0");
  NCCLEXT_ARG(opts.lsaBarrierCount >= 0, "symmetric memory: lsaBarrierCount %d < 0", opts.lsaBarrierCount);
  std::unique_ptr<SymmetricMemory> m(new SymmetricMemory());
  m->comm_ = comm;
  m->bytes_ = (opts.bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;

  // (1) Device communicator first (see the header).
  ncclDevCommRequirements reqs = makeRequirements(opts.lsaBarrierCount);
  ncclResult_t res = ncclDevCommCreate(comm, &reqs, &m->devComm_);
  if (res != ncclSuccess) {
    return fail(res, __FILE__, __LINE__,
                "ncclDevCommCreate failed: %s. The communicator needs symmetric-memory support (CUDA P2P between all "
                "local GPUs, cuMem, NCCL_WIN_ENABLE=1)",
                ncclGetLastError(comm));
  }
  m->haveDevComm_ = true;

  // (2) Same size everywhere.
  std::vector<uint64_t> sizes;
  NCCLEXT_CHECK(allGatherU64(comm, stream, m->bytes_, &sizes));
  for (size_t r = 0; r < sizes.size(); r++) {
    if (sizes[r] != m->bytes_) {
      std::string list;
      for (uint64_t s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
      return fail(ncclInvalidUsage, __FILE__, __LINE__,
                  "symmetric memory: ranks asked for different window sizes [%s]; every rank must pass the same size",
                  list.c_str());
    }
  }

  // (3) Allocate, zero (barrier flags start at 0), register.
  NCCLEXT_NCCL(ncclMemAlloc(&m->base_, m->bytes_));
  NCCLEXT_CUDA(cudaMemsetAsync(m->base_, 0, m->bytes_, stream));
  NCCLEXT_CUDA(cudaStreamSynchronize(stream));
  m->window_ = nullptr;  // 2.28 leaves it untouched when it skips registration
  NCCLEXT_NCCL(ncclCommWindowRegister(comm, m->base_, m->bytes_, &m->window_, opts.windowFlags));
  NCCLEXT_USAGE(m->window_ != nullptr, "ncclCommWindowRegister returned no window (symmetric memory unsupported?)");
  NCCLEXT_INFO("symmetric memory: %zu bytes, LSA rank %d of %d", m->bytes_, m->devComm_.lsaRank,
               m->devComm_.lsaSize);
  *out = std::move(m);
  return ncclSuccess;
}

SymmetricMemory::~SymmetricMemory() {
  if (window_) NCCLEXT_WARN_ON(ncclCommWindowDeregister(comm_, window_));
  if (base_) NCCLEXT_WARN_ON(ncclMemFree(base_));
  if (haveDevComm_) NCCLEXT_WARN_ON(ncclDevCommDestroy(comm_, &devComm_));
}

ncclResult_t hostBarrier(ncclComm_t comm, cudaStream_t stream, double timeoutSeconds) {
  int* d = nullptr;
  NCCLEXT_CUDA(cudaMallocAsync(&d, sizeof(int), stream));
  NCCLEXT_CUDA(cudaMemsetAsync(d, 0, sizeof(int), stream));
  NCCLEXT_NCCL(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm, stream));
  NCCLEXT_CUDA(cudaFreeAsync(d, stream));
  return waitStream(stream, timeoutSeconds, "host barrier");
}

}  // namespace ncclext
