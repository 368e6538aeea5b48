// The one-GPU test mode of a rank's thread for nccl_ep (nccl_ep_testing.h): set once at the start of the rank's body
// (setEpTesting), it makes every group the thread creates through createEpGroup a group of that mode, wherever in the
// test the group is made. Real ranks: nothing set, the same as ncclEpCreateGroup.
#pragma once

#include <cstdio>

#include "nccl_ep/include/nccl_ep_testing.h"
#include "tests/harness/launcher.h"

namespace ncclext {
namespace harness {

inline thread_local ncclEpTestingConfig_t tEpTesting = NCCL_EP_TESTING_CONFIG_INIT;

// `virt` NULL: real ranks (or one-GPU nodes); else this thread is virtual rank `rank` of it; `rail`: the mixed mode's
// rail of the thread's index (NULL otherwise).
inline void setEpTesting(ncclEpVirtualDomain_t virt, int rank, ncclComm_t rail) {
  tEpTesting = NCCL_EP_TESTING_CONFIG_INIT;
  tEpTesting.virtual_domain = virt;
  tEpTesting.virtual_rank = virt ? rank : 0;
  tEpTesting.virtual_rail = rail;
}

inline ncclResult_t createEpGroup(ncclEpGroup_t* group, ncclComm_t comm, const ncclEpGroupConfig_t* config) {
  return ncclEpCreateGroupTesting(group, comm, config, &tEpTesting);
}

// The library's in-process domain of a virtual or mixed run, made before the launcher forks the processes that run its
// ranks (mixed: each node's process gets its copy, a domain of lo.domainSize ranks; virtual: every rank, 2 when the
// count is left to the launcher). *virt stays NULL in the other modes. False, with the library's error printed, when
// the domain cannot be made.
inline bool makeVirtualDomain(const LaunchOptions& lo, ncclEpVirtualDomain_t* virt) {
  *virt = nullptr;
  const bool mixed = lo.oneGpu == OneGpu::kMixed;
  if (lo.oneGpu != OneGpu::kVirtual && !mixed) return true;
  const int n = mixed ? lo.domainSize : lo.nRanks > 0 ? lo.nRanks : 2;
  if (ncclEpVirtualDomainCreate(virt, n) == ncclSuccess) return true;
  fprintf(stderr, "ncclEpVirtualDomainCreate: %s\n", ncclEpGetLastError());
  return false;
}

}  // namespace harness
}  // namespace ncclext
