// The M2N layout model and planner: hand-checked and named cases, validation, determinism, balance.
#include <chrono>

#include <gtest/gtest.h>

#include "tests/unit/m2n_test_util.h"

namespace ncclm2n {
namespace {

using testing::iota;
using testing::layout;
using testing::oneTensor;
using testing::planAndSimulate;

// An explicit layout on a 1-D mesh over `ranks`: boxes[i] = {offset..., shape...} of mesh position i.
Layout boxLayout(std::vector<int64_t> shape, std::vector<int> ranks, const std::vector<std::vector<int64_t>>& boxes) {
  Layout l = layout(std::move(shape), {(int)ranks.size()}, ranks, {});
  for (const std::vector<int64_t>& v : boxes) {
    Box b;
    b.ndims = l.ndims();
    for (int d = 0; d < b.ndims; d++) {
      b.offset[d] = v[d];
      b.shape[d] = v[b.ndims + d];
    }
    l.boxes.push_back(b);
  }
  return l;
}

TEST(Layout, ChunkFollowsTorchChunk) {
  // torch.chunk(arange(5), 4) -> sizes 2, 2, 1 and an empty fourth.
  EXPECT_EQ(chunkInterval({0, 5}, 4, 0).hi, 2);
  EXPECT_EQ(chunkInterval({0, 5}, 4, 2).lo, 4);
  EXPECT_EQ(chunkInterval({0, 5}, 4, 2).hi, 5);
  EXPECT_EQ(chunkInterval({0, 5}, 4, 3).lo, 5);
  EXPECT_EQ(chunkInterval({0, 5}, 4, 3).hi, 5);
  EXPECT_EQ(chunkInterval({10, 13}, 2, 1).lo, 12);
}

TEST(Layout, NestedShardsOfOneDimFollowMeshAxisOrder) {
  // Mesh 2x2, both axes Shard(0) of 8 rows: axis 0 halves, axis 1 halves each half (DTensor's order).
  Layout l = layout({8, 3}, {2, 2}, {0, 1, 2, 3}, {0, 0});
  ShardGrid g(l);
  EXPECT_EQ(g.numShards(), 4);
  for (int pos = 0; pos < 4; pos++) {
    EXPECT_EQ(g.boxOfPosition(pos).offset[0], 2 * pos) << pos;
    EXPECT_EQ(g.boxOfPosition(pos).shape[0], 2);
    EXPECT_EQ(g.boxOfPosition(pos).shape[1], 3);
  }
}

TEST(Layout, ReplicasShareAShard) {
  Layout l = layout({6}, {3, 2}, {5, 4, 3, 2, 1, 0}, {kReplicate, 0});
  ShardGrid g(l);
  ASSERT_EQ(g.numShards(), 2);
  EXPECT_EQ(g.replicas(0), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(g.replicas(1), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(g.localSpan(1), 3);
}

TEST(Layout, ValidationSaysWhatIsWrong) {
  std::string why;
  EXPECT_TRUE(validateLayout(layout({4, 4}, {2}, {0, 1}, {0}), 2, &why)) << why;
  EXPECT_FALSE(validateLayout(layout({4, 4}, {2}, {0, 2}, {0}), 2, &why));
  EXPECT_NE(why.find("out of [0, 2)"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({4, 4}, {2}, {1, 1}, {0}), 2, &why));
  EXPECT_NE(why.find("appears twice"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({4, 4}, {2}, {0, 1}, {2}), 2, &why));
  EXPECT_NE(why.find("shards dim 2"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({4, 4}, {2, 2}, {0, 1}, {0, 0}), 4, &why));
  EXPECT_NE(why.find("lists 2 ranks"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({4, 4}, {2}, {0, 1}, {0, 1}), 2, &why));
  EXPECT_NE(why.find("2 placements"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({int64_t(1) << 40, int64_t(1) << 40}, {1}, {0}, {0}), 1, &why));
  EXPECT_NE(why.find("overflows"), std::string::npos) << why;
  EXPECT_FALSE(validateLayout(layout({}, {1}, {0}, {kReplicate}), 1, &why));
  Layout bad = layout({4}, {1}, {0}, {kReplicate});
  bad.strides = {1, 1};
  EXPECT_FALSE(validateLayout(bad, 1, &why));
  EXPECT_NE(why.find("strides given"), std::string::npos) << why;
  bad.strides = {-1};
  EXPECT_FALSE(validateLayout(bad, 1, &why));
  Layout boxes = layout({4}, {2}, {0, 1}, {});
  boxes.boxes.resize(2);
  boxes.boxes[0].ndims = boxes.boxes[1].ndims = 1;
  boxes.boxes[0].shape[0] = 4;
  boxes.boxes[1].offset[0] = 3;
  boxes.boxes[1].shape[0] = 2;
  EXPECT_FALSE(validateLayout(boxes, 2, &why));
  EXPECT_NE(why.find("leaves the tensor"), std::string::npos) << why;
}

TEST(Problem, RejectsMismatchesAndAliasingDestinations) {
  std::string why;
  Problem p = oneTensor(layout({4, 4}, {2}, {0, 1}, {0}), layout({4, 5}, {2}, {0, 1}, {1}), 2);
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("global shapes differ"), std::string::npos) << why;
  p = oneTensor(layout({4, 4}, {2}, {0, 1}, {0}), layout({4, 4}, {2}, {0, 1}, {1}, ncclInt32), 2);
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("no conversion from NCCL type 9 to 2"), std::string::npos) << why;
  p = oneTensor(layout({4, 4}, {2}, {0, 1}, {0}), layout({4, 4}, {2}, {0, 1}, {1}, ncclFloat32), 2);
  EXPECT_TRUE(validateProblem(p, &why)) << why;  // bf16 -> fp32: converted in flight
  p = oneTensor(layout({4, 4}, {2}, {0, 1}, {0}, ncclFloat32), layout({4, 4}, {2}, {0, 1}, {1}), 2);
  EXPECT_TRUE(validateProblem(p, &why)) << why;  // fp32 -> bf16: converted in flight
  p = oneTensor(layout({4, 4}, {2}, {0, 1}, {0}, ncclInt32), layout({4, 4}, {2}, {0, 1}, {1}, ncclFloat32), 2);
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("no conversion from NCCL type 2 to 7"), std::string::npos) << why;
  Layout dst = layout({4, 4}, {1}, {1}, {kReplicate});
  dst.strides = {1, 1};  // element (i, j) and (i+1, j-1) collide
  p = oneTensor(layout({4, 4}, {1}, {0}, {kReplicate}), dst, 2);
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("map two elements to one address"), std::string::npos) << why;
  p = oneTensor(layout({4}, {1}, {0}, {0}), layout({4}, {1}, {1}, {0}), 2);
  p.options.domainOfRank = {0};
  EXPECT_FALSE(validateProblem(p, &why));
}

