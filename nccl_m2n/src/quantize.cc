#include "nccl_m2n/src/quantize.h"

#include <algorithm>

#include "common/numeric.h"

namespace ncclm2n {

namespace {

constexpr int64_t kBlock = ncclext::kFp8BlockElems;

int64_t blocksOf(int64_t cols) { return (cols + kBlock - 1) / kBlock; }

// The first position of `l` whose part does not hold whole blocks along dim `d` (block `size`; -1: none), with
// the part's [lo, hi) there.
int offGridPosition(const Layout& l, int d, int64_t size, int64_t* lo, int64_t* hi) {
  const ShardGrid g(l);
  for (int pos = 0; pos < l.mesh.size(); pos++) {
    const Box& b = g.boxOfPosition(pos);
    if (b.empty()) continue;
    *lo = b.offset[d];
    *hi = b.offset[d] + b.shape[d];
    if (*lo % size != 0 || (*hi % size != 0 && *hi != l.globalShape[d])) return pos;
  }
  return -1;
}

// Dim d of a box in blocks of `size`.
void toBlocks(Box* b, int d, int64_t size, int64_t dimBlocks) {
  const int64_t lo = b->offset[d], hi = lo + b->shape[d];
  const bool empty = b->empty();
  b->offset[d] = std::min(lo / size, dimBlocks);
  b->shape[d] = empty ? 0 : (hi + size - 1) / size - lo / size;
}

}  // namespace

bool quantizesToFp8(ncclDataType_t src, ncclDataType_t dst) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
  return dst == ncclFloat8e4m3 && (src == ncclBfloat16 || src == ncclFloat32);
#else
  (void)src;
  (void)dst;
  return false;
#endif
}

Layout scalesLayout(const Layout& l, int blockRows) {
  const ShardGrid g(l);
  const int last = l.ndims() - 1;
  Layout s;
  s.globalShape = l.globalShape;
  s.globalShape[last] = blocksOf(l.globalShape[last]);
  if (blockRows > 1) s.globalShape[last - 1] = (l.globalShape[last - 1] + blockRows - 1) / blockRows;
  s.dtype = ncclFloat32;
  s.mesh = l.mesh;
  for (int pos = 0; pos < l.mesh.size(); pos++) {
    Box b = g.boxOfPosition(pos);
    const bool empty = b.empty();
    toBlocks(&b, last, kBlock, s.globalShape[last]);
    if (blockRows > 1) toBlocks(&b, last - 1, blockRows, s.globalShape[last - 1]);
    if (empty) {  // an empty part stays empty (and inside the tensor)
      for (int d = 0; d < b.ndims; d++) b.offset[d] = std::min(b.offset[d], s.globalShape[d]);
      b.shape[last] = 0;
    }
    s.boxes.push_back(b);
  }
  return s;
}

bool rewriteFp8(Problem* p, const std::vector<char>& isScales, int blockRows, std::vector<Fp8Tensor>* fp8,
                std::string* why) {
  fp8->clear();
  const int n = (int)p->tensors.size();
  for (int t = 0; t < n; t++) {
    TensorPair& tp = p->tensors[t];
    const std::string name = "tensor " + std::to_string(t) + " (" + tp.name + ")";
    if (isScales[t]) {
      *why = name + " has neither layout, but does not follow a tensor quantised to fp8 e4m3 (the entry for its "
                    "scales)";
      return false;
    }
    if (!quantizesToFp8(tp.src.dtype, tp.dst.dtype)) continue;
    if (t + 1 >= n || !isScales[t + 1]) {
      *why = name + " is quantised to fp8 e4m3: the next entry must be its scales (both layouts NULL)";
      return false;
    }
    for (const auto& [side, l] : {std::make_pair("source", &tp.src), std::make_pair("destination", &tp.dst)}) {
      std::string bad;
      if (!validateLayout(*l, p->nRanks, &bad)) {
        *why = name + " " + side + ": " + bad;
        return false;
      }
      if (blockRows > 1 && l->ndims() < 2) {
        *why = name + " is quantised to fp8 e4m3 in blocks of " + std::to_string(blockRows) +
               " x 128, which needs two dims; it has one";
        return false;
      }
      const int last = l->ndims() - 1;
      for (int d : {last, last - 1}) {
        if (d < 0 || (d < last && blockRows == 1)) continue;
        const int64_t size = d == last ? kBlock : blockRows;
        int64_t lo = 0, hi = 0;
        const int pos = offGridPosition(*l, d, size, &lo, &hi);
        if (pos >= 0) {
          *why = name + " is quantised to fp8 e4m3 in blocks of " + std::to_string(blockRows) + " x 128, but its " +
                 side + " position " + std::to_string(pos) + " (rank " + std::to_string(l->mesh.ranks[pos]) +
                 ") holds " + (d == last ? "columns [" : "rows [") + std::to_string(lo) + ", " + std::to_string(hi) +
                 "): every part must hold whole blocks";
          return false;
        }
      }
    }
    fp8->push_back({t, blockRows, tp.src});
    TensorPair& scales = p->tensors[t + 1];
    if (scales.name.empty()) scales.name = tp.name + ".scales";
    scales.src = scalesLayout(tp.src, blockRows);
    scales.dst = scalesLayout(tp.dst, blockRows);
    tp.src.dtype = tp.dst.dtype;  // the scratch: e4m3, dense
    tp.src.strides.clear();
    t++;  // past the scales entry
  }
  return true;
}

std::vector<QuantDesc> quantDescs(const std::vector<Fp8Tensor>& fp8, int rank, int64_t* scratchBytes) {
  std::vector<QuantDesc> out;
  int64_t at = 0;
  auto align = [](int64_t v) { return (v + 15) / 16 * 16; };
  for (const Fp8Tensor& f : fp8) {
    const Layout& l = f.source;
    int pos = -1;
    for (int i = 0; i < l.mesh.size(); i++)
      if (l.mesh.ranks[i] == rank) pos = i;
    if (pos < 0) continue;
    const ShardGrid g(l);
    const Box& b = g.boxOfPosition(pos);
    if (b.empty()) continue;
    QuantDesc q;
    q.srcIndex = f.tensor;
    q.srcBytes = (int32_t)elementSize(l.dtype);
    q.ndims = b.ndims;
    q.blockRows = f.blockRows;
    for (int d = 0; d < b.ndims; d++) {
      q.extent[d] = b.shape[d];
      q.srcStride[d] = g.strides(pos)[d];
    }
    const int last = b.ndims - 1;
    const int64_t cols = b.shape[last], rows = b.elements() / cols;
    const int64_t inner = last >= 1 ? b.shape[last - 1] : 1;
    q.blocks = rows / inner * ((inner + f.blockRows - 1) / f.blockRows) * blocksOf(cols);
    q.valuesOffset = at;
    at = align(at + rows * cols);
    q.scalesOffset = at;
    at = align(at + q.blocks * 4);
    out.push_back(q);
  }
  *scratchBytes = at;
  return out;
}

}  // namespace ncclm2n
