// ncclM2nReshard's plan cache (nccl_m2n/src/reshard.h): the key tells apart every layout and config that plans
// differently and nothing else, and the cache keeps the most recent plans in an order every rank reproduces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nccl_m2n/src/reshard.h"

namespace ncclm2n {
namespace {

// A [rows, cols] bf16 tensor on a mesh of `ranks` (1-D), Shard(dim) or boxes.
struct Side {
  int64_t shape[2];
  int dims[1];
  std::vector<int> ranks;
  int placements[1];
  std::vector<ncclM2nBox_t> boxes;
  std::vector<int64_t> strides;
  ncclM2nMesh_t mesh = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t layout = NCCL_M2N_LAYOUT_INITIALIZER;
  Side(int64_t rows, int64_t cols, int n, int placement) : shape{rows, cols}, dims{n}, placements{placement} {
    for (int r = 0; r < n; r++) ranks.push_back(r);
    point();
  }
  Side(const Side& o) { *this = o; }
  Side& operator=(const Side& o) {  // the copy's pointers point into the copy
    shape[0] = o.shape[0];
    shape[1] = o.shape[1];
    dims[0] = o.dims[0];
    ranks = o.ranks;
    placements[0] = o.placements[0];
    boxes = o.boxes;
    strides = o.strides;
    mesh = o.mesh;
    layout = o.layout;
    point();
    return *this;
  }
  void point() {
    mesh.ndims = 1;
    mesh.dims = dims;
    mesh.ranks = ranks.data();
    layout.ndims = 2;
    layout.globalShape = shape;
    layout.mesh = &mesh;
    layout.placements = placements;
    layout.boxes = boxes.empty() ? nullptr : boxes.data();
    layout.localStrides = strides.empty() ? nullptr : strides.data();
  }
};

std::string keyOf(const Side& src, const Side& dst, const ncclM2nExecConfig_t* config = nullptr,
                  const char* name = "w") {
  ncclM2nTensorSpec_t spec{name, &src.layout, &dst.layout};
  return reshardKey(spec, config);
}

TEST(M2nReshardCache, TheKeyTellsApartWhatPlansDifferently) {
  const Side a(64, 32, 2, 0), b(64, 32, 2, 1);
  const std::string base = keyOf(a, b);
  EXPECT_EQ(keyOf(a, b, nullptr, "another name"), base);  // names only name
  const ncclM2nExecConfig_t init = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  EXPECT_EQ(keyOf(a, b, &init), base);  // NULL is the initializer's config
  EXPECT_NE(keyOf(b, a), base);         // the direction
  std::vector<std::string> keys{base};
  auto differs = [&](const Side& s, const Side& d, const ncclM2nExecConfig_t* c, const char* what) {
    const std::string k = keyOf(s, d, c);
    for (const std::string& seen : keys) EXPECT_NE(k, seen) << what;
    keys.push_back(k);
  };
  Side s = a;
  s.shape[0] = 65;
  differs(s, b, nullptr, "global shape");
  s = a;
  s.layout.dtype = ncclFloat32;
  differs(s, b, nullptr, "dtype");
  s = a;
  s.ranks = {1, 0};
  s.point();
  differs(s, b, nullptr, "mesh ranks");
  Side wide(64, 32, 4, 0);
  differs(wide, b, nullptr, "mesh size");
  s = a;
  s.strides = {32, 1, 64, 1};
  s.point();
  differs(s, b, nullptr, "local strides");
  s = a;
  s.boxes = {ncclM2nBox_t{{0, 0}, {32, 32}}, ncclM2nBox_t{{32, 0}, {32, 32}}};
  s.point();
  differs(s, b, nullptr, "boxes");
  Side t = s;
  t.placements[0] = 1;        // ignored beside boxes
  t.boxes[0].offset[5] = 99;  // past ndims: unused
  t.point();
  EXPECT_EQ(keyOf(t, b), keys.back());
  t.boxes[1].offset[0] = 31;
  t.boxes[1].shape[0] = 33;
  t.point();
  differs(t, b, nullptr, "a box");
  ncclM2nExecConfig_t c = init;
  c.stagingBytes = 1 << 20;
  differs(a, b, &c, "stagingBytes");
  c = init;
  c.timeoutSeconds = 5;
  differs(a, b, &c, "timeoutSeconds");
  c = init;
  c.fp8BlockRows = 128;
  differs(a, b, &c, "fp8BlockRows");
  c = init;
  c.lsa = 1;
  differs(a, b, &c, "lsa");
  c.zeroCopy = NCCL_M2N_ZERO_COPY_PULL;
  differs(a, b, &c, "zeroCopy");
}

TEST(M2nReshardCache, KeepsTheMostRecentlyUsedAndHandsBackTheRest) {
  RecentPlans<int> plans(3);
  EXPECT_TRUE(plans.add("a", 1).empty());
  EXPECT_TRUE(plans.add("b", 2).empty());
  EXPECT_TRUE(plans.add("c", 3).empty());
  ASSERT_NE(plans.find("a"), nullptr);  // a is now the most recent: b is the oldest
  EXPECT_EQ(*plans.find("a"), 1);
  EXPECT_EQ(plans.add("d", 4), std::vector<int>{2});
  EXPECT_EQ(plans.find("b"), nullptr);
  int out = 0;
  EXPECT_TRUE(plans.take("c", &out));
  EXPECT_EQ(out, 3);
  EXPECT_FALSE(plans.take("c", &out));
  EXPECT_EQ(plans.takeAll(), (std::vector<int>{4, 1}));
  EXPECT_EQ(plans.size(), 0u);
  // Two ranks that make the same calls evict the same plans at the same calls (capacity kReshardPlans).
  RecentPlans<int> r0, r1;
  for (int call = 0; call < 200; call++) {
    const std::string k = std::to_string((call * 7919) % 13);
    const bool hit0 = r0.find(k) != nullptr, hit1 = r1.find(k) != nullptr;
    ASSERT_EQ(hit0, hit1);
    if (!hit0) {
      ASSERT_EQ(r0.add(k, call), r1.add(k, call));
    }
  }
}

}  // namespace
}  // namespace ncclm2n