TEST(Problem, SourceBoxesMustHoldEveryDestinationElement) {
  // [0, 3) and [5, 8) of 8 on ranks 0-1, replicated on ranks 2-3: nobody holds elements 3-4 (they were never
  // written).
  std::string why;
  Problem p = oneTensor(boxLayout({8}, {0, 1}, {{0, 3}, {5, 3}}), layout({8}, {2}, {2, 3}, {kReplicate}), 4);
  p.tensors[0].name = "w";
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("tensor 0 (w): source boxes do not cover elements [3, 5) of dim 0, which destination mesh "
                     "position 0 (rank 2) needs"),
            std::string::npos)
      << why;
  // A destination box touching half the gap: the message names the part it needs.
  p.tensors[0].dst = boxLayout({8}, {2, 3}, {{0, 3}, {2, 2}});
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("elements [3, 4) of dim 0, which destination mesh position 1 (rank 3)"), std::string::npos) << why;
  // The gap is harmless where no destination box needs it.
  p.tensors[0].dst = boxLayout({8}, {2, 3}, {{0, 3}, {5, 3}});
  SimulationResult r = planAndSimulate(p);
  EXPECT_TRUE(r.ok) << r.firstError;
}

// Found by the C API fuzzer: 8-D explicit boxes cut as unit slabs at even offsets fragment the uncovered set as
// k^ndims (30 s and 4 GB for one tensor). Covered through a whole-tensor box, the answer is now immediate (largest
// boxes first); without it the check gives up after kMaxCoveragePieces pieces with an error, never a blow-up.
TEST(Problem, FragmentedExplicitSourcesAreCheckedQuicklyOrRefused) {
  constexpr int kDims = 8;
  std::vector<int64_t> shape(kDims, 16);
  std::vector<std::vector<int64_t>> boxes;
  for (int d = 0; d < kDims; d++)
    for (int64_t at = 0; at < 16; at += 2) {
      std::vector<int64_t> b(2 * kDims);
      for (int e = 0; e < kDims; e++) {
        b[e] = e == d ? at : 0;
        b[kDims + e] = e == d ? 1 : 16;
      }
      boxes.push_back(b);
    }
  for (int withWhole = 1; withWhole >= 0; withWhole--) {
    std::vector<std::vector<int64_t>> all = boxes;
    if (withWhole) {
      std::vector<int64_t> whole(2 * kDims, 0);
      for (int e = 0; e < kDims; e++) whole[kDims + e] = 16;
      all.push_back(whole);
    }
    const int n = (int)all.size();
    Problem p = oneTensor(boxLayout(shape, iota(0, n), all), layout(shape, {1}, {n}, {kReplicate}), n + 1);
    std::string why;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = validateProblem(p, &why);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0) << (withWhole ? "covered" : "with holes");
    if (withWhole) {
      EXPECT_TRUE(ok) << why;
    } else {
      EXPECT_FALSE(ok);
      EXPECT_NE(why.find("too fragmented"), std::string::npos) << why;
    }
  }
}

