// nccl_ep's public entry points reject bad input with a code and a message, without a GPU: group creation checks
// its config before touching the communicator, and handle/dispatch/combine checks run on a group and handle
// assembled here by hand (no device memory: every case below fails before any CUDA call).
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/topology.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "tests/harness/ep_tensor.h"

namespace {

bool says(const char* part) { return std::string(ncclEpGetLastError()).find(part) != std::string::npos; }

// A struct as a program built against an older header passes it: `now`'s first `size` bytes, that size in its header,
// and garbage (0x5a) in what lies past it, which this library must not read as its newer fields.
template <typename T>
struct OlderLayout {
  T s;
  char pad[64];
  OlderLayout(const T& now, size_t size) {
    std::memset(static_cast<void*>(this), 0x5a, sizeof(*this));
    std::memcpy(static_cast<void*>(&s), static_cast<const void*>(&now), size);
    s.size = (unsigned)size;
  }
};

using ncclext::harness::epTensor;

ncclEpGroupConfig_t goodConfig() {
  ncclEpGroupConfig_t c = NCCL_EP_GROUP_CONFIG_INIT;
  c.num_experts = 256;
  c.max_tokens_per_rank = 4096;
  c.max_token_bytes = 14336;
  c.max_topk = 8;
  return c;
}

TEST(EpApi, GroupConfigRejections) {
  ncclComm_t fake = reinterpret_cast<ncclComm_t>(0x1);  // never used: every case fails first
  ncclEpGroup_t g = nullptr;
  ncclEpGroupConfig_t c = goodConfig();
  EXPECT_EQ(ncclEpCreateGroup(nullptr, fake, &c), ncclInvalidArgument);
  EXPECT_EQ(ncclEpCreateGroup(&g, nullptr, &c), ncclInvalidArgument);
  EXPECT_EQ(ncclEpCreateGroup(&g, fake, nullptr), ncclInvalidArgument);
  struct Bad {
    void (*edit)(ncclEpGroupConfig_t*);
    ncclResult_t code;
    const char* message;
  } cases[] = {
      {[](ncclEpGroupConfig_t* x) { x->magic = 7; }, ncclInvalidArgument, "NCCL_EP_GROUP_CONFIG_INIT"},
      {[](ncclEpGroupConfig_t* x) { x->size = 8; }, ncclInvalidArgument, "size 8"},
      {[](ncclEpGroupConfig_t* x) { x->algorithm = NCCL_EP_ALGO_LOW_LATENCY; }, ncclInvalidArgument,
       "the Low-Latency mode takes at most 1024"},  // goodConfig's 4096 tokens
      {[](ncclEpGroupConfig_t* x) { x->algorithm = (ncclEpAlgorithm_t)7; }, ncclInvalidArgument, "algorithm 7"},
      {[](ncclEpGroupConfig_t* x) { x->num_experts = 0; }, ncclInvalidArgument, "num_experts 0"},
      {[](ncclEpGroupConfig_t* x) { x->num_experts = 2048; }, ncclInvalidArgument, "num_experts 2048"},
      {[](ncclEpGroupConfig_t* x) { x->max_tokens_per_rank = 20000; }, ncclInvalidArgument, "max_tokens_per_rank"},
      {[](ncclEpGroupConfig_t* x) { x->max_token_bytes = 100; }, ncclInvalidArgument, "multiple of 16"},
      {[](ncclEpGroupConfig_t* x) { x->max_topk = 33; }, ncclInvalidArgument, "max_topk 33"},
      {[](ncclEpGroupConfig_t* x) { x->num_sms = -1; }, ncclInvalidArgument, "num_sms"},
      {[](ncclEpGroupConfig_t* x) { x->zero_copy = NCCL_EP_ZERO_COPY_ON; }, ncclInvalidUsage,
       "zero_copy ON: dispatch outputs in the window"},  // goodConfig has no receive cap
      {[](ncclEpGroupConfig_t* x) { x->zero_copy = (ncclEpZeroCopyMode_t)3; }, ncclInvalidArgument, "zero_copy 3"},
      {[](ncclEpGroupConfig_t* x) { x->alloc.alloc_fn = [](void**, size_t, void*) { return 0; }; }, ncclInvalidUsage,
       "both alloc_fn and free_fn"},
      {[](ncclEpGroupConfig_t* x) { x->enable_mask = 2; }, ncclInvalidArgument, "enable_mask 2"},
      {[](ncclEpGroupConfig_t* x) { x->enable_mask = 1; }, ncclInvalidUsage, "rank masks belong to the Low-Latency"},
  };
  for (const Bad& b : cases) {
    ncclEpGroupConfig_t x = goodConfig();
    b.edit(&x);
    EXPECT_EQ(ncclEpCreateGroup(&g, fake, &x), b.code) << b.message;
    EXPECT_TRUE(says(b.message)) << "want \"" << b.message << "\" in: " << ncclEpGetLastError();
    EXPECT_EQ(g, nullptr);
  }
  // The one-GPU test modes (nccl_ep_testing.h), checked before the comm is used too.
  struct BadTesting {
    void (*edit)(ncclEpTestingConfig_t*);
    ncclResult_t code;
    const char* message;
  } testing[] = {
      {[](ncclEpTestingConfig_t* t) { t->magic = 7; }, ncclInvalidArgument, "NCCL_EP_TESTING_CONFIG_INIT"},
      {[](ncclEpTestingConfig_t* t) { t->virtual_rank = 3; }, ncclInvalidArgument,
       "virtual_rank 3 without a virtual_domain"},
      {[](ncclEpTestingConfig_t* t) { t->virtual_rail = reinterpret_cast<ncclComm_t>(0x2); }, ncclInvalidUsage,
       "virtual_rail without a virtual_domain"},
  };
  for (const BadTesting& b : testing) {
    ncclEpTestingConfig_t t = NCCL_EP_TESTING_CONFIG_INIT;
    b.edit(&t);
    EXPECT_EQ(ncclEpCreateGroupTesting(&g, fake, &c, &t), b.code) << b.message;
    EXPECT_TRUE(says(b.message)) << "want \"" << b.message << "\" in: " << ncclEpGetLastError();
    EXPECT_EQ(g, nullptr);
  }
}

// A 2-rank group and a FLAT handle of 100 tokens, top-8, with no device state.
struct Fake {
  ncclEpGroup group;
  ncclEpHandle handle;
  ncclext::LiveSet::Scoped liveGroup{ncclep::liveGroups(), &group};  // as if created: the API accepts them
  ncclext::LiveSet::Scoped liveHandle{ncclep::liveHandles(), &handle};
  int64_t totals[2] = {150, 300};
  alignas(16) char bytes[16] = {};
  void* p = bytes;  // a non-NULL, 16-byte aligned pointer for tensors that must have data
  Fake() {
    group.config = goodConfig();
    group.smCount = 132;
    group.numSms = 64;
    group.view.nRanks = 2;
    group.view.numExperts = 256;
    group.view.localExperts = 128;
    group.view.maxTokens = 4096;
    group.view.meta.maxScales = 112;
    handle.group = &group;
    handle.layout = NCCL_EP_LAYOUT_FLAT;
    handle.config = NCCL_EP_HANDLE_CONFIG_INIT;
    handle.config.sizing = NCCL_EP_SIZING_EXACT;
    handle.topk = 8;
    handle.view.numTokens = 100;
    handle.hostTotals = totals;
    handle.maxRecvRows = 8192;
  }
  ~Fake() { handle.hostTotals = nullptr; }
};

TEST(EpApi, HandleRejections) {
  Fake f;
  ncclEpHandle_t h = nullptr;
  ncclEpTensor_t idx = epTensor(f.p, ncclInt32, {100, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_RANK_MAJOR, &idx, nullptr, nullptr, nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(says("RANK_MAJOR belongs to the Low-Latency mode"));
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, nullptr, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  ncclEpTensor_t wide = epTensor(f.p, ncclInt32, {100, 9});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &wide, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("top-k 9 not in [1, max_topk 8]"));
  ncclEpTensor_t many = epTensor(f.p, ncclInt32, {5000, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &many, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("above max_tokens_per_rank 4096"));
  ncclEpTensor_t floats = epTensor(f.p, ncclFloat32, {100, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &floats, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("dtype fp32"));
  ncclEpTensor_t noData = epTensor(nullptr, ncclInt64, {100, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &noData, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("data is NULL"));
  ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
  hc.dispatch_output_per_expert_alignment = 1025;
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_EXPERT_MAJOR, &idx, nullptr, &hc, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("dispatch_output_per_expert_alignment 1025: not in [0, 1024]"));
  hc.dispatch_output_per_expert_alignment = -1;
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_EXPERT_MAJOR, &idx, nullptr, &hc, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("dispatch_output_per_expert_alignment -1: not in [0, 1024]"));
  ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
  info.expert_counters = epTensor(f.p, ncclInt32, {64});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &idx, &info, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("layout_info.expert_counters: sizes[0] = 64, expected 128"));
  EXPECT_EQ(h, nullptr);
  int64_t rows = 0;
  EXPECT_EQ(ncclEpHandleGetRecvRows(&f.handle, &rows), ncclSuccess);
  EXPECT_EQ(rows, 150);
  f.handle.config.sizing = NCCL_EP_SIZING_WORST_CASE;
  EXPECT_EQ(ncclEpHandleGetRecvRows(&f.handle, &rows), ncclInvalidUsage);
}

TEST(EpApi, DispatchAndCombineRejections) {
  Fake f;
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  auto dispatch = [&]() { return ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr); };
  EXPECT_EQ(ncclEpDispatch(nullptr, &in, &out, nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpDispatch(&f.handle, nullptr, &out, nullptr, nullptr, nullptr), ncclInvalidArgument);
  in.tokens.sizes[0] = 99;  // not the handle's token count
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.tokens: sizes[0] = 99, expected 100"));
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7172});  // 14344 bytes: above the maximum and not a multiple of 16
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7164});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("not a positive multiple of 16"));
  in.tokens = epTensor(f.p, ncclInt32, {100, 128});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("dtype int32"));
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  out.tokens = epTensor(f.p, ncclBfloat16, {149, 7168});  // the exact count is 150
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("has 149 rows; this handle needs 150"));
  out.tokens = epTensor(f.p, ncclFloat16, {150, 7168});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  out.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  in.topk_weights = epTensor(f.p, ncclFloat32, {100, 4});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.topk_weights: sizes[1] = 4, expected 8"));
  in.topk_weights = NCCL_EP_TENSOR_INIT;
  // High-Throughput rows of any dtype may carry side words (scales); their output then is needed.
  in.scales = epTensor(f.p, ncclFloat32, {100, 56});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales given: outputs.scales [N, 56] of their dtype are needed")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclInt32, {100, 113});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales: 113 a row; from 1 to the group's 112")) << ncclEpGetLastError();
  in.scales = NCCL_EP_TENSOR_INIT;
  in.tokens = epTensor(f.p, ncclFloat8e4m3, {100, 7168});
  out.tokens = epTensor(f.p, ncclFloat8e4m3, {150, 7168});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("fp8 tokens need inputs.scales"));
  // Scales as the caller lays them out: any S from 1 to max_token_bytes / 128 of fp32 or int32, the output's the
  // same; uint8 rows (opaque: packed fp4) with or without. Each accepted form gets as far as the next check (the
  // row of outputs.topk_idx given one column short).
  const ncclEpTensor_t none = NCCL_EP_TENSOR_INIT;
  out.topk_idx = epTensor(f.p, ncclInt32, {150, 7});
  const std::pair<ncclDataType_t, ncclEpTensor_t> forms[] = {{ncclFloat8e4m3, epTensor(f.p, ncclFloat32, {100, 56})},
                                                             {ncclFloat8e4m3, epTensor(f.p, ncclInt32, {100, 14})},
                                                             {ncclFloat8e4m3, epTensor(f.p, ncclFloat32, {100, 1})},
                                                             {ncclUint8, epTensor(f.p, ncclInt32, {100, 112})},
                                                             {ncclUint8, none}};
  for (const auto& [tokens, scales] : forms) {
    const int64_t H = tokens == ncclUint8 ? 3584 : 7168;  // an fp4 row: two values a byte
    in.tokens = epTensor(f.p, tokens, {100, H});
    out.tokens = epTensor(f.p, tokens, {150, H});
    in.scales = scales;
    out.scales = scales.ndim ? epTensor(f.p, scales.datatype, {150, scales.sizes[1]}) : none;
    EXPECT_EQ(dispatch(), ncclInvalidArgument);
    EXPECT_TRUE(says("outputs.topk_idx: sizes[1] = 7, expected 8")) << ncclEpGetLastError();
  }
  out.topk_idx = none;
  in.scales = epTensor(f.p, ncclInt32, {100, 14});
  out.scales = epTensor(f.p, ncclFloat32, {150, 14});  // not the input's dtype
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.scales")) << ncclEpGetLastError();
  out.scales = none;
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.scales [N, 14] of their dtype are needed")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclInt32, {100, 113});  // above the group's max_token_bytes / 128 = 112
  out.scales = epTensor(f.p, ncclInt32, {150, 113});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales: 113 a row; from 1 to the group's 112")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclInt64, {100, 14});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  in.scales = out.scales = none;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  out.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  f.handle.layout = NCCL_EP_LAYOUT_EXPERT_MAJOR;  // its exact count is 300 rows
  out.tokens = epTensor(f.p, ncclBfloat16, {300, 7168});
  out.topk_idx = epTensor(f.p, ncclInt32, {300, 8});
  EXPECT_EQ(dispatch(), ncclInvalidUsage);
  EXPECT_TRUE(says("outputs.topk_idx is for the FLAT layout"));
  f.handle.layout = NCCL_EP_LAYOUT_FLAT;

  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = epTensor(f.p, ncclFloat8e4m3, {150, 7168});
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);  // no fp8 combine
  ci.tokens = epTensor(f.p, ncclBfloat16, {120, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("has 120 rows"));
  ci.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  co.tokens = epTensor(f.p, ncclBfloat16, {101, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens: sizes[0] = 101, expected 100"));
  EXPECT_EQ(ncclEpComplete(&f.handle, nullptr, nullptr), ncclSuccess);
  ci.topk_weights = epTensor(f.p, ncclFloat32, {100, 8});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("topk_weights at combine are for the Low-Latency mode"));
  ci.topk_weights = NCCL_EP_TENSOR_INIT;
  // bias: [T, H] of the tokens' dtype or fp32.
  ci.bias = epTensor(f.p, ncclFloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.bias: dtype")) << ncclEpGetLastError();
  ci.bias = epTensor(f.p, ncclFloat32, {99, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.bias: sizes[0] = 99, expected 100")) << ncclEpGetLastError();
  ci.bias = epTensor(static_cast<char*>(f.p) + 8, ncclBfloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("not 16-byte aligned")) << ncclEpGetLastError();
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ci.bias = epTensor(static_cast<char*>(f.p) + 7168 * 2 * 99, ncclBfloat16, {100, 7168});  // from the output's last row
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.bias overlaps outputs.tokens")) << ncclEpGetLastError();
  ci.bias = NCCL_EP_TENSOR_INIT;
  // The first layout of the combine inputs (no bias) is read up to its size.
  OlderLayout<ncclEpCombineInputs_t> oldCi(ci, NCCL_EP_COMBINE_INPUTS_V1_SIZE);
  co.tokens = epTensor(f.p, ncclBfloat16, {101, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &oldCi.s, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens: sizes[0] = 101, expected 100")) << ncclEpGetLastError();
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  out.src_info = epTensor(f.p, ncclInt32, {150});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.src_info is a Low-Latency output"));
  out.src_info = NCCL_EP_TENSOR_INIT;
  in.tokens.data = static_cast<char*>(f.p) + 8;
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("not 16-byte aligned"));
}

// The Fake as a Low-Latency group of 2 ranks x 256 tokens, hidden 7168 bf16, and a RANK_MAJOR handle (512 rows).
struct FakeLl : Fake {
  FakeLl() {
    group.config.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
    group.config.max_tokens_per_rank = 256;
    group.view.lowLatency = 1;
    group.view.maxTokens = 256;
    handle.layout = NCCL_EP_LAYOUT_RANK_MAJOR;
    handle.config.sizing = NCCL_EP_SIZING_WORST_CASE;
    handle.maxRecvRows = 512;
    group.view.wl.slices = (group.config.max_token_bytes + 511) / 512;  // as layout.cc sizes them
    group.view.meta.maxScales = group.config.max_token_bytes / 128;
  }
};

TEST(EpApi, LowLatencyRejections) {
  FakeLl f;
  ncclEpHandle_t h = nullptr;
  ncclEpTensor_t idx = epTensor(f.p, ncclInt32, {100, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &idx, nullptr, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("layout FLAT belongs to the High-Throughput mode"));
  ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
  hc.sizing = NCCL_EP_SIZING_EXACT;
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_RANK_MAJOR, &idx, nullptr, &hc, nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(says("EXACT sizing"));
  hc = NCCL_EP_HANDLE_CONFIG_INIT;
  hc.dispatch_output_per_expert_alignment = 4;
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_EXPERT_MAJOR, &idx, nullptr, &hc, nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(says("Low-Latency zones are fixed"));
  ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_RANK_MAJOR, &idx, &info, nullptr, nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(says("counts arrive with each dispatch"));
  ncclEpTensor_t many = epTensor(f.p, ncclInt32, {257, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_RANK_MAJOR, &many, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("above max_tokens_per_rank 256"));
  EXPECT_EQ(h, nullptr);

  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {511, 7168});
  auto dispatch = [&]() { return ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr); };
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("a Low-Latency RANK_MAJOR output has 512"));
  out.tokens = epTensor(f.p, ncclFloat8e4m3, {512, 7168});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("fp8 outputs need outputs.scales"));
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7160});  // a multiple of 8 (16-byte rows), not of 128
  out.tokens = epTensor(f.p, ncclFloat8e4m3, {512, 7160});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("not a multiple of 128"));
  in.tokens = epTensor(f.p, ncclFloat8e4m3, {100, 7168});
  in.scales = epTensor(f.p, ncclFloat32, {100, 56});
  out.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens must be fp8 too"));
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  in.scales = NCCL_EP_TENSOR_INIT;
  f.handle.layout = NCCL_EP_LAYOUT_EXPERT_MAJOR;
  f.handle.maxRecvRows = 512 * 128;
  out.tokens = epTensor(f.p, ncclBfloat16, {512 * 128, 7168});
  out.topk_idx = epTensor(f.p, ncclInt32, {512 * 128, 8});
  EXPECT_EQ(dispatch(), ncclInvalidUsage);
  EXPECT_TRUE(says("outputs.topk_idx is for the RANK_MAJOR layout"));
  out.topk_idx = NCCL_EP_TENSOR_INIT;
  out.src_info = epTensor(f.p, ncclInt32, {100});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.src_info has 100 rows"));

  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = epTensor(f.p, ncclFloat32, {512 * 128, 7168});
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("dtype fp32"));
  ci.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("has 512 rows; this handle's dispatch output has 65536"));
  f.handle.layout = NCCL_EP_LAYOUT_RANK_MAJOR;
  f.handle.maxRecvRows = 512;
  ci.topk_weights = epTensor(f.p, ncclFloat32, {100, 8});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("the owner-weighted path is EXPERT_MAJOR's"));
  ci.topk_weights = NCCL_EP_TENSOR_INIT;
  co.missing_experts = epTensor(f.p, ncclInt32, {100});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("created without enable_mask"));
  co.missing_experts = NCCL_EP_TENSOR_INIT;
  ci.bias = epTensor(f.p, ncclBfloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.bias at combine is for the High-Throughput mode"));
  ci.bias = NCCL_EP_TENSOR_INIT;
  // The output inside the input (here both at f.p; then its last row on the input's first): refused.
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens overlaps inputs.tokens"));
  co.tokens = epTensor(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(f.p) - 99 * 7168 * 2), ncclBfloat16,
                       {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens overlaps inputs.tokens"));
}

// recv_wait_cycles (DeepEP's *_wait_recv_cost_stats): Low-Latency only, [nRanks] int64, 8-byte aligned; the
// outputs' first layouts (without it) are read up to their size, nothing past them taken for it.
TEST(EpApi, RecvWaitCycles) {
  FakeLl f;
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  ncclEpLayoutInfo_t badInfo = NCCL_EP_LAYOUT_INFO_INIT;
  badInfo.magic = 0;  // fails after the wait cycles' check: the call got past it
  auto dispatch = [&](const ncclEpDispatchOutputs_t* o) {
    return ncclEpDispatch(&f.handle, &in, o, &badInfo, nullptr, nullptr);
  };
  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(static_cast<char*>(f.p) + 512 * 7168 * 2, ncclBfloat16, {100, 7168});
  co.missing_experts = epTensor(f.p, ncclInt32, {100});  // refused after the wait cycles' check (no enable_mask)
  auto combine = [&](const ncclEpCombineOutputs_t* o) { return ncclEpCombine(&f.handle, &ci, o, nullptr, nullptr); };
  for (const auto& [t, text] : std::vector<std::pair<ncclEpTensor_t, const char*>>{
           {epTensor(f.p, ncclInt32, {2}), "outputs.recv_wait_cycles: dtype int32"},
           {epTensor(f.p, ncclInt64, {3}), "outputs.recv_wait_cycles: sizes[0] = 3, expected 2"},
           {epTensor(f.p, ncclInt64, {2, 1}), "outputs.recv_wait_cycles: 2 dims, expected 1"},
           {epTensor(static_cast<char*>(f.p) + 4, ncclInt64, {2}), "outputs.recv_wait_cycles: data"}}) {
    out.recv_wait_cycles = t;
    EXPECT_EQ(dispatch(&out), ncclInvalidArgument);
    EXPECT_TRUE(says(text)) << ncclEpGetLastError();
    co.recv_wait_cycles = t;
    EXPECT_EQ(combine(&co), ncclInvalidArgument);
    EXPECT_TRUE(says(text)) << ncclEpGetLastError();
  }
  out.recv_wait_cycles = co.recv_wait_cycles = epTensor(f.p, ncclInt64, {2});
  EXPECT_EQ(dispatch(&out), ncclInvalidArgument);
  EXPECT_TRUE(says("layout_info")) << ncclEpGetLastError();
  EXPECT_EQ(combine(&co), ncclInvalidUsage);
  EXPECT_TRUE(says("created without enable_mask")) << ncclEpGetLastError();
  // The first layouts: what lies past them (0x5a bytes) is no tensor.
  OlderLayout<ncclEpDispatchOutputs_t> oldOut(out, NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE);
  EXPECT_EQ(dispatch(&oldOut.s), ncclInvalidArgument);
  EXPECT_TRUE(says("layout_info")) << ncclEpGetLastError();
  OlderLayout<ncclEpCombineOutputs_t> oldCo(co, NCCL_EP_COMBINE_OUTPUTS_V1_SIZE);
  EXPECT_EQ(combine(&oldCo.s), ncclInvalidUsage);
  EXPECT_TRUE(says("created without enable_mask")) << ncclEpGetLastError();
  // High-Throughput: refused.
  Fake ht;
  ncclEpDispatchOutputs_t hout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  hout.tokens = epTensor(ht.p, ncclBfloat16, {150, 7168});
  hout.recv_wait_cycles = epTensor(ht.p, ncclInt64, {2});
  EXPECT_EQ(ncclEpDispatch(&ht.handle, &in, &hout, nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.recv_wait_cycles is a Low-Latency output")) << ncclEpGetLastError();
  ncclEpCombineOutputs_t hco = NCCL_EP_COMBINE_OUTPUTS_INIT;
  hco.tokens = epTensor(ht.p, ncclBfloat16, {100, 7168});
  hco.recv_wait_cycles = epTensor(ht.p, ncclInt64, {2});
  ci.tokens = epTensor(ht.p, ncclBfloat16, {150, 7168});
  EXPECT_EQ(ncclEpCombine(&ht.handle, &ci, &hco, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.recv_wait_cycles is a Low-Latency output")) << ncclEpGetLastError();
}

// Low-Latency forwarded fp8 takes any S 32-bit words a row (the caller's layout: per block, UE8M0 packed, per token,
// anything), fp32 or int32, from 1 to the group's max_token_bytes / 128 = 112; each accepted form gets as far as the
// next check (outputs.topk_idx a column short). The output's scales are the input's form, or refused.
TEST(EpApi, LowLatencyForwardedScaleForms) {
  FakeLl f;
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclFloat8e4m3, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclFloat8e4m3, {512, 7168});
  out.topk_idx = epTensor(f.p, ncclInt32, {512, 7});
  auto dispatch = [&]() { return ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr); };
  const ncclEpTensor_t forms[] = {epTensor(f.p, ncclFloat32, {100, 56}), epTensor(f.p, ncclInt32, {100, 14}),
                                  epTensor(f.p, ncclFloat32, {100, 1}), epTensor(f.p, ncclInt32, {100, 3}),
                                  epTensor(f.p, ncclFloat32, {100, 112})};
  for (const ncclEpTensor_t& scales : forms) {
    in.scales = scales;
    out.scales = epTensor(f.p, scales.datatype, {512, scales.sizes[1]});
    EXPECT_EQ(dispatch(), ncclInvalidArgument);
    EXPECT_TRUE(says("outputs.topk_idx: sizes[1] = 7, expected 8")) << ncclEpGetLastError();
  }
  out.topk_idx = NCCL_EP_TENSOR_INIT;
  in.scales = epTensor(f.p, ncclFloat32, {100, 1});
  out.scales = epTensor(f.p, ncclFloat32, {512, 2});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.scales: sizes[1] = 2, expected 1")) << ncclEpGetLastError();
  out.scales = epTensor(f.p, ncclInt32, {512, 1});  // int32 words out of fp32 ones
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales: dtype fp32")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclFloat32, {100, 113});
  out.scales = epTensor(f.p, ncclFloat32, {512, 113});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales has 113 words a row; forwarded fp8 takes 1 to 112")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclFloat32, {100, 0});
  out.scales = epTensor(f.p, ncclFloat32, {512, 0});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("forwarded fp8 takes 1 to 112")) << ncclEpGetLastError();
}

// Low-Latency NVFP4: bf16 in, uint8 [N, H/2] out with [N, H/16] e4m3 scales and inputs.global_scale quantises;
// uint8 in and out forwards with the scales; every missing or misshapen piece is named, and the pieces that belong
// to NVFP4 are refused elsewhere (High-Throughput's global_scale, round_scale). An inputs struct of the first layout
// (no global_scale) is read up to its size.
TEST(EpApi, LowLatencyNvfp4Checks) {
  FakeLl f;
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclUint8, {512, 7168});
  ncclEpDispatchConfig_t cfg = NCCL_EP_DISPATCH_CONFIG_INIT;
  auto dispatch = [&]() { return ncclEpDispatch(&f.handle, &in, &out, nullptr, &cfg, nullptr); };
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("sizes[1] = 7168, expected 3584 (hidden 7168 as NVFP4, two columns a byte)"))
      << ncclEpGetLastError();
  out.tokens = epTensor(f.p, ncclUint8, {512, 3584});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("NVFP4 outputs need outputs.scales [N, hidden/16] uint8 or e4m3")) << ncclEpGetLastError();
  out.scales = epTensor(f.p, ncclFloat32, {512, 56});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.scales: dtype fp32")) << ncclEpGetLastError();
  out.scales = epTensor(f.p, ncclUint8, {512, 448});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("NVFP4 quantisation needs inputs.global_scale [1] fp32")) << ncclEpGetLastError();
  in.global_scale = epTensor(f.p, ncclFloat32, {2});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.global_scale: sizes[0] = 2, expected 1")) << ncclEpGetLastError();
  in.global_scale = epTensor(f.p, ncclFloat32, {1});
  cfg.round_scale = 1;
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("config.round_scale is for fp8 quantisation")) << ncclEpGetLastError();
  cfg.round_scale = 0;
  // Forwarded NVFP4: the input's scales are required; the output must be NVFP4 too; no global scale.
  in.tokens = epTensor(f.p, ncclUint8, {100, 3584});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("NVFP4 tokens need inputs.scales [T, hidden/16] uint8 or e4m3")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclFloat8e4m3, {100, 448});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.global_scale is for NVFP4 quantisation")) << ncclEpGetLastError();
  in.global_scale = NCCL_EP_TENSOR_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  out.scales = NCCL_EP_TENSOR_INIT;
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.tokens must be NVFP4 too")) << ncclEpGetLastError();
  // bf16 out with a global scale; High-Throughput refuses it.
  in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  in.global_scale = epTensor(f.p, ncclFloat32, {1});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.global_scale is for NVFP4 quantisation (bf16 in, uint8 out)")) << ncclEpGetLastError();
  Fake ht;
  ncclEpDispatchOutputs_t hout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  hout.tokens = epTensor(ht.p, ncclBfloat16, {150, 7168});
  EXPECT_EQ(ncclEpDispatch(&ht.handle, &in, &hout, nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.global_scale is for Low-Latency NVFP4 quantisation")) << ncclEpGetLastError();
  // The first layout of the inputs: read up to its size (what lies past it is not a global scale).
  ncclEpDispatchInputs_t now = NCCL_EP_DISPATCH_INPUTS_INIT;
  now.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  OlderLayout<ncclEpDispatchInputs_t> old(now, NCCL_EP_DISPATCH_INPUTS_V1_SIZE);
  out.tokens = epTensor(f.p, ncclBfloat16, {511, 7168});
  EXPECT_EQ(ncclEpDispatch(&f.handle, &old.s, &out, nullptr, &cfg, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("a Low-Latency RANK_MAJOR output has 512")) << ncclEpGetLastError();
  // Forwarded NVFP4 rows are H / 2 bytes, but the window keeps a flag per 512 columns and a scale word per 128 bytes
  // of max_token_bytes (14336 here): hidden 8192 (4096 bytes a row) would write past its row's flags and scales.
  in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclUint8, {100, 4096});
  in.scales = epTensor(f.p, ncclUint8, {100, 512});
  out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclUint8, {512, 4096});
  out.scales = epTensor(f.p, ncclUint8, {512, 512});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("NVFP4 rows of hidden 8192 need max_token_bytes >= 16384")) << ncclEpGetLastError();
  // Scales move as 32-bit words: a view that starts off a 4-byte boundary is refused.
  in.tokens = epTensor(f.p, ncclUint8, {100, 3584});
  in.scales = epTensor(static_cast<char*>(f.p) + 2, ncclUint8, {100, 448});
  out.tokens = epTensor(f.p, ncclUint8, {512, 3584});
  out.scales = epTensor(f.p, ncclUint8, {512, 448});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.scales: data")) << ncclEpGetLastError();
  EXPECT_TRUE(says("is not 4-byte aligned")) << ncclEpGetLastError();
  in.scales = epTensor(f.p, ncclUint8, {100, 448});
  out.scales = epTensor(static_cast<char*>(f.p) + 1, ncclUint8, {512, 448});
  EXPECT_EQ(dispatch(), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.scales: data")) << ncclEpGetLastError();
}

