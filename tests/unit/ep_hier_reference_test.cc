// The hierarchical High-Throughput protocol model (ep_hier_reference.h) against the single-domain contract
// (ep_reference.h) on random routings over several domain shapes: every receiver's FLAT rows in the same order,
// every EXPERT_MAJOR row at the same place, one rail row per (token, remote domain hit) to the rank with the
// source's local index there, and combine through the proxies equal to the flat sum.
#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "tests/unit/ep_hier_reference.h"

namespace ncclep {
namespace {

ref::Routing randomRouting(std::mt19937& rng, int R, int L, int K) {
  ref::Routing r;
  r.nRanks = R;
  r.numExperts = R * L;
  r.topk = K;
  std::vector<int> pool(r.numExperts);
  for (int e = 0; e < r.numExperts; e++) pool[e] = e;
  for (int s = 0; s < R; s++) {
    const int T = (int)(rng() % 41);
    r.numTokens.push_back(T);
    std::vector<int> idx((size_t)T * K, -1);
    for (int t = 0; t < T; t++) {
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int k = 0; k < K && k < r.numExperts; k++) idx[(size_t)t * K + k] = rng() % 7 == 0 ? -1 : pool[k];
    }
    r.topkIdx.push_back(idx);
  }
  return r;
}

TEST(EpHierReference, ProxiesDeliverTheSingleDomainLayoutWithOneRailRowPerTokenAndRemoteDomain) {
  std::mt19937 rng(20261201);
  struct Shape {
    int R, G;
  };
  int64_t rows = 0, rail = 0;
  for (const Shape sh : {Shape{4, 2}, Shape{8, 2}, Shape{8, 4}, Shape{6, 3}, Shape{4, 1}, Shape{8, 8}, Shape{2, 1}})
    for (int c = 0; c < 40; c++) {
      const int L = 1 + (int)(rng() % 3), K = 1 + (int)(rng() % 4);
      const ref::Routing r = randomRouting(rng, sh.R, L, K);
      const hier::Plan p = hier::plan(r, sh.G);
      const std::vector<ref::RankRecv> want = ref::dispatchLayout(r, 1);
      // FLAT: the same rows in the same order at every receiver.
      const auto flat = hier::flatOrder(r, p);
      ASSERT_EQ(flat.size(), (size_t)sh.R);
      for (int d = 0; d < sh.R; d++) {
        ASSERT_EQ(flat[d].size(), want[d].flat.size()) << "receiver " << d;
        for (size_t i = 0; i < flat[d].size(); i++) {
          ASSERT_EQ(flat[d][i].src, want[d].flat[i].src) << d << " row " << i;
          ASSERT_EQ(flat[d][i].token, want[d].flat[i].token) << d << " row " << i;
        }
        rows += (int64_t)flat[d].size();
      }
      // EXPERT_MAJOR: zoneStart[e] + block(e, s) + emIdx from what each delivery carries.
      for (int d = 0; d < sh.R; d++) {
        std::vector<std::vector<int>> block(L, std::vector<int>(sh.R + 1, 0));  // rows of (e, s) before source s
        for (const ref::EmRow& e : want[d].em)
          if (e.src >= 0) block[r.topkIdx[e.src][(size_t)e.token * K + e.k] - d * L][e.src + 1]++;
        for (int e = 0; e < L; e++)
          for (int s = 0; s < sh.R; s++) block[e][s + 1] += block[e][s];
        for (const hier::Delivery& v : p.delivered[d])
          for (int k = 0; k < K; k++) {
            const int id = r.topkIdx[v.src][(size_t)v.token * K + k];
            if (id < 0 || r.owner(id) != d) continue;
            const int e = id - d * L;
            const int row = want[d].zoneStart[e] + block[e][v.src] + v.emIdx[k];
            ASSERT_LT(row, (int)want[d].em.size());
            const ref::EmRow& w = want[d].em[row];
            ASSERT_TRUE(w.src == v.src && w.token == v.token && w.k == k) << "receiver " << d << " EM row " << row;
          }
      }
      // The rail: each proxy hears only from its own local index in other domains, one row per (token, domain).
      int64_t expectRail = 0;
      for (int s = 0; s < sh.R; s++)
        for (int t = 0; t < r.numTokens[s]; t++)
          for (int dom = 0; dom < sh.R / sh.G; dom++) {
            if (dom == p.domainOf(s)) continue;
            bool hit = false;
            for (int k = 0; k < K; k++) {
              const int id = r.topkIdx[s][(size_t)t * K + k];
              hit = hit || (id >= 0 && p.domainOf(r.owner(id)) == dom);
            }
            expectRail += hit;
          }
      EXPECT_EQ(p.railRows, expectRail);
      for (int proxy = 0; proxy < sh.R; proxy++) {
        std::vector<int> next(sh.R, 0);
        for (const hier::RailRow& row : p.railIn[proxy]) {
          ASSERT_EQ(row.src % sh.G, proxy % sh.G);
          ASSERT_NE(p.domainOf(row.src), p.domainOf(proxy));
          ASSERT_EQ(row.q, next[row.src]++);  // each source's stream in rail-position order
        }
      }
      rail += p.railRows;
      // Combine through the proxies: the flat sum (the same terms, other association).
      const int H = 3;
      std::vector<std::vector<std::vector<double>>> in(sh.R);
      for (int d = 0; d < sh.R; d++)
        for (size_t i = 0; i < want[d].flat.size(); i++)
          in[d].push_back({(double)(rng() % 1000) / 7, (double)d, (double)i * 0.5});
      const auto a = ref::combineFlat(r, want, in, H);
      const auto b = hier::combineFlat(r, p, want, in, H);
      for (int s = 0; s < sh.R; s++)
        for (int t = 0; t < r.numTokens[s]; t++)
          for (int h = 0; h < H; h++)
            ASSERT_NEAR(a[s][t][h], b[s][t][h], 1e-9 * (1 + std::fabs(a[s][t][h]))) << s << " " << t << " " << h;
    }
  EXPECT_GT(rows, 1000);
  EXPECT_GT(rail, 100);
}

}  // namespace
}  // namespace ncclep