TEST(Problem, AHoleInTheMiddleOfA2dSourceIsReported) {
  // A ring of four boxes around [1, 3) x [1, 3) of a [4, 4] tensor; the destination shards dim 0 over ranks 4-5.
  const Layout ring = boxLayout({4, 4}, iota(0, 4), {{0, 0, 1, 4}, {3, 0, 1, 4}, {1, 0, 2, 1}, {1, 3, 2, 1}});
  std::string why;
  Problem p = oneTensor(ring, layout({4, 4}, {2}, {4, 5}, {0}), 6);
  EXPECT_FALSE(validateProblem(p, &why));
  EXPECT_NE(why.find("tensor 0 (t): source boxes do not cover the box at offset (1, 1) shape (1, 2), which "
                     "destination mesh position 0 (rank 4) needs"),
            std::string::npos)
      << why;
  // Rows 0 and 3 alone have every source.
  p.tensors[0].dst = boxLayout({4, 4}, {4, 5}, {{0, 0, 1, 4}, {3, 1, 1, 3}});
  SimulationResult r = planAndSimulate(p);
  EXPECT_TRUE(r.ok) << r.firstError;
}

TEST(Plan, SourceBoxesMayCoverOnlyTogether) {
  // Three boxes that are no grid tile a [4, 4] tensor: rows 0-1, then rows 2-3 split after column 0.
  Layout src = boxLayout({4, 4}, {0, 1, 2}, {{0, 0, 2, 4}, {2, 0, 2, 1}, {2, 1, 2, 3}});
  Problem p = oneTensor(src, layout({4, 4}, {2}, {3, 4}, {1}), 5);
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.totalBytes, 4 * 4 * 2);
}