// A call on a group or handle that is not alive (destroyed, or never created) is an error, not a use-after-free; a
// group with live handles is not destroyed.
TEST(EpApi, CallsOnObjectsNotAliveAreErrors) {
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  ncclEpGroup* deadGroup = nullptr;
  ncclEpHandle* deadHandle = nullptr;
  {
    Fake f;
    deadGroup = &f.group;
    deadHandle = &f.handle;
    EXPECT_EQ(ncclEpGroupGetAsyncError(deadGroup), ncclSuccess);  // alive here
    f.group.liveHandles = 1;  // as ncclEpCreateHandle counts its handle
    EXPECT_EQ(ncclEpGroupDestroy(deadGroup), ncclInvalidUsage);
    EXPECT_TRUE(says("1 handle(s) of this group are alive"));
    EXPECT_EQ(ncclEpGroupGetAsyncError(deadGroup), ncclSuccess);  // unchanged
    f.group.liveHandles = 0;
  }  // gone: every call below must fail on the registry, before it reads the object
  int64_t rows = 0;
  EXPECT_EQ(ncclEpDispatch(deadHandle, &in, &out, nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("ncclEpDispatch: handle")) << ncclEpGetLastError();
  EXPECT_TRUE(says("is not a live handle (destroyed, or never created)"));
  EXPECT_EQ(ncclEpCombine(deadHandle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpComplete(deadHandle, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpUpdateHandle(deadHandle, nullptr, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpHandleGetRecvRows(deadHandle, &rows), ncclInvalidArgument);
  EXPECT_EQ(ncclEpHandleGetMaxRecvRows(deadHandle, &rows), ncclInvalidArgument);
  EXPECT_EQ(ncclEpHandleDestroy(deadHandle), ncclInvalidArgument);
  EXPECT_TRUE(says("ncclEpHandleDestroy: handle")) << ncclEpGetLastError();
  EXPECT_TRUE(says("is not a live handle (destroyed already, or never created)"));
  EXPECT_EQ(ncclEpGroupGetAsyncError(deadGroup), ncclInvalidArgument);
  EXPECT_TRUE(says("is not a live group"));
  EXPECT_EQ(ncclEpGroupDestroy(deadGroup), ncclInvalidArgument);
  EXPECT_EQ(ncclEpMaskClean(deadGroup, nullptr), ncclInvalidArgument);
  ncclEpHandle_t h = nullptr;
  ncclEpTensor_t topk = epTensor(&rows, ncclInt32, {1, 1});
  EXPECT_EQ(ncclEpCreateHandle(&h, deadGroup, NCCL_EP_LAYOUT_FLAT, &topk, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("is not a live group"));
  EXPECT_EQ(ncclEpHandleDestroy(nullptr), ncclSuccess);  // NULL stays a no-op
  EXPECT_EQ(ncclEpGroupDestroy(nullptr), ncclSuccess);
}

// The mask calls need a group made with enable_mask; send-only calls complete in issue order, two per kind at most.
TEST(EpApi, MasksAndOpenCalls) {
  FakeLl f;
  int mask[2] = {1, 1};
  EXPECT_EQ(ncclEpMaskQuery(nullptr, mask, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpMaskUpdate(&f.group, mask, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("ncclEpMaskUpdate: the group was created without enable_mask"));
  EXPECT_EQ(ncclEpMaskQuery(&f.group, mask, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclEpMaskClean(&f.group, nullptr), ncclInvalidUsage);
  f.group.view.mask = mask;  // as if made with enable_mask (never dereferenced by the refusals below)
  EXPECT_EQ(ncclEpMaskUpdate(&f.group, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("mask_host is NULL"));
  EXPECT_EQ(ncclEpMaskQuery(&f.group, nullptr, nullptr), ncclInvalidArgument);
  // Two open send-only dispatches (handles a, b: as the library records them).
  ncclEpHandle a, b;
  ncclext::LiveSet::Scoped liveA(ncclep::liveHandles(), &a), liveB(ncclep::liveHandles(), &b);
  for (ncclEpHandle* h : {&a, &b}) {
    h->group = &f.group;
    h->layout = NCCL_EP_LAYOUT_RANK_MAJOR;
    h->maxRecvRows = 512;
    h->pendingKind = ncclep::kDispatch;
    f.group.ll.pending[ncclep::kDispatch].push_back(h);
  }
  EXPECT_EQ(ncclEpMaskClean(&f.group, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("a send-only dispatch awaits ncclEpComplete"));
  EXPECT_EQ(ncclEpComplete(&b, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("complete in the order they were issued"));
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {512, 7168});
  ncclEpDispatchConfig_t so = NCCL_EP_DISPATCH_CONFIG_INIT;
  so.send_only = 1;
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, &so, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("the staging has two banks"));
  f.group.ll.pending[ncclep::kDispatch].pop_back();
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("complete them before a plain dispatch"));
  for (ncclEpHandle* h : {&a, &b}) h->pendingKind = -1;  // nothing for the destructors to unlink
  f.group.ll.pending[ncclep::kDispatch].clear();
  f.group.view.mask = nullptr;
}

// Low-Latency across NVLink domains (RailView): every byte a sender's kernels write towards a rank of another
// domain has its place in the sender's outbox for that rank (one byte each), and the rail exchange (slice i of the
// outbox into the receiver's inbox at the same place, then copied to base[i] + sender * slice[i] of the call's
// bank, 8 bytes at a time) puts it exactly where the kernels would have written it over LSA. Every rank lays the
// window out alike; ranks of the own domain are local.
// The hierarchical dispatch's rail row (HierRow): the row, then the tail's fields in order, aligned for their loads,
// none overlapping, the whole a multiple of 16 bytes (rows follow each other in the rail buffers).
TEST(EpRail, HierarchicalRowTailIsLaidOutInOrder) {
  for (int G : {1, 2, 8, 72})
    for (int K : {1, 8, 32}) {
      ncclep::HierRow hr;
      hr.rowStride = 14336;
      hr.domainSize = G;
      hr.maxTopk = K;
      hr.maxScales = 112;
      EXPECT_EQ(hr.seqOff(), 14336u);
      EXPECT_EQ(hr.countsOff(), hr.seqOff() + 8);
      EXPECT_EQ(hr.posOff(), hr.countsOff() + 8);
      EXPECT_EQ(hr.slotOff(), hr.posOff() + 4);
      EXPECT_EQ(hr.expertOff(), hr.slotOff() + 4u * G);
      EXPECT_EQ(hr.weightOff(), hr.expertOff() + 4u * K);
      EXPECT_EQ(hr.idxOff(), hr.weightOff() + 4u * K);
      EXPECT_EQ(hr.scaleOff(), hr.idxOff() + 4u * K);
      EXPECT_GE(hr.bytes(), hr.scaleOff() + 4u * 112);
      EXPECT_LT(hr.bytes(), hr.scaleOff() + 4u * 112 + 16);
      EXPECT_EQ(hr.bytes() % 16, 0u);
      EXPECT_EQ(hr.seqOff() % 8, 0u);
    }
}

TEST(EpRail, OutboxBytesLandWhereTheKernelsWouldHaveWrittenThem) {
  struct Shape {
    int nRanks, lsaSize, domainSize;
  };
  for (const Shape sh : {Shape{3, 1, 0}, Shape{4, 4, 2}, Shape{8, 8, 4}, Shape{2, 2, 1}}) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
    cfg.num_experts = 2 * sh.nRanks;
    cfg.max_tokens_per_rank = 5;
    cfg.max_token_bytes = 1536;  // three slices of 512 columns
    cfg.max_topk = 4;
    std::vector<ncclep::GroupView> v(sh.nRanks);
    std::vector<ncclext::Topology> topo(sh.nRanks);
    for (int r = 0; r < sh.nRanks; r++)
      ASSERT_EQ(ncclext::makeTopology(r, sh.nRanks, r % sh.lsaSize, sh.lsaSize, sh.domainSize, &topo[r]),
                ncclSuccess);
    for (int r = 0; r < sh.nRanks; r++) {
      ncclep::layoutGroup(cfg, topo[r], &v[r]);
      ASSERT_EQ(v[r].wl.total, v[0].wl.total);
      ASSERT_EQ(v[r].rail.outboxBytes, v[0].rail.outboxBytes);
      for (int i = 0; i < ncclep::kRailRegions; i++) {
        ASSERT_EQ(v[r].rail.base[i], v[0].rail.base[i]);
        ASSERT_EQ(v[r].rail.slice[i], v[0].rail.slice[i]);
        ASSERT_EQ(v[r].rail.outOff[i], v[0].rail.outOff[i]);
      }
      for (int q = 0; q < sh.nRanks; q++)
        EXPECT_EQ(v[r].rail.local(q), topo[q].domainIndex == topo[r].domainIndex) << r << " " << q;
    }
    const ncclep::WindowLayout& w = v[0].wl;
    const ncclep::RailView& rv = v[0].rail;
    ASSERT_GT(rv.outboxBytes, 0u);
    for (int i = 0; i < ncclep::kRailRegions; i++)  // the inbox copy moves 8-byte words
      ASSERT_TRUE(rv.base[i] % 8 == 0 && rv.slice[i] % 8 == 0 && rv.outOff[i] % 8 == 0 && w.bankBytes % 8 == 0) << i;
    const int M = v[0].maxTokens, S = w.slices;
    const size_t stride = v[0].rowStride, meta = v[0].meta.bytes;
    int64_t checked = 0;
    for (int me = 0; me < sh.nRanks; me++) {
      // The byte ranges LL's kernels write into another rank's window as sender `me` (ll/kernels.cu): its header row,
      // its dispatch rows' slice flags, rows and metadata, its combine rows' slice flags and rows ([me][slot]), and
      // the owner-weighted combine's ([me][slot][k]).
      std::vector<std::pair<size_t, size_t>> ranges = {{w.header + (size_t)me * w.headerBytes, (size_t)w.headerBytes}};
      for (int j = 0; j < M; j++) {
        const size_t row = (size_t)me * M + j;
        for (int sl = 0; sl < S; sl++) {
          ranges.push_back({w.dispFlags + (row * S + sl) * 8, 8});
          ranges.push_back({w.combFlags + (row * S + sl) * 8, 8});
        }
        ranges.push_back({w.dispRows + row * stride, stride});
        ranges.push_back({w.dispMeta + row * meta, meta});
        ranges.push_back({w.combRows + row * stride, stride});
        for (int k = 0; k < w.ownerCols; k++) {  // the owner-weighted combine's [me][j][c]
          const size_t at = row * w.ownerCols + k;
          for (int sl = 0; sl < S; sl++) ranges.push_back({w.ownerFlags + (at * S + sl) * 8, 8});
          ranges.push_back({w.ownerRows + at * stride, stride});
        }
      }
      for (size_t bank : {(size_t)0, w.bankBytes}) {
        std::vector<char> used(rv.outboxBytes, 0);
        for (const auto& [start, len] : ranges)
          for (size_t b = 0; b < len; b++) {
            const size_t off = bank + start + b;
            size_t at = 0;
            ASSERT_TRUE(ncclep::railOutboxOffset(v[me], off, &at)) << "rank " << me << " offset " << off;
            ASSERT_LT(at, rv.outboxBytes);
            ASSERT_EQ(used[at]++, 0) << "two bytes at outbox " << at;
            // The exchange: outbox slice i lands at base[i] + me * slice[i] of the receiver's bank.
            int i = 0;
            while (i + 1 < ncclep::kRailRegions && at >= rv.outOff[i + 1]) i++;
            ASSERT_LT(at - rv.outOff[i], rv.slice[i]) << "outbox " << at << " outside its region's slice";
            // ... and inside the one message its call's exchange sends.
            for (const auto kind : {ncclep::RailRegions::of(ncclep::kDispatch, false),
                                    ncclep::RailRegions::of(ncclep::kCombine, false),
                                    ncclep::RailRegions::of(ncclep::kCombine, true)})
              if (i >= kind.first && i <= kind.last) {
                ASSERT_GE(at, rv.outOff[kind.first]);
                ASSERT_LT(at - rv.outOff[kind.first], rv.spanOf(kind)) << "outbox " << at << " outside its message";
              }
            EXPECT_EQ(bank + rv.base[i] + (size_t)me * rv.slice[i] + (at - rv.outOff[i]), off);
            checked++;
          }
      }
      // What is not a sender's slice has no place: the done flags, another source's rows.
      size_t at = 0;
      EXPECT_FALSE(ncclep::railOutboxOffset(v[me], w.dispDone + (size_t)me * 8, &at));
      EXPECT_FALSE(ncclep::railOutboxOffset(v[me], w.dispRows + (size_t)((me + 1) % sh.nRanks) * M * stride, &at));
    }
    EXPECT_GT(checked, 0);
  }
}

// High-Throughput across NVLink domains: the same, for what its kernels write towards another domain's rank: the
// handle's exchange row (int32 counts), the dispatch rows and metadata (the row flag inside) of [me][slot], and the
// combine rows and flags of [me][slot]. Each byte lies in the one message of its exchange (handle, dispatch or
// combine: RailView::regionsOf); nothing else (done flags, barrier flags) has a place.
TEST(EpRail, HighThroughputOutboxBytesLandWhereTheKernelsWouldHaveWrittenThem) {
  for (const int nRanks : {2, 3}) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = 3 * nRanks;
    cfg.max_tokens_per_rank = 37;  // two chunks, an odd exchange row (R + E + NC + 1 ints)
    cfg.max_token_bytes = 96;
    cfg.max_topk = 3;
    std::vector<ncclep::GroupView> v(nRanks);
    for (int r = 0; r < nRanks; r++) {
      ncclext::Topology topo;
      ASSERT_EQ(ncclext::makeTopology(r, nRanks, 0, 1, 0, &topo), ncclSuccess);  // one-GPU nodes
      ncclep::layoutGroup(cfg, topo, &v[r]);
    }
    const ncclep::WindowLayout& w = v[0].wl;
    const ncclep::RailView& rv = v[0].rail;
    ASSERT_TRUE(rv.highThroughput);
    ASSERT_EQ(rv.slice[ncclep::kRailDispFlags], 0u);
    ASSERT_EQ(rv.slice[ncclep::kRailOwnerRows], 0u);
    for (int i = 0; i < ncclep::kRailRegions; i++)  // the relay's copies move 8-byte words, or 4-byte ones
      ASSERT_TRUE((rv.base[i] | rv.slice[i]) % 4 == 0 && rv.outOff[i] % 16 == 0) << i;
    const int M = v[0].maxTokens;
    const size_t stride = v[0].rowStride, meta = v[0].meta.bytes, row = (size_t)w.exchangeInts * 4;
    int64_t checked = 0;
    for (int me = 0; me < nRanks; me++) {
      // (offset, bytes, exchange kind) of everything me's kernels write into another rank's window.
      struct Range {
        size_t start, len;
        int kind;
      };
      std::vector<Range> ranges = {{w.exchange + (size_t)me * row, row, ncclep::kRailHandle}};
      for (int j = 0; j < M; j++) {
        const size_t at = (size_t)me * M + j;
        ranges.push_back({w.dispRows + at * stride, stride, ncclep::kDispatch});
        ranges.push_back({w.dispMeta + at * meta, meta, ncclep::kDispatch});
        ranges.push_back({w.combRows + at * stride, stride, ncclep::kCombine});
        ranges.push_back({w.combFlags + at * 8, 8, ncclep::kCombine});
      }
      std::vector<char> used(rv.outboxBytes, 0);
      for (const Range& rg : ranges) {
        const ncclep::RailRegions kind = rv.regionsOf(rg.kind, false);
        for (size_t b = 0; b < rg.len; b++) {
          const size_t off = rg.start + b;
          size_t at = 0;
          ASSERT_TRUE(ncclep::railOutboxOffset(v[me], off, &at)) << "rank " << me << " offset " << off;
          ASSERT_LT(at, rv.outboxBytes);
          ASSERT_EQ(used[at]++, 0) << "two bytes at outbox " << at;
          int i = 0;  // the region whose slice holds outbox byte `at`
          while (i < ncclep::kRailRegions && !(at >= rv.outOff[i] && at - rv.outOff[i] < rv.slice[i])) i++;
          ASSERT_LT(i, ncclep::kRailRegions) << "outbox " << at << " in no region's slice";
          EXPECT_EQ(rv.base[i] + (size_t)me * rv.slice[i] + (at - rv.outOff[i]), off);
          ASSERT_TRUE(i >= kind.first && i <= kind.last) << "offset " << off << " in region " << i;
          ASSERT_LT(at - rv.outOff[kind.first], rv.spanOf(kind));
          checked++;
        }
      }
      size_t at = 0;
      EXPECT_FALSE(ncclep::railOutboxOffset(v[me], w.dispDone + (size_t)me * 8, &at));
      EXPECT_FALSE(ncclep::railOutboxOffset(v[me], w.barrierFlags + (size_t)me * 8, &at));
      EXPECT_FALSE(ncclep::railOutboxOffset(v[me], w.dispRows + (size_t)((me + 1) % nRanks) * M * stride, &at));
    }
    EXPECT_GT(checked, 0);
  }
}

// The rail layout tests' small groups: `experts` experts, `tokens` tokens a rank, rows of 512 bytes, top-2.
ncclEpGroupConfig_t smallGroup(int experts, int tokens, ncclEpAlgorithm_t algorithm = NCCL_EP_ALGO_HIGH_THROUGHPUT) {
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  cfg.algorithm = algorithm;
  cfg.num_experts = experts;
  cfg.max_tokens_per_rank = tokens;
  cfg.max_token_bytes = 512;
  cfg.max_topk = 2;
  return cfg;
}

// Rank 0's layout of `cfg` on `nRanks` ranks in LSA teams of `lsaSize` (layoutGroup).
ncclep::GroupView layoutOnRank0(const ncclEpGroupConfig_t& cfg, int nRanks, int lsaSize, bool hierarchical = false) {
  ncclext::Topology topo;
  EXPECT_EQ(ncclext::makeTopology(0, nRanks, 0, lsaSize, 0, &topo), ncclSuccess);
  ncclep::GroupView v;
  ncclep::layoutGroup(cfg, topo, &v, hierarchical);
  return v;
}

// What one exchange of `kind` moves to each remote rank with fixed slices (RailView::callBytes: LL's span, HT's
// regions), on rank 0 of 2 one-GPU domains: top-2, rows of 512 bytes.
size_t fixedSliceBytes(int algorithm, int experts, int tokens, int kind, bool ownerWeighted) {
  const ncclep::GroupView v = layoutOnRank0(smallGroup(experts, tokens, (ncclEpAlgorithm_t)algorithm), 2, 1);
  return v.rail.callBytes(v.rail.regionsOf(kind, ownerWeighted));
}

// The analytic model's fixed-slice bytes (bench/ep_internode_model.py, ll_fixed_slice_bytes; its test checks the
// same numbers) are the library's: 4 experts, 4 tokens.
TEST(EpRail, FixedSliceBytesMatchTheModel) {
  auto ll = [](int experts, int tokens, int kind, bool owner) {
    return fixedSliceBytes(NCCL_EP_ALGO_LOW_LATENCY, experts, tokens, kind, owner);
  };
  EXPECT_EQ(ll(4, 4, ncclep::kDispatch, false), 2368u);
  EXPECT_EQ(ll(4, 4, ncclep::kCombine, false), 2080u);
  EXPECT_EQ(ll(4, 4, ncclep::kCombine, true), 4160u);
  // One expert a rank: a token's columns on one rank are at most one, so the owner slices hold one row a slot.
  EXPECT_EQ(ll(2, 4, ncclep::kCombine, true), 2080u);
  // Three rows: a flag slice of 24 bytes is padded to 16 before the next region of the call's one message.
  EXPECT_EQ(ll(4, 3, ncclep::kDispatch, false), 1792u);
  EXPECT_EQ(ll(4, 3, ncclep::kCombine, false), 1568u);
  EXPECT_EQ(ll(4, 3, ncclep::kCombine, true), 3120u);
}

// The same for High-Throughput's flat exchange (ht_fixed_slice_bytes): dispatch rows + metadata (64 bytes a row),
// combine flags + rows (a message per region: no padding between them).
TEST(EpRail, HighThroughputFixedSliceBytesMatchTheModel) {
  auto ht = [](int tokens, int kind) { return fixedSliceBytes(NCCL_EP_ALGO_HIGH_THROUGHPUT, 4, tokens, kind, false); };
  EXPECT_EQ(ht(4, ncclep::kDispatch), 4u * (512 + 64));
  EXPECT_EQ(ht(4, ncclep::kCombine), 2080u);
  EXPECT_EQ(ht(3, ncclep::kCombine), 24u + 3 * 512);
}

// The flat HT exchange's staging (ht_staging_bytes, ncclEpGroupInfo_t::rail_staging_bytes: one outbox per rank of
// another domain) on rank 0 of 2 one-GPU domains, 4 experts, top-2, rows of 512 bytes, 4 tokens: the count row (2 +
// 4 + 1 + 1 ints: 32 bytes), then a round's dispatch rows and metadata (64 bytes) and combine flags and rows, each
// 16-aligned: 4416 bytes in one round, 3328 in rounds of 3 (24 flag bytes padded to 32). The model's test checks the
// same numbers, and the GPU runs' rail_staging_bytes against the model.
TEST(EpRail, HighThroughputStagingBytesMatchTheModel) {
  for (const auto& [round, want] : {std::pair<int, size_t>{0, 4416}, {4, 4416}, {3, 3328}, {64, 4416}}) {
    ncclEpGroupConfig_t cfg = smallGroup(4, 4);
    cfg.rail_round_tokens = round;
    const ncclep::GroupView v = layoutOnRank0(cfg, 2, 1);
    EXPECT_EQ((size_t)v.rail.boxes * v.rail.outboxBytes, want) << "rounds of " << round;
  }
}

// The hierarchical HT's staging (ht_hier_staging_bytes): 2 domains of 2, 8 experts, top-2, rows of 512 bytes, 4 tokens.
// Outside the window (rail_staging_bytes): 4 inboxes of the handle's count row (R + E + chunks + 1 + domains int32 = 64
// bytes) and the rail rows of a round (2 x 2 domains x C x (592 + 512 + 16: a dispatch row, a combine partial, its
// tail)): 18176 bytes in one round, 13696 in rounds of 3; in the window, 4 outboxes of the count row, C flags and C
// rows of 512 (2144 each).
TEST(EpRail, HierarchicalStagingBytesMatchTheModel) {
  for (const auto& [round, want] : {std::pair<int, size_t>{0, 18176}, {4, 18176}, {3, 13696}}) {
    ncclEpGroupConfig_t cfg = smallGroup(8, 4);
    cfg.rail_round_tokens = round;
    const ncclep::GroupView v = layoutOnRank0(cfg, 4, 2, true);
    ASSERT_EQ(v.rail.hier, 1);
    EXPECT_EQ(ncclep::railStagingBytes(v), want) << "rounds of " << round;
    EXPECT_EQ(v.wl.total - v.wl.outboxes, 4u * 2144u);
  }
}

// A receive cap across domains (the flat exchange, RailView::capped; ht_window_bytes and ht_staging_bytes with
// recv_cap): 2 one-GPU domains, 4 experts, top-2, rows of 512 bytes, 64 tokens, a cap of 16 rows. The window's
// staging holds the cap's rows (86016 bytes against 147456), the rail an inbox beside each outbox (70192 bytes: the
// count row grows by the 2 local experts' counts that fit, 16 bytes with its alignment; the inbox 36864, a round of
// dispatch rows and metadata, as large as one of combine flags and rows, which share its bytes), the exchange rows
// take the counts that fit; the hierarchical exchange and the mixed mode's relayed one are refused.
TEST(EpRail, ACapAcrossDomainsMatchesTheModel) {
  ncclEpGroupConfig_t cfg = smallGroup(4, 64);
  EXPECT_EQ(layoutOnRank0(cfg, 2, 1).wl.total, 147456u);
  cfg.max_recv_rows_per_rank = 16;
  const ncclep::GroupView v = layoutOnRank0(cfg, 2, 1);
  EXPECT_EQ(v.recvCap, 16);
  EXPECT_EQ(v.rail.capped, 1);
  EXPECT_EQ(v.wl.total, 86016u);
  EXPECT_EQ(ncclep::railStagingBytes(v), 107056u);
  EXPECT_EQ(v.rail.outboxBytes, 70192u);
  EXPECT_EQ(v.rail.inboxBytes, 36864u);
  // Each kind's regions from the inbox's start, one after another (16-aligned), none past the inbox.
  for (const int kind : {ncclep::kDispatch, ncclep::kCombine}) {
    const ncclep::RailRegions regions = v.rail.regionsOf(kind, false);
    EXPECT_EQ(v.rail.inOff[regions.first], 0u);
    EXPECT_EQ(v.rail.inOff[regions.last], (v.rail.outSlice[regions.first] + 15) / 16 * 16);
    EXPECT_LE(v.rail.inOff[regions.last] + v.rail.outSlice[regions.last], v.rail.inboxBytes);
  }
  EXPECT_EQ(v.wl.retained, v.wl.domainCounts);
  ncclext::Topology topo;
  ASSERT_EQ(ncclext::makeTopology(0, 4, 0, 2, 0, &topo), ncclSuccess);
  ncclep::GroupView w;
  EXPECT_EQ(ncclep::layoutWithinBudget(cfg, topo, &w, true), ncclInvalidUsage);  // hierarchical: relayed
  EXPECT_EQ(ncclep::layoutWithinBudget(cfg, topo, &w, false, true), ncclInvalidUsage);  // the mixed mode's rail
  ASSERT_EQ(ncclep::layoutWithinBudget(cfg, topo, &w, false), ncclSuccess);
  EXPECT_EQ(w.rail.capped, 1);
}

// ncclEpGroupConfig_t::rail_staging_bytes_max (layoutWithinBudget): High-Throughput's round becomes the largest
// one, at most the configured round, whose rail staging fits the budget (flat: 2 one-GPU domains; hierarchical: 2
// domains of 2); a budget below one row a peer, or below Low-Latency's fixed staging, is refused; 0 is no limit.
TEST(EpRail, StagingBudgetPicksTheLargestRoundThatFits) {
  struct Shape {
    ncclEpAlgorithm_t algorithm;
    int nRanks, lsaSize;
    bool hierarchical;
  };
  const ncclEpAlgorithm_t ht = NCCL_EP_ALGO_HIGH_THROUGHPUT;
  for (const Shape sh : {Shape{ht, 2, 1, false}, Shape{ht, 4, 2, true}, Shape{NCCL_EP_ALGO_LOW_LATENCY, 2, 1, false}}) {
    ncclEpGroupConfig_t cfg = smallGroup(2 * sh.nRanks, 64, sh.algorithm);
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(0, sh.nRanks, 0, sh.lsaSize, 0, &topo), ncclSuccess);
    auto stagingAt = [&](int round) {  // the staging of rounds of `round` rows, no budget
      ncclEpGroupConfig_t c = cfg;
      c.rail_round_tokens = round;
      ncclep::GroupView v;
      ncclep::layoutGroup(c, topo, &v, sh.hierarchical);
      return ncclep::railStagingBytes(v);
    };
    const size_t whole = stagingAt(64), one = stagingAt(1);
    ncclep::GroupView v;
    cfg.rail_staging_bytes_max = 0;
    ASSERT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclSuccess);
    EXPECT_EQ(ncclep::railStagingBytes(v), whole);
    cfg.rail_staging_bytes_max = whole;  // fits as it is
    ASSERT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclSuccess);
    EXPECT_EQ(ncclep::railStagingBytes(v), whole);
    if (sh.algorithm == NCCL_EP_ALGO_LOW_LATENCY) {  // fixed: refused below it
      cfg.rail_staging_bytes_max = whole - 1;
      EXPECT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclInvalidArgument);
      continue;
    }
    ASSERT_LT(one, whole);
    for (const size_t budget : {one, one + 1, (one + whole) / 3, (one + whole) / 2, stagingAt(17), stagingAt(17) - 1,
                                whole - 1}) {
      cfg.rail_staging_bytes_max = budget;
      ASSERT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclSuccess) << budget;
      const int round = v.rail.roundSlots;
      EXPECT_LE(stagingAt(round), budget);
      EXPECT_EQ(ncclep::railStagingBytes(v), stagingAt(round));
      if (round < 64) {
        EXPECT_GT(stagingAt(round + 1), budget) << "budget " << budget << ": a larger round fits";
      }
    }
    cfg.rail_staging_bytes_max = stagingAt(17);
    cfg.rail_round_tokens = 8;  // the configured round stays the most
    ASSERT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclSuccess);
    EXPECT_EQ(v.rail.roundSlots, 8);
    cfg.rail_round_tokens = 0;
    cfg.rail_staging_bytes_max = one - 1;
    EXPECT_EQ(ncclep::layoutWithinBudget(cfg, topo, &v, sh.hierarchical), ncclInvalidArgument);
  }
}

