#include "nccl_m2n/src/agree.h"

#include <algorithm>

namespace ncclm2n {

void digestGroup(int64_t n, int g, int64_t* lo, int64_t* hi) {
  const int64_t per = (n + kDigestGroups - 1) / kDigestGroups;
  *lo = std::min<int64_t>(n, per * g);
  *hi = std::min<int64_t>(n, *lo + per);
}

Digest digestOf(const std::vector<uint64_t>& h) {
  Digest d;
  d.nTensors = (int64_t)h.size();
  uint64_t total = 0x6d326e31u;
  for (int g = 0; g < kDigestGroups; g++) {
    int64_t lo, hi;
    digestGroup(d.nTensors, g, &lo, &hi);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)g;
    for (int64_t i = lo; i < hi; i++) x = (x ^ h[i]) * 0x100000001b3ull + (uint64_t)i;
    d.groups[g] = x;
    total = (total ^ x) * 0x100000001b3ull;
  }
  d.total = total;
  return d;
}

Agreement compareDigests(const std::vector<Digest>& all) {
  Agreement a;
  for (size_t r = 1; r < all.size(); r++) {
    if (all[r].nTensors != all[0].nTensors) {
      a.agree = false;
      a.message = "rank " + std::to_string(r) + " passes " + std::to_string(all[r].nTensors) + " tensors, rank 0 " +
                  std::to_string(all[0].nTensors);
      return a;
    }
  }
  for (int g = 0; g < kDigestGroups; g++)
    for (size_t r = 1; r < all.size(); r++)
      if (all[r].groups[g] != all[0].groups[g]) {
        a.agree = false;
        a.group = g;
        return a;
      }
  return a;
}

std::string firstDifference(const std::vector<std::vector<uint64_t>>& all, int64_t lo,
                            const std::vector<std::string>& names) {
  const size_t n = all.empty() ? 0 : all[0].size();
  for (size_t i = 0; i < n; i++)
    for (size_t r = 1; r < all.size(); r++)
      if (i >= all[r].size() || all[r][i] != all[0][i]) {
        const int64_t t = lo + (int64_t)i;
        const std::string name = t < (int64_t)names.size() ? names[t] : "";
        return "rank " + std::to_string(r) + " describes tensor " + std::to_string(t) + " (" + name +
               ") differently from rank 0 (name, shape, dtype, meshes, placements, boxes or strides)";
      }
  return "the ranks' metadata hashes differ, but no tensor of the group does (a hash collision?)";
}

ExchangeDecision decideExchange(const std::vector<ExchangeVote>& votes) {
  ExchangeDecision d;
  d.reuse = !votes.empty();
  uint64_t splits = 0;
  for (const ExchangeVote& v : votes) {
    d.reuse = d.reuse && v.reuse != 0 && v.reuse == votes[0].reuse;
    splits = std::max(splits, v.splits);
  }
  d.generation = d.reuse ? votes[0].reuse : splits + 1;
  return d;
}

}  // namespace ncclm2n
