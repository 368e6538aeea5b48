#include "nccl_m2n/src/layout.h"

#include "nccl_m2n/src/move.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

namespace ncclm2n {
namespace {

bool failWith(std::string* error, const char* fmt, long long a = 0, long long b = 0, long long c = 0) {
  if (error) {
    char buf[256];
    snprintf(buf, sizeof(buf), fmt, a, b, c);
    *error = buf;
  }
  return false;
}

bool mulOverflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

bool Box::operator==(const Box& o) const {
  if (ndims != o.ndims) return false;
  for (int d = 0; d < ndims; d++)
    if (offset[d] != o.offset[d] || shape[d] != o.shape[d]) return false;
  return true;
}

Box intersect(const Box& a, const Box& b) {
  Box r;
  r.ndims = a.ndims;
  for (int d = 0; d < a.ndims; d++) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    r.offset[d] = lo;
    r.shape[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

void subtract(const Box& a, const Box& b, std::vector<Box>* out) {
  if (a.empty()) return;
  const Box x = intersect(a, b);
  if (x.empty()) {
    out->push_back(a);
    return;
  }
  // Slabs dim by dim: below and above x in dim d, spanning x in the dims before d and all of `a` in those after.
  Box rest = a;
  for (int d = 0; d < a.ndims; d++) {
    const int64_t xhi = x.offset[d] + x.shape[d], rhi = rest.offset[d] + rest.shape[d];
    if (x.offset[d] > rest.offset[d]) {
      Box below = rest;
      below.shape[d] = x.offset[d] - rest.offset[d];
      out->push_back(below);
    }
    if (xhi < rhi) {
      Box above = rest;
      above.offset[d] = xhi;
      above.shape[d] = rhi - xhi;
      out->push_back(above);
    }
    rest.offset[d] = x.offset[d];
    rest.shape[d] = x.shape[d];
  }
}

size_t elementSize(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8: case ncclUint8: return 1;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
#endif
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

int conversionOf(ncclDataType_t src, ncclDataType_t dst) {
  if (src == dst) return kConvertNone;
  if (src == ncclFloat32 && dst == ncclBfloat16) return kConvertF32ToBf16;
  if (src == ncclBfloat16 && dst == ncclFloat32) return kConvertBf16ToF32;
  return -1;
}

Interval chunkInterval(Interval whole, int parts, int i) {
  const int64_t n = whole.hi - whole.lo;
  const int64_t c = (n + parts - 1) / parts;
  const int64_t lo = std::min(n, c * i), hi = std::min(n, c * (i + 1));
  return {whole.lo + lo, whole.lo + hi};
}

bool validateLayout(const Layout& l, int nRanks, std::string* error) {
  const int nd = l.ndims();
  if (nd < 1 || nd > kMaxTensorDims) return failWith(error, "tensor rank %lld not in [1, %lld]", nd, kMaxTensorDims);
  int64_t total = 1;
  for (int d = 0; d < nd; d++) {
    if (l.globalShape[d] < 0) return failWith(error, "global shape[%lld] = %lld < 0", d, l.globalShape[d]);
    if (mulOverflows(total, l.globalShape[d], &total) || total > (int64_t(1) << 62))
      return failWith(error, "global shape overflows 2^62 elements at dim %lld", d);
  }
  if (elementSize(l.dtype) == 0) return failWith(error, "unsupported dtype %lld", (long long)l.dtype);
  const int md = static_cast<int>(l.mesh.dims.size());
  if (md < 1 || md > kMaxMeshDims) return failWith(error, "mesh rank %lld not in [1, %lld]", md, kMaxMeshDims);
  int64_t meshSize = 1;
  for (int a = 0; a < md; a++) {
    if (l.mesh.dims[a] < 1) return failWith(error, "mesh dims[%lld] = %lld < 1", a, l.mesh.dims[a]);
    if (mulOverflows(meshSize, l.mesh.dims[a], &meshSize) || meshSize > (1 << 24))
      return failWith(error, "mesh has more than 2^24 positions");
  }
  if ((int64_t)l.mesh.ranks.size() != meshSize)
    return failWith(error, "mesh lists %lld ranks but its dims multiply to %lld", (long long)l.mesh.ranks.size(),
                    meshSize);
  std::vector<int> sorted(l.mesh.ranks);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); i++) {
    if (sorted[i] < 0 || (nRanks > 0 && sorted[i] >= nRanks))
      return failWith(error, "mesh rank %lld out of [0, %lld)", sorted[i], nRanks);
    if (i > 0 && sorted[i] == sorted[i - 1]) return failWith(error, "rank %lld appears twice in the mesh", sorted[i]);
  }
  if (l.boxes.empty()) {
    if ((int)l.placements.size() != md)
      return failWith(error, "%lld placements for a mesh of rank %lld", (long long)l.placements.size(), md);
    for (int a = 0; a < md; a++) {
      const int p = l.placements[a];
      if (p != kReplicate && (p < 0 || p >= nd))
        return failWith(error, "placement of mesh axis %lld shards dim %lld, tensor rank is %lld", a, p, nd);
    }
  } else {
    if ((int64_t)l.boxes.size() != meshSize)
      return failWith(error, "%lld explicit boxes for %lld mesh positions", (long long)l.boxes.size(), meshSize);
    for (int64_t p = 0; p < meshSize; p++) {
      const Box& b = l.boxes[p];
      if (b.ndims != nd) return failWith(error, "box %lld has rank %lld, tensor rank %lld", p, b.ndims, nd);
      for (int d = 0; d < nd; d++)
        if (b.offset[d] < 0 || b.shape[d] < 0 || b.shape[d] > l.globalShape[d] - b.offset[d])
          return failWith(error, "box %lld leaves the tensor at dim %lld (global size %lld)", p, d, l.globalShape[d]);
    }
  }
  if (!l.strides.empty()) {
    if ((int64_t)l.strides.size() != meshSize * nd)
      return failWith(error, "%lld strides given, want mesh size x tensor rank = %lld", (long long)l.strides.size(),
                      meshSize * nd);
    for (size_t i = 0; i < l.strides.size(); i++)
      if (l.strides[i] < 0) return failWith(error, "stride %lld is negative (%lld)", (long long)i, l.strides[i]);
    // Spans must not overflow either: checked against each position's box below.
    ShardGrid g(l);
    for (int64_t p = 0; p < meshSize; p++) {
      const Box& b = g.boxOfPosition(p);
      int64_t span = 0;
      for (int d = 0; d < nd && !b.empty(); d++) {
        int64_t t;
        if (mulOverflows(b.shape[d] - 1, l.strides[p * nd + d], &t) || __builtin_add_overflow(span, t, &span))
          return failWith(error, "local strides of mesh position %lld overflow", p);
      }
    }
  }
  return true;
}

ShardGrid::ShardGrid(const Layout& l) : ndims_(l.ndims()) {
  const int meshSize = l.mesh.size();
  const int md = static_cast<int>(l.mesh.dims.size());
  whole_.ndims = ndims_;
  std::copy(l.globalShape.begin(), l.globalShape.end(), whole_.shape);
  shardOfPosition_.assign(meshSize, 0);
  if (l.boxes.empty()) {
    grid_ = true;
    // Per tensor dim, the mesh axes that shard it, in mesh-axis order; leaves = product of their sizes.
    intervals_.resize(ndims_);
    radix_.assign(ndims_, 1);
    std::vector<std::vector<int>> axesOfDim(ndims_);
    for (int a = 0; a < md; a++)
      if (l.placements[a] != kReplicate) axesOfDim[l.placements[a]].push_back(a);
    for (int d = 0; d < ndims_; d++) {
      std::vector<Interval> cur{{0, l.globalShape[d]}};
      for (int a : axesOfDim[d]) {
        std::vector<Interval> next;
        next.reserve(cur.size() * l.mesh.dims[a]);
        for (const Interval& v : cur)
          for (int i = 0; i < l.mesh.dims[a]; i++) next.push_back(chunkInterval(v, l.mesh.dims[a], i));
        cur.swap(next);
      }
      intervals_[d] = std::move(cur);
      radix_[d] = static_cast<int>(intervals_[d].size());
    }
    int nShards = 1;
    for (int d = 0; d < ndims_; d++) nShards *= radix_[d];
    shardBoxes_.resize(nShards);
    replicas_.resize(nShards);
    for (int s = 0; s < nShards; s++) {
      Box& b = shardBoxes_[s];
      b.ndims = ndims_;
      int rest = s;
      for (int d = ndims_ - 1; d >= 0; d--) {
        const Interval& v = intervals_[d][rest % radix_[d]];
        rest /= radix_[d];
        b.offset[d] = v.lo;
        b.shape[d] = v.hi - v.lo;
      }
    }
    // Mesh position -> leaf per dim: the leaf index of dim d is the mixed-radix number of the coordinates along
    // the axes sharding d, in mesh-axis order (outer axis major), matching the nested chunking above.
    std::vector<int> coord(md, 0);
    for (int p = 0; p < meshSize; p++) {
      int shard = 0;
      for (int d = 0; d < ndims_; d++) {
        int leaf = 0;
        for (int a : axesOfDim[d]) leaf = leaf * l.mesh.dims[a] + coord[a];
        shard = shard * radix_[d] + leaf;
      }
      shardOfPosition_[p] = shard;
      replicas_[shard].push_back(p);
      for (int a = md - 1; a >= 0; a--) {
        if (++coord[a] < l.mesh.dims[a]) break;
        coord[a] = 0;
      }
    }
  } else {
    // Explicit boxes: identical boxes are replicas of one shard.
    std::map<std::vector<int64_t>, int> seen;
    for (int p = 0; p < meshSize; p++) {
      const Box& b = l.boxes[p];
      std::vector<int64_t> key(b.offset, b.offset + ndims_);
      key.insert(key.end(), b.shape, b.shape + ndims_);
      auto it = seen.find(key);
      if (it == seen.end()) {
        it = seen.emplace(key, numShards()).first;
        shardBoxes_.push_back(b);
        replicas_.emplace_back();
      }
      shardOfPosition_[p] = it->second;
      replicas_[it->second].push_back(p);
    }
  }
  strides_.resize((size_t)meshSize * ndims_);
  for (int p = 0; p < meshSize; p++) {
    int64_t* st = &strides_[(size_t)p * ndims_];
    if (!l.strides.empty()) {
      std::copy(l.strides.begin() + (size_t)p * ndims_, l.strides.begin() + (size_t)(p + 1) * ndims_, st);
    } else {
      const Box& b = boxOfPosition(p);
      int64_t s = 1;
      for (int d = ndims_ - 1; d >= 0; d--) {
        st[d] = s;
        s *= std::max<int64_t>(b.shape[d], 1);
      }
    }
  }
}

ShardGrid::Coverage ShardGrid::coverage() const {
  Coverage c;
  if (grid_) return c;
  std::vector<Box> left, next;
  if (!whole_.empty()) left.push_back(whole_);
  // Largest boxes first: they leave the fewest pieces behind (a box over the whole tensor leaves none, whatever
  // holes the small ones would have cut first). Neither answer depends on the order.
  std::vector<const Box*> order;
  for (const Box& s : shardBoxes_) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(),
                   [](const Box* a, const Box* b) { return a->elements() > b->elements(); });
  for (const Box* sp : order) {
    const Box& s = *sp;
    if (s.empty()) continue;
    int64_t taken = 0;
    next.clear();
    for (const Box& r : left) {
      const Box x = intersect(r, s);
      if (x.empty()) {
        next.push_back(r);
        continue;
      }
      taken += x.elements();
      subtract(r, x, &next);
    }
    left.swap(next);
    if (left.size() > kMaxCoveragePieces) {
      c.tooFragmented = true;
      return c;
    }
    // `left` never meets an earlier shard, so this one meets an earlier one exactly when it takes less than itself.
    if (taken < s.elements()) c.disjoint = false;
    if (left.empty() && !c.disjoint) break;  // nothing more to learn
  }
  std::sort(left.begin(), left.end(), [&](const Box& a, const Box& b) {
    return std::lexicographical_compare(a.offset, a.offset + ndims_, b.offset, b.offset + ndims_);
  });
  c.holes = std::move(left);
  return c;
}

int64_t ShardGrid::localSpan(int pos) const {
  const Box& b = boxOfPosition(pos);
  if (b.empty()) return 0;
  const int64_t* st = strides(pos);
  int64_t span = 1;
  for (int d = 0; d < ndims_; d++) span += (b.shape[d] - 1) * st[d];
  return span;
}

}  // namespace ncclm2n