// A High-Throughput rank's window (ht_window_bytes, ncclEpGroupInfo_t::window_bytes): rows of 512 bytes, top-2, 4
// tokens; 2 one-GPU domains of 4 experts: 20480 bytes; 2 domains of 2, 8 experts: 28672, and 37248 with the
// hierarchical HT (its 4 outboxes of 2144 bytes in the window, and one count per domain in each exchange row).
TEST(EpRail, WindowBytesMatchTheModel) {
  struct Shape {
    int nRanks, lsaSize, experts;
    bool hierarchical;
    size_t want;
  };
  for (const Shape sh : {Shape{2, 1, 4, false, 20480}, Shape{4, 2, 8, false, 28672}, Shape{4, 2, 8, true, 37248}}) {
    const ncclep::GroupView v = layoutOnRank0(smallGroup(sh.experts, 4), sh.nRanks, sh.lsaSize, sh.hierarchical);
    EXPECT_EQ(v.wl.total, sh.want) << sh.nRanks << " ranks, hierarchical " << sh.hierarchical;
  }
}

// ncclEpGroupInfoQuery: what ncclEpGroupGetInfo reports, before any group exists (host arithmetic): the window and
// rail staging of WindowBytesMatchTheModel's and HighThroughputStagingBytesMatchTheModel's shapes, a staging budget
// that shrinks the rounds, and the checks (the config's as ncclEpCreateGroup's; the ranks, their LSA teams).
TEST(EpRail, InfoQueryReportsWhatTheGroupWould) {
  ncclEpGroupConfig_t cfg = smallGroup(4, 4);
  ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
  ASSERT_EQ(ncclEpGroupInfoQuery(&cfg, 2, 1, &info), ncclSuccess);  // two one-GPU nodes
  EXPECT_EQ(info.n_domains, 2);
  EXPECT_EQ(info.domain_size, 1);
  EXPECT_EQ(info.window_bytes, 20480u);
  EXPECT_EQ(info.rail_staging_bytes, 4416u);
  EXPECT_EQ(info.rail_round_tokens, 4);
  EXPECT_EQ(info.rail_messages_per_domain, 2);  // a message per region, one round
  EXPECT_EQ(info.rail_relayed + info.rail_hierarchical + info.rail_overlapped, 0);
  cfg.rail_staging_bytes_max = 3328;  // rounds of 3 rows a peer take that
  ASSERT_EQ(ncclEpGroupInfoQuery(&cfg, 2, 1, &info), ncclSuccess);
  EXPECT_EQ(info.rail_round_tokens, 3);
  EXPECT_EQ(info.rail_staging_bytes, 3328u);
  EXPECT_EQ(info.rail_messages_per_domain, 4);  // two rounds of fixed slices
  cfg.rail_staging_bytes_max = 100;
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 2, 1, &info), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclEpGetLastError()).find("rail_staging_bytes_max 100"), std::string::npos);
  cfg.rail_staging_bytes_max = 0;
  cfg.num_experts = 8;
  ASSERT_EQ(ncclEpGroupInfoQuery(&cfg, 4, 2, &info), ncclSuccess);  // two domains of two
  EXPECT_EQ(info.window_bytes, 28672u);
  EXPECT_EQ(info.n_domains, 2);
  ASSERT_EQ(ncclEpGroupInfoQuery(&cfg, 4, 4, &info), ncclSuccess);  // one domain: no rail
  EXPECT_EQ(info.n_domains, 1);
  EXPECT_EQ(info.rail_staging_bytes, 0u);
  EXPECT_EQ(info.rail_dispatch_bytes, 0u);
  // The checks.
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 3, 1, &info), ncclInvalidArgument);  // 8 experts on 3 ranks
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 4, 3, &info), ncclInvalidArgument);  // LSA teams of 3 do not tile 4 ranks
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 0, 1, &info), ncclInvalidArgument);
  EXPECT_EQ(ncclEpGroupInfoQuery(nullptr, 4, 1, &info), ncclInvalidArgument);
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 4, 1, nullptr), ncclInvalidArgument);
  cfg.max_token_bytes = 500;  // as ncclEpCreateGroup: a multiple of 16
  EXPECT_EQ(ncclEpGroupInfoQuery(&cfg, 4, 1, &info), ncclInvalidArgument);
  cfg.max_token_bytes = 512;
}

