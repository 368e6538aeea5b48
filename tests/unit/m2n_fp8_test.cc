// fp8 e4m3 with one fp32 scale per 128 columns (nccl_m2n/src/quantize.h): the batch rules, the derived scales
// layouts, and end to end on the host. Every rank quantises its source part with move.h's quantizeBlock (the
// kernel's own code) into a scratch image, the rewritten batch is planned for every rank and its transfers applied
// element by element, and every destination value and scale must equal the global tensor quantised block by block
// with numeric.h's fp8QuantizeRow (an independent path: whole blocks, a short last block padded with zeros).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "common/numeric.h"
#include "nccl_m2n/src/move.h"
#include "nccl_m2n/src/quantize.h"
#include "tests/unit/m2n_elements.h"
#include "tests/unit/m2n_test_util.h"

namespace ncclm2n {
namespace {

using testing::layout;

constexpr int kRanks = 4;

int positionOf(const Mesh& m, int rank) {
  for (int i = 0; i < m.size(); i++)
    if (m.ranks[i] == rank) return i;
  return -1;
}

// A batch of one quantised tensor: the tensor, then its scales entry (no layouts: isScales).
Problem fp8Batch(const Layout& src, Layout dst, std::vector<char>* isScales) {
  dst.dtype = ncclFloat8e4m3;
  Problem p = testing::oneTensor(src, dst, kRanks);
  p.tensors.push_back({"t.scales", Layout(), Layout()});
  *isScales = {0, 1};
  return p;
}

// Row-major global elements as floats (rounded to the source dtype).
std::vector<float> globalValues(const Layout& src, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> v(product(src.globalShape.data(), src.ndims()));
  for (size_t i = 0; i < v.size(); i++) {
    float x = n(rng) * (i % 257 == 0 ? 100.0f : 1.0f);  // a few outliers: blocks of different scales
    if (i % 911 == 0) x = 0.0f;
    v[i] = src.dtype == ncclBfloat16 ? ncclext::bf16ToFloat(ncclext::floatToBf16(x)) : x;
  }
  return v;
}

// One rank's local buffer of tensor t on one side: bytes at the position's strides.
using Buffers = std::map<std::pair<int, int>, std::vector<char>>;  // (rank, tensor) -> bytes

// Runs the rewritten batch on the host; returns the number of wrong destination bytes (values and scales).
int64_t runOnHost(const Layout& userSrc, const Layout& userDst, int blockRows, uint64_t seed, std::string* why) {
  std::vector<char> isScales;
  Problem p = fp8Batch(userSrc, userDst, &isScales);
  std::vector<Fp8Tensor> fp8;
  if (!rewriteFp8(&p, isScales, blockRows, &fp8, why) || !validateProblem(p, why)) return -1;
  const std::vector<float> g = globalValues(userSrc, seed);
  std::vector<uint8_t> wantQ;
  std::vector<float> wantS;
  testing::fp8Reference(g, userSrc.globalShape, blockRows, &wantQ, &wantS);

  // Each rank: its caller-side source part (user strides), quantised into its scratch.
  Buffers src, dst;
  const ShardGrid ug(userSrc);
  for (int r = 0; r < kRanks; r++) {
    int64_t scratchBytes = 0;
    const std::vector<QuantDesc> qd = quantDescs(fp8, r, &scratchBytes);
    const int pos = positionOf(userSrc.mesh, r);
    if (pos < 0) {
      EXPECT_TRUE(qd.empty());
      continue;
    }
    const int64_t eb = (int64_t)elementSize(userSrc.dtype);
    std::vector<char> part(std::max<int64_t>(ug.localSpan(pos), 1) * eb);
    testing::forEachElement(ug, pos, userSrc.ndims(), [&](const int64_t* gi, int64_t off) {
      testing::storeFloat(g[testing::globalLinear(userSrc, gi)], (int)eb, &part[off * eb]);
    });
    std::vector<char> scratch(std::max<int64_t>(scratchBytes, 1), (char)0x55);
    for (const QuantDesc& q : qd)
      for (int64_t b = 0; b < q.blocks; b++) quantizeBlock(q, b, part.data(), scratch.data());
    if (qd.empty()) continue;  // an empty part
    // The moves read the scratch as tensors 0 (values, dense) and 1 (scales, dense).
    src[{r, 0}].assign(scratch.begin() + qd[0].valuesOffset, scratch.begin() + qd[0].scalesOffset);
    src[{r, 1}].assign(scratch.begin() + qd[0].scalesOffset, scratch.end());
  }
  for (int t = 0; t < 2; t++) {
    const Layout& d = p.tensors[t].dst;
    const ShardGrid dg(d);
    for (int pos = 0; pos < d.mesh.size(); pos++)
      dst[{d.mesh.ranks[pos], t}].assign(std::max<int64_t>(dg.localSpan(pos), 1) * elementSize(d.dtype), (char)0xff);
  }
  // Every rank's transfers, element by element (the executor's moves are the emulator's business).
  std::vector<RankPlan> plans;
  PlanStats stats;
  planAll(p, &plans, &stats);
  for (const RankPlan& rp : plans)
    for (const std::vector<Transfer>* list : {&rp.sends, &rp.copies})
      for (const Transfer& t : *list) {
        const int64_t eb = (int64_t)elementSize(p.tensors[t.tensor].dst.dtype);
        const std::vector<char>& from = src[{t.src, (int)t.tensor}];
        std::vector<char>& to = dst[{t.dst, (int)t.tensor}];
        for (int64_t e = 0; e < t.elements(); e++) {
          int64_t rem = e, so = t.srcOffset, dof = t.dstOffset;
          for (int k = t.ndims - 1; k >= 0; k--) {
            so += (rem % t.extent[k]) * t.srcStride[k];
            dof += (rem % t.extent[k]) * t.dstStride[k];
            rem /= t.extent[k];
          }
          if ((so + 1) * eb > (int64_t)from.size() || (dof + 1) * eb > (int64_t)to.size()) return 1 << 30;
          memcpy(&to[dof * eb], &from[so * eb], eb);
        }
      }
  int64_t bad = 0;
  for (int t = 0; t < 2; t++) {
    const Layout& d = p.tensors[t].dst;
    const ShardGrid dg(d);
    for (int pos = 0; pos < d.mesh.size(); pos++) {
      const std::vector<char>& h = dst[{d.mesh.ranks[pos], t}];
      testing::forEachElement(dg, pos, d.ndims(), [&](const int64_t* gi, int64_t off) {
        const int64_t lin = testing::globalLinear(d, gi);
        if (t == 0)
          bad += (uint8_t)h[off] != wantQ[lin];
        else
          bad += memcmp(&h[off * 4], &wantS[lin], 4) != 0;
      });
    }
  }
  return bad;
}

// blockRows 1 (rows of 128 columns) and 128 (128 x 128 weight blocks).
class M2nFp8Blocks : public ::testing::TestWithParam<int> {};

TEST_P(M2nFp8Blocks, QuantisedTensorsArriveAsTheGlobalTensorQuantisedBlockByBlock) {
  const int blockRows = GetParam();
  int accepted = 0, refused = 0;
  const std::vector<std::vector<int64_t>> shapes =
      blockRows == 1 ? std::vector<std::vector<int64_t>>{{3, 256}, {5, 300}, {2, 3, 640}, {4, 128}, {1, 700}, {6, 1024}}
                     : std::vector<std::vector<int64_t>>{{256, 256}, {300, 200}, {2, 256, 384}, {512, 128}, {130, 700}};
  uint64_t seed = 1;
  for (const auto& shape : shapes)
    for (ncclDataType_t dt : {ncclBfloat16, ncclFloat32}) {
      const int last = (int)shape.size() - 1;
      std::vector<Layout> srcs = {layout(shape, {2}, {0, 1}, {0}, dt), layout(shape, {4}, {0, 1, 2, 3}, {last}, dt),
                                  layout(shape, {1}, {2}, {kReplicate}, dt),
                                  layout(shape, {2, 2}, {0, 1, 2, 3}, {0, last}, dt)};
      // A strided source: each position's part stored column-major.
      Layout strided = layout(shape, {2}, {1, 3}, {0}, dt);
      if (shape.size() == 2) {
        const ShardGrid sg(strided);
        for (int pos = 0; pos < 2; pos++) {
          const Box& b = sg.boxOfPosition(pos);
          strided.strides.insert(strided.strides.end(), {1, std::max<int64_t>(1, b.shape[0])});
        }
        srcs.push_back(strided);
      }
      const std::vector<Layout> dsts = {layout(shape, {2}, {2, 3}, {0}), layout(shape, {4}, {0, 1, 2, 3}, {kReplicate}),
                                        layout(shape, {4}, {3, 2, 1, 0}, {last}), layout(shape, {1}, {1}, {0})};
      for (const Layout& s : srcs)
        for (const Layout& d : dsts) {
          std::string why;
          const int64_t bad = runOnHost(s, d, blockRows, seed++, &why);
          if (bad < 0) {
            EXPECT_NE(why.find("whole blocks"), std::string::npos) << why;
            refused++;
            continue;
          }
          EXPECT_EQ(bad, 0) << "shape " << shape.size() << "-D, last " << shape.back() << ", seed " << seed - 1;
          accepted++;
        }
    }
  printf("fp8 %d x 128: %d layout pairs quantised, moved and checked, %d refused (parts off the block grid)\n",
         blockRows, accepted, refused);
  EXPECT_GT(accepted, blockRows == 1 ? 80 : 40);
  EXPECT_GT(refused, 10);
}

INSTANTIATE_TEST_SUITE_P(Rows, M2nFp8Blocks, ::testing::Values(1, 128));

TEST(M2nFp8, TheBatchRulesNameTheTensor) {
  const Layout src = layout({4, 256}, {2}, {0, 1}, {0});
  std::vector<char> isScales;
  std::vector<Fp8Tensor> fp8;
  std::string why;
  // No scales entry after the quantised tensor.
  Layout d = layout({4, 256}, {2}, {2, 3}, {0}, ncclFloat8e4m3);
  Problem p = testing::oneTensor(src, d, kRanks);
  EXPECT_FALSE(rewriteFp8(&p, {0}, 1, &fp8, &why));
  EXPECT_NE(why.find("tensor 0 (t) is quantised to fp8 e4m3: the next entry must be its scales"), std::string::npos)
      << why;
  // A scales entry after a tensor that is not quantised.
  p = testing::oneTensor(src, layout({4, 256}, {2}, {2, 3}, {0}), kRanks);
  p.tensors.push_back({"s", Layout(), Layout()});
  EXPECT_FALSE(rewriteFp8(&p, {0, 1}, 1, &fp8, &why));
  EXPECT_NE(why.find("tensor 1 (s) has neither layout"), std::string::npos) << why;
  // Columns off the grid: Shard(1) of 300 columns over 2 ranks (150 each).
  p = fp8Batch(src, layout({4, 300}, {2}, {2, 3}, {1}), &isScales);
  p.tensors[0].src = layout({4, 300}, {2}, {0, 1}, {0});
  EXPECT_FALSE(rewriteFp8(&p, isScales, 1, &fp8, &why));
  EXPECT_NE(why.find("destination position 0 (rank 2) holds columns [0, 150)"), std::string::npos) << why;
  // 128 x 128 blocks: rows off the grid (200 rows over 2 ranks: 100 each), and a tensor of one dim.
  p = fp8Batch(layout({200, 256}, {1}, {0}, {kReplicate}), layout({200, 256}, {2}, {2, 3}, {0}), &isScales);
  EXPECT_FALSE(rewriteFp8(&p, isScales, 128, &fp8, &why));
  EXPECT_NE(why.find("blocks of 128 x 128, but its destination position 0 (rank 2) holds rows [0, 100)"),
            std::string::npos)
      << why;
  p = fp8Batch(layout({256}, {1}, {0}, {kReplicate}), layout({256}, {1}, {1}, {kReplicate}), &isScales);
  EXPECT_FALSE(rewriteFp8(&p, isScales, 128, &fp8, &why));
  EXPECT_NE(why.find("which needs two dims"), std::string::npos) << why;
  // The scales layout of explicit parts [0, 640) and [640, 700): blocks [0, 5) and [5, 6).
  Layout e = layout({2, 700}, {2}, {0, 1}, {});
  Box a, b;
  a.ndims = b.ndims = 2;
  a.shape[0] = b.shape[0] = 2;
  a.shape[1] = 640;
  b.offset[1] = 640;
  b.shape[1] = 60;
  e.boxes = {a, b};
  const Layout s = scalesLayout(e);
  ASSERT_EQ(s.boxes.size(), 2u);
  EXPECT_EQ(s.globalShape, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(s.boxes[0].offset[1], 0);
  EXPECT_EQ(s.boxes[0].shape[1], 5);
  EXPECT_EQ(s.boxes[1].offset[1], 5);
  EXPECT_EQ(s.boxes[1].shape[1], 1);
  EXPECT_EQ(s.dtype, ncclFloat32);
}

}  // namespace
}  // namespace ncclm2n
