#include "tests/unit/ep_hier_reference.h"

#include <map>
#include <utility>

namespace ncclep {
namespace hier {

Plan plan(const ref::Routing& r, int G) {
  Plan p;
  p.nRanks = r.nRanks;
  p.domainSize = G;
  const int R = r.nRanks, K = r.topk, D = R / G;
  p.railIn.assign(R, {});
  p.delivered.assign(R, {});
  for (int s = 0; s < R; s++) {
    // The source's handle: each token's slot towards every rank and index among the tokens naming each expert.
    std::vector<int> slotNext(R, 0), emNext(r.numExperts, 0), railNext(D, 0);
    const int ds = p.domainOf(s);
    for (int t = 0; t < r.numTokens[s]; t++) {
      const int* ids = &r.topkIdx[s][(size_t)t * K];
      std::vector<int> slot(R, -1), emIdx(K, -1);
      for (int k = 0; k < K; k++) {
        if (ids[k] < 0) continue;
        emIdx[k] = emNext[ids[k]]++;
        slot[r.owner(ids[k])] = 0;  // marked: hit
      }
      for (int d = 0; d < R; d++)
        if (slot[d] == 0) slot[d] = slotNext[d]++;
      for (int dom = 0; dom < D; dom++) {
        bool hit = false;
        for (int d = dom * G; d < (dom + 1) * G; d++) hit = hit || slot[d] >= 0;
        if (!hit) continue;
        if (dom == ds) {  // straight to every rank of the own domain it hits
          for (int d = dom * G; d < (dom + 1) * G; d++)
            if (slot[d] >= 0) {
              p.delivered[d].push_back({s, t, s, slot[d], emIdx});
              p.nvlinkRows += d != s;
            }
          continue;
        }
        // One rail row to the proxy, which forwards it to every rank of its domain the token hits.
        RailRow row;
        row.src = s;
        row.token = t;
        row.q = railNext[dom]++;
        row.slots.assign(slot.begin() + dom * G, slot.begin() + (dom + 1) * G);
        row.emIdx = emIdx;
        const int proxy = p.proxyOf(s, dom);
        p.railIn[proxy].push_back(row);
        p.railRows++;
        for (int i = 0; i < G; i++)
          if (row.slots[i] >= 0) {
            const int d = dom * G + i;
            p.delivered[d].push_back({s, t, proxy, row.slots[i], row.emIdx});
            p.nvlinkRows += d != proxy;
          }
      }
    }
  }
  return p;
}

std::vector<std::vector<ref::FlatRow>> flatOrder(const ref::Routing& r, const Plan& p) {
  std::vector<std::vector<ref::FlatRow>> out(r.nRanks);
  for (int d = 0; d < r.nRanks; d++) {
    std::vector<int> count(r.nRanks, 0), offset(r.nRanks + 1, 0);
    for (const Delivery& v : p.delivered[d]) count[v.src]++;
    for (int s = 0; s < r.nRanks; s++) offset[s + 1] = offset[s] + count[s];
    out[d].assign(offset[r.nRanks], ref::FlatRow{-1, -1});
    for (const Delivery& v : p.delivered[d]) {
      const int row = offset[v.src] + v.slot;
      if (v.slot < 0 || v.slot >= count[v.src] || out[d][row].src != -1) return {};  // a collision: no order
      out[d][row] = {v.src, v.token};
    }
  }
  return out;
}

std::vector<std::vector<std::vector<double>>> combineFlat(const ref::Routing& r, const Plan& p,
                                                          const std::vector<ref::RankRecv>& recv,
                                                          const std::vector<std::vector<std::vector<double>>>& flatIn,
                                                          int hidden) {
  const int R = r.nRanks, G = p.domainSize;
  // (source, token) -> its row at each receiver.
  std::vector<std::map<std::pair<int, int>, size_t>> rowOf(R);
  for (int d = 0; d < R; d++)
    for (size_t i = 0; i < recv[d].flat.size(); i++) rowOf[d][{recv[d].flat[i].src, recv[d].flat[i].token}] = i;
  std::vector<std::vector<std::vector<double>>> out(R);
  for (int s = 0; s < R; s++) {
    out[s].assign(r.numTokens[s], std::vector<double>(hidden, 0.0));
    const int ds = p.domainOf(s);
    for (int t = 0; t < r.numTokens[s]; t++) {
      // The own domain's rows straight back, in rank order; then each other domain's partial, in domain order.
      std::vector<double>& o = out[s][t];
      std::vector<int> order(1, ds);  // the own domain first
      for (int dom = 0; dom < R / G; dom++)
        if (dom != ds) order.push_back(dom);
      for (int dom : order) {
        const bool own = dom == ds;
        std::vector<double> partial(hidden, 0.0);
        bool any = false;
        for (int d = dom * G; d < (dom + 1) * G; d++) {
          auto it = rowOf[d].find({s, t});
          if (it == rowOf[d].end()) continue;
          any = true;
          for (int h = 0; h < hidden; h++) (own ? o[h] : partial[h]) += flatIn[d][it->second][h];
        }
        if (!own && any)
          for (int h = 0; h < hidden; h++) o[h] += partial[h];
      }
    }
  }
  return out;
}

}  // namespace hier
}  // namespace ncclep
