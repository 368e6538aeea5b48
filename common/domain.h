// The communicators a library works on. From the caller's communicator (which may span many nodes) a Domain
// derives, collectively and once:
//   - the domain communicator: the ranks of my NVLink domain (NCCL's LSA team, or blocks of k ranks of it when
//     NCCL_EXT_LSA_DOMAIN_SIZE or a config field says k). Device communicators, symmetric windows and LSA kernels
//     live only here: on NCCL 2.28 a device communicator on a multi-node communicator fails ("GIN not supported").
//   - the rail communicator: the ranks with my index in every domain (NULL when there is one domain): whatever
//     crosses domains goes through NCCL point-to-point on it, which works on every NCCL network.
// In the virtual-rank mode (common/virtual_domain.h) the caller's communicator is this thread's single-rank one;
// the domain is the process's virtual ranks, and its host collectives meet in the process. With a rail given as
// well (DomainOptions::rail: the test harness's mixed mode, one-GPU nodes each of virtual ranks) the process is one
// domain of several: world rank = rail rank x domain size + virtual rank, and the rail is the given communicator.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "common/topology.h"
#include "common/virtual_domain.h"

namespace ncclext {

struct DomainOptions {
  int domainSize = 0;               // 0: NCCL's LSA team (or NCCL_EXT_LSA_DOMAIN_SIZE); k: blocks of k ranks of it
  VirtualDomain* virt = nullptr;    // the virtual-rank mode
  int virtualRank = 0;
  ncclComm_t rail = nullptr;        // with virt: the virtual ranks of my index on every domain (borrowed)
  double timeoutSeconds = 100;      // host collectives and barriers
};

class Domain {
 public:
  // COLLECTIVE over `comm` (every rank; virtual ranks: every virtual rank's thread). Every rank learns the same
  // topology or gets the same error: the LSA teams are all-gathered and checked before any split.
  static ncclResult_t create(ncclComm_t comm, const DomainOptions& opts, std::unique_ptr<Domain>* out);
  // Local: destroys the derived communicators (finalised, or aborted once a host collective failed).
  ~Domain();
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;

  const Topology& topo() const { return topo_; }
  bool isVirtual() const { return virt_ != nullptr; }
  ncclComm_t world() const { return world_; }          // the caller's (borrowed)
  ncclComm_t domainComm() const { return domain_; }    // windows and device communicators live here
  ncclComm_t railComm() const { return rail_; }        // NULL with one domain (and in the virtual mode, unless given)
  double timeoutSeconds() const { return timeoutSeconds_; }

  // Host collectives over the domain's ranks, bounded by the timeout. COLLECTIVE over the domain.
  ncclResult_t allGather(const void* mine, size_t bytes, void* all);
  ncclResult_t barrier();
  // A peer is gone (a host collective failed): aborts the derived communicators now, which also stops any NCCL
  // kernel of theirs still waiting for the peer. Windows registered on them must then be abandoned, not deregistered
  // (SymmetricMemory::abandon) when this returns true; the virtual mode's communicator is the caller's and is never
  // aborted here (false). Local.
  bool abort();
  bool broken() const { return broken_; }

 private:
  Domain() = default;
  Topology topo_{};
  ncclComm_t world_ = nullptr, domain_ = nullptr, rail_ = nullptr;
  bool ownDomain_ = false, ownRail_ = false;
  VirtualDomain* virt_ = nullptr;
  double timeoutSeconds_ = 100;
  bool broken_ = false;
  cudaStream_t stream_ = nullptr;  // host collectives of real ranks
};

// All-gathers `bytes` per rank over `comm` through device memory on `stream`, waiting at most `timeoutSeconds`.
// COLLECTIVE over `comm`.
ncclResult_t ncclAllGatherHost(ncclComm_t comm, cudaStream_t stream, const void* mine, size_t bytes, void* all,
                               double timeoutSeconds);

}  // namespace ncclext
