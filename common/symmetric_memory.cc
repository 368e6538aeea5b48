#include "common/symmetric_memory.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"

namespace ncclext {

ncclResult_t SymmetricMemory::create(Domain& domain, const SymmetricMemoryOptions& opts, cudaStream_t stream,
                                     std::unique_ptr<SymmetricMemory>* out) {
  NCCLEXT_ARG(out != nullptr, "symmetric memory: out is NULL");
  NCCLEXT_ARG(opts.bytes > 0, "symmetric memory: size 0");
  NCCLEXT_ARG(opts.lsaBarrierCount >= 0, "symmetric memory: lsaBarrierCount %d < 0", opts.lsaBarrierCount);
  ncclComm_t comm = domain.domainComm();
  const int nRanks = domain.topo().domainSize;
  std::unique_ptr<SymmetricMemory> m(new SymmetricMemory());
  m->comm_ = comm;
  m->rank_ = domain.topo().domainRank;
  m->bytes_ = (opts.bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;

  // (1) Device communicator first (see the header).
  NCCLEXT_CHECK(loadedNcclAbi(&m->abi_));
  int lsaSize = 0;
  NCCLEXT_CHECK(m->abi_->createDevComm(comm, opts.lsaBarrierCount, &m->devComm_, &lsaSize));
  const int wantLsa = domain.isVirtual() ? 1 : nRanks;
  NCCLEXT_USAGE(lsaSize == wantLsa,
                "symmetric memory: the domain communicator's LSA team has %d ranks, expected %d (every rank of an "
                "NVLink domain must reach every other by load/store)",
                lsaSize, wantLsa);

  // (2) Same size everywhere.
  std::vector<uint64_t> sizes(nRanks);
  const uint64_t mine = m->bytes_;
  NCCLEXT_CHECK(domain.allGather(&mine, sizeof(mine), sizes.data()));
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

  // (4) Every rank's window base, for dev::Peers.
  std::vector<char*> bases(nRanks);
  if (domain.isVirtual()) {
    char* myBase = static_cast<char*>(m->base_);
    NCCLEXT_CHECK(domain.allGather(&myBase, sizeof(myBase), bases.data()));
  } else {
    NCCLEXT_CHECK(m->abi_->lsaBases(m->window_, nRanks, bases.data()));
  }
  m->mine_ = bases[m->rank_];
  NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&m->bases_), sizeof(char*) * nRanks));
  NCCLEXT_CUDA(cudaMemcpyAsync(m->bases_, bases.data(), sizeof(char*) * nRanks, cudaMemcpyHostToDevice, stream));
  NCCLEXT_CUDA(cudaStreamSynchronize(stream));
  NCCLEXT_INFO("symmetric memory: %zu bytes, domain rank %d of %d%s", m->bytes_, m->rank_, nRanks,
               domain.isVirtual() ? " (virtual ranks)" : "");
  *out = std::move(m);
  return ncclSuccess;
}

SymmetricMemory::~SymmetricMemory() {
  if (bases_) NCCLEXT_WARN_ON(cudaFree(bases_));
  if (window_ && !abandoned_) NCCLEXT_WARN_ON(ncclCommWindowDeregister(comm_, window_));
  if (base_) NCCLEXT_WARN_ON(ncclMemFree(base_));
  if (devComm_) {
    if (abandoned_)
      abi_->destroyDevComm(nullptr, devComm_);  // frees our object only: NCCL's went with the aborted communicator
    else
      NCCLEXT_WARN_ON(abi_->destroyDevComm(comm_, devComm_));
  }
}

}  // namespace ncclext
