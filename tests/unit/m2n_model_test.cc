// The m2n_plan tool's model configs and Megatron layout conventions; shipped configs plan and simulate.
#include <gtest/gtest.h>

#include "tests/unit/m2n_test_util.h"
#include "tools/m2n_plan/model.h"

namespace m2nplan {
namespace {

TEST(ModelConfig, ExpandsLayersAndExperts) {
  Model m;
  std::string err;
  ASSERT_TRUE(parseModelJson(R"({"name": "tiny", "num_layers": 2, "tensors": [
      {"name": "embed_tokens.weight", "shape": [10, 4]},
      {"name": "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight", "shape": [6, 4], "layers": [0, 2],
       "experts": 3, "dtype": "fp32"},
      {"name": "model.layers.1.extra.weight", "shape": [4]}]})", &m, &err)) << err;
  ASSERT_EQ(m.tensors.size(), 1u + 6u + 1u);
  EXPECT_EQ(m.tensors[5].name, "model.layers.1.mlp.experts.1.up_proj.weight");
  EXPECT_EQ(m.tensors[5].layer, 1);
  EXPECT_EQ(m.tensors[5].expert, 1);
  EXPECT_EQ(m.tensors[5].dtype, ncclFloat32);
  EXPECT_EQ(m.tensors[7].layer, 1);  // from the plain name
  EXPECT_EQ(m.expertsInLayer.at(1), 3);
}

TEST(ModelConfig, RejectsMalformedEntries) {
  Model m;
  std::string err;
  EXPECT_FALSE(parseModelJson("[1, 2]", &m, &err));
  EXPECT_FALSE(parseModelJson(R"({"tensors": [{"name": "a"}]})", &m, &err));
  EXPECT_FALSE(parseModelJson(R"({"tensors": [{"name": "a", "shape": [-1]}]})", &m, &err));
  EXPECT_FALSE(parseModelJson(R"({"tensors": [{"name": "a", "shape": [1], "dtype": "fp64x"}]})", &m, &err));
  EXPECT_NE(err.find("unknown dtype"), std::string::npos) << err;
  EXPECT_FALSE(parseModelJson(R"({"tensors": [{"name": "a{layer}", "shape": [1]}]})", &m, &err));
  EXPECT_NE(err.find("{layer} goes with"), std::string::npos) << err;
}

TEST(Parallel, ParsesAndChecks) {
  Parallel p;
  std::string err;
  ASSERT_TRUE(parseParallel("tp=4,pp=2,dp=4,ep=2", &p, &err)) << err;
  EXPECT_EQ(p.worldSize(), 32);
  EXPECT_FALSE(parseParallel("tp=4,dp=3,ep=2", &p, &err));
  EXPECT_NE(err.find("must divide"), std::string::npos) << err;
  EXPECT_FALSE(parseParallel("tp=0", &p, &err));
  EXPECT_FALSE(parseParallel("xp=2", &p, &err));
  EXPECT_FALSE(parseParallel("tp=2,etp=3", &p, &err));
}

TEST(Megatron, ColumnRowVocabAndReplicated) {
  EXPECT_EQ(shardingOf("model.layers.0.self_attn.q_proj.weight"), Sharding::kColumn);
  EXPECT_EQ(shardingOf("model.layers.0.mlp.down_proj.weight"), Sharding::kRow);
  EXPECT_EQ(shardingOf("model.layers.0.mlp.down_proj.bias"), Sharding::kReplicate);
  EXPECT_EQ(shardingOf("model.layers.0.self_attn.q_proj.bias"), Sharding::kColumn);
  EXPECT_EQ(shardingOf("model.embed_tokens.weight"), Sharding::kVocab);
  EXPECT_EQ(shardingOf("lm_head.weight"), Sharding::kVocab);
  EXPECT_EQ(shardingOf("model.layers.3.mlp.gate.weight"), Sharding::kReplicate);
  EXPECT_EQ(shardingOf("model.layers.0.self_attn.q_a_proj.weight"), Sharding::kReplicate);
  EXPECT_EQ(shardingOf("model.norm.weight"), Sharding::kReplicate);
}

TEST(Megatron, StagesAndExperts) {
  Model m;
  std::string err;
  ASSERT_TRUE(parseModelJson(R"({"num_layers": 4, "tensors": [
      {"name": "model.embed_tokens.weight", "shape": [16, 4]},
      {"name": "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight", "shape": [8, 4], "layers": [0, 4],
       "experts": 4},
      {"name": "lm_head.weight", "shape": [16, 4]}]})", &m, &err)) << err;
  Parallel par;
  ASSERT_TRUE(parseParallel("tp=2,pp=2,dp=4,ep=2", &par, &err));
  ncclm2n::Layout l;
  // Expert 3 of layer 2: stage 1 (ranks 8-15), EP index 1: dp indices 1 and 3, tp ranks 0-1.
  const TensorDesc& e = m.tensors[1 + 2 * 4 + 3];
  ASSERT_EQ(e.name, "model.layers.2.mlp.experts.3.up_proj.weight");
  ASSERT_TRUE(megatronLayout(m, e, par, &l, &err)) << err;
  EXPECT_EQ(l.mesh.ranks, (std::vector<int>{10, 11, 14, 15}));
  EXPECT_EQ(l.placements, (std::vector<int>{ncclm2n::kReplicate, 0}));
  ASSERT_TRUE(megatronLayout(m, m.tensors.back(), par, &l, &err));  // lm_head: last stage
  EXPECT_EQ(l.mesh.ranks.front(), 8);
  ASSERT_TRUE(megatronLayout(m, m.tensors.front(), par, &l, &err));  // embeddings: first stage
  EXPECT_EQ(l.mesh.ranks.front(), 0);
  ASSERT_TRUE(parseParallel("tp=2,dp=3,ep=3", &par, &err));
  EXPECT_FALSE(megatronLayout(m, e, par, &l, &err));
  EXPECT_NE(err.find("do not split"), std::string::npos) << err;
}