TEST(Plan, OverlappingSourceBoxesDeliverEachElementOnce) {
  // Identical boxes are replicas: [0, 5) on ranks 0-1 and [5, 8) on ranks 2-3, gathered on ranks 4-5.
  Problem p = oneTensor(boxLayout({8}, iota(0, 4), {{0, 5}, {0, 5}, {5, 3}, {5, 3}}),
                        layout({8}, {2}, {4, 5}, {kReplicate}), 6);
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.totalBytes, 2 * 8 * 2);
  EXPECT_EQ(s.sendBytes, (std::vector<int64_t>{5 * 2, 5 * 2, 3 * 2, 3 * 2, 0, 0})) << "each replica serves once";
  // Boxes that overlap without being equal: rank 0 holds everything, rank 1 [0, 5), rank 2 [3, 8). Destination
  // Shard(0) over ranks 1-3 ([0, 3), [3, 6), [6, 8)): ranks 1 and 2 copy theirs locally, rank 3 receives once.
  p = oneTensor(boxLayout({8}, {0, 1, 2}, {{0, 8}, {0, 5}, {3, 5}}), layout({8}, {3}, {1, 2, 3}, {0}), 4);
  std::vector<RankPlan> plans;
  r = planAndSimulate(p, &plans, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.totalBytes, 8 * 2);
  EXPECT_EQ(s.localBytes, 6 * 2);
  EXPECT_EQ(plans[3].recvs.size(), 1u);
  // 2-D: rows [0, 3) and rows [2, 4) overlap in row 2; one rank gathers the whole tensor.
  p = oneTensor(boxLayout({4, 4}, {0, 1}, {{0, 0, 3, 4}, {2, 0, 2, 4}}), layout({4, 4}, {1}, {2}, {kReplicate}), 3);
  r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.totalBytes, 4 * 4 * 2);
}

TEST(Plan, Tp2ToTp4SameDimIsHandChecked) {
  // [8, 4] bf16, Shard(0) over ranks {0,1} -> Shard(0) over ranks {2,3,4,5}: dst k gets rows [2k, 2k+2) from
  // source k/2, as one contiguous run of 8 elements.
  Problem p = oneTensor(layout({8, 4}, {2}, {0, 1}, {0}), layout({8, 4}, {4}, {2, 3, 4, 5}, {0}), 6);
  std::vector<RankPlan> plans;
  PlanStats stats;
  SimulationResult r = planAndSimulate(p, &plans, &stats);
  ASSERT_TRUE(r.ok) << r.firstError;
  for (int k = 0; k < 4; k++) {
    const RankPlan& d = plans[2 + k];
    ASSERT_EQ(d.recvs.size(), 1u) << k;
    const Transfer& t = d.recvs[0];
    EXPECT_EQ(t.src, k / 2);
    EXPECT_EQ(t.srcOffset, (k % 2) * 8);
    EXPECT_EQ(t.dstOffset, 0);
    EXPECT_EQ(t.ndims, 1);
    EXPECT_EQ(t.extent[0], 8);
    EXPECT_EQ(t.contiguousRun(), 8);
  }
  EXPECT_EQ(stats.totalBytes, 8 * 4 * 2);
  EXPECT_EQ(stats.localBytes, 0);
  EXPECT_EQ(plans[0].sends.size(), 2u);
}

TEST(Plan, Shard0ToShard1IsAStridedAllToAll) {
  // [4, 6] on ranks {0,1}: Shard(0) -> Shard(1) co-located. Rank 0 keeps rows 0-1, cols 0-2 locally and sends
  // rows 0-1, cols 3-5 to rank 1: 2 runs of 3 elements.
  Problem p = oneTensor(layout({4, 6}, {2}, {0, 1}, {0}), layout({4, 6}, {2}, {0, 1}, {1}), 2);
  std::vector<RankPlan> plans;
  SimulationResult r = planAndSimulate(p, &plans);
  ASSERT_TRUE(r.ok) << r.firstError;
  ASSERT_EQ(plans[0].copies.size(), 1u);
  ASSERT_EQ(plans[0].sends.size(), 1u);
  const Transfer& t = plans[0].sends[0];
  EXPECT_EQ(t.dst, 1);
  EXPECT_EQ(t.srcOffset, 3);
  EXPECT_EQ(t.dstOffset, 0);
  ASSERT_EQ(t.ndims, 2);
  EXPECT_EQ(t.extent[0], 2);
  EXPECT_EQ(t.extent[1], 3);
  EXPECT_EQ(t.srcStride[0], 6);
  EXPECT_EQ(t.dstStride[0], 3);
  EXPECT_EQ(t.contiguousRun(), 3);
}

