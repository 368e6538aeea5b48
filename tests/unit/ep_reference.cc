#include "tests/unit/ep_reference.h"

#include <algorithm>

namespace ncclep {
namespace ref {

Routing randomRouting(std::mt19937& rng, int maxLocal, int maxTokens, int noneOneIn) {
  Routing r;
  r.nRanks = 1 + rng() % 8;
  r.numExperts = r.nRanks * (1 + rng() % maxLocal);
  r.topk = 1 + rng() % std::min(8, r.numExperts);
  r.numTokens.resize(r.nRanks);
  r.topkIdx.resize(r.nRanks);
  for (int s = 0; s < r.nRanks; s++) {
    r.numTokens[s] = rng() % (maxTokens + 1);
    for (int t = 0; t < r.numTokens[s]; t++) {
      std::vector<int> pool(r.numExperts);
      for (int e = 0; e < r.numExperts; e++) pool[e] = e;
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int k = 0; k < r.topk; k++) r.topkIdx[s].push_back(rng() % noneOneIn == 0 ? -1 : pool[k]);
    }
  }
  return r;
}

std::vector<RankRecv> dispatchLayout(const Routing& r, int align, int cap) {
  const int L = r.localExperts();
  std::vector<RankRecv> out(r.nRanks);
  for (int d = 0; d < r.nRanks; d++) {
    RankRecv& rr = out[d];
    rr.srcCounts.assign(r.nRanks, 0);
    rr.expertCounts.assign(L, 0);
    std::vector<std::vector<EmRow>> zones(L);
    for (int s = 0; s < r.nRanks; s++) {
      for (int t = 0; t < r.numTokens[s]; t++) {
        bool hit = false;
        for (int k = 0; k < r.topk; k++) {
          const int e = r.topkIdx[s][(size_t)t * r.topk + k];
          hit = hit || (e >= 0 && r.owner(e) == d);
        }
        if (!hit) continue;
        if (cap > 0 && (int)rr.flat.size() >= cap) {
          rr.dropped++;
          continue;
        }
        for (int k = 0; k < r.topk; k++) {
          const int e = r.topkIdx[s][(size_t)t * r.topk + k];
          if (e >= 0 && r.owner(e) == d) zones[e - d * L].push_back({s, t, k});
        }
        rr.flat.push_back({s, t});
        rr.srcCounts[s]++;
      }
    }
    rr.zoneStart.assign(L, 0);
    int64_t pos = 0;
    for (int e = 0; e < L; e++) {
      rr.zoneStart[e] = (int)pos;
      rr.expertCounts[e] = (int)zones[e].size();
      for (const EmRow& row : zones[e]) rr.em.push_back(row);
      const int64_t padded = (zones[e].size() + align - 1) / align * align;
      for (int64_t p = (int64_t)zones[e].size(); p < padded; p++) rr.em.push_back(EmRow{});
      pos += padded;
    }
  }
  return out;
}

std::vector<std::vector<std::vector<double>>> combineFlat(const Routing& r, const std::vector<RankRecv>& recv,
                                                          const std::vector<std::vector<std::vector<double>>>& flatIn,
                                                          int hidden) {
  std::vector<std::vector<std::vector<double>>> out(r.nRanks);
  for (int s = 0; s < r.nRanks; s++) out[s].assign(r.numTokens[s], std::vector<double>(hidden, 0.0));
  for (int d = 0; d < r.nRanks; d++)
    for (size_t row = 0; row < recv[d].flat.size(); row++) {
      const FlatRow& f = recv[d].flat[row];
      for (int h = 0; h < hidden; h++) out[f.src][f.token][h] += flatIn[d][row][h];
    }
  return out;
}

std::vector<std::vector<std::vector<double>>> combineExpertMajor(
    const Routing& r, const std::vector<RankRecv>& recv, const std::vector<std::vector<std::vector<double>>>& emIn,
    const std::vector<std::vector<float>>& weights, int hidden) {
  std::vector<std::vector<std::vector<double>>> out(r.nRanks);
  for (int s = 0; s < r.nRanks; s++) out[s].assign(r.numTokens[s], std::vector<double>(hidden, 0.0));
  for (int d = 0; d < r.nRanks; d++)
    for (size_t row = 0; row < recv[d].em.size(); row++) {
      const EmRow& e = recv[d].em[row];
      if (e.src < 0) continue;
      const double w = weights[e.src][(size_t)e.token * r.topk + e.k];
      for (int h = 0; h < hidden; h++) out[e.src][e.token][h] += w * emIn[d][row][h];
    }
  return out;
}

}  // namespace ref
}  // namespace ncclep
