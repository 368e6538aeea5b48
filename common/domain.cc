#include "common/domain.h"

#include <string>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/env.h"
#include "common/nccl_abi.h"

namespace ncclext {
namespace {

// What every rank learns about every other before anything is split: all ranks then reach the same verdict.
struct RankInfo {
  int32_t lsaSize, lsaRank, lsaStride, domainSize;
};

ncclResult_t splitComm(ncclComm_t comm, int color, int key, ncclComm_t* out) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  NCCLEXT_NCCL(ncclCommSplit(comm, color, key, out, &cfg));
  return ncclSuccess;
}

void destroyComm(ncclComm_t c, bool abort) {
  if (!c) return;
  if (abort) {
    NCCLEXT_WARN_ON(ncclCommAbort(c));
  } else {
    NCCLEXT_WARN_ON(ncclCommFinalize(c));
    NCCLEXT_WARN_ON(ncclCommDestroy(c));
  }
}

}  // namespace

ncclResult_t ncclAllGatherHost(ncclComm_t comm, cudaStream_t stream, const void* mine, size_t bytes, void* all,
                               double timeoutSeconds) {
  int nRanks = 0;
  NCCLEXT_NCCL(ncclCommCount(comm, &nRanks));
  char* d = nullptr;
  NCCLEXT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), bytes * (nRanks + 1), stream));
  ncclResult_t res = ncclSuccess;
  // The stream is idle here (every earlier all-gather on it finished, or its domain is broken and never comes back),
  // so the copy from pageable memory does not wait for anything.
  if (cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) {
    res = fail(ncclUnhandledCudaError, __FILE__, __LINE__, "host all-gather: copy to the device failed");
  } else if (ncclAllGather(d, d + bytes, bytes, ncclUint8, comm, stream) != ncclSuccess) {
    res = fail(ncclSystemError, __FILE__, __LINE__, "host all-gather: ncclAllGather failed: %s",
               ncclGetLastError(comm));
  }
  // A peer that never arrives leaves the all-gather running: the wait gives up after the budget, before any copy
  // to the host could block behind it.
  const ncclResult_t waited = waitStream(stream, timeoutSeconds, "host all-gather");
  if (res == ncclSuccess) res = waited;
  if (res == ncclSuccess)
    res = copyToHostAfter(stream, all, d + bytes, bytes * nRanks, timeoutSeconds, "host all-gather");
  if (waited == ncclSuccess) cudaFreeAsync(d, stream);  // else the kernel may still write it: leak it
  return res;
}

