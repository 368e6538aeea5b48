// nccl_m2n's public C API for layouts and host plans: every rejection comes back as a code and a message.
#include <string>

#include <gtest/gtest.h>

#include "nccl_m2n.h"
#include "nccl_m2n_testing.h"

namespace {

struct TwoRankTp {
  int dims[1] = {2};
  int ranks[2] = {0, 1};
  int ranks2[2] = {2, 3};
  int64_t shape[2] = {8, 4};
  int shard0[1] = {NCCL_M2N_SHARD(0)};
  int shard1[1] = {NCCL_M2N_SHARD(1)};
  ncclM2nMesh_t srcMesh = NCCL_M2N_MESH_INITIALIZER, dstMesh = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t src = NCCL_M2N_LAYOUT_INITIALIZER, dst = NCCL_M2N_LAYOUT_INITIALIZER;
  ncclM2nTensorSpec_t spec;
  ncclM2nPlanConfig_t cfg = NCCL_M2N_PLAN_CONFIG_INITIALIZER;
  TwoRankTp() {
    srcMesh.ndims = dstMesh.ndims = 1;
    srcMesh.dims = dstMesh.dims = dims;
    srcMesh.ranks = ranks;
    dstMesh.ranks = ranks2;
    for (ncclM2nLayout_t* l : {&src, &dst}) {
      l->ndims = 2;
      l->globalShape = shape;
      l->dtype = ncclBfloat16;
    }
    src.mesh = &srcMesh;
    src.placements = shard0;
    dst.mesh = &dstMesh;
    dst.placements = shard1;
    spec.name = "w";
    spec.src = &src;
    spec.dst = &dst;
    cfg.nRanks = 4;
  }
};

bool says(const char* part) { return std::string(ncclM2nGetLastError()).find(part) != std::string::npos; }

TEST(M2nApi, PlansAndReportsTransfers) {
  TwoRankTp t;
  ncclM2nHostPlan_t plan = nullptr;
  ASSERT_EQ(ncclM2nHostPlanCreate(&plan, 2, 1, &t.spec, &t.cfg), ncclSuccess) << ncclM2nGetLastError();
  ncclM2nPlanInfo_t info;
  ASSERT_EQ(ncclM2nHostPlanGetInfo(plan, &info), ncclSuccess);
  EXPECT_EQ(info.counts[ncclM2nRecvs], 2);  // rank 2 holds columns 0-1 of all 8 rows: 4 rows from each source
  EXPECT_EQ(info.bytes[ncclM2nRecvs], 8 * 2 * 2);
  EXPECT_EQ(info.counts[ncclM2nSends], 0);
  EXPECT_EQ(info.totalBytes, 8 * 4 * 2);
  const ncclM2nTransfer_t* list = nullptr;
  int64_t n = 0;
  ASSERT_EQ(ncclM2nHostPlanGetTransfers(plan, ncclM2nRecvs, &list, &n), ncclSuccess);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(list[1].srcRank, 1);
  EXPECT_EQ(list[1].dstOffset, 8);  // rows 4-7 of a [8, 2] local tensor
  EXPECT_EQ(list[1].ndims, 2);
  EXPECT_EQ(list[1].srcStride[0], 4);
  EXPECT_EQ(list[1].dstStride[0], 2);
  ncclM2nHostPlan_t again = nullptr;
  ASSERT_EQ(ncclM2nHostPlanCreate(&again, 0, 1, &t.spec, &t.cfg), ncclSuccess);
  ncclM2nPlanInfo_t info0;
  ncclM2nHostPlanGetInfo(again, &info0);
  EXPECT_EQ(info0.metadataHash, info.metadataHash);
  EXPECT_EQ(info0.planHash, info.planHash);
  EXPECT_EQ(ncclM2nHostPlanDestroy(again), ncclSuccess);
  EXPECT_EQ(ncclM2nHostPlanDestroy(plan), ncclSuccess);
  EXPECT_EQ(ncclM2nHostPlanDestroy(nullptr), ncclSuccess);
}

TEST(M2nApi, RejectsBadInputWithAMessage) {
  ncclM2nHostPlan_t plan = nullptr;
  {
    TwoRankTp t;
    EXPECT_EQ(ncclM2nHostPlanCreate(nullptr, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 4, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("rank 4 not in [0, 4)")) << ncclM2nGetLastError();
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, nullptr, &t.cfg), ncclInvalidArgument);
  }
  {
    TwoRankTp t;
    t.cfg.magic = 0;
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("NCCL_M2N_PLAN_CONFIG_INITIALIZER")) << ncclM2nGetLastError();
  }
  {
    TwoRankTp t;
    t.src.size = 8;
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("NCCL_M2N_LAYOUT_INITIALIZER")) << ncclM2nGetLastError();
  }
  {
    TwoRankTp t;
    t.ranks2[1] = 9;  // beyond the communicator
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("tensor 0 (w): destination layout: mesh rank 9 out of [0, 4)")) << ncclM2nGetLastError();
  }
  {
    TwoRankTp t;
    t.shard1[0] = 5;
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("shards dim 5")) << ncclM2nGetLastError();
  }
  {
    TwoRankTp t;
    t.dst.placements = nullptr;
    EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 0, 1, &t.spec, &t.cfg), ncclInvalidArgument);
    EXPECT_TRUE(says("placements is NULL")) << ncclM2nGetLastError();
  }
  {
    TwoRankTp t;
    t.srcMesh.ndims = 9;
    EXPECT_EQ(ncclM2nLayoutValidate(&t.src, 4), ncclInvalidArgument);
    EXPECT_TRUE(says("mesh: rank 9")) << ncclM2nGetLastError();
    t.srcMesh.ndims = 1;
    t.ranks[1] = 0;
    EXPECT_EQ(ncclM2nLayoutValidate(&t.src, 4), ncclInvalidArgument);
    EXPECT_TRUE(says("appears twice")) << ncclM2nGetLastError();
    t.ranks[1] = 1;
    EXPECT_EQ(ncclM2nLayoutValidate(&t.src, 4), ncclSuccess);
    EXPECT_EQ(ncclM2nLayoutValidate(nullptr, 4), ncclInvalidArgument);
  }
  EXPECT_EQ(plan, nullptr);
  EXPECT_EQ(ncclM2nHostPlanGetInfo(nullptr, nullptr), ncclInvalidArgument);
}

