// M2N layout model (internal C++; pure host code, no CUDA).
//
// A layout = a mesh (an N-D array of communicator ranks, row-major) + one placement per mesh axis (Replicate or
// Shard(dim), torch.chunk semantics: chunk = ceil(n / parts), trailing shards may be short or empty; several axes
// may shard, the same dim included, applied in mesh-axis order as DTensor does) + the global shape + dtype + each
// rank's local strides in elements. Or, instead of placements, an explicit box (offset, shape) per mesh position.
//
// A layout compiles into a ShardGrid: the distinct boxes ("shards") and, for each, the mesh positions holding it
// (its replicas). Placement layouts are grids: each tensor dim is cut into sorted intervals and a shard is one
// interval per dim, so the shards overlapping any box are found per dim by binary search.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ncclm2n {

constexpr int kMaxTensorDims = 8;
constexpr int kMaxMeshDims = 8;
constexpr int kReplicate = -1;

// The product of v[0..n) (1 when n is 0): the elements of a box of that shape.
inline int64_t product(const int64_t* v, int n) {
  int64_t p = 1;
  for (int d = 0; d < n; d++) p *= v[d];
  return p;
}

struct Box {
  int ndims = 0;
  int64_t offset[kMaxTensorDims] = {};
  int64_t shape[kMaxTensorDims] = {};
  int64_t elements() const { return product(shape, ndims); }
  bool empty() const { return elements() == 0; }
  bool operator==(const Box& o) const;
};

// The intersection of two boxes of the same rank; empty (some shape 0) if they do not meet.
Box intersect(const Box& a, const Box& b);

// Appends the part of `a` outside `b` to `out`: at most 2 * ndims disjoint boxes, none when `b` holds all of `a`.
void subtract(const Box& a, const Box& b, std::vector<Box>* out);

struct Mesh {
  std::vector<int> dims;   // sizes of the mesh axes
  std::vector<int> ranks;  // communicator ranks, row-major, prod(dims) entries, no repeats
  int size() const { return static_cast<int>(ranks.size()); }
};

struct Layout {
  std::vector<int64_t> globalShape;
  ncclDataType_t dtype = ncclBfloat16;
  Mesh mesh;
  std::vector<int> placements;  // one per mesh axis: kReplicate or a tensor dim; ignored when `boxes` is set
  std::vector<Box> boxes;       // optional: one box per mesh position (explicit layout)
  std::vector<int64_t> strides; // optional: mesh.size() * ndims element strides, position-major; empty = contiguous
  int ndims() const { return static_cast<int>(globalShape.size()); }
};

// Bytes of one element of `dtype`; 0 for an unknown type.
size_t elementSize(ncclDataType_t dtype);
// The executor's conversion from `src` to `dst` elements (move.h's MoveConvert: kConvertNone for the same dtype), or
// -1 when it has none.
int conversionOf(ncclDataType_t src, ncclDataType_t dst);

// Checks a layout; on failure returns false and says why in `error`. `nRanks` bounds the ranks (0: no bound).
bool validateLayout(const Layout& layout, int nRanks, std::string* error);

struct Interval {
  int64_t lo, hi;  // [lo, hi)
};

// torch.chunk: part `i` of [lo, hi) cut into `parts`.
Interval chunkInterval(Interval whole, int parts, int i);

class ShardGrid {
 public:
  // The layout must have passed validateLayout.
  explicit ShardGrid(const Layout& layout);

  int numShards() const { return static_cast<int>(shardBoxes_.size()); }
  const Box& shardBox(int shard) const { return shardBoxes_[shard]; }
  const std::vector<int>& replicas(int shard) const { return replicas_[shard]; }  // mesh positions
  int shardOfPosition(int pos) const { return shardOfPosition_[pos]; }
  const Box& boxOfPosition(int pos) const { return shardBoxes_[shardOfPosition_[pos]]; }
  // Element strides of position `pos`'s local tensor (row-major over its own box unless the layout gives them).
  const int64_t* strides(int pos) const { return &strides_[(size_t)pos * ndims_]; }
  // Elements a local buffer of position `pos` must span (max offset + 1; 0 for an empty box).
  int64_t localSpan(int pos) const;

  // Calls fn(shard) for every non-empty shard whose box meets `box`.
  template <typename Fn>
  void forEachOverlap(const Box& box, Fn&& fn) const;

  // How the shards cover the tensor. Placement layouts tile it (no holes, disjoint shards); explicit boxes may
  // leave holes and may overlap without being replicas. Computed on each call: one subtraction per shard, largest
  // first, from the holes left so far, about linear in the shards when boxes tile the tensor.
  struct Coverage {
    std::vector<Box> holes;  // disjoint boxes that no position holds, in offset order
    bool disjoint = true;    // no two shards meet
    // The holes fragmented past kMaxCoveragePieces (explicit boxes with many holes in many dims fragment as
    // k^ndims: seen taking 30 s and 4 GB on one 8-D tensor) and the answer was given up: treat as an error.
    bool tooFragmented = false;
  };
  static constexpr size_t kMaxCoveragePieces = size_t(1) << 18;
  Coverage coverage() const;

 private:
  int ndims_ = 0;
  bool grid_ = false;
  Box whole_;                                     // the global tensor
  std::vector<std::vector<Interval>> intervals_;  // grid: per dim, sorted leaf intervals
  std::vector<int> radix_;                        // grid: leaves per dim; shard id is mixed radix, dim 0 major
  std::vector<Box> shardBoxes_;
  std::vector<std::vector<int>> replicas_;
  std::vector<int> shardOfPosition_;
  std::vector<int64_t> strides_;
};

template <typename Fn>
void ShardGrid::forEachOverlap(const Box& box, Fn&& fn) const {
  if (box.empty()) return;
  if (!grid_) {
    for (int s = 0; s < numShards(); s++)
      if (!shardBoxes_[s].empty() && !intersect(shardBoxes_[s], box).empty()) fn(s);
    return;
  }
  // Per dim: the range of leaf intervals meeting [lo, hi). Leaves are sorted and disjoint; empty ones sit where
  // their chunk would start and are skipped.
  int first[kMaxTensorDims], last[kMaxTensorDims];
  for (int d = 0; d < ndims_; d++) {
    const std::vector<Interval>& iv = intervals_[d];
    const int64_t lo = box.offset[d], hi = lo + box.shape[d];
    int a = 0, b = static_cast<int>(iv.size());
    while (a < b) {  // first leaf with hi > lo
      int m = (a + b) / 2;
      if (iv[m].hi > lo) b = m; else a = m + 1;
    }
    int e = a;
    while (e < static_cast<int>(iv.size()) && iv[e].lo < hi) e++;
    if (a >= e) return;
    first[d] = a;
    last[d] = e;
  }
  int idx[kMaxTensorDims];
  for (int d = 0; d < ndims_; d++) idx[d] = first[d];
  for (;;) {
    bool nonEmpty = true;
    int shard = 0;
    for (int d = 0; d < ndims_; d++) {
      const Interval& v = intervals_[d][idx[d]];
      nonEmpty = nonEmpty && v.hi > v.lo;
      shard = shard * radix_[d] + idx[d];
    }
    if (nonEmpty) fn(shard);
    int d = ndims_ - 1;
    while (d >= 0 && ++idx[d] == last[d]) {
      idx[d] = first[d];
      d--;
    }
    if (d < 0) return;
  }
}

}  // namespace ncclm2n
