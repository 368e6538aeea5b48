// The EP host reference model on hand-checked and random cases.
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "tests/unit/ep_reference.h"

namespace ncclep {
namespace ref {
namespace {

// 2 ranks, 4 experts (2 each), top-2. Rank 0: t0 -> {0, 3}, t1 -> {1, -1}, t2 -> {2, 3}. Rank 1: t0 -> {3, 2},
// t1 -> {-1, -1}.
Routing handCase() {
  Routing r;
  r.nRanks = 2;
  r.numExperts = 4;
  r.topk = 2;
  r.numTokens = {3, 2};
  r.topkIdx = {{0, 3, 1, -1, 2, 3}, {3, 2, -1, -1}};
  return r;
}

TEST(EpReference, FlatIsBySourceThenToken) {
  auto recv = dispatchLayout(handCase(), 1);
  ASSERT_EQ(recv[0].flat.size(), 2u);
  EXPECT_EQ(recv[0].flat[0].token, 0);
  EXPECT_EQ(recv[0].flat[1].token, 1);
  ASSERT_EQ(recv[1].flat.size(), 3u);  // (0,0), (0,2), (1,0): one row per token, not per expert
  EXPECT_EQ(recv[1].flat[1].src, 0);
  EXPECT_EQ(recv[1].flat[1].token, 2);
  EXPECT_EQ(recv[1].flat[2].src, 1);
  EXPECT_EQ(recv[1].srcCounts, (std::vector<int>{2, 1}));
  EXPECT_EQ(recv[1].expertCounts, (std::vector<int>{2, 3}));
}

TEST(EpReference, ExpertMajorZonesAreAligned) {
  auto recv = dispatchLayout(handCase(), 4);
  EXPECT_EQ(recv[1].zoneStart, (std::vector<int>{0, 4}));
  ASSERT_EQ(recv[1].em.size(), 8u);
  EXPECT_EQ(recv[1].em[0].token, 2);  // expert 2: (0, t2, k0), (1, t0, k1)
  EXPECT_EQ(recv[1].em[1].src, 1);
  EXPECT_EQ(recv[1].em[1].k, 1);
  EXPECT_EQ(recv[1].em[2].src, -1);  // pads
  EXPECT_EQ(recv[1].em[4].token, 0);  // expert 3: (0, t0, k1), (0, t2, k1), (1, t0, k0), pad
  EXPECT_EQ(recv[1].em[6].src, 1);
  EXPECT_EQ(recv[1].em[7].src, -1);
}

TEST(EpReference, CombineSumsFlatAndWeightsExpertMajor) {
  Routing r = handCase();
  auto recv = dispatchLayout(r, 1);
  // FLAT: every received row carries (rank+1); token 0 of rank 0 went to both ranks: 1 + 2.
  std::vector<std::vector<std::vector<double>>> in(2);
  for (int d = 0; d < 2; d++) in[d].assign(recv[d].flat.size(), std::vector<double>(1, d + 1.0));
  auto out = combineFlat(r, recv, in, 1);
  EXPECT_DOUBLE_EQ(out[0][0][0], 3.0);
  EXPECT_DOUBLE_EQ(out[0][1][0], 1.0);
  EXPECT_DOUBLE_EQ(out[1][1][0], 0.0);  // routed nowhere
  // EM: rows carry 10; weights 0.25 / 0.75 -> each token gets 10 * (sum of its weights).
  std::vector<std::vector<std::vector<double>>> em(2);
  for (int d = 0; d < 2; d++) em[d].assign(recv[d].em.size(), std::vector<double>(1, 10.0));
  std::vector<std::vector<float>> w = {{0.25f, 0.75f, 0.5f, 0.f, 0.25f, 0.75f}, {0.25f, 0.75f, 0.f, 0.f}};
  auto outEm = combineExpertMajor(r, recv, em, w, 1);
  EXPECT_DOUBLE_EQ(outEm[0][0][0], 10.0);
  EXPECT_DOUBLE_EQ(outEm[0][1][0], 5.0);
  EXPECT_DOUBLE_EQ(outEm[1][0][0], 10.0);
}

// The receive cap on the hand case: rank 1's FLAT rows are (0, t0), (0, t2), (1, t0); a cap of 2 keeps the first
// two, so its own token t0 (experts 3 and 2, both here) is dropped: out of zones and counts, and out of combine.
TEST(EpReference, CapKeepsTheFirstFlatRows) {
  Routing r = handCase();
  auto recv = dispatchLayout(r, 1, 2);
  ASSERT_EQ(recv[1].flat.size(), 2u);
  EXPECT_EQ(recv[1].dropped, 1);
  EXPECT_EQ(recv[1].srcCounts, (std::vector<int>{2, 0}));
  EXPECT_EQ(recv[1].expertCounts, (std::vector<int>{1, 2}));
  EXPECT_EQ(recv[0].dropped, 0);  // two rows: none past the cap
  std::vector<std::vector<std::vector<double>>> in(2);
  for (int d = 0; d < 2; d++) in[d].assign(recv[d].flat.size(), std::vector<double>(1, d + 1.0));
  auto out = combineFlat(r, recv, in, 1);
  EXPECT_DOUBLE_EQ(out[0][0][0], 3.0);
  EXPECT_DOUBLE_EQ(out[1][0][0], 0.0);  // its only row was dropped
}

// What the kernels rely on (ht/route.cu, the retained counts): under a cap, each source's rows that an expert's
// zone keeps are the first of that source's rows in the uncapped zone, so that a row's (source, expert) index
// still places it.
TEST(EpReference, CapKeepsAPrefixOfEverySourcesRowsPerExpert) {
  std::mt19937 rng(11);
  for (int c = 0; c < 200; c++) {
    const Routing r = randomRouting(rng, 8, 39, 5);
    const int cap = 1 + rng() % 60;
    const auto open = dispatchLayout(r, 1), capped = dispatchLayout(r, 1, cap);
    const int L = r.localExperts();
    for (int d = 0; d < r.nRanks; d++) {
      EXPECT_EQ(capped[d].flat.size() + capped[d].dropped, open[d].flat.size());
      EXPECT_LE((int)capped[d].flat.size(), cap);
      for (int l = 0; l < L; l++) {
        auto rowsOf = [&](const RankRecv& rr, int s) {
          std::vector<int> tokens;
          for (int i = rr.zoneStart[l]; i < rr.zoneStart[l] + rr.expertCounts[l]; i++)
            if (rr.em[i].src == s) tokens.push_back(rr.em[i].token);
          return tokens;
        };
        for (int s = 0; s < r.nRanks; s++) {
          const std::vector<int> all = rowsOf(open[d], s), kept = rowsOf(capped[d], s);
          ASSERT_LE(kept.size(), all.size());
          EXPECT_TRUE(std::equal(kept.begin(), kept.end(), all.begin())) << "case " << c << " rank " << d;
        }
      }
    }
  }
}

TEST(EpReference, RandomRoutingsConserveRows) {
  std::mt19937 rng(5);
  for (int c = 0; c < 200; c++) {
    Routing r;
    r.nRanks = 1 + rng() % 8;
    r.numExperts = r.nRanks * (1 + rng() % 8);
    r.topk = 1 + rng() % std::min(8, r.numExperts);
    r.numTokens.resize(r.nRanks);
    r.topkIdx.resize(r.nRanks);
    int64_t pairs = 0;
    for (int s = 0; s < r.nRanks; s++) {
      r.numTokens[s] = rng() % 20;
      for (int t = 0; t < r.numTokens[s]; t++) {
        std::vector<int> experts(r.numExperts);
        for (int e = 0; e < r.numExperts; e++) experts[e] = e;
        std::shuffle(experts.begin(), experts.end(), rng);
        for (int k = 0; k < r.topk; k++) {
          const int e = rng() % 5 == 0 ? -1 : experts[k];
          r.topkIdx[s].push_back(e);
          pairs += e >= 0;
        }
      }
    }
    const int aligns[] = {1, 2, 4, 3, 24, 224};  // powers of two and not (DeepGEMM's M tile on sm_100: 224)
    const int align = aligns[rng() % 6];
    auto recv = dispatchLayout(r, align);
    int64_t emRows = 0;
    for (const RankRecv& rr : recv) {
      for (int n : rr.expertCounts) emRows += n;
      for (size_t e = 0; e < rr.zoneStart.size(); e++) EXPECT_EQ(rr.zoneStart[e] % align, 0);
    }
    EXPECT_EQ(emRows, pairs);
  }
}

}  // namespace
}  // namespace ref
}  // namespace ncclep