ncclResult_t Domain::create(ncclComm_t comm, const DomainOptions& opts, std::unique_ptr<Domain>* out) {
  NCCLEXT_ARG(comm != nullptr && out != nullptr, "domain: comm or out is NULL");
  std::unique_ptr<Domain> d(new Domain());
  d->world_ = comm;
  d->timeoutSeconds_ = opts.timeoutSeconds;
  const int domainSize = opts.domainSize > 0 ? opts.domainSize : env().lsaDomainSize;
  if (opts.virt) {
    int commRanks = 0;
    NCCLEXT_NCCL(ncclCommCount(comm, &commRanks));
    const int n = opts.virt->size();
    NCCLEXT_USAGE(commRanks == 1, "virtual ranks: each virtual rank passes its own single-rank communicator (got %d "
                  "ranks)", commRanks);
    NCCLEXT_ARG(opts.virtualRank >= 0 && opts.virtualRank < n, "virtual rank %d not in [0, %d)", opts.virtualRank, n);
    NCCLEXT_USAGE(domainSize == 0 || domainSize == n,
                  "virtual ranks form one NVLink domain of %d: an LSA domain size of %d needs the rail, which the "
                  "virtual mode has not (use one-GPU nodes for across-domain paths)",
                  n, domainSize);
    d->virt_ = opts.virt;
    d->domain_ = comm;
    int node = 0, nodes = 1;
    if (opts.rail) {  // one domain of several: the rail's ranks are the domains, in order
      NCCLEXT_NCCL(ncclCommUserRank(opts.rail, &node));
      NCCLEXT_NCCL(ncclCommCount(opts.rail, &nodes));
      NCCLEXT_CUDA(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking));
      std::vector<int> sizes(nodes);
      NCCLEXT_CHECK(ncclAllGatherHost(opts.rail, d->stream_, &n, sizeof(n), sizes.data(), opts.timeoutSeconds));
      for (int k = 0; k < nodes; k++)
        NCCLEXT_USAGE(sizes[k] == n, "virtual domains of different sizes over the rail (mine %d, domain %d's %d)", n,
                      k, sizes[k]);
      d->rail_ = nodes > 1 ? opts.rail : nullptr;
    }
    NCCLEXT_CHECK(makeTopology(node * n + opts.virtualRank, nodes * n, opts.virtualRank, n, 0, &d->topo_));
    NCCLEXT_CHECK(d->barrier());  // every virtual rank is here, with the same idea of the domain
    *out = std::move(d);
    return ncclSuccess;
  }

  int rank = 0, nRanks = 0;
  NCCLEXT_NCCL(ncclCommUserRank(comm, &rank));
  NCCLEXT_NCCL(ncclCommCount(comm, &nRanks));
  LsaTeam lsa;
  NCCLEXT_CHECK(lsaTeamOf(comm, &lsa));
  NCCLEXT_CUDA(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking));
  const RankInfo mine{lsa.nRanks, lsa.rank, lsa.stride, domainSize};
  std::vector<RankInfo> all(nRanks);
  NCCLEXT_CHECK(ncclAllGatherHost(comm, d->stream_, &mine, sizeof(mine), all.data(), opts.timeoutSeconds));
  // The same checks on every rank's view of every rank: a bad topology fails everywhere, before any split.
  for (int r = 0; r < nRanks; r++) {
    const RankInfo& i = all[r];
    NCCLEXT_USAGE(i.domainSize == all[0].domainSize,
                  "ranks disagree on the NVLink domain size (rank 0: %d, rank %d: %d): set NCCL_EXT_LSA_DOMAIN_SIZE "
                  "or the config field alike everywhere",
                  all[0].domainSize, r, i.domainSize);
    NCCLEXT_USAGE(i.lsaStride == 1 || i.lsaSize == 1,
                  "rank %d: its NVLink (LSA) team is not a block of consecutive ranks (stride %d); order the ranks "
                  "node by node",
                  r, i.lsaStride);
    NCCLEXT_USAGE(i.lsaSize == all[0].lsaSize, "NVLink (LSA) teams of different sizes (rank 0: %d, rank %d: %d)",
                  all[0].lsaSize, r, i.lsaSize);
    Topology t;
    NCCLEXT_CHECK(makeTopology(r, nRanks, i.lsaRank, i.lsaSize, i.domainSize, &t));
  }
  NCCLEXT_CHECK(makeTopology(rank, nRanks, lsa.rank, lsa.nRanks, domainSize, &d->topo_));
  const Topology& t = d->topo_;
  NCCLEXT_CHECK(splitComm(comm, t.domainIndex, t.domainRank, &d->domain_));
  d->ownDomain_ = true;
  if (t.nDomains > 1) NCCLEXT_CHECK(splitComm(comm, t.domainRank, t.domainIndex, &d->rail_));
  d->ownRail_ = d->rail_ != nullptr;
  int got = 0;
  NCCLEXT_NCCL(ncclCommCount(d->domain_, &got));
  NCCLEXT_USAGE(got == t.domainSize, "the domain communicator has %d ranks, expected %d", got, t.domainSize);
  NCCLEXT_INFO("domain: rank %d of %d, domain %d of %d (rank %d of %d), LSA team %d", rank, nRanks, t.domainIndex,
               t.nDomains, t.domainRank, t.domainSize, t.lsaSize);
  *out = std::move(d);
  return ncclSuccess;
}

Domain::~Domain() {
  if (ownRail_) destroyComm(rail_, broken_);
  if (ownDomain_) destroyComm(domain_, broken_);
  // A stream whose all-gather never finished cannot be destroyed without waiting for it; an aborted communicator's
  // kernels end, but leave the stream to the process's exit rather than risk the wait.
  if (stream_ && !broken_) NCCLEXT_WARN_ON(cudaStreamDestroy(stream_));
}

bool Domain::abort() {
  broken_ = true;
  if (ownRail_) destroyComm(rail_, true);  // a borrowed one (DomainOptions::rail) is its owner's to abort
  rail_ = nullptr;
  ownRail_ = false;
  if (!ownDomain_) return false;
  destroyComm(domain_, true);
  domain_ = nullptr;
  ownDomain_ = false;
  return true;
}

ncclResult_t Domain::allGather(const void* mine, size_t bytes, void* all) {
  // After a failed collective the communicators may still run it (a peer is gone): nothing more is queued behind it.
  if (broken_)
    return fail(ncclRemoteError, __FILE__, __LINE__,
                "domain: an earlier host collective of this domain failed (a peer is gone or disagreed); its "
                "communicators are unusable: destroy and recreate");
  // Virtual ranks wait longer than a real rank's waitStream: a peer may first sit out a launch fence (nccl_ep's
  // relay mode) and then a device wait, each of the budget, before it arrives (a group destroyed after a timeout).
  ncclResult_t res = virt_ ? virt_->allGather(topo_.domainRank, mine, bytes, all,
                                              2 * timeoutSeconds_ + kHostMarginSeconds)
                           : ncclAllGatherHost(domain_, stream_, mine, bytes, all, timeoutSeconds_);
  if (res != ncclSuccess) broken_ = true;
  return res;
}

ncclResult_t Domain::barrier() {
  int one = 1;
  std::vector<int> all(topo_.domainSize);
  return allGather(&one, sizeof(one), all.data());
}

}  // namespace ncclext
