#include "tests/unit/ep_ll_reference.h"

#include <cmath>

#include "common/numeric.h"

namespace ncclep {
namespace llref {

std::vector<RankRecv> dispatch(const Routing& r) {
  const int R = r.nRanks, L = r.localExperts(), K = r.topk;
  std::vector<RankRecv> out(R);
  for (int d = 0; d < R; d++) {
    RankRecv& rr = out[d];
    rr.rankCount.assign(R, 0);
    rr.slots.assign(R, {});
    rr.expertCount.assign(L, 0);
    rr.blockStart.assign(L, std::vector<int>(R, 0));
    rr.zones.assign(L, {});
    if (!r.isActive(d)) continue;
    for (int s = 0; s < R; s++) {
      for (int e = 0; e < L; e++) rr.blockStart[e][s] = (int)rr.zones[e].size();
      for (int t = 0; t < r.numTokens[s]; t++) {
        RankMajorSlot slot;
        slot.srcToken = t;
        slot.localIds.assign(K, -1);
        slot.weights.assign(K, 0.0f);
        bool here = false;
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[s][(size_t)t * K + k];
          if (!r.delivered(s, e) || r.owner(e) != d) continue;
          here = true;
          const float w = r.weights[s][(size_t)t * K + k];
          slot.localIds[k] = e - d * L;
          slot.weights[k] = w;
          rr.zones[e - d * L].push_back({s, t, k, w});
        }
        if (here) rr.slots[s].push_back(slot);
      }
      rr.rankCount[s] = (int)rr.slots[s].size();
    }
    for (int e = 0; e < L; e++) rr.expertCount[e] = (int)rr.zones[e].size();
  }
  return out;
}

std::vector<std::vector<int>> missingExperts(const Routing& r) {
  std::vector<std::vector<int>> out(r.nRanks);
  for (int s = 0; s < r.nRanks; s++) {
    out[s].assign(r.numTokens[s], 0);
    for (int t = 0; t < r.numTokens[s]; t++)
      for (int k = 0; k < r.topk; k++) {
        const int e = r.topkIdx[s][(size_t)t * r.topk + k];
        out[s][t] += e >= 0 && !r.delivered(s, e);
      }
  }
  return out;
}

namespace {

float bf(uint16_t b) { return ncclext::bf16ToFloat(b); }

std::vector<std::vector<uint16_t>> zeros(const Routing& r, int hidden) {
  std::vector<std::vector<uint16_t>> out(r.nRanks);
  for (int s = 0; s < r.nRanks; s++) out[s].assign((size_t)r.numTokens[s] * hidden, 0);
  return out;
}

}  // namespace

std::vector<std::vector<uint16_t>> combineRankMajor(const Routing& r, const std::vector<RankRecv>& recv,
                                                    const std::vector<std::vector<std::vector<uint16_t>>>& in,
                                                    int hidden) {
  std::vector<std::vector<uint16_t>> out = zeros(r, hidden);
  for (int s = 0; s < r.nRanks; s++) {
    if (!r.isActive(s)) continue;
    std::vector<float> acc((size_t)r.numTokens[s] * hidden, 0.0f);
    for (int d = 0; d < r.nRanks; d++)  // rank order
      for (int j = 0; j < (int)recv[d].slots[s].size(); j++) {
        const int t = recv[d].slots[s][j].srcToken;
        for (int h = 0; h < hidden; h++) acc[(size_t)t * hidden + h] += bf(in[d][s][(size_t)j * hidden + h]);
      }
    for (size_t i = 0; i < acc.size(); i++) out[s][i] = ncclext::floatToBf16(acc[i]);
  }
  return out;
}

std::vector<std::vector<uint16_t>> combineExpertMajor(const Routing& r, const std::vector<RankRecv>& recv,
                                                      const std::vector<std::vector<std::vector<uint16_t>>>& in,
                                                      int hidden, bool weightsAtDispatch) {
  const int R = r.nRanks, L = r.localExperts(), K = r.topk;
  std::vector<std::vector<uint16_t>> out = zeros(r, hidden);
  // row[d][s][t * K + k]: the zone row of (s, t, k) on rank d, or -1.
  std::vector<std::vector<std::vector<int>>> row(R, std::vector<std::vector<int>>(R));
  for (int d = 0; d < R; d++) {
    for (int s = 0; s < R; s++) row[d][s].assign((size_t)r.numTokens[s] * K, -1);
    for (int e = 0; e < L; e++)
      for (int i = 0; i < (int)recv[d].zones[e].size(); i++) {
        const ExpertRow& x = recv[d].zones[e][i];
        row[d][x.src][(size_t)x.token * K + x.k] = e * (1 << 20) + i;  // zone and row, unpacked below
      }
  }
  auto value = [&](int d, int packed, int h) {
    return bf(in[d][packed >> 20][(size_t)(packed & ((1 << 20) - 1)) * hidden + h]);
  };
  for (int s = 0; s < R; s++) {
    if (!r.isActive(s)) continue;
    for (int t = 0; t < r.numTokens[s]; t++)
      for (int h = 0; h < hidden; h++) {
        float acc = 0.0f;
        if (weightsAtDispatch) {
          for (int d = 0; d < R; d++) {  // each rank's partial, rounded to bf16 as it is sent back
            float p = 0.0f;
            bool any = false;
            for (int k = 0; k < K; k++) {
              const int at = row[d][s][(size_t)t * K + k];
              if (at < 0) continue;
              p = std::fmaf(r.weights[s][(size_t)t * K + k], value(d, at, h), p);
              any = true;
            }
            if (any) acc += bf(ncclext::floatToBf16(p));
          }
        } else {
          for (int k = 0; k < K; k++) {  // each (token, expert) row as it came back, weighted here
            const int e = r.topkIdx[s][(size_t)t * K + k];
            if (!r.delivered(s, e)) continue;
            const int d = r.owner(e);
            acc = std::fmaf(r.weights[s][(size_t)t * K + k], value(d, row[d][s][(size_t)t * K + k], h), acc);
          }
        }
        out[s][(size_t)t * hidden + h] = ncclext::floatToBf16(acc);
      }
  }
  return out;
}

}  // namespace llref
}  // namespace ncclep