// A program built against the first layout of ncclEpGroupConfig_t (NCCL_EP_GROUP_CONFIG_V1_SIZE: before
// ht_hierarchical and rail_overlap) runs on this library: its struct is read up to its size, the rest is
// NCCL_EP_AUTO, whatever lies past it in the caller's memory; a size of no layout is refused with a message.
TEST(EpApi, OlderConfigLayoutsAreAccepted) {
  const ncclEpGroupConfig_t now = smallGroup(16, 4);
  OlderLayout<ncclEpGroupConfig_t> old(now, NCCL_EP_GROUP_CONFIG_V1_SIZE);
  ncclEpGroupInfo_t a = NCCL_EP_GROUP_INFO_INIT, b = NCCL_EP_GROUP_INFO_INIT;
  ASSERT_EQ(ncclEpGroupInfoQuery(&old.s, 8, 4, &a), ncclSuccess) << ncclEpGetLastError();
  ASSERT_EQ(ncclEpGroupInfoQuery(&now, 8, 4, &b), ncclSuccess);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);  // the appended fields read as NCCL_EP_AUTO, as `now` has them
  ncclComm_t fake = reinterpret_cast<ncclComm_t>(0x1);
  ncclEpGroup_t g = nullptr;
  old.s.num_experts = 0;  // group creation reads the old layout too: its own checks run (before the comm is used)
  EXPECT_EQ(ncclEpCreateGroup(&g, fake, &old.s), ncclInvalidArgument);
  EXPECT_TRUE(says("num_experts 0")) << ncclEpGetLastError();
  for (unsigned size : {(unsigned)NCCL_EP_GROUP_CONFIG_V1_SIZE + 4, (unsigned)sizeof(ncclEpGroupConfig_t) + 8, 8u}) {
    ncclEpGroupConfig_t c = now;
    c.size = size;
    EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclInvalidArgument) << size;
    EXPECT_TRUE(says("are not a layout of this library")) << ncclEpGetLastError();
  }
  ncclEpGroupConfig_t c = now;
  c.ht_hierarchical = 2;
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclInvalidArgument);
  EXPECT_TRUE(says("ht_hierarchical 2"));
  c = now;
  c.ht_hierarchical = 1;  // the config's switch, not the environment's: a rail row per (token, domain), relayed
  ASSERT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclSuccess);
  EXPECT_EQ(a.rail_hierarchical, 1);
  c.ht_hierarchical = NCCL_EP_OFF;
  ASSERT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclSuccess);
  EXPECT_EQ(a.rail_hierarchical, 0);
}

