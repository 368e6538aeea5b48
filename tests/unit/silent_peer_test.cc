// The EP timeout tests' verdict (tests/harness/silent_peer.h): which message, for which shape of group, within which
// bound, counts as the right failure when the last rank stays silent.
#include <string>

#include <gtest/gtest.h>

#include "tests/harness/silent_peer.h"

namespace ncclext {
namespace harness {
namespace {

const std::string kRail = "ncclEp: across NVLink domains: a rail exchange timed out (not finished within 2.0 s)";
std::string waitFor(int peer) {
  return "ncclEp: timed out after 2.000 s: rank 0 waited for peer " + std::to_string(peer) + " at header of source";
}

TEST(SilentPeerVerdict, OneDomainWantsTheSilentRankNamedWithinTheBudget) {
  const GroupShape g{1, 4, false};  // 4 virtual ranks, or 4 real ones of one node
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(3), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(1), 2.0, 2.0));   // another rank
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(31), 2.0, 2.0));  // "peer 3" is not "peer 31"
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, kRail, 2.0, 2.0));        // no rail in one domain
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(3), 1.5, 2.0));   // gave up too soon
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(3), 12.5, 2.0));  // too late
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclSystemError, waitFor(3), 2.0, 2.0));   // the wrong code
}

TEST(SilentPeerVerdict, DomainsOfOneRankWantTheRailsAbortWithinTwoBudgets) {
  const GroupShape g{2, 1, false};  // 2 one-GPU nodes, or 2 GPUs with NCCL_EXT_LSA_DOMAIN_SIZE=1
  EXPECT_TRUE(silentPeerVerdict(2, g, 1, ncclRemoteError, kRail, 4.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(2, g, 1, ncclRemoteError, waitFor(1), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(2, g, 1, ncclRemoteError, kRail, 14.5, 2.0));
}

TEST(SilentPeerVerdict, RelayedDomainsAcceptEitherAndTheSourcesTheSilentRankRelays) {
  const GroupShape g{2, 2, true};  // 4 ranks, domains {0, 1} and {2, 3}: the mixed mode, or the hierarchical HT
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, kRail, 4.0, 2.0));
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(3), 2.0, 2.0));
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(1), 4.0, 2.0));   // index 1: relayed by rank 3
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(2), 2.0, 2.0));  // index 0: not the silent one's
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(0), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, kRail, 14.5, 2.0));
}

TEST(SilentPeerVerdict, FlatDomainsOfSeveralRanksNameTheSilentRankOnly) {
  const GroupShape g{2, 2, false};  // 4 real GPUs with NCCL_EXT_LSA_DOMAIN_SIZE=2, the flat exchange
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, kRail, 4.0, 2.0));
  EXPECT_TRUE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(3), 2.0, 2.0));   // its domain peer, over LSA
  EXPECT_FALSE(silentPeerVerdict(4, g, 3, ncclRemoteError, waitFor(1), 2.0, 2.0));  // nobody relays there
}

}  // namespace
}  // namespace harness
}  // namespace ncclext
