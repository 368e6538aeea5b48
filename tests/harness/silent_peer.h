// The verdict of nccl_ep's timeout tests (ep_ht_test, ep_ll_test) on a rank whose call waited for a silent peer.
#pragma once

#include <string>

#include "tests/harness/launcher.h"

namespace ncclext {
namespace harness {

// The last rank (`silentRank`) skipped a call; this rank's call came back with `res` and the group's last error
// `msg` after `waited` seconds, the group's budget being `budget`. Right when the group reported ncclRemoteError after
// at least the budget, for the reason the mode allows and within its bound:
//   one domain: a device wait timed out naming the silent rank (budget + 10 s);
//   one-GPU nodes (every rank a domain of its own): the rail exchange's abort (2 budgets + 10 s: the exchange waits
//     first, then the receive half);
//   mixed (relayed exchanges): either, where a wait may also name a source of another domain at the silent rank's
//     index, whose rows the silent rank relays (2 budgets + 10 s: a launch fence, then a device wait).
inline bool silentPeerVerdict(const RankContext& ctx, int silentRank, ncclResult_t res, const std::string& msg,
                              double waited, double budget) {
  const bool mixed = ctx.mode == OneGpu::kMixed;
  const bool nodes = ctx.mode == OneGpu::kNodes && ctx.nRanks > 1;
  const bool railAbort = msg.find("rail exchange timed out") != std::string::npos;
  const int domainSize = mixed && ctx.virt ? ctx.virt->size() : ctx.nRanks;
  bool named = false;
  for (int p = silentRank % domainSize; p < ctx.nRanks; p += domainSize)
    named |= (p == silentRank || mixed) && msg.find("peer " + std::to_string(p) + " ") != std::string::npos;
  const bool peerWait = named && msg.find("timed out") != std::string::npos;
  if (res != ncclRemoteError || waited < budget * 0.99) return false;
  if (mixed) return (railAbort || peerWait) && waited < 2 * budget + 10;
  if (nodes) return railAbort && waited < 2 * budget + 10;
  return peerWait && waited < budget + 10;
}

}  // namespace harness
}  // namespace ncclext