// High-Throughput's receive cap (max_recv_rows_per_rank, one NVLink domain): the dispatch staging holds the cap's
// rows, the combine staging the most rows one rank's tokens send (M x min(R, K)), and the exchange row gains the
// retained counts (L ints); the rest of the window is as without a cap. A cap above R x M stays dense but bounds
// nothing; the checks refuse it across domains, on Low-Latency groups, below 0, and an unknown overflow policy.
TEST(EpCap, ReceiveCapSizesTheStaging) {
  ncclEpGroupConfig_t cfg = goodConfig();  // 256 experts, M 4096, 14336-byte rows, top-8
  const int R = 8, M = 4096, K = 8, L = 256 / R;
  const ncclep::GroupView open = layoutOnRank0(cfg, R, R);
  EXPECT_EQ(open.recvCap, 0);
  cfg.max_recv_rows_per_rank = 12000;
  const ncclep::GroupView capped = layoutOnRank0(cfg, R, R);
  EXPECT_EQ(capped.recvCap, 12000);
  EXPECT_EQ(capped.recvCapError, 1);
  EXPECT_EQ(capped.wl.dispMeta - capped.wl.dispRows, ncclep::alignUp(12000ull * 14336, 4096));
  EXPECT_EQ(capped.wl.combSlots, M * std::min(R, K));
  EXPECT_EQ(capped.wl.exchangeInts, open.wl.exchangeInts + L);
  EXPECT_EQ(capped.wl.retained, open.wl.exchangeInts);
  EXPECT_LT(capped.wl.total, open.wl.total);
  cfg.max_recv_rows_per_rank = R * M + 5;  // above the most rows any routing sends: dense, nothing dropped
  EXPECT_EQ(layoutOnRank0(cfg, R, R).recvCap, R * M);
  cfg.recv_overflow = NCCL_EP_RECV_OVERFLOW_DROP;
  EXPECT_EQ(layoutOnRank0(cfg, R, R).recvCapError, 0);
  // The memory model: 64 ranks in one domain (4 experts each), a cap of twice the mean load of uniform top-8
  // routing: a source's token reaches a given rank with probability 1 - C(252, 8) / C(256, 8), so a rank receives
  // 64 x M x that rows on average (31,439). The window shrinks 5.4x (7.67 GB to 1.41 GB).
  double miss = 1;
  for (int i = 0; i < 8; i++) miss *= (252.0 - i) / (256.0 - i);
  const int meanRows = (int)(64.0 * M * (1 - miss));
  EXPECT_EQ(meanRows, 31439);
  ncclEpGroupConfig_t big = goodConfig();
  ncclEpGroupInfo_t a = NCCL_EP_GROUP_INFO_INIT, b = NCCL_EP_GROUP_INFO_INIT;
  ASSERT_EQ(ncclEpGroupInfoQuery(&big, 64, 64, &a), ncclSuccess) << ncclEpGetLastError();
  big.max_recv_rows_per_rank = 2 * meanRows;
  ASSERT_EQ(ncclEpGroupInfoQuery(&big, 64, 64, &b), ncclSuccess) << ncclEpGetLastError();
  EXPECT_GT((double)a.window_bytes / (double)b.window_bytes, 5.0) << a.window_bytes << " vs " << b.window_bytes;
  // The checks.
  ncclEpGroupConfig_t c = goodConfig();
  c.max_recv_rows_per_rank = 1000;
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclSuccess) << ncclEpGetLastError();  // two domains of four: flat
  c.ht_hierarchical = 1;  // the hierarchical exchange relays: no cap
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 4, &a), ncclInvalidUsage);
  EXPECT_TRUE(says("across NVLink domains the receive cap takes the flat exchange")) << ncclEpGetLastError();
  c.ht_hierarchical = NCCL_EP_AUTO;
  c.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
  c.max_tokens_per_rank = 128;
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 8, &a), ncclInvalidUsage);
  EXPECT_TRUE(says("belongs to the High-Throughput mode")) << ncclEpGetLastError();
  c = goodConfig();
  c.max_recv_rows_per_rank = -1;
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 8, &a), ncclInvalidArgument);
  EXPECT_TRUE(says("max_recv_rows_per_rank -1 < 0")) << ncclEpGetLastError();
  c.max_recv_rows_per_rank = 1000;
  c.recv_overflow = (ncclEpRecvOverflow_t)7;
  EXPECT_EQ(ncclEpGroupInfoQuery(&c, 8, 8, &a), ncclInvalidArgument);
  EXPECT_TRUE(says("recv_overflow 7 unknown")) << ncclEpGetLastError();
}