TEST(Plan, ReplicateToShardIsBalancedAcrossReplicas) {
  // 4 replicas -> Shard(0) over 4 other ranks: each replica serves exactly one destination.
  Problem p = oneTensor(layout({16, 8}, {4}, {0, 1, 2, 3}, {kReplicate}), layout({16, 8}, {4}, {4, 5, 6, 7}, {0}), 8);
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_DOUBLE_EQ(s.maxSourceLoad(), s.meanSourceLoad());
  for (int src = 0; src < 4; src++) EXPECT_EQ(s.sendBytes[src], 4 * 8 * 2);
}

TEST(Plan, ShardToReplicateGathersEverything) {
  Problem p = oneTensor(layout({10, 3}, {4}, {0, 1, 2, 3}, {0}), layout({10, 3}, {3}, {3, 4, 5}, {kReplicate}), 6);
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.totalBytes, 3 * 10 * 3 * 2);
  EXPECT_EQ(s.copyBytes[3], 1 * 3 * 2);  // rank 3 holds rows 9..9 (chunk 3 of 10 over 4) already
}

TEST(Plan, Dp2Tp2ToTp4) {
  // Source mesh [dp=2, tp=2] on ranks 0-3 with (Replicate, Shard(1)); destination tp=4 on ranks 4-7, Shard(1).
  Problem p = oneTensor(layout({6, 8}, {2, 2}, iota(0, 4), {kReplicate, 1}), layout({6, 8}, {4}, iota(4, 4), {1}), 8);
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_DOUBLE_EQ(s.maxSourceLoad(), s.meanSourceLoad()) << "both dp replicas serve";
}

TEST(Plan, PipelineStagesToTpDp) {
  // (PP2, TP2) trainer on ranks 0-3 -> (TP2, DP2) inference on ranks 4-7: a batch of 4 layers' weights, each
  // on its stage's mesh (stage = layer / 2), column- and row-parallel.
  Problem p;
  p.nRanks = 8;
  for (int layer = 0; layer < 4; layer++) {
    const int stage = layer / 2;
    const std::vector<int> stageRanks = {2 * stage, 2 * stage + 1};
    for (int kind = 0; kind < 2; kind++) {
      const int dim = kind;  // column-parallel shards dim 0, row-parallel dim 1
      p.tensors.push_back({"layer" + std::to_string(layer) + (kind ? ".row" : ".col"),
                           layout({12, 10}, {2}, stageRanks, {dim}),
                           layout({12, 10}, {2, 2}, {4, 5, 6, 7}, {dim, kReplicate})});
    }
  }
  SimulationResult r = planAndSimulate(p);
  EXPECT_TRUE(r.ok) << r.firstError;
  EXPECT_GT(r.elementsChecked, 0);
}

