// Random M2N batches for the property tests and the GPU executor test: meshes, placements, explicit boxes and
// strided local tensors over up to 12 ranks (tests/unit/m2n_property_test.cc, tests/gpu/m2n_exec_test.cu).
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nccl_m2n/src/plan.h"

namespace ncclm2n {
namespace testing {

inline std::vector<int> iotaRanks(int lo, int hi) {
  std::vector<int> v(hi - lo);
  std::iota(v.begin(), v.end(), lo);
  return v;
}

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(uint64_t seed) : rng(seed) {}
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }  // inclusive
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  // A mesh of rank 1-3 over `pool` (a shuffled list of ranks), at most `maxSize` positions.
  Mesh mesh(std::vector<int> pool, int maxSize) {
    Mesh m;
    const int rank = uniform(1, 3);
    int size = 1;
    for (int a = 0; a < rank; a++) {
      int d = uniform(1, 3);
      while (size * d > maxSize && d > 1) d--;
      m.dims.push_back(d);
      size *= d;
    }
    std::shuffle(pool.begin(), pool.end(), rng);
    m.ranks.assign(pool.begin(), pool.begin() + size);
    return m;
  }

  // Strides that place dims in a random order with random padding (never aliasing).
  std::vector<int64_t> stridesFor(const ShardGrid& g, int positions, int nd) {
    std::vector<int64_t> out;
    for (int pos = 0; pos < positions; pos++) {
      const Box& b = g.boxOfPosition(pos);
      std::vector<int> order(nd);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);  // order[0] is innermost
      std::vector<int64_t> st(nd);
      int64_t span = 1;
      for (int d : order) {
        st[d] = span + (chance(0.5) ? uniform(0, 2) : 0);
        span = st[d] * std::max<int64_t>(b.shape[d], 1);
      }
      out.insert(out.end(), st.begin(), st.end());
    }
    return out;
  }

  // Any sub-box of the tensor, empty ones included.
  Box subBox(const std::vector<int64_t>& shape) {
    Box b;
    b.ndims = (int)shape.size();
    for (int d = 0; d < b.ndims; d++) {
      const int64_t lo = uniform(0, (int)shape[d]);
      b.offset[d] = lo;
      b.shape[d] = uniform(0, (int)(shape[d] - lo));
    }
    return b;
  }

  Layout layout(const std::vector<int64_t>& shape, const Mesh& m, bool allowBoxes, bool destination) {
    Layout l;
    l.globalShape = shape;
    l.mesh = m;
    const int nd = (int)shape.size();
    for (size_t a = 0; a < m.dims.size(); a++) l.placements.push_back(chance(0.3) ? kReplicate : uniform(0, nd - 1));
    if (allowBoxes && chance(0.15)) {
      if (destination) {
        // Any sub-boxes: replicas, overlaps and gaps between destination ranks are all legal.
        for (int pos = 0; pos < m.size(); pos++) l.boxes.push_back(subBox(shape));
      } else {
        // The boxes of a placement layout, listed explicitly: they cover the tensor (gaps are the next test's).
        ShardGrid g(l);
        for (int pos = 0; pos < m.size(); pos++) l.boxes.push_back(g.boxOfPosition(pos));
      }
    }
    if (chance(0.3)) {
      ShardGrid g(l);
      l.strides = stridesFor(g, m.size(), nd);
    }
    return l;
  }

  // Every tensor one dtype of 1, 2, 4 or 8 bytes (the same on both sides), one draw per tensor.
  void mixDtypes(Problem* p) {
    const ncclDataType_t dtypes[] = {ncclInt8, ncclBfloat16, ncclFloat32, ncclInt64};
    for (TensorPair& tp : p->tensors) tp.src.dtype = tp.dst.dtype = dtypes[uniform(0, 3)];
  }

  // Every tensor a conversion the executor does in flight (fp32 -> bf16 or bf16 -> fp32), or none.
  void conversionDtypes(Problem* p) {
    for (TensorPair& tp : p->tensors) {
      const int k = uniform(0, 2);
      tp.src.dtype = k == 1 ? ncclBfloat16 : ncclFloat32;
      tp.dst.dtype = k == 0 ? ncclBfloat16 : k == 1 ? ncclFloat32 : ncclFloat32;
    }
  }

  // maxRanks: the communicator size is drawn from [1, maxRanks] (0: [1, 12]).
  Problem problem(int maxRanks = 0) {
    Problem p;
    p.nRanks = maxRanks > 0 ? maxRanks : uniform(1, 12);
    p.options.ranksPerDomain = uniform(0, 4);
    const int batch = uniform(1, 3);
    for (int t = 0; t < batch; t++) {
      const int nd = uniform(1, 4);
      std::vector<int64_t> shape(nd);
      for (int d = 0; d < nd; d++) shape[d] = chance(0.05) ? 0 : uniform(1, 9);
      std::vector<int> all = iotaRanks(0, p.nRanks);
      Mesh sm = mesh(all, p.nRanks);
      std::vector<int> pool;  // disjoint destination when there is room, else any ranks (co-located)
      for (int r : all)
        if (std::find(sm.ranks.begin(), sm.ranks.end(), r) == sm.ranks.end()) pool.push_back(r);
      if (pool.empty() || chance(0.5)) pool = all;
      Mesh dm = mesh(pool, (int)pool.size());
      TensorPair tp{"t" + std::to_string(t), layout(shape, sm, true, false), layout(shape, dm, true, true)};
      p.tensors.push_back(std::move(tp));
    }
    return p;
  }
};


}  // namespace testing
}  // namespace ncclm2n