// A config of the second layout (NCCL_EP_GROUP_CONFIG_V2_SIZE: before the receive cap) reads no cap whatever lies
// past it; a layout_info of the first layout (no recv_dropped_counter) is read up to its size; the cap's outputs are
// refused where they mean nothing (recv_dropped_counter on Low-Latency groups, missing_experts on a High-Throughput
// group without a cap) and checked where they do.
TEST(EpCap, OlderLayoutsAndTheCapsOutputs) {
  const ncclEpGroupConfig_t now = goodConfig();
  OlderLayout<ncclEpGroupConfig_t> old(now, NCCL_EP_GROUP_CONFIG_V2_SIZE);
  ncclEpGroupInfo_t a = NCCL_EP_GROUP_INFO_INIT, b = NCCL_EP_GROUP_INFO_INIT;
  ASSERT_EQ(ncclEpGroupInfoQuery(&old.s, 8, 8, &a), ncclSuccess) << ncclEpGetLastError();
  ASSERT_EQ(ncclEpGroupInfoQuery(&now, 8, 8, &b), ncclSuccess);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  // layout_info of the first layout: its header passes, the next check (a tensor of the wrong length) speaks.
  Fake f;
  OlderLayout<ncclEpLayoutInfo_t> oldInfo(NCCL_EP_LAYOUT_INFO_INIT, NCCL_EP_LAYOUT_INFO_V1_SIZE);
  oldInfo.s.recv_total_counter = epTensor(f.p, ncclInt32, {2});
  ncclEpHandle_t h = nullptr;
  ncclEpTensor_t idx = epTensor(f.p, ncclInt32, {100, 8});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &idx, &oldInfo.s, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(says("layout_info.recv_total_counter: sizes[0] = 2")) << ncclEpGetLastError();
  ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
  info.recv_dropped_counter = epTensor(f.p, ncclInt32, {3});
  EXPECT_EQ(ncclEpCreateHandle(&h, &f.group, NCCL_EP_LAYOUT_FLAT, &idx, &info, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("layout_info.recv_dropped_counter: sizes[0] = 3")) << ncclEpGetLastError();
  FakeLl ll;
  info.recv_dropped_counter = epTensor(ll.p, ncclInt32, {1});
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(ll.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(ll.p, ncclBfloat16, {2 * 256, 7168});
  EXPECT_EQ(ncclEpDispatch(&ll.handle, &in, &out, &info, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("recv_dropped_counter: High-Throughput only")) << ncclEpGetLastError();
  // missing_experts at a High-Throughput combine: only with a cap, then [T] int32.
  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  co.missing_experts = epTensor(f.p, ncclInt32, {99});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("High-Throughput groups with max_recv_rows_per_rank")) << ncclEpGetLastError();
  f.group.view.recvCap = 150;
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("outputs.missing_experts: sizes[0] = 99")) << ncclEpGetLastError();
}

// Zero-copy outputs: ncclEpGroupGetDispatchWindow describes the window's dispatch staging ([cap, hidden] of the
// dtype, hidden x its size the row stride) on a group with a receive cap only; a dispatch whose outputs.tokens lies
// in the window is accepted only at that tensor, for FLAT handles and rows of the window's size.
TEST(EpCap, DispatchWindowAndItsChecks) {
  Fake f;
  ncclEpTensor_t w = NCCL_EP_TENSOR_INIT;
  EXPECT_EQ(ncclEpGroupGetDispatchWindow(&f.group, ncclBfloat16, 7168, &w), ncclInvalidUsage);
  EXPECT_TRUE(says("need a High-Throughput group with max_recv_rows_per_rank")) << ncclEpGetLastError();
  alignas(16) static char window[1 << 16];
  f.group.view.recvCap = 150;
  f.group.view.rowStride = 14336;
  f.group.view.wl.dispRows = 4096;
  f.group.view.wl.total = sizeof(window);
  f.group.view.peers.mine = window;
  EXPECT_EQ(ncclEpGroupGetDispatchWindow(&f.group, ncclBfloat16, 7000, &w), ncclInvalidArgument);
  EXPECT_TRUE(says("hidden 7000 x 2 bytes is not the window's row of max_token_bytes 14336")) << ncclEpGetLastError();
  EXPECT_EQ(ncclEpGroupGetDispatchWindow(&f.group, (ncclDataType_t)99, 7168, &w), ncclInvalidArgument);
  EXPECT_EQ(ncclEpGroupGetDispatchWindow(&f.group, ncclBfloat16, 7168, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclEpGroupGetDispatchWindow(nullptr, ncclBfloat16, 7168, &w), ncclInvalidArgument);
  ASSERT_EQ(ncclEpGroupGetDispatchWindow(&f.group, ncclBfloat16, 7168, &w), ncclSuccess) << ncclEpGetLastError();
  EXPECT_EQ(w.ndim, 2u);
  EXPECT_EQ(w.data, window + 4096);
  EXPECT_EQ(w.sizes[0], 150);
  EXPECT_EQ(w.sizes[1], 7168);
  // A dispatch into the window elsewhere than the staging, and into it from an EXPERT_MAJOR handle.
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = w;
  out.tokens.data = window + 4096 + 16;
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("only ncclEpGroupGetDispatchWindow's tensor may")) << ncclEpGetLastError();
  out.tokens = w;
  f.handle.layout = NCCL_EP_LAYOUT_EXPERT_MAJOR;
  f.totals[1] = 150;  // EXACT: the EXPERT_MAJOR rows it needs
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("FLAT handles only")) << ncclEpGetLastError();
  // The window as combine's input: refused (a peer's next dispatch may write it while combine reads).
  f.handle.layout = NCCL_EP_LAYOUT_FLAT;
  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = w;
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(f.p, ncclBfloat16, {100, 7168});
  EXPECT_EQ(ncclEpCombine(&f.handle, &ci, &co, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("inputs.tokens lies in the group's window")) << ncclEpGetLastError();
}

// A dispatch config of the first layout (no global_expert_ids) is read as such: what lies past it is not read (the
// appended field is 0), so the call goes on to its next check; a field out of range and an unknown size are refused.
TEST(EpApi, OlderDispatchConfigLayoutsAreAccepted) {
  Fake f;
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(f.p, ncclBfloat16, {99, 7168});  // not the handle's 100 tokens: the check after the config's
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(f.p, ncclBfloat16, {150, 7168});
  const ncclEpDispatchConfig_t now = NCCL_EP_DISPATCH_CONFIG_INIT;
  OlderLayout<ncclEpDispatchConfig_t> old(now, NCCL_EP_DISPATCH_CONFIG_V1_SIZE);
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, &old.s, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("inputs.tokens: sizes[0] = 99")) << ncclEpGetLastError();
  ncclEpDispatchConfig_t c = now;
  c.global_expert_ids = 2;
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, &c, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("config.global_expert_ids 2")) << ncclEpGetLastError();
  c = now;
  c.size = NCCL_EP_DISPATCH_CONFIG_V1_SIZE + 8;
  EXPECT_EQ(ncclEpDispatch(&f.handle, &in, &out, nullptr, &c, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("are not a layout of this library")) << ncclEpGetLastError();
}

