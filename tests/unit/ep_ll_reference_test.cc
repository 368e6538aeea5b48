// The Low-Latency reference model (ep_ll_reference.h) against what it must satisfy whatever the kernels do:
// every delivered (token, expert) once, in the stated order, within the fixed capacities; masks; combine sums that
// an independent double computation gives exactly (small integers and dyadic weights, so that every rounding is
// exact); and the fp8 quantiser's bounds.
#include "tests/unit/ep_ll_reference.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "common/numeric.h"

namespace ncclep {
namespace llref {
namespace {

struct Draw {
  std::mt19937_64 rng;
  explicit Draw(uint64_t seed) : rng(seed) {}
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng); }
};

// Random routings: 1-8 ranks, up to 64 tokens a rank (0 and 1 included), -1 slots, skew (a hot expert), masks.
Routing routing(Draw& g, bool masks) {
  Routing r;
  r.nRanks = g.uniform(1, 8);
  r.numExperts = r.nRanks * g.uniform(1, 6);
  r.topk = g.uniform(1, std::min(8, r.numExperts));
  r.maxTokens = g.uniform(1, 64);
  const bool hot = g.chance(0.2);
  for (int s = 0; s < r.nRanks; s++) {
    const int T = g.chance(0.15) ? g.uniform(0, 1) : g.uniform(0, r.maxTokens);
    r.numTokens.push_back(T);
    std::vector<int> idx((size_t)T * r.topk, -1);
    std::vector<float> w((size_t)T * r.topk, 0.0f);
    for (int t = 0; t < T; t++) {
      std::vector<int> experts(r.numExperts);
      for (int e = 0; e < r.numExperts; e++) experts[e] = e;
      std::shuffle(experts.begin(), experts.end(), g.rng);
      if (hot) std::swap(*std::find(experts.begin(), experts.end(), 0), experts[0]);  // everyone names expert 0
      for (int k = 0; k < r.topk; k++) {
        idx[(size_t)t * r.topk + k] = g.chance(0.1) ? -1 : experts[k];
        w[(size_t)t * r.topk + k] = g.chance(0.5) ? 1.0f : 0.5f;  // see CombineSumsWhatEachPathPromises
      }
    }
    r.topkIdx.push_back(idx);
    r.weights.push_back(w);
  }
  if (masks && r.nRanks > 1) {
    r.active.assign(r.nRanks, 1);
    r.active[g.uniform(0, r.nRanks - 1)] = 0;
  }
  return r;
}

TEST(EpLlReference, EveryDeliveredPairOnceInOrderAndWithinCapacity) {
  Draw g(7);
  int64_t pairs = 0, masked = 0;
  for (int c = 0; c < 400; c++) {
    const Routing r = routing(g, c % 3 == 0);
    const std::vector<RankRecv> recv = dispatch(r);
    const std::vector<std::vector<int>> missing = missingExperts(r);
    const int R = r.nRanks, L = r.localExperts(), K = r.topk;
    std::vector<std::vector<int>> seen(R);
    for (int s = 0; s < R; s++) seen[s].assign((size_t)r.numTokens[s] * K, 0);
    for (int d = 0; d < R; d++) {
      const RankRecv& rr = recv[d];
      for (int s = 0; s < R; s++) {
        ASSERT_LE(rr.rankCount[s], r.maxTokens);
        for (int j = 1; j < rr.rankCount[s]; j++) ASSERT_LT(rr.slots[s][j - 1].srcToken, rr.slots[s][j].srcToken);
        for (const RankMajorSlot& slot : rr.slots[s]) {
          bool any = false;
          for (int k = 0; k < K; k++) {
            const int e = r.topkIdx[s][(size_t)slot.srcToken * K + k];
            const bool here = r.delivered(s, e) && r.owner(e) == d;
            ASSERT_EQ(slot.localIds[k], here ? e - d * L : -1);
            ASSERT_EQ(slot.weights[k], here ? r.weights[s][(size_t)slot.srcToken * K + k] : 0.0f);
            any = any || here;
          }
          ASSERT_TRUE(any) << "a slot with no local expert";
        }
      }
      for (int e = 0; e < L; e++) {
        ASSERT_LE(rr.expertCount[e], R * r.maxTokens);
        for (int s = 0; s < R; s++) {
          const int end = s + 1 < R ? rr.blockStart[e][s + 1] : rr.expertCount[e];
          for (int i = rr.blockStart[e][s]; i < end; i++) ASSERT_EQ(rr.zones[e][i].src, s);
        }
        for (int i = 0; i < rr.expertCount[e]; i++) {
          const ExpertRow& x = rr.zones[e][i];
          if (i > 0) {
            const ExpertRow& p = rr.zones[e][i - 1];
            ASSERT_TRUE(p.src < x.src || (p.src == x.src && p.token < x.token)) << "zone order";
          }
          ASSERT_EQ(r.topkIdx[x.src][(size_t)x.token * K + x.k], d * L + e);
          ASSERT_EQ(x.srcInfo(r.maxTokens), x.src * r.maxTokens + x.token);
          seen[x.src][(size_t)x.token * K + x.k]++;
        }
      }
      if (!r.isActive(d)) {
        for (int s = 0; s < R; s++) ASSERT_EQ(rr.rankCount[s], 0);
      }
    }
    for (int s = 0; s < R; s++)
      for (int t = 0; t < r.numTokens[s]; t++) {
        int lost = 0;
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[s][(size_t)t * K + k];
          ASSERT_EQ(seen[s][(size_t)t * K + k], r.delivered(s, e) ? 1 : 0);
          pairs += r.delivered(s, e);
          lost += e >= 0 && !r.delivered(s, e);
        }
        ASSERT_EQ(missing[s][t], lost);
        masked += lost;
      }
  }
  printf("LL reference: %lld (token, expert) pairs delivered, %lld lost to masked ranks\n", (long long)pairs,
         (long long)masked);
  EXPECT_GT(pairs, 20000);
  EXPECT_GT(masked, 500);
}

