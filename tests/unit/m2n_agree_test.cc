// nccl_m2n/src/agree.h: the digests ranks compare at plan creation, and the message that names the first tensor
// they disagree on.
#include <gtest/gtest.h>

#include "nccl_m2n/src/agree.h"

namespace ncclm2n {
namespace {

std::vector<uint64_t> hashes(int n, uint64_t seed) {
  std::vector<uint64_t> h(n);
  for (int i = 0; i < n; i++) h[i] = seed * 1000003 + (uint64_t)i * 7919;
  return h;
}

// What every rank computes from the two rounds (the all-gathers simulated by the vectors).
std::string verdict(const std::vector<std::vector<uint64_t>>& perRank, const std::vector<std::string>& names) {
  std::vector<Digest> d;
  for (const auto& h : perRank) d.push_back(digestOf(h));
  const Agreement a = compareDigests(d);
  if (a.agree) return "";
  if (!a.message.empty()) return a.message;
  int64_t lo, hi;
  digestGroup((int64_t)perRank[0].size(), a.group, &lo, &hi);
  std::vector<std::vector<uint64_t>> group;
  for (const auto& h : perRank) group.emplace_back(h.begin() + lo, h.begin() + hi);
  return firstDifference(group, lo, names);
}

TEST(M2nAgree, IdenticalBatchesAgree) {
  for (int n : {0, 1, 3, 64, 65, 5000}) EXPECT_EQ(verdict({hashes(n, 1), hashes(n, 1), hashes(n, 1)}, {}), "") << n;
}

TEST(M2nAgree, DifferentCountsAreNamed) {
  EXPECT_EQ(verdict({hashes(10, 1), hashes(10, 1), hashes(9, 1)}, {}), "rank 2 passes 9 tensors, rank 0 10");
}

TEST(M2nAgree, TheFirstDifferingTensorIsNamedWhereverItIs) {
  std::vector<std::string> names;
  for (int i = 0; i < 5000; i++) names.push_back("layer" + std::to_string(i));
  for (int bad : {0, 77, 78, 4999}) {
    std::vector<std::vector<uint64_t>> ranks(4, hashes(5000, 1));
    ranks[3][bad] ^= 1;
    ranks[2][4999] ^= 1;  // a later difference too: the first one is named
    const std::string v = verdict(ranks, names);
    const int first = std::min(bad, 4999);
    const int who = bad < 4999 ? 3 : 2;
    EXPECT_EQ(v, "rank " + std::to_string(who) + " describes tensor " + std::to_string(first) + " (layer" +
                     std::to_string(first) + ") differently from rank 0 (name, shape, dtype, meshes, placements, "
                     "boxes or strides)")
        << bad;
  }
}

TEST(M2nAgree, GroupsCoverTheBatchOnce) {
  for (int64_t n : {0, 1, 63, 64, 65, 1000, 46182}) {
    int64_t covered = 0, prevHi = 0;
    for (int g = 0; g < kDigestGroups; g++) {
      int64_t lo, hi;
      digestGroup(n, g, &lo, &hi);
      ASSERT_EQ(lo, prevHi);
      covered += hi - lo;
      prevHi = hi;
    }
    EXPECT_EQ(covered, n);
  }
}

// The exchange communicator's vote: reuse only when every rank names the same live one; otherwise every rank
// numbers the new split alike, past the largest count, so that the next vote can agree.
TEST(M2nAgree, ExchangeVotesReuseOnlyWhatEveryRankHolds) {
  auto decide = [](std::vector<ExchangeVote> v) { return decideExchange(v); };
  EXPECT_FALSE(decide({}).reuse);
  ExchangeDecision d = decide({{0, 0}, {0, 0}});  // the first plan: a split, generation 1
  EXPECT_FALSE(d.reuse);
  EXPECT_EQ(d.generation, 1u);
  d = decide({{1, 1}, {1, 1}, {1, 1}});  // all hold generation 1
  EXPECT_TRUE(d.reuse);
  EXPECT_EQ(d.generation, 1u);
  d = decide({{1, 1}, {0, 1}});  // one rank let it go
  EXPECT_FALSE(d.reuse);
  EXPECT_EQ(d.generation, 2u);
  d = decide({{3, 3}, {2, 3}});  // they hold different ones
  EXPECT_FALSE(d.reuse);
  EXPECT_EQ(d.generation, 4u);
  d = decide({{0, 7}, {0, 2}, {0, 5}});  // counts that drifted apart: numbered past the largest
  EXPECT_FALSE(d.reuse);
  EXPECT_EQ(d.generation, 8u);
  // A generation every rank then records as its count: the next vote agrees.
  d = decide({{8, 8}, {8, 8}, {8, 8}});
  EXPECT_TRUE(d.reuse);
  EXPECT_EQ(d.generation, 8u);
}

}  // namespace
}  // namespace ncclm2n