// The shipped configs' first layers, shrunk 64x per dim, planned between several layouts and simulated.
TEST(Megatron, ShippedConfigsPlanCorrectlyWhenShrunk) {
  for (const char* path : {"bench/configs/qwen3-32b.json", "bench/configs/deepseek-v3.json"}) {
    Model m;
    std::string err;
    ASSERT_TRUE(loadModel(std::string(NCCL_EXT_SOURCE_DIR) + "/" + path, &m, &err)) << err;
    std::vector<TensorDesc> keep;
    for (TensorDesc t : m.tensors) {
      if (t.layer > 3 && t.layer < m.numLayers - 1) continue;  // first layers, the last and extras
      if (t.expert >= 8) continue;
      for (int64_t& d : t.shape) d = std::max<int64_t>(1, d / 64);
      keep.push_back(t);
    }
    for (int l = 0; l < (int)m.expertsInLayer.size(); l++) m.expertsInLayer[l] = std::min(m.expertsInLayer[l], 8);
    m.tensors = keep;
    for (auto [s, d, colocated] : {std::tuple{"tp=2,pp=2,dp=2", "tp=4,dp=2", false},
                                   std::tuple{"tp=2,pp=2,dp=2,ep=2", "tp=1,dp=4,ep=4", true}}) {
      Parallel src, dst;
      ASSERT_TRUE(parseParallel(s, &src, &err) && parseParallel(d, &dst, &err)) << err;
      dst.firstRank = colocated ? 0 : src.worldSize();
      ncclm2n::Problem p;
      p.nRanks = colocated ? std::max(src.worldSize(), dst.worldSize()) : src.worldSize() + dst.worldSize();
      p.options.ranksPerDomain = 4;
      for (const TensorDesc& t : m.tensors) {
        ncclm2n::TensorPair tp{t.name, {}, {}};
        ASSERT_TRUE(megatronLayout(m, t, src, &tp.src, &err) && megatronLayout(m, t, dst, &tp.dst, &err)) << err;
        p.tensors.push_back(tp);
      }
      ncclm2n::SimulationResult r = ncclm2n::testing::planAndSimulate(p);
      EXPECT_TRUE(r.ok) << path << " " << s << " -> " << d << ": " << r.firstError;
    }
  }
}

}  // namespace
}  // namespace m2nplan
