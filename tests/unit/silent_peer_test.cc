// The EP timeout tests' verdict (tests/harness/silent_peer.h): which message, in which one-GPU mode, within which
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
  RankContext ctx;
  ctx.nRanks = 4;
  ctx.mode = OneGpu::kVirtual;
  EXPECT_TRUE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(3), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(1), 2.0, 2.0));  // another rank
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(31), 2.0, 2.0));  // "peer 3" is not "peer 31"
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, kRail, 2.0, 2.0));       // no rail in one domain
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(3), 1.5, 2.0));  // gave up too soon
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(3), 12.5, 2.0)); // too late
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclSystemError, waitFor(3), 2.0, 2.0));  // the wrong code
}

TEST(SilentPeerVerdict, OneGpuNodesWantTheRailsAbortWithinTwoBudgets) {
  RankContext ctx;
  ctx.nRanks = 2;
  ctx.mode = OneGpu::kNodes;
  EXPECT_TRUE(silentPeerVerdict(ctx, 1, ncclRemoteError, kRail, 4.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(ctx, 1, ncclRemoteError, waitFor(1), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(ctx, 1, ncclRemoteError, kRail, 14.5, 2.0));
}

TEST(SilentPeerVerdict, MixedAcceptsEitherAndTheSourcesTheSilentRankRelays) {
  VirtualDomain domain(2);  // one-GPU nodes of 2 virtual ranks: 4 ranks, domains {0, 1} and {2, 3}
  RankContext ctx;
  ctx.nRanks = 4;
  ctx.mode = OneGpu::kMixed;
  ctx.virt = &domain;
  EXPECT_TRUE(silentPeerVerdict(ctx, 3, ncclRemoteError, kRail, 4.0, 2.0));
  EXPECT_TRUE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(3), 2.0, 2.0));
  EXPECT_TRUE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(1), 4.0, 2.0));   // index 1: relayed by rank 3
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(2), 2.0, 2.0));  // index 0: not the silent one's
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, waitFor(0), 2.0, 2.0));
  EXPECT_FALSE(silentPeerVerdict(ctx, 3, ncclRemoteError, kRail, 14.5, 2.0));
}

}  // namespace
}  // namespace harness
}  // namespace ncclext