uint16_t bf(float f) { return ncclext::floatToBf16(f); }

TEST(EpLlReference, CombineSumsWhatEachPathPromises) {
  // Identity experts on integer-valued rows x[s][t][h] in [-4, 4]: expert outputs are the dispatched rows. With
  // weights of 1 or 1/2 and at most 8 of them, every partial and sum needs at most 7 significant bits, exact in
  // bf16 (8) and fp32, so each path must equal the double computation.
  Draw g(11);
  const int H = 4;
  int checked = 0;
  for (int c = 0; c < 300; c++) {
    const Routing r = routing(g, c % 4 == 0);
    const std::vector<RankRecv> recv = dispatch(r);
    const int R = r.nRanks, L = r.localExperts(), K = r.topk;
    std::vector<std::vector<uint16_t>> x(R);
    for (int s = 0; s < R; s++) {
      x[s].resize((size_t)r.numTokens[s] * H);
      for (uint16_t& v : x[s]) v = bf((float)g.uniform(-4, 4));
    }
    std::vector<std::vector<std::vector<uint16_t>>> rm(R), em(R);
    for (int d = 0; d < R; d++) {
      rm[d].resize(R);
      for (int s = 0; s < R; s++)
        for (const RankMajorSlot& slot : recv[d].slots[s])
          for (int h = 0; h < H; h++) rm[d][s].push_back(x[s][(size_t)slot.srcToken * H + h]);
      em[d].resize(L);
      for (int e = 0; e < L; e++)
        for (const ExpertRow& row : recv[d].zones[e])
          for (int h = 0; h < H; h++) em[d][e].push_back(x[row.src][(size_t)row.token * H + h]);
    }
    const auto outRm = combineRankMajor(r, recv, rm, H);
    const auto outAtDispatch = combineExpertMajor(r, recv, em, H, true);
    const auto outAtCombine = combineExpertMajor(r, recv, em, H, false);
    for (int s = 0; s < R; s++)
      for (int t = 0; t < r.numTokens[s]; t++) {
        int ranks = 0;
        double wsum = 0;
        for (int d = 0; d < R; d++) {
          bool hit = false;
          for (int k = 0; k < K; k++) {
            const int e = r.topkIdx[s][(size_t)t * K + k];
            if (r.delivered(s, e) && r.owner(e) == d) hit = true;
          }
          ranks += hit;
        }
        for (int k = 0; k < K; k++)
          if (r.delivered(s, r.topkIdx[s][(size_t)t * K + k])) wsum += r.weights[s][(size_t)t * K + k];
        if (!r.isActive(s)) ranks = 0, wsum = 0;
        for (int h = 0; h < H; h++) {
          const double v = ncclext::bf16ToFloat(x[s][(size_t)t * H + h]);
          const size_t i = (size_t)t * H + h;
          ASSERT_EQ(ncclext::bf16ToFloat(outRm[s][i]), v * ranks) << "rank-major, case " << c;
          ASSERT_EQ(ncclext::bf16ToFloat(outAtDispatch[s][i]), v * wsum) << "weights at dispatch, case " << c;
          ASSERT_EQ(ncclext::bf16ToFloat(outAtCombine[s][i]), v * wsum) << "weights at combine, case " << c;
          checked++;
        }
      }
  }
  EXPECT_GT(checked, 50000);
}

