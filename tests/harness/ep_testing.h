// The one-GPU test mode of a rank's thread for nccl_ep (nccl_ep_testing.h): set once at the start of the rank's body
// (setEpTesting), it makes every group the thread creates through createEpGroup a group of that mode, wherever in the
// test the group is made. Real ranks: nothing set, the same as ncclEpCreateGroup.
#pragma once

#include "nccl_ep/include/nccl_ep_testing.h"

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

}  // namespace harness
}  // namespace ncclext