TEST(M2nApi, RejectsSourceBoxesThatLeaveADestinationElementWithoutSource) {
  // Length 8, source boxes [0, 3) and [5, 8) on ranks 0-1, replicated on ranks 2-3: elements 3-4 have no source.
  int dims[1] = {2}, srcRanks[2] = {0, 1}, dstRanks[2] = {2, 3}, replicate[1] = {NCCL_M2N_REPLICATE};
  int64_t shape[1] = {8};
  ncclM2nBox_t boxes[2] = {};
  boxes[0].shape[0] = 3;
  boxes[1].offset[0] = 5;
  boxes[1].shape[0] = 3;
  ncclM2nMesh_t srcMesh = NCCL_M2N_MESH_INITIALIZER, dstMesh = NCCL_M2N_MESH_INITIALIZER;
  srcMesh.ndims = dstMesh.ndims = 1;
  srcMesh.dims = dstMesh.dims = dims;
  srcMesh.ranks = srcRanks;
  dstMesh.ranks = dstRanks;
  ncclM2nLayout_t src = NCCL_M2N_LAYOUT_INITIALIZER, dst = NCCL_M2N_LAYOUT_INITIALIZER;
  for (ncclM2nLayout_t* l : {&src, &dst}) {
    l->ndims = 1;
    l->globalShape = shape;
  }
  src.mesh = &srcMesh;
  src.boxes = boxes;
  dst.mesh = &dstMesh;
  dst.placements = replicate;
  ncclM2nTensorSpec_t spec = {"w", &src, &dst};
  ncclM2nPlanConfig_t cfg = NCCL_M2N_PLAN_CONFIG_INITIALIZER;
  cfg.nRanks = 4;
  EXPECT_EQ(ncclM2nLayoutValidate(&src, 4), ncclSuccess) << "a source layout alone may leave gaps";
  ncclM2nHostPlan_t plan = nullptr;
  EXPECT_EQ(ncclM2nHostPlanCreate(&plan, 2, 1, &spec, &cfg), ncclInvalidArgument);
  EXPECT_TRUE(says("tensor 0 (w): source boxes do not cover elements [3, 5) of dim 0")) << ncclM2nGetLastError();
  EXPECT_EQ(plan, nullptr);
  boxes[1].offset[0] = 3;  // [3, 8): now they cover
  boxes[1].shape[0] = 5;
  ASSERT_EQ(ncclM2nHostPlanCreate(&plan, 2, 1, &spec, &cfg), ncclSuccess) << ncclM2nGetLastError();
  ncclM2nPlanInfo_t info;
  ASSERT_EQ(ncclM2nHostPlanGetInfo(plan, &info), ncclSuccess);
  EXPECT_EQ(info.bytes[ncclM2nRecvs], 8 * 2);
  EXPECT_EQ(ncclM2nHostPlanDestroy(plan), ncclSuccess);
}