// The hierarchical exchange's rail row (ht_hier_fixed_bytes): rows of 512 bytes, domains of 2, top-2, 4 scales (512
// / 128, as layoutGroup sets them): the row, seq + counts (16), the position (4), 2 slots, experts + weights +
// indices (24), scales (16) = 580, padded to 592; with 6 slots 596, padded to 608. A call's dispatch is M of them
// to each other domain, its combine M rows (in rounds: group.h hierMessageBytes; the GPU run's
// rail_dispatch_domain_bytes matched the model too).
TEST(EpRail, HierarchicalRowBytesMatchTheModel) {
  ncclep::HierRow hr;
  hr.rowStride = 512;
  hr.domainSize = 2;
  hr.maxTopk = 2;
  hr.maxScales = 4;
  EXPECT_EQ(hr.bytes(), 592u);
  hr.domainSize = 6;
  EXPECT_EQ(hr.bytes(), 608u);
}

// The flat exchange keeps one outbox (and, Low-Latency, one inbox) per rank of another domain: box(r) numbers those
// ranks 0.. in rank order, skipping my domain; High-Throughput's receives land in the window itself (direct: no
// inbox). Relayed exchanges keep every rank's place (inbox[D * G + r] is by domain and rank).
TEST(EpRail, FlatExchangeKeepsOneBoxPerRankOfAnotherDomain) {
  struct Shape {
    int nRanks, lsaSize;
    bool hierarchical;
  };
  for (const ncclEpAlgorithm_t algorithm : {NCCL_EP_ALGO_HIGH_THROUGHPUT, NCCL_EP_ALGO_LOW_LATENCY})
    for (const Shape sh : {Shape{2, 1, false}, Shape{4, 1, false}, Shape{8, 2, false}, Shape{8, 4, false},
                           Shape{8, 2, true}, Shape{4, 4, false}}) {
      const ncclEpGroupConfig_t cfg = smallGroup(2 * sh.nRanks, 4, algorithm);
      for (int me = 0; me < sh.nRanks; me++) {
        ncclext::Topology topo;
        ASSERT_EQ(ncclext::makeTopology(me, sh.nRanks, me % sh.lsaSize, sh.lsaSize, 0, &topo), ncclSuccess);
        ncclep::GroupView v;
        ncclep::layoutGroup(cfg, topo, &v, sh.hierarchical);
        const ncclep::RailView& rv = v.rail;
        const std::string at = std::to_string(sh.nRanks) + "/" + std::to_string(sh.lsaSize) + " rank " +
                               std::to_string(me) + (algorithm == NCCL_EP_ALGO_LOW_LATENCY ? " LL" : " HT");
        if (topo.nDomains == 1) {
          EXPECT_EQ(rv.boxes, 0) << at;
          EXPECT_EQ(rv.direct, 0) << at;
          continue;
        }
        const bool ht = algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT;
        EXPECT_EQ(rv.relay, ht && sh.hierarchical && sh.lsaSize > 1 ? 1 : 0) << at;
        EXPECT_EQ(rv.direct, ht && !rv.relay ? 1 : 0) << at;
        EXPECT_EQ(rv.boxes, rv.relay ? sh.nRanks : sh.nRanks - sh.lsaSize) << at;
        std::vector<int> seen(rv.boxes, 0);
        for (int r = 0; r < sh.nRanks; r++) {
          if (rv.local(r)) continue;
          const int b = rv.box(r);
          ASSERT_TRUE(b >= 0 && b < rv.boxes) << at << " remote " << r << " box " << b;
          EXPECT_EQ(seen[b]++, 0) << at << " two ranks in box " << b;
          EXPECT_TRUE(!rv.relay || b == r) << at << " relayed: rank " << r << " in box " << b;
        }
        for (int b = 0; b < rv.boxes && !rv.relay; b++) EXPECT_EQ(seen[b], 1) << at << " box " << b << " unused";
      }
    }
}

// High-Throughput's flat exchange in rounds (rail_round_tokens): the outbox's row regions hold a round's slots, and
// every byte the send half of round k writes for slot s (at slot s - k x roundSlots of the outbox, roundSlotOf)
// lands, through the round's message (from the outbox slice's start into roundInto), where the kernels would have
// written it without rounds; a slot outside the round has no place. Low-Latency and one domain have one round.
TEST(EpRail, RoundsLandEverySlotWhereOneRoundWould) {
  for (const int round : {0, 1, 8, 37, 64}) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = 6;
    cfg.max_tokens_per_rank = 37;  // rounds of 8: four of 8 and one of 5
    cfg.max_token_bytes = 96;
    cfg.max_topk = 3;
    cfg.rail_round_tokens = round;
    const int R = 3, M = cfg.max_tokens_per_rank;
    const int want = round == 0 ? std::min(M, ncclep::kDefaultRailRoundTokens) : std::min(M, round);
    for (int me = 0; me < R; me++) {
      ncclext::Topology topo;
      ASSERT_EQ(ncclext::makeTopology(me, R, 0, 1, 0, &topo), ncclSuccess);  // one-GPU nodes
      ncclep::GroupView v;
      ncclep::layoutGroup(cfg, topo, &v);
      const ncclep::RailView& rv = v.rail;
      ASSERT_EQ(rv.direct, 1);
      ASSERT_EQ(rv.roundSlots, want) << round;
      const size_t stride = v.rowStride, meta = v.meta.bytes;
      ASSERT_EQ(rv.outSlice[ncclep::kRailDispRows], (size_t)want * stride);
      ASSERT_EQ(rv.outSlice[ncclep::kRailDispMeta], (size_t)want * meta);
      ASSERT_EQ(rv.outSlice[ncclep::kRailHeader], rv.slice[ncclep::kRailHeader]);  // the count row, whole
      struct Region {
        int i;
        size_t window, slot;
      };
      const ncclep::WindowLayout& w = v.wl;
      for (const Region rg : {Region{ncclep::kRailDispRows, w.dispRows, stride},
                              Region{ncclep::kRailDispMeta, w.dispMeta, meta},
                              Region{ncclep::kRailCombRows, w.combRows, stride},
                              Region{ncclep::kRailCombFlags, w.combFlags, 8}}) {
        ASSERT_EQ(rv.slotBytes(rg.i), rg.slot);
        for (int slot = 0; slot < M; slot++) {
          const int k = slot / want, lo = k * want;
          const int to = (me + 1) % R;  // another domain's rank
          const int at = ncclep::roundSlotOf(rv, to, slot, lo, rv.roundSlots);
          ASSERT_EQ(at, slot - lo);
          EXPECT_EQ(ncclep::roundSlotOf(rv, to, slot, lo + want, rv.roundSlots), -1) << "slot " << slot;
          EXPECT_EQ(ncclep::roundSlotOf(rv, me, slot, lo, rv.roundSlots), slot) << "my domain: no rounds";
          // The kernels' write for slot `slot` in round k, and where the round's message lands that byte.
          const size_t written = rg.window + ((size_t)me * M + at) * rg.slot;
          size_t out = 0;
          ASSERT_TRUE(ncclep::railOutboxOffset(v, written, &out)) << "slot " << slot << " region " << rg.i;
          ASSERT_GE(out, rv.outOff[rg.i]);
          ASSERT_LT(out - rv.outOff[rg.i] + rg.slot, rv.outSlice[rg.i] + 1) << "past the round's rows";
          EXPECT_EQ(rv.roundInto(rg.i, me, lo) + (out - rv.outOff[rg.i]), rg.window + ((size_t)me * M + slot) * rg.slot)
              << "slot " << slot << " region " << rg.i;
        }
        // A slot past the round's rows has no place in the outbox (with one round: past my slice).
        size_t out = 0;
        EXPECT_FALSE(ncclep::railOutboxOffset(v, rg.window + ((size_t)me * M + want) * rg.slot, &out))
            << "region " << rg.i;
      }
    }
    // Low-Latency: one round whatever the field.
    cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(0, R, 0, 1, 0, &topo), ncclSuccess);
    ncclep::GroupView v;
    ncclep::layoutGroup(cfg, topo, &v);
    EXPECT_EQ(v.rail.direct, 0);
    EXPECT_EQ(v.rail.roundSlots, M);
    for (int i = 0; i < ncclep::kRailRegions; i++) EXPECT_EQ(v.rail.outSlice[i], v.rail.slice[i]) << i;
  }
}

// One pair's rounds (railRoundRows): in every round either rank takes, what sender a moves (from its count `sent`,
// in its `roundsA` rounds) is what receiver b expects (from its count `got`, in its `roundsB`), and the rounds move
// `rows` in all (a round past a rank's own number moves nothing on that side).
void expectRoundsAgree(const ncclep::RailView& a, int roundsA, int64_t sent, const ncclep::RailView& b, int roundsB,
                       int64_t got, int64_t rows) {
  int64_t moved = 0;
  for (int k = 0; k < std::max(roundsA, roundsB); k++) {
    const int64_t out = k < roundsA ? ncclep::railRoundRows(a, k, sent) : 0;
    const int64_t in = k < roundsB ? ncclep::railRoundRows(b, k, got) : 0;
    ASSERT_EQ(out, in) << "round " << k;
    moved += out;
  }
  ASSERT_EQ(moved, rows);
}

