// Builders shared by the M2N planner tests.
#pragma once

#include <numeric>
#include <vector>

#include "nccl_m2n/src/plan.h"
#include "tests/unit/m2n_simulator.h"

namespace ncclm2n {
namespace testing {

inline std::vector<int> iota(int start, int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

inline Layout layout(std::vector<int64_t> shape, std::vector<int> meshDims, std::vector<int> ranks,
                     std::vector<int> placements, ncclDataType_t dtype = ncclBfloat16) {
  Layout l;
  l.globalShape = std::move(shape);
  l.mesh.dims = std::move(meshDims);
  l.mesh.ranks = std::move(ranks);
  l.placements = std::move(placements);
  l.dtype = dtype;
  return l;
}

inline Problem oneTensor(const Layout& src, const Layout& dst, int nRanks, int ranksPerDomain = 0) {
  Problem p;
  p.nRanks = nRanks;
  p.options.ranksPerDomain = ranksPerDomain;
  p.tensors.push_back({"t", src, dst});
  return p;
}

// Validates, plans every rank and simulates; returns the plans for further checks.
inline SimulationResult planAndSimulate(const Problem& p, std::vector<RankPlan>* plans = nullptr,
                                        PlanStats* stats = nullptr, std::string* error = nullptr) {
  std::string why;
  if (!validateProblem(p, &why)) {
    SimulationResult r;
    r.ok = false;
    r.firstError = "invalid problem: " + why;
    if (error) *error = why;
    return r;
  }
  std::vector<RankPlan> local;
  PlanStats s;
  planAll(p, plans ? plans : &local, &s);
  if (stats) *stats = s;
  return simulate(p, plans ? *plans : local);
}

}  // namespace testing
}  // namespace ncclm2n