TEST(Plan, ExpertParallelMoeLayer8To4) {
  // 16 experts, each [6, 4] and whole: on the source expert e lives on rank e / 2 (EP=8, one-rank meshes), on
  // the destination on rank 8 + e / 4 (EP=4 over ranks 8-11).
  Problem p;
  p.nRanks = 12;
  for (int e = 0; e < 16; e++)
    p.tensors.push_back({"expert" + std::to_string(e), layout({6, 4}, {1}, {e / 2}, {kReplicate}),
                         layout({6, 4}, {1}, {8 + e / 4}, {kReplicate})});
  PlanStats s;
  SimulationResult r = planAndSimulate(p, nullptr, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  for (int d = 8; d < 12; d++) EXPECT_EQ(s.recvBytes[d], 4 * 6 * 4 * 2);
}

TEST(Plan, RankLocalDataIsCopiedNeverSent) {
  // Co-located: replicated on ranks 0-2 -> Shard(0) on the same ranks: every rank already holds its shard.
  Problem p = oneTensor(layout({9, 2}, {3}, {0, 1, 2}, {kReplicate}), layout({9, 2}, {3}, {2, 1, 0}, {0}), 3);
  std::vector<RankPlan> plans;
  PlanStats s;
  SimulationResult r = planAndSimulate(p, &plans, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(s.localBytes, s.totalBytes);
  for (const RankPlan& rp : plans) {
    EXPECT_TRUE(rp.sends.empty()) << "rank " << rp.rank;
    EXPECT_EQ(rp.copies.size(), 1u) << "rank " << rp.rank;
  }
}

TEST(Plan, PrefersTheSameDomain) {
  // Replicas on ranks 0 (domain 0) and 2 (domain 1); destinations 1 (domain 0) and 3 (domain 1).
  Problem p = oneTensor(layout({4}, {2}, {0, 2}, {kReplicate}), layout({4}, {2}, {1, 3}, {kReplicate}), 4, 2);
  std::vector<RankPlan> plans;
  PlanStats s;
  SimulationResult r = planAndSimulate(p, &plans, &s);
  ASSERT_TRUE(r.ok) << r.firstError;
  EXPECT_EQ(plans[1].recvs.at(0).src, 0);
  EXPECT_EQ(plans[3].recvs.at(0).src, 2);
  EXPECT_EQ(s.interDomainBytes, 0);
}

TEST(Plan, StridedLocalTensors) {
  // Destination stores its [4, 6] shard transposed (column-major) with padding; source rows padded to 8.
  Layout src = layout({4, 6}, {2}, {0, 1}, {0});
  src.strides = {8, 1, 8, 1};
  Layout dst = layout({4, 6}, {1}, {2}, {kReplicate});
  dst.strides = {1, 5};
  Problem p = oneTensor(src, dst, 3);
  SimulationResult r = planAndSimulate(p);
  EXPECT_TRUE(r.ok) << r.firstError;
}

TEST(Plan, EmptyTrailingShardsAndEmptyTensors) {
  Problem p = oneTensor(layout({3, 2}, {4}, iota(0, 4), {0}), layout({3, 2}, {2}, {4, 5}, {1}), 6);
  p.tensors.push_back({"empty", layout({0, 5}, {2}, {0, 1}, {0}), layout({0, 5}, {2}, {2, 3}, {1})});
  SimulationResult r = planAndSimulate(p);
  EXPECT_TRUE(r.ok) << r.firstError;
}

TEST(Plan, RankPlanMatchesTheGlobalPlanAndHashesAreStable) {
  Problem p = oneTensor(layout({9, 7}, {3}, {0, 1, 2}, {1}), layout({9, 7}, {2, 2}, {1, 2, 3, 4}, {0, 1}), 5);
  std::vector<RankPlan> all;
  PlanStats s1, s2;
  planAll(p, &all, &s1);
  for (int r = 0; r < 5; r++) {
    RankPlan mine;
    planRank(p, r, &mine, &s2);
    EXPECT_EQ(mine.sends.size(), all[r].sends.size());
    EXPECT_EQ(mine.recvs.size(), all[r].recvs.size());
    EXPECT_EQ(mine.copies.size(), all[r].copies.size());
    EXPECT_EQ(s1.planHash, s2.planHash);
    EXPECT_EQ(s1.metadataHash, s2.metadataHash);
  }
  Problem q = p;
  q.tensors[0].dst.placements = {1, 0};
  EXPECT_NE(metadataHash(p), metadataHash(q));
  PlanStats s3;
  planRank(q, 0, nullptr, &s3);
  EXPECT_NE(s1.planHash, s3.planHash);
}

TEST(Plan, NormalizeMergesContiguousDims) {
  Transfer t;
  t.ndims = 3;
  int64_t ext[3] = {2, 3, 4}, st[3] = {12, 4, 1};
  for (int d = 0; d < 3; d++) {
    t.extent[d] = ext[d];
    t.srcStride[d] = t.dstStride[d] = st[d];
  }
  normalizeTransfer(&t);
  EXPECT_EQ(t.ndims, 1);
  EXPECT_EQ(t.extent[0], 24);
  t = Transfer();
  t.ndims = 3;
  int64_t ext2[3] = {1, 3, 4}, ss2[3] = {99, 8, 1}, ds2[3] = {12, 4, 1};
  for (int d = 0; d < 3; d++) {
    t.extent[d] = ext2[d];
    t.srcStride[d] = ss2[d];
    t.dstStride[d] = ds2[d];
  }
  normalizeTransfer(&t);
  EXPECT_EQ(t.ndims, 2);  // the extent-1 dim is gone; rows of 4 stay apart on the source side
  EXPECT_EQ(t.contiguousRun(), 4);
}

}  // namespace
}  // namespace ncclm2n