// The rounds of the direct exchange agree between every pair of ranks whatever each one's own number of rounds: on
// random EXACT counts (rows[a][b]: a's rows to b) over 4 one-GPU domains and rounds of 3 slots, for each pair and
// round, what a sends b (from a's counts) is what b receives from a (from b's counts), rounds past a rank's own
// number move nothing, and the rounds move every row once. Fixed slices: ceil(M / C) rounds on every rank.
TEST(EpRail, RoundsAgreeBetweenEveryPair) {
  const int R = 4, M = 16;
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  cfg.num_experts = 2 * R;
  cfg.max_tokens_per_rank = M;
  cfg.max_token_bytes = 512;
  cfg.max_topk = 2;
  cfg.rail_round_tokens = 3;
  std::vector<ncclep::GroupView> v(R);
  for (int r = 0; r < R; r++) {
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(r, R, 0, 1, 0, &topo), ncclSuccess);
    ncclep::layoutGroup(cfg, topo, &v[r]);
    ASSERT_EQ(v[r].rail.roundSlots, 3);
    EXPECT_EQ(ncclep::railRoundsOf(v[r].rail, R, M, nullptr), 6);  // fixed slices: ceil(16 / 3)
  }
  std::mt19937 rng(12);
  for (int trial = 0; trial < 200; trial++) {
    int64_t rows[R][R];
    for (int a = 0; a < R; a++)
      for (int b = 0; b < R; b++) rows[a][b] = a == b ? 0 : (int64_t)(rng() % (M + 1)) * (rng() % 4 != 0);
    int rounds[R];
    std::vector<int64_t> counts[R];
    for (int me = 0; me < R; me++) {
      counts[me].assign(2 * R, 0);
      for (int r = 0; r < R; r++) {
        counts[me][r] = rows[me][r];
        counts[me][R + r] = rows[r][me];
      }
      rounds[me] = ncclep::railRoundsOf(v[me].rail, R, M, counts[me].data());
      ASSERT_GE(rounds[me], 1);
    }
    for (int a = 0; a < R; a++)
      for (int b = 0; b < R; b++) {
        if (a == b) continue;
        SCOPED_TRACE("trial " + std::to_string(trial) + " pair " + std::to_string(a) + "->" + std::to_string(b));
        ASSERT_NO_FATAL_FAILURE(
            expectRoundsAgree(v[a].rail, rounds[a], counts[a][b], v[b].rail, rounds[b], counts[b][R + a], rows[a][b]));
      }
  }
}

// The hierarchical HT's rounds (rail positions towards each other domain, between ranks of one index) agree between
// every pair whatever each one's own number of rounds: on random EXACT counts over 3 domains of 2 ranks and rounds
// of 3 positions (tokens[a][d]: a's tokens that hit domain d, its rail rows to d's rank of its index, and back as
// partials), what a sends b in each round (from a's counts, HandleView::hostTotals' rail part) is what b receives
// from a (from b's), rounds past a rank's own number move nothing, and the rounds move every row once. The ranks
// of a domain take the same rounds (their launch fences pair up): the most rows of any of them.
TEST(EpRail, HierarchicalRoundsAgreeBetweenEveryPair) {
  const int G = 2, D = 3, R = G * D, M = 16;
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  cfg.num_experts = 2 * R;
  cfg.max_tokens_per_rank = M;
  cfg.max_token_bytes = 512;
  cfg.max_topk = 2;
  cfg.rail_round_tokens = 3;
  std::vector<ncclep::GroupView> v(R);
  for (int r = 0; r < R; r++) {
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(r, R, r % G, G, 0, &topo), ncclSuccess);
    ncclep::layoutGroup(cfg, topo, &v[r], true);
    ASSERT_EQ(v[r].rail.hier, 1);
    ASSERT_EQ(v[r].rail.roundSlots, 3);
    EXPECT_EQ(ncclep::railRoundsOf(v[r].rail, R, M, nullptr), 6);  // fixed slices: ceil(16 / 3)
  }
  std::mt19937 rng(18);
  for (int trial = 0; trial < 200; trial++) {
    int64_t tokens[R][D];
    for (int a = 0; a < R; a++)
      for (int d = 0; d < D; d++) tokens[a][d] = d == a / G ? -1 : (int64_t)(rng() % (M + 1)) * (rng() % 4 != 0);
    int rounds[R];
    // hostTotals + 2: [r], [R + r] (the flat counts, unused here), then the rail's, then the domain's most.
    std::vector<int64_t> counts[R];
    for (int me = 0; me < R; me++) {
      counts[me].assign(2 * R + 2 * D + 1, 0);
      for (int d = 0; d < D; d++) {
        counts[me][2 * R + d] = tokens[me][d];
        counts[me][2 * R + D + d] = d == me / G ? -1 : tokens[d * G + me % G][me / G];
      }
    }
    for (int me = 0; me < R; me++) {
      int64_t most = 0;
      for (int p = me / G * G; p < me / G * G + G; p++)
        for (int d = 0; d < 2 * D; d++) most = std::max(most, counts[p][2 * R + d]);
      counts[me][2 * R + 2 * D] = most;
      rounds[me] = ncclep::railRoundsOf(v[me].rail, R, M, counts[me].data());
      ASSERT_GE(rounds[me], 1);
      if (me % G) {
        ASSERT_EQ(rounds[me], rounds[me - 1]) << "trial " << trial << ": one domain, different rounds";
      }
    }
    for (int a = 0; a < R; a++)
      for (int db = 0; db < D; db++) {
        if (db == a / G) continue;
        const int b = db * G + a % G;
        SCOPED_TRACE("trial " + std::to_string(trial) + " pair " + std::to_string(a) + "->" + std::to_string(b));
        ASSERT_NO_FATAL_FAILURE(expectRoundsAgree(v[a].rail, rounds[a], counts[a][2 * R + db], v[b].rail, rounds[b],
                                                  counts[b][2 * R + D + a / G], tokens[a][db]));
      }
  }
}

// The hierarchical HT's staging: its rail rows in rounds (4 buffers of domains x roundSlots rows: rail_staging_bytes
// beside the inboxes), inboxes that hold the handle's count rows only, and outboxes (in the window, one per rank)
// without dispatch regions, their combine slices whole (a relay reduces its domain's rows at any slot).
TEST(EpRail, HierarchicalStagingHoldsARoundOfRailRows) {
  const int G = 2, D = 2, R = G * D, M = 64;
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  cfg.num_experts = 2 * R;
  cfg.max_tokens_per_rank = M;
  cfg.max_token_bytes = 512;
  cfg.max_topk = 2;
  for (const int round : {0, 16, 64, 100}) {
    cfg.rail_round_tokens = round;
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(1, R, 1, G, 0, &topo), ncclSuccess);
    ncclep::GroupView v;
    ncclep::layoutGroup(cfg, topo, &v, true);
    const ncclep::RailView& rv = v.rail;
    ASSERT_EQ(rv.hier, 1);
    EXPECT_EQ(rv.roundSlots, round == 16 ? 16 : M) << "rounds of " << round;  // 0: the default, 1024, above M
    EXPECT_EQ(ncclep::railRoundsOf(rv, R, M, nullptr), M / rv.roundSlots);
    for (const int i : {(int)ncclep::kRailDispFlags, (int)ncclep::kRailDispRows, (int)ncclep::kRailDispMeta})
      EXPECT_EQ(rv.outSlice[i], 0u);
    for (const int i : {(int)ncclep::kRailHeader, (int)ncclep::kRailCombFlags, (int)ncclep::kRailCombRows})
      EXPECT_EQ(rv.outSlice[i], rv.slice[i]);
    EXPECT_EQ(rv.inboxBytes, (rv.slice[ncclep::kRailHeader] + 15) / 16 * 16);
    EXPECT_LT(rv.inboxBytes, rv.outboxBytes);
    EXPECT_EQ(v.wl.total, v.wl.outboxes + (size_t)R * rv.outboxBytes);
    // A combine row of another domain's rank, written by my send half, lands in my outbox for it.
    size_t at = 0;
    const size_t mine = rv.base[ncclep::kRailCombRows] + (size_t)1 * rv.slice[ncclep::kRailCombRows];
    ASSERT_TRUE(ncclep::railOutboxOffset(v, mine + (size_t)(M - 1) * 512, &at));
    EXPECT_EQ(at, rv.outOff[ncclep::kRailCombRows] + (size_t)(M - 1) * 512);
  }
}

// NCCL_EXT_HT_HIERARCHICAL (layoutGroup's htHierarchical) on real ranks, without a virtual_rail: High-Throughput
// exchanges relayed and hierarchical when the domains have several ranks (2 of 2 here, with the row above), flat
// with one rank a domain (the same protocol), with one domain, for Low-Latency, and without the variable. The
// hierarchical HT's exchange rows end with one token count per domain (which size an EXACT handle's rail messages),
// and the handle's exchange over the rail moves them with the row.
TEST(EpRail, HierarchicalRelaysOnDomainsOfSeveralRanks) {
  struct Got {
    int relay, hier;
    size_t rowBytes, outboxes;
    int domainCounts;  // ints at the end of an exchange row
    size_t handleSlice;
  };
  auto layout = [](ncclEpAlgorithm_t algorithm, int nRanks, int lsaSize, bool hierarchical) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = algorithm;
    cfg.num_experts = 2 * nRanks;
    cfg.max_tokens_per_rank = 4;
    cfg.max_token_bytes = 512;
    cfg.max_topk = 2;
    ncclext::Topology topo;
    EXPECT_EQ(ncclext::makeTopology(0, nRanks, 0, lsaSize, 0, &topo), ncclSuccess);
    ncclep::GroupView v;
    ncclep::layoutGroup(cfg, topo, &v, hierarchical);
    EXPECT_EQ(v.wl.domainCounts, nRanks + cfg.num_experts + v.nChunks + 1);
    EXPECT_EQ(v.wl.exchangeInts, v.wl.domainCounts + v.wl.nDomainCounts);  // (no receive cap here)
    return Got{v.rail.relay, v.rail.hier, v.rail.hier ? v.rail.hierRow.bytes() : 0, v.wl.outboxes,
               v.wl.nDomainCounts, v.rail.slice[ncclep::kRailHeader]};
  };
  const Got on = layout(NCCL_EP_ALGO_HIGH_THROUGHPUT, 4, 2, true);
  EXPECT_EQ(on.relay, 1);
  EXPECT_EQ(on.hier, 1);
  EXPECT_EQ(on.rowBytes, 592u);  // HierarchicalRowBytesMatchTheModel's row: layoutGroup's sizes
  EXPECT_GT(on.outboxes, 0u);    // the relays read their domain's outboxes in the window
  EXPECT_EQ(on.domainCounts, 2);
  EXPECT_EQ(on.handleSlice, (4u + 8u + 1u + 1u + 2u) * 4u);  // R + E + NC + 1 + domains, int32
  const ncclEpAlgorithm_t ht = NCCL_EP_ALGO_HIGH_THROUGHPUT, ll = NCCL_EP_ALGO_LOW_LATENCY;
  for (const Got& g :
       {layout(ht, 4, 2, false), layout(ht, 2, 1, true), layout(ht, 4, 4, true), layout(ll, 4, 2, true)}) {
    EXPECT_EQ(g.relay, 0);
    EXPECT_EQ(g.hier, 0);
    EXPECT_EQ(g.outboxes, 0u);
    EXPECT_EQ(g.domainCounts, 0);
  }
}

// A receive cap's exchange rows end with the L retained counts, not with domain counts: exchangeKernel took every
// int past domainCounts for one (a count per "domain" for each of them: at 1 rank and 256 experts, 256 passes over
// the tokens, the shared domainHits[kMaxRanks] and an EXACT handle's host totals written past their ends; the capped
// handle update took 583 us against 31 in ncu, one H100).
TEST(EpLayout, ReceiveCapRowsHaveNoDomainCounts) {
  for (int nRanks : {1, 2, 8}) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = NCCL_EP_ALGO_HIGH_THROUGHPUT;
    cfg.num_experts = 256;
    cfg.max_tokens_per_rank = 4096;
    cfg.max_token_bytes = 7168 * 2;
    cfg.max_topk = 8;
    cfg.max_recv_rows_per_rank = 4096;
    ncclext::Topology topo;
    ASSERT_EQ(ncclext::makeTopology(0, nRanks, 0, nRanks, 0, &topo), ncclSuccess);  // one NVLink domain
    ncclep::GroupView v;
    ncclep::layoutGroup(cfg, topo, &v, false);
    ASSERT_GT(v.recvCap, 0);
    EXPECT_EQ(v.wl.nDomainCounts, 0) << nRanks << " ranks";
    EXPECT_EQ(v.wl.retained, v.wl.domainCounts);
    EXPECT_EQ(v.wl.exchangeInts, v.wl.domainCounts + cfg.num_experts / nRanks);
  }
}

}  // namespace
