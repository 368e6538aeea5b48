// Walking a layout's local elements, for the M2N oracles (the CPU simulator and the GPU executor test): the global
// row-major index of an element, every element of a mesh position with its local offset, and a value that names
// (round, tensor, element) and fills any element size; the fp8 oracle (a global tensor quantised row by row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/numeric.h"

#include "nccl_m2n/src/layout.h"

namespace ncclm2n {
namespace testing {

inline int64_t globalLinear(const Layout& l, const int64_t* idx) {
  int64_t lin = 0;
  for (int d = 0; d < l.ndims(); d++) lin = lin * l.globalShape[d] + idx[d];
  return lin;
}

// Calls fn(globalIndex, localOffset) for every element of position `pos`'s box.
template <typename Fn>
void forEachElement(const ShardGrid& g, int pos, int ndims, Fn&& fn) {
  const Box& b = g.boxOfPosition(pos);
  if (b.empty()) return;
  const int64_t* st = g.strides(pos);
  int64_t idx[kMaxTensorDims] = {}, gi[kMaxTensorDims];
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < ndims; d++) {
      gi[d] = b.offset[d] + idx[d];
      off += idx[d] * st[d];
    }
    fn(gi, off);
    int d = ndims - 1;
    while (d >= 0 && ++idx[d] == b.shape[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

// splitmix64 of (round, tensor, element): the low bytes of it name the element in any dtype.
inline uint64_t elementValue(uint64_t round, uint64_t tensor, int64_t linear) {
  uint64_t x = round << 56 ^ tensor << 40 ^ (uint64_t)linear;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// v stored as a bf16 (bytes 2) or fp32 (bytes 4) element at `to`: the fp8 tests' sources.
inline void storeFloat(float v, int bytes, char* to) {
  if (bytes == 2) {
    const uint16_t b = ncclext::floatToBf16(v);
    memcpy(to, &b, 2);
  } else {
    memcpy(to, &v, 4);
  }
}

// The fp8 oracle: a row-major global tensor g of `shape` quantised in blocks of blockRows (of the dim before the
// last) x 128 (of the last): e4m3 values, and fp32 scales row-major over the shape in blocks. One-row blocks go
// through numeric.h's fp8QuantizeRow (a short last block padded with zeros, which leave its largest magnitude as it
// is); taller blocks through the same two steps written out (largest magnitude, fp8BlockScale, divide, round).
inline void fp8Reference(const std::vector<float>& g, const std::vector<int64_t>& shape, int blockRows,
                         std::vector<uint8_t>* q, std::vector<float>* s) {
  const int64_t cols = shape.back(), rows = (int64_t)g.size() / cols, blocks = (cols + 127) / 128;
  const int64_t inner = shape.size() >= 2 ? shape[shape.size() - 2] : 1, outer = rows / inner;
  const int64_t rowBlocks = (inner + blockRows - 1) / blockRows;
  q->assign(g.size(), 0);
  s->assign(outer * rowBlocks * blocks, 0.0f);
  if (blockRows == 1) {
    std::vector<float> row(blocks * 128);
    std::vector<uint8_t> qr(blocks * 128);
    for (int64_t r = 0; r < rows; r++) {
      std::fill(row.begin(), row.end(), 0.0f);
      std::copy(g.begin() + r * cols, g.begin() + (r + 1) * cols, row.begin());
      ncclext::fp8QuantizeRow(row.data(), (int)(blocks * 128), false, qr.data(), s->data() + r * blocks);
      std::copy(qr.begin(), qr.begin() + cols, q->begin() + r * cols);
    }
    return;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t rb = 0; rb < rowBlocks; rb++)
      for (int64_t cb = 0; cb < blocks; cb++) {
        const int64_t r0 = o * inner + rb * blockRows, r1 = o * inner + std::min(inner, (rb + 1) * blockRows);
        const int64_t c0 = cb * 128, c1 = std::min(cols, c0 + 128);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; r++)
          for (int64_t c = c0; c < c1; c++) amax = std::max(amax, std::fabs(g[r * cols + c]));
        const float scale = ncclext::fp8BlockScale(amax, false);
        (*s)[(o * rowBlocks + rb) * blocks + cb] = scale;
        for (int64_t r = r0; r < r1; r++)
          for (int64_t c = c0; c < c1; c++) (*q)[r * cols + c] = ncclext::floatToE4m3(g[r * cols + c] / scale);
      }
}

}  // namespace testing
}  // namespace ncclm2n
