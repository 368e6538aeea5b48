// The verdict of nccl_ep's timeout tests (ep_ht_test, ep_ll_test) on a rank whose call waited for a silent peer.
#pragma once

#include <nccl.h>

#include <string>

#include "nccl_ep/include/nccl_ep.h"

namespace ncclext {
namespace harness {

// The group as the verdict needs it: ncclEpGroupGetInfo's n_domains, domain_size and rail_relayed.
struct GroupShape {
  int nDomains = 1, domainSize = 1;
  bool relayed = false;
};

// The shape of `group` (n_domains 0 if ncclEpGroupGetInfo fails, which no verdict then accepts).
inline GroupShape groupShape(ncclEpGroup_t group) {
  ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
  if (ncclEpGroupGetInfo(group, &info) != ncclSuccess) return GroupShape{0, 0, false};
  return GroupShape{info.n_domains, info.domain_size, info.rail_relayed != 0};
}

// Rank `silentRank` skipped a call; this rank's call came back with `res` and the group's last error `msg` after
// `waited` seconds, the group's budget being `budget`. Right when the group reported ncclRemoteError after at least
// the budget, for the reason the group's shape allows and within its bound:
//   one domain: a device wait timed out naming the silent rank (budget + 10 s);
//   several domains of one rank (one-GPU nodes, real ranks with NCCL_EXT_LSA_DOMAIN_SIZE=1): the rail exchange's
//     abort (2 budgets + 10 s: the exchange waits first, then the receive half);
//   several domains of several ranks: either, a wait of a relayed group (the mixed test mode, the hierarchical HT)
//     also naming a source of another domain at the silent rank's index, whose rows the silent rank relays (2 budgets
//     + 10 s: a launch fence or the exchange, then a device wait).
inline bool silentPeerVerdict(int nRanks, const GroupShape& g, int silentRank, ncclResult_t res, const std::string& msg,
                              double waited, double budget) {
  const bool railAbort = msg.find("rail exchange timed out") != std::string::npos;
  const int step = g.relayed && g.domainSize > 0 ? g.domainSize : nRanks;
  bool named = false;
  for (int p = silentRank % step; p < nRanks; p += step)
    named |= msg.find("peer " + std::to_string(p) + " ") != std::string::npos;
  const bool peerWait = named && msg.find("timed out") != std::string::npos;
  if (res != ncclRemoteError || waited < budget * 0.99 || g.nDomains < 1) return false;
  if (g.nDomains == 1) return peerWait && waited < budget + 10;
  if (g.domainSize <= 1) return railAbort && waited < 2 * budget + 10;
  return (railAbort || peerWait) && waited < 2 * budget + 10;
}

}  // namespace harness
}  // namespace ncclext