TEST(M2nApi, ExecConfigLsaAndTestingConfigAreChecked) {
  // The checks come before the communicator is touched, so a stand-in handle serves on a machine without a GPU.
  TwoRankTp t;
  ncclComm_t notAComm = reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(0x10));
  ncclM2nPlan_t plan = nullptr;
  ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  EXPECT_EQ(cfg.lsa, 0);
  cfg.lsa = 2;
  EXPECT_EQ(ncclM2nPlanCreate(&plan, notAComm, 1, &t.spec, &cfg), ncclInvalidArgument);
  EXPECT_TRUE(says("lsa 2: 0 or 1")) << ncclM2nGetLastError();
  cfg.lsa = 0;
  ncclM2nTestingConfig_t testing = NCCL_M2N_TESTING_CONFIG_INITIALIZER;
  EXPECT_EQ(testing.virtualDomain, nullptr);
  testing.virtualRank = 1;
  EXPECT_EQ(ncclM2nPlanCreateTesting(&plan, notAComm, 1, &t.spec, &cfg, &testing), ncclInvalidArgument);
  EXPECT_TRUE(says("virtualRank 1 without a virtualDomain")) << ncclM2nGetLastError();
  testing.virtualRank = 0;
  testing.size = sizeof(testing) - 4;
  EXPECT_EQ(ncclM2nPlanCreateTesting(&plan, notAComm, 1, &t.spec, &cfg, &testing), ncclInvalidArgument);
  EXPECT_TRUE(says("NCCL_M2N_TESTING_CONFIG_INITIALIZER")) << ncclM2nGetLastError();
  EXPECT_EQ(plan, nullptr);
  ncclM2nVirtualDomain_t vd = nullptr;
  EXPECT_EQ(ncclM2nVirtualDomainCreate(&vd, 0), ncclInvalidArgument);
  EXPECT_TRUE(says("0 ranks not in [1, 8]")) << ncclM2nGetLastError();
  EXPECT_EQ(ncclM2nVirtualDomainCreate(&vd, 9), ncclInvalidArgument);
  EXPECT_EQ(ncclM2nVirtualDomainCreate(nullptr, 2), ncclInvalidArgument);
  ASSERT_EQ(ncclM2nVirtualDomainCreate(&vd, 4), ncclSuccess);
  EXPECT_NE(vd, nullptr);
  EXPECT_EQ(ncclM2nVirtualDomainDestroy(vd), ncclSuccess);
  EXPECT_EQ(ncclM2nPlanDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclM2nPlanSetStageHookTesting(nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("ncclM2nPlanSetStageHookTesting: plan is NULL")) << ncclM2nGetLastError();
}

TEST(M2nApi, ZeroCopyFieldsAndRegistrationArgumentsAreChecked) {
  TwoRankTp t;
  ncclComm_t notAComm = reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(0x10));
  ncclM2nPlan_t plan = nullptr;
  ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  EXPECT_EQ(cfg.zeroCopy, NCCL_M2N_ZERO_COPY_OFF);
  cfg.zeroCopy = 3;
  EXPECT_EQ(ncclM2nPlanCreate(&plan, notAComm, 1, &t.spec, &cfg), ncclInvalidArgument);
  EXPECT_TRUE(says("zeroCopy 3: NCCL_M2N_ZERO_COPY_OFF, _PULL or _PUSH")) << ncclM2nGetLastError();
  cfg.zeroCopy = NCCL_M2N_ZERO_COPY_PULL;  // lsa 0
  EXPECT_EQ(ncclM2nPlanCreate(&plan, notAComm, 1, &t.spec, &cfg), ncclInvalidArgument);
  EXPECT_TRUE(says("zeroCopy 1 needs lsa = 1")) << ncclM2nGetLastError();
  EXPECT_EQ(plan, nullptr);
  ncclM2nRegistration_t reg = reinterpret_cast<ncclM2nRegistration_t>(static_cast<uintptr_t>(0x20));
  EXPECT_EQ(ncclM2nRegister(nullptr, reinterpret_cast<void*>(0x1000), 4096, &reg), ncclInvalidArgument);
  EXPECT_EQ(reg, nullptr);
  EXPECT_TRUE(says("comm is NULL")) << ncclM2nGetLastError();
  EXPECT_EQ(ncclM2nRegister(notAComm, nullptr, 4096, &reg), ncclInvalidArgument);
  EXPECT_TRUE(says("buffer (nil) of 4096 bytes")) << ncclM2nGetLastError();
  EXPECT_EQ(ncclM2nRegister(notAComm, reinterpret_cast<void*>(0x1000), 4096, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclM2nDeregister(nullptr), ncclInvalidArgument);
}

}  // namespace