TEST(EpLlReference, CombinePathsRoundWhereTheyPromise) {
  // One token, experts 0 and 1 on rank 0 and expert 2 on rank 1, weights 1, outputs 1, 3 * 2^-9 and -1. Weights at
  // dispatch: rank 0 sends bf16(1 + 3 * 2^-9) = 1 + 2^-7 (bf16 keeps 7 fraction bits), the owner adds -1: 2^-7.
  // Weights at combine: one fp32 sum, 3 * 2^-9, rounded once (exact in bf16). Each path rounds where it says.
  Routing r;
  r.nRanks = 2;
  r.numExperts = 4;
  r.topk = 3;
  r.maxTokens = 1;
  r.numTokens = {1, 0};
  r.topkIdx = {{0, 1, 2}, {}};
  r.weights = {{1.0f, 1.0f, 1.0f}, {}};
  const std::vector<RankRecv> recv = dispatch(r);
  ASSERT_EQ(recv[0].expertCount, std::vector<int>({1, 1}));
  ASSERT_EQ(recv[1].expertCount, std::vector<int>({1, 0}));
  const float b = 3 * std::ldexp(1.0f, -9);
  const std::vector<std::vector<std::vector<uint16_t>>> em = {{{bf(1.0f)}, {bf(b)}}, {{bf(-1.0f)}, {}}};
  EXPECT_EQ(ncclext::bf16ToFloat(combineExpertMajor(r, recv, em, 1, true)[0][0]), std::ldexp(1.0f, -7));
  EXPECT_EQ(ncclext::bf16ToFloat(combineExpertMajor(r, recv, em, 1, false)[0][0]), b);
}

TEST(EpLlReference, Fp8RowsStayWithinTheirBlockBounds) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 4 * ncclext::kFp8BlockElems;
  for (int c = 0; c < 200; c++) {
    std::vector<float> x(n);
    const float spread = std::ldexp(1.0f, (int)(rng() % 40) - 20);
    for (float& v : x) v = normal(rng) * spread;
    if (c % 10 == 0) std::fill(x.begin(), x.begin() + ncclext::kFp8BlockElems, 0.0f);  // an all-zero block
    for (bool pow2 : {false, true}) {
      std::vector<uint8_t> q(n);
      std::vector<float> scales(n / ncclext::kFp8BlockElems);
      ncclext::fp8QuantizeRow(x.data(), n, pow2, q.data(), scales.data());
      for (int b = 0; b < (int)scales.size(); b++) {
        float amax = 0;
        for (int i = 0; i < ncclext::kFp8BlockElems; i++)
          amax = std::max(amax, std::fabs(x[b * ncclext::kFp8BlockElems + i]));
        const float plain = std::max(amax, ncclext::kFp8MinAmax) / ncclext::kFp8E4m3Max;
        if (pow2) {
          int e;
          ASSERT_EQ(std::frexp(scales[b], &e), 0.5f) << "not a power of two";
          ASSERT_GE(scales[b], plain);
          ASSERT_LT(scales[b], 2 * plain);
        } else {
          ASSERT_EQ(scales[b], plain);
        }
        for (int i = 0; i < ncclext::kFp8BlockElems; i++) {
          const int at = b * ncclext::kFp8BlockElems + i;
          const float back = ncclext::e4m3ToFloat(q[at]) * scales[b];
          ASSERT_LE(std::fabs(ncclext::e4m3ToFloat(q[at])), ncclext::kFp8E4m3Max);
          // e4m3 keeps 3 mantissa bits: relative error at most 2^-4, or half the smallest subnormal step.
          const float tol = std::max(std::fabs(x[at]) * 0.0625f, scales[b] * 0.0009765625f);
          ASSERT_LE(std::fabs(back - x[at]), tol) << "block " << b << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace llref
}  // namespace ncclep
