// nccl_ep's public functions under hostile arguments, without a communicator and without touching a GPU.
//
// What may be passed where (anything else would dereference garbage, which is the caller's fault, not a finding):
// - ncclEpCreateGroup: comm NULL with any config; or a fake comm (a PROT_NONE page: any use faults at once) only
//   with a config that fails one of the checks made before the comm is used (see ep_api_test.cc).
// - handle and group arguments: NULL, or the group and handle assembled here on the static library (no device
//   state), as ep_api_test.cc does. Arguments that pass every check would go on to allocate and launch: on a
//   machine without a GPU that fails with a CUDA error (fine); where a GPU is visible it would run a kernel on
//   garbage, so there every such call carries at least one "structural" break (a NULL struct, a wrong size/magic,
//   a tensor of the wrong rank or dtype) that the first checks reject unconditionally.
// - ncclEpGroupDestroy / ncclEpHandleDestroy: NULL only (the fakes are not heap objects).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <climits>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "tests/fuzz/fuzz.h"

namespace {

using fuzz::Campaign;
using fuzz::Lib;
using fuzz::Rng;

// Defects this fuzzer found, fixed in api.cc; the switches stay so that a regression can be bisected with them off:
// - checkTensor multiplied sizes in int64: sizes {2^59, 32} made 2^64 elements, which wrapped to 0, so a tensor with
//   data NULL passed as empty (ncclEpCombine inputs.tokens, ncclEpDispatch outputs.tokens). The product is checked.
constexpr bool kElementCountOverflowRejected = true;
// - Dispatch/combine computed a row's bytes as hidden * dtype bytes: fp32 with hidden 2^62 + 4 made 2^64 + 16, which
//   wrapped to 16 and passed every row check. Hidden is bounded first.
constexpr bool kRowBytesOverflowRejected = true;

const ncclDataType_t kAllDtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const int kBadEnums[] = {-1, 4, 5, 12, 100, INT_MIN, INT_MAX};

using fuzz::dtypeBytes;

// A comm that faults on any use.
ncclComm_t fakeComm() {
  static void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return reinterpret_cast<ncclComm_t>(page);
}

// What the calls of one iteration break: `why` names the first break that makes the arguments invalid by
// construction; `structural` says that one break is of the unconditional kind that stays safe with a GPU.
struct Breaks {
  std::string why;
  bool structural = false;
  void sure(const std::string& what) {
    if (why.empty()) why = what;
  }
  void hard(const std::string& what) {
    sure(what);
    structural = true;
  }
  const char* poison() const { return why.empty() ? nullptr : why.c_str(); }
  std::string suffix() const { return why.empty() ? std::string() : " poison: " + why; }
};

bool present(const ncclEpTensor_t& t) { return t.ndim != 0 || t.data != nullptr; }

bool oneOf(const ncclDataType_t& d, std::initializer_list<ncclDataType_t> set) {
  for (ncclDataType_t x : set)
    if ((int)x == fuzz::dtypeInt(d)) return true;
  return false;
}

std::string describeTensor(const ncclEpTensor_t& t) {
  std::string s = "{ndim " + std::to_string(t.ndim) + " dtype " + std::to_string(fuzz::dtypeInt(t.datatype)) +
                  (t.data ? " data" : " NULL") + " sizes";
  for (int i = 0; i < NCCL_EP_MAX_TENSOR_DIMS; i++) s += " " + std::to_string(t.sizes[i]);
  return s + "}";
}

template <typename T>
std::string describeHeader(const T* p) {
  if (!p) return "NULL";
  char buf[64];
  snprintf(buf, sizeof(buf), "{size %u magic 0x%x}", p->size, p->magic);
  return buf;
}

// A tensor the call checks: `ndim` dims, one of `types`, `sizes`; fixed[i]: the check wants exactly sizes[i].
struct Want {
  const char* name;
  unsigned ndim;
  std::vector<ncclDataType_t> types;     // the valid tensor has types[0..)
  std::vector<ncclDataType_t> accepted;  // what the check takes (empty: `types`); a break picks another
  std::vector<int64_t> sizes;
  std::vector<bool> fixed;
  bool optional;
  bool hugeRows;  // sizes[0] is a lower bound only: it may be made huge
};

char gBytes[64];
void* const kData = gBytes;  // a non-NULL pointer; nothing on the host reads it

// The tensor `w` asks for, broken now and then.
ncclEpTensor_t makeTensor(Rng& rng, const Want& w, bool mayBreak, Breaks* b) {
  ncclEpTensor_t t = NCCL_EP_TENSOR_INIT;
  t.ndim = w.ndim;
  t.datatype = w.types[rng.below(w.types.size())];
  t.data = kData;
  for (unsigned i = 0; i < w.ndim; i++) t.sizes[i] = w.sizes[i];
  if (rng.chance(1, 20)) t.win_offset = (size_t)rng.next();  // reserved for zero-copy: ignored
  if (!mayBreak || !rng.chance(1, 6)) return t;
  auto poison = [&](const char* what) { return std::string(w.name) + ": " + what; };
  switch (rng.below(6)) {
    case 0: {
      const unsigned bad[] = {0, 1, 2, 3, 4, 5, 64, UINT_MAX};
      unsigned n = w.ndim;
      while (n == w.ndim) n = rng.pick(bad);
      t.ndim = n;
      if (!(w.optional && n == 0 && rng.chance(1, 2))) {
        b->sure(poison("wrong rank"));
      } else {
        t.data = nullptr;  // ndim 0 and no data: absent, which an optional tensor may be
      }
      break;
    }
    case 1: {
      const std::vector<ncclDataType_t>& ok = w.accepted.empty() ? w.types : w.accepted;
      int d = w.types[0];
      for (;;) {
        d = rng.chance(1, 3) ? rng.pick(kBadEnums) : (int)rng.pick(kAllDtypes);
        bool accepted = false;
        for (ncclDataType_t x : ok) accepted |= (int)x == d;
        if (!accepted) break;
      }
      fuzz::storeDtype(&t.datatype, d);
      b->sure(poison("dtype not accepted"));
      break;
    }
    case 2: {
      const int64_t bad[] = {-1, -16, INT64_MIN};
      t.sizes[rng.below(w.ndim)] = rng.pick(bad);
      b->sure(poison("negative size"));
      break;
    }
    case 3: {
      const unsigned i = (unsigned)rng.below(w.ndim);
      if (w.fixed[i]) {
        const int64_t off[] = {-1, 1, 7, INT64_MAX / 2};
        int64_t v;
        if (__builtin_add_overflow(w.sizes[i], rng.pick(off), &v)) v = INT64_MAX;
        t.sizes[i] = std::max<int64_t>(0, v);
        if (t.sizes[i] == w.sizes[i]) t.sizes[i] = w.sizes[i] == INT64_MAX ? 0 : w.sizes[i] + 1;
        b->sure(poison("size differs from the one the call needs"));
      }
      break;
    }
    case 4: {
      // No data for a non-empty tensor. With a huge first dim the element count reaches 2^64 exactly, which int64
      // arithmetic wraps to 0 (checkTensor's elems).
      t.data = nullptr;
      if (w.optional && rng.chance(1, 3)) {
        t.ndim = 0;  // absent, which an optional tensor may be
        break;
      }
      int64_t rest = 1;
      bool pow2 = true;
      for (unsigned i = 1; i < w.ndim; i++) {
        pow2 = pow2 && t.sizes[i] > 0 && (t.sizes[i] & (t.sizes[i] - 1)) == 0;
        pow2 = pow2 && !__builtin_mul_overflow(rest, t.sizes[i], &rest);
      }
      if (w.hugeRows && pow2 && rest > 1 && rng.chance(1, 2)) {
        t.sizes[0] = (int64_t)(((unsigned __int128)1 << 64) / (unsigned __int128)rest);
        if (kElementCountOverflowRejected)
          b->sure(poison("data NULL for a non-empty tensor whose element count (2^64) overflows int64"));
      } else {
        bool empty = false;
        uint64_t wrapped = 1;  // the element count as int64 arithmetic sees it
        for (unsigned i = 0; i < w.ndim; i++) {
          empty |= t.sizes[i] == 0;
          wrapped *= (uint64_t)t.sizes[i];
        }
        if (!empty && w.ndim > 0 && (wrapped != 0 || kElementCountOverflowRejected))
          b->sure(poison("data NULL for a non-empty tensor"));
      }
      break;
    }
    default:
      if (w.hugeRows) t.sizes[0] = rng.chance(1, 2) ? INT64_MAX : int64_t(1) << rng.range(32, 62);  // valid: >= need
      break;
  }
  return t;
}

// A group and a handle on the static library, of random shape, with no device state (status, windows, memory).
struct Fake {
  ncclEpGroup group;
  ncclEpHandle handle;
  ncclext::LiveSet::Scoped liveGroup{ncclep::liveGroups(), &group};  // as if created: the API accepts them
  ncclext::LiveSet::Scoped liveHandle{ncclep::liveHandles(), &handle};
  int64_t totals[2] = {0, 0};
  // The allocator hook of `hooked` groups: hands out a token instead of device memory and counts what is live,
  // so that a handle built past its allocation and then failing (no GPU) is seen to give the memory back.
  struct Hook {
    int mode = 0;  // 0: succeed, 1: fail, 2: succeed with NULL
    int64_t live = 0;
    char token = 0;
  } hook;

  Fake(Rng& rng, bool hooked) {
    const int R = 1 << rng.below(7);
    const int L = (int)rng.range(1, ncclep::kMaxExperts / R);
    ncclEpGroupConfig_t& c = group.config;
    c = NCCL_EP_GROUP_CONFIG_INIT;
    c.num_experts = R * L;
    c.max_tokens_per_rank = (int)(rng.chance(1, 4) ? rng.range(1, ncclep::kMaxTokens) : rng.range(1, 256));
    c.max_token_bytes = 16 * (int)rng.range(1, 4096);
    c.max_topk = (int)rng.range(1, ncclep::kMaxTopk);
    if (hooked) {
      hook.mode = (int)rng.below(3);
      c.alloc.context = &hook;
      c.alloc.alloc_fn = [](void** ptr, size_t, void* ctx) {
        Hook* h = static_cast<Hook*>(ctx);
        if (h->mode == 1) return 1;
        *ptr = h->mode == 2 ? nullptr : &h->token;
        if (*ptr) h->live++;
        return 0;
      };
      c.alloc.free_fn = [](void* ptr, void* ctx) {
        Hook* h = static_cast<Hook*>(ctx);
        if (ptr == &h->token) h->live--;
        return 0;
      };
    }
    group.memory = ncclep::DeviceMemory(c.alloc, false);
    group.smCount = (int)rng.range(1, 132);
    group.numSms = std::min(64, group.smCount);
    ncclep::GroupView& v = group.view;
    v.nRanks = R;
    v.numExperts = c.num_experts;
    v.localExperts = L;
    v.maxTokens = c.max_tokens_per_rank;
    v.nChunks = (v.maxTokens + ncclep::kChunkTokens - 1) / ncclep::kChunkTokens;
    v.rowStride = c.max_token_bytes;
    v.meta.maxTopk = c.max_topk;
    v.meta.maxScales = std::max(1, c.max_token_bytes / 128);
    handle.group = &group;
    handle.layout = rng.chance(1, 2) ? NCCL_EP_LAYOUT_FLAT : NCCL_EP_LAYOUT_EXPERT_MAJOR;
    handle.config = NCCL_EP_HANDLE_CONFIG_INIT;
    handle.config.sizing = rng.chance(1, 2) ? NCCL_EP_SIZING_EXACT : NCCL_EP_SIZING_WORST_CASE;
    handle.config.dispatch_output_per_expert_alignment = 1 << rng.below(11);
    handle.topk = (int)rng.range(1, c.max_topk);
    handle.view.numTokens = (int)rng.range(0, v.maxTokens);
    handle.view.topk = handle.topk;
    handle.maxFlatRows = (int64_t)R * v.maxTokens;
    const int align = handle.config.dispatch_output_per_expert_alignment;
    handle.maxRecvRows = handle.layout == NCCL_EP_LAYOUT_FLAT
                             ? handle.maxFlatRows
                             : handle.maxFlatRows * std::min(handle.topk, L) + (int64_t)L * (align - 1);
    totals[0] = rng.range(0, handle.maxFlatRows);
    totals[1] = rng.range(0, handle.maxRecvRows);
    handle.hostTotals = totals;
  }
  ~Fake() { handle.hostTotals = nullptr; }  // not pinned memory: the destructor must not free it
  int64_t need() const {
    if (handle.config.sizing == NCCL_EP_SIZING_WORST_CASE) return handle.maxRecvRows;
    return handle.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR ? totals[1] : totals[0];
  }
  std::string describe() const {
    char buf[400];
    snprintf(buf, sizeof(buf),
             "fake group{ranks %d experts %d (local %d) max_tokens %d max_token_bytes %d max_topk %d sms %d/%d "
             "alloc hook %s} handle{layout %d sizing %d align %d topk %d tokens %d totals %lld/%lld maxRecvRows %lld}",
             group.view.nRanks, group.view.numExperts, group.view.localExperts, group.view.maxTokens,
             group.config.max_token_bytes, group.config.max_topk, group.numSms, group.smCount,
             group.config.alloc.alloc_fn ? std::to_string(hook.mode).c_str() : "none", (int)handle.layout,
             (int)handle.config.sizing, handle.config.dispatch_output_per_expert_alignment, handle.topk,
             handle.view.numTokens, (long long)totals[0], (long long)totals[1], (long long)handle.maxRecvRows);
    return buf;
  }
};

// Whether the library reads a T of `size` bytes: its size, or an earlier layout's (the *_V<n>_SIZE sizes).
template <typename T>
bool knownSize(size_t size) {
  if (size == sizeof(T)) return true;
  if constexpr (std::is_same_v<T, ncclEpGroupConfig_t>)
    return size == NCCL_EP_GROUP_CONFIG_V1_SIZE || size == NCCL_EP_GROUP_CONFIG_V2_SIZE;
  if constexpr (std::is_same_v<T, ncclEpLayoutInfo_t>) return size == NCCL_EP_LAYOUT_INFO_V1_SIZE;
  if constexpr (std::is_same_v<T, ncclEpDispatchInputs_t>) return size == NCCL_EP_DISPATCH_INPUTS_V1_SIZE;
  if constexpr (std::is_same_v<T, ncclEpDispatchConfig_t>) return size == NCCL_EP_DISPATCH_CONFIG_V1_SIZE;
  if constexpr (std::is_same_v<T, ncclEpCombineInputs_t>) return size == NCCL_EP_COMBINE_INPUTS_V1_SIZE;
  return false;
}

// Header fields: valid, or one of the mismatches a caller could build (a struct of another version, no init).
template <typename T>
void makeHeader(Rng& rng, T* p, bool mayBreak, Breaks* b) {
  p->size = sizeof(T);
  p->magic = NCCL_EP_MAGIC;
  if (!mayBreak || !rng.chance(1, 12)) return;
  if (rng.chance(1, 2)) {
    const unsigned bad[] = {0, 4, 8, (unsigned)sizeof(T) - 4, (unsigned)sizeof(T) + 8, UINT_MAX};
    while (knownSize<T>(p->size)) p->size = rng.pick(bad);
  } else {
    p->magic = rng.chance(1, 2) ? 0 : NCCL_EP_MAGIC ^ (1u << rng.below(32));
  }
  b->hard("struct size/magic");
}

ncclEpLayoutInfo_t makeLayoutInfo(Rng& rng, const Fake& f, Breaks* b) {
  ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
  makeHeader(rng, &info, true, b);
  const int L = f.group.view.localExperts, R = f.group.view.nRanks;
  ncclEpTensor_t* outs[] = {&info.expert_counters, &info.src_rank_counters, &info.expert_offsets,
                            &info.recv_total_counter, &info.recv_dropped_counter};
  const int n[] = {L, R, L, 1, 1};
  const char* names[] = {"layout_info.expert_counters", "layout_info.src_rank_counters", "layout_info.expert_offsets",
                         "layout_info.recv_total_counter", "layout_info.recv_dropped_counter"};
  for (int i = 0; i < 5; i++)
    if (rng.chance(1, 2))
      *outs[i] = makeTensor(rng, {names[i], 1, {ncclInt32}, {}, {n[i]}, {true}, true, false}, true, b);
  return info;
}

// Where a GPU is visible, a call on the fakes that nothing broke structurally gets a break that is: the call's
// first struct (or tensor) loses its header, rank or dtype.
bool mustHarden(const Breaks& b) { return fuzz::gpuVisible() && !b.structural; }

TEST(EpFuzz, CreateGroup) {
  Campaign c("EpFuzz.CreateGroup", 60000);
  c.run([&](Rng& rng, int64_t) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = (int)rng.range(1, 1024);
    cfg.max_tokens_per_rank = (int)rng.range(1, 16384);
    cfg.max_token_bytes = 16 * (int)rng.range(1, 4096);
    cfg.max_topk = (int)rng.range(1, 32);
    cfg.num_sms = rng.chance(1, 2) ? 0 : (int)rng.range(1, 200);
    cfg.timeout_ns = rng.chance(1, 2) ? 0 : rng.next();
    cfg.zero_copy = rng.chance(1, 2) ? NCCL_EP_ZERO_COPY_AUTO : NCCL_EP_ZERO_COPY_OFF;
    cfg.lsa_domain_size = rng.chance(1, 2) ? 0 : (int)rng.range(1, 72);
    // The classic checks, each broken now and then; a fake comm only ever meets a config that fails one of them.
    auto classic = [&](int which) {
      switch (which) {
        case 0:
          cfg.size = rng.chance(1, 2) ? 0 : (unsigned)sizeof(cfg) - 4;
          break;  // no size, or one no layout of the struct has
        case 1:
          cfg.magic = rng.chance(1, 2) ? 0 : NCCL_EP_MAGIC + 1;
          break;
        case 2:
          if (rng.chance(1, 2)) {  // Low-Latency past its token limit
            cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
            cfg.max_tokens_per_rank = (int)rng.range(1025, INT_MAX);
          } else {
            cfg.algorithm = (ncclEpAlgorithm_t)rng.pick(kBadEnums);
          }
          break;
        case 3:
          cfg.num_experts = rng.chance(1, 2) ? (int)rng.range(INT_MIN, 0) : (int)rng.range(1025, INT_MAX);
          break;
        case 4:
          cfg.max_tokens_per_rank = rng.chance(1, 2) ? (int)rng.range(INT_MIN, 0) : (int)rng.range(16385, INT_MAX);
          break;
        case 5: {
          const int bad[] = {0, 8, 15, 17, 100, 65537, 65552, -16, INT_MIN, INT_MAX};
          cfg.max_token_bytes = rng.pick(bad);
          break;
        }
        case 6:
          cfg.max_topk = rng.chance(1, 2) ? (int)rng.range(INT_MIN, 0) : (int)rng.range(33, INT_MAX);
          break;
        case 7:
          cfg.num_sms = (int)rng.range(INT_MIN, -1);
          break;
        case 8:  // an unknown mode, or ON on a group without a receive cap or of the Low-Latency mode
          if (rng.chance(1, 2)) {
            cfg.zero_copy = (ncclEpZeroCopyMode_t)rng.pick(kBadEnums);
          } else {
            cfg.zero_copy = NCCL_EP_ZERO_COPY_ON;
            if (rng.chance(1, 2)) {
              cfg.max_recv_rows_per_rank = 0;
            } else {
              cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
              cfg.max_tokens_per_rank = (int)rng.range(1, 1024);
            }
          }
          break;
        case 9:
          if (rng.chance(1, 2))
            cfg.alloc.alloc_fn = [](void**, size_t, void*) { return 0; };
          else
            cfg.alloc.free_fn = [](void*, void*) { return 0; };
          break;
        case 10:
          if (rng.chance(1, 2)) {  // a receive cap below 0, or on a Low-Latency group
            cfg.max_recv_rows_per_rank = (int)rng.range(INT_MIN, -1);
          } else {
            cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
            cfg.max_tokens_per_rank = (int)rng.range(1, 1024);
            cfg.max_recv_rows_per_rank = (int)rng.range(1, INT_MAX);
          }
          break;
        case 11:
          cfg.recv_overflow = (ncclEpRecvOverflow_t)rng.pick(kBadEnums);
          break;
        default:
          cfg.lsa_domain_size = (int)rng.range(INT_MIN, -1);
          break;
      }
    };
    if (rng.chance(1, 4)) cfg.max_recv_rows_per_rank = (int)rng.range(0, INT_MAX);
    if (rng.chance(1, 4)) cfg.recv_overflow = NCCL_EP_RECV_OVERFLOW_DROP;
    bool broken = false;
    for (int k = 0; k < 13; k++)
      if (rng.chance(1, 12)) {
        classic(k);
        broken = true;
      }
    const int commKind = (int)rng.below(3);    // NULL, fake, fake
    const bool nullGroup = rng.chance(1, 20), nullConfig = rng.chance(1, 20);
    ncclComm_t comm = commKind == 0 ? nullptr : fakeComm();
    if (comm && !nullGroup && !nullConfig && !broken) classic((int)rng.below(13));
    ncclEpGroup_t g = reinterpret_cast<ncclEpGroup_t>(0x1);
    c.describe([&] {
      char buf[400];
      snprintf(buf, sizeof(buf),
               "group %s comm %s config %s{size %u magic 0x%x algorithm %d num_experts %d max_tokens_per_rank %d "
               "max_token_bytes %d max_topk %d num_sms %d zero_copy %d alloc %s/%s lsa_domain_size %d}",
               nullGroup ? "NULL" : "&g", comm ? "fake" : "NULL", nullConfig ? "NULL " : "", cfg.size, cfg.magic,
               (int)cfg.algorithm, cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_token_bytes, cfg.max_topk,
               cfg.num_sms, (int)cfg.zero_copy, cfg.alloc.alloc_fn ? "fn" : "NULL", cfg.alloc.free_fn ? "fn" : "NULL",
               cfg.lsa_domain_size);
      return std::string(buf);
    });
    const ncclResult_t r = c.call(Lib::kEp, "ncclEpCreateGroup", [&] {
      return ncclEpCreateGroup(nullGroup ? nullptr : &g, comm, nullConfig ? nullptr : &cfg);
    });
    // Every case above is invalid: NULL group or comm or config, or a config that fails a classic check.
    c.expectRejected(r, "ncclEpCreateGroup", "no comm, or a config that fails its checks");
    if (!nullGroup && g != nullptr) c.fail("ncclEpCreateGroup failed but left *group non-NULL");
  });
}

TEST(EpFuzz, Handles) {
  Campaign c("EpFuzz.Handles", 50000);
  c.run([&](Rng& rng, int64_t) {
    Fake f(rng, rng.chance(1, 3));
    const ncclEpGroupConfig_t& gc = f.group.config;
    Breaks b;
    // ncclEpCreateHandle on the fake group.
    const bool nullOut = rng.chance(1, 30), nullGroup = rng.chance(1, 30);
    if (nullOut || nullGroup) b.hard("handle or group NULL");
    ncclEpLayout_t layout = rng.chance(1, 2) ? NCCL_EP_LAYOUT_FLAT : NCCL_EP_LAYOUT_EXPERT_MAJOR;
    if (rng.chance(1, 15)) {
      layout = rng.chance(1, 3)   ? NCCL_EP_LAYOUT_RANK_MAJOR
               : rng.chance(1, 2) ? NCCL_EP_LAYOUT_UNSET
                                  : (ncclEpLayout_t)rng.pick(kBadEnums);
      b.hard("layout not of High-Throughput");
    }
    const int64_t T =
        rng.chance(1, 10) ? rng.range(gc.max_tokens_per_rank + 1, INT64_MAX) : rng.range(0, gc.max_tokens_per_rank);
    const int64_t K =
        rng.chance(1, 10) ? (rng.chance(1, 2) ? 0 : rng.range(gc.max_topk + 1, 1 << 20)) : rng.range(1, gc.max_topk);
    if (T > gc.max_tokens_per_rank) b.sure("topk_idx: more tokens than max_tokens_per_rank");
    if (K < 1 || K > gc.max_topk) b.sure("topk_idx: top-k out of [1, max_topk]");
    const bool nullIdx = rng.chance(1, 30);
    if (nullIdx) b.hard("topk_idx NULL");
    ncclEpTensor_t idx =
        makeTensor(rng, {"topk_idx", 2, {ncclInt32, ncclInt64}, {}, {T, K}, {false, false}, false, false}, true, &b);
    if (idx.ndim != 2 || !oneOf(idx.datatype, {ncclInt32, ncclInt64})) b.hard("topk_idx rank or dtype");
    const bool withInfo = rng.chance(1, 3), withConfig = rng.chance(1, 2);
    ncclEpLayoutInfo_t info = withInfo ? makeLayoutInfo(rng, f, &b) : ncclEpLayoutInfo_t{};
    ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
    if (withConfig) {
      makeHeader(rng, &hc, true, &b);
      hc.dispatch_output_per_expert_alignment = rng.chance(1, 2) ? 1 : rng.chance(1, 2) ? 1 << rng.below(11)
                                                                                        : (int)rng.below(1025);
      hc.sizing = rng.chance(1, 2) ? NCCL_EP_SIZING_EXACT : NCCL_EP_SIZING_WORST_CASE;
      if (rng.chance(1, 10)) {
        const int bad[] = {-1, 1025, 2048, INT_MIN, INT_MAX};
        hc.dispatch_output_per_expert_alignment = rng.pick(bad);
        b.sure("alignment not in [0, 1024]");
      }
      if (rng.chance(1, 10)) {
        hc.sizing = (ncclEpSizing_t)rng.pick(kBadEnums);
        if (hc.sizing != NCCL_EP_SIZING_EXACT && hc.sizing != NCCL_EP_SIZING_WORST_CASE) b.sure("sizing unknown");
      }
    }
    if (mustHarden(b)) {
      layout = NCCL_EP_LAYOUT_UNSET;
      b.hard("layout UNSET (a GPU is visible)");
    }
    ncclEpHandle_t h = reinterpret_cast<ncclEpHandle_t>(0x1);
    c.describe([&] {
      return f.describe() + "\n    ncclEpCreateHandle(" + (nullOut ? "NULL" : "&h") + ", " +
             (nullGroup ? "NULL" : "fake") + ", layout " + std::to_string((int)layout) + ", topk_idx " +
             (nullIdx ? "NULL" : describeTensor(idx)) + ", layout_info " +
             (withInfo ? describeHeader(&info) + " " + describeTensor(info.expert_counters) + " " +
                             describeTensor(info.src_rank_counters) + " " + describeTensor(info.expert_offsets) + " " +
                             describeTensor(info.recv_total_counter)
                       : std::string("NULL")) +
             ", config " +
             (withConfig ? describeHeader(&hc) + " align " + std::to_string(hc.dispatch_output_per_expert_alignment) +
                               " sizing " + std::to_string((int)hc.sizing)
                         : std::string("NULL")) +
             ")" + b.suffix();
    });
    const ncclResult_t r = c.call(Lib::kEp, "ncclEpCreateHandle", [&] {
      return ncclEpCreateHandle(nullOut ? nullptr : &h, nullGroup ? nullptr : &f.group, layout,
                                nullIdx ? nullptr : &idx, withInfo ? &info : nullptr, withConfig ? &hc : nullptr,
                                nullptr);
    });
    c.expectRejected(r, "ncclEpCreateHandle", b.poison());
    if (r == ncclSuccess) {
      c.call(Lib::kEp, "ncclEpHandleDestroy", [&] { return ncclEpHandleDestroy(h); });  // a real handle
    } else if (!nullOut && h != nullptr && h != reinterpret_cast<ncclEpHandle_t>(0x1)) {
      c.fail("ncclEpCreateHandle failed but wrote a handle");
    }
    if (f.hook.live != 0) c.fail("ncclEpCreateHandle: " + std::to_string(f.hook.live) + " allocations not given back");

    // ncclEpUpdateHandle on the fake handle: new routing of the same top-k.
    Breaks u;
    const int64_t T2 =
        rng.chance(1, 10) ? rng.range(gc.max_tokens_per_rank + 1, INT64_MAX) : rng.range(0, gc.max_tokens_per_rank);
    const int64_t K2 = rng.chance(1, 8) ? rng.range(1, gc.max_topk) : f.handle.topk;
    if (T2 > gc.max_tokens_per_rank) u.sure("topk_idx: more tokens than max_tokens_per_rank");
    if (K2 != f.handle.topk) u.sure("topk_idx: top-k differs from the handle's");
    ncclEpTensor_t idx2 =
        makeTensor(rng, {"topk_idx", 2, {ncclInt32, ncclInt64}, {}, {T2, K2}, {false, false}, false, false}, true, &u);
    if (idx2.ndim != 2 || !oneOf(idx2.datatype, {ncclInt32, ncclInt64})) u.hard("topk_idx rank or dtype");
    const bool nullHandle = rng.chance(1, 30), nullIdx2 = rng.chance(1, 30) || mustHarden(u);
    if (nullHandle) u.hard("handle NULL");
    if (nullIdx2) u.hard("topk_idx NULL");
    const bool withInfo2 = rng.chance(1, 3);
    ncclEpLayoutInfo_t info2 = withInfo2 ? makeLayoutInfo(rng, f, &u) : ncclEpLayoutInfo_t{};
    c.describe([&] {
      return f.describe() + "\n    ncclEpUpdateHandle(" + (nullHandle ? "NULL" : "fake") + ", " +
             (nullIdx2 ? "NULL" : describeTensor(idx2)) + ", layout_info " +
             (withInfo2 ? describeHeader(&info2) : std::string("NULL")) + ")" + u.suffix();
    });
    const ncclResult_t ru = c.call(Lib::kEp, "ncclEpUpdateHandle", [&] {
      return ncclEpUpdateHandle(nullHandle ? nullptr : &f.handle, nullIdx2 ? nullptr : &idx2,
                                withInfo2 ? &info2 : nullptr, nullptr);
    });
    c.expectRejected(ru, "ncclEpUpdateHandle", u.poison());

    // The host-only queries, on the fake handle or NULL.
    const bool qNullHandle = rng.chance(1, 10), qNullRows = rng.chance(1, 10);
    int64_t rows = -12345;
    c.describe([&] {
      return f.describe() + "\n    ncclEpHandleGet{Recv,MaxRecv}Rows(" + (qNullHandle ? "NULL" : "fake") + ", " +
             (qNullRows ? "NULL" : "&rows") + ")";
    });
    const ncclResult_t rr = c.call(Lib::kEp, "ncclEpHandleGetRecvRows", [&] {
      return ncclEpHandleGetRecvRows(qNullHandle ? nullptr : &f.handle, qNullRows ? nullptr : &rows);
    });
    const bool exact = f.handle.config.sizing == NCCL_EP_SIZING_EXACT;
    if (qNullHandle || qNullRows || !exact) {
      c.expectRejected(rr, "ncclEpHandleGetRecvRows",
                       qNullHandle || qNullRows ? "handle or rows NULL" : "worst-case sizing");
      if (rows != -12345) c.fail("ncclEpHandleGetRecvRows wrote rows on failure");
    } else if (rr != ncclSuccess || rows != f.need()) {
      c.fail("ncclEpHandleGetRecvRows: " + std::to_string(rows) + ", expected " + std::to_string(f.need()));
    }
    rows = -12345;
    const ncclResult_t rm = c.call(Lib::kEp, "ncclEpHandleGetMaxRecvRows", [&] {
      return ncclEpHandleGetMaxRecvRows(qNullHandle ? nullptr : &f.handle, qNullRows ? nullptr : &rows);
    });
    if (qNullHandle || qNullRows) {
      c.expectRejected(rm, "ncclEpHandleGetMaxRecvRows", "handle or rows NULL");
      if (rows != -12345) c.fail("ncclEpHandleGetMaxRecvRows wrote rows on failure");
    } else if (rm != ncclSuccess || rows != f.handle.maxRecvRows) {
      c.fail("ncclEpHandleGetMaxRecvRows: " + std::to_string(rows));
    }
    // ncclEpComplete: a no-op in High-Throughput mode, after its header check.
    Breaks k;
    ncclEpCompleteConfig_t cc = NCCL_EP_COMPLETE_CONFIG_INIT;
    const bool withCc = rng.chance(1, 2);
    if (withCc) makeHeader(rng, &cc, true, &k);
    if (qNullHandle) k.hard("handle NULL");
    const ncclResult_t rc = c.call(Lib::kEp, "ncclEpComplete", [&] {
      return ncclEpComplete(qNullHandle ? nullptr : &f.handle, withCc ? &cc : nullptr, nullptr);
    });
    if (k.poison())
      c.expectRejected(rc, "ncclEpComplete", k.poison());
    else if (rc != ncclSuccess)
      c.fail(std::string("ncclEpComplete failed: ") + ncclEpGetLastError());
    // The group queries and the two destroys, which only ever see NULL or (async error) the fake group.
    const ncclResult_t ra = c.call(Lib::kEp, "ncclEpGroupGetAsyncError",
                                   [&] { return ncclEpGroupGetAsyncError(qNullHandle ? nullptr : &f.group); });
    if (qNullHandle)
      c.expectRejected(ra, "ncclEpGroupGetAsyncError", "group NULL");
    else if (ra != ncclSuccess)
      c.fail("ncclEpGroupGetAsyncError failed on a group with no device status");
    // ncclEpGroupGetInfo: a NULL group, a NULL info or a broken header refused (the fake group has no domain, so a
    // good header is not sent to it).
    ncclEpGroupInfo_t gi = NCCL_EP_GROUP_INFO_INIT;
    const int infoCase = (int)rng.below(3);
    if (infoCase == 2) gi.magic ^= 1u + (unsigned)rng.below(1000);
    const ncclResult_t rinfo = c.call(Lib::kEp, "ncclEpGroupGetInfo", [&] {
      return ncclEpGroupGetInfo(infoCase == 0 ? nullptr : &f.group, infoCase == 1 ? nullptr : &gi);
    });
    c.expectRejected(rinfo, "ncclEpGroupGetInfo", infoCase == 0 ? "group NULL" : infoCase == 1 ? "info NULL" : "magic");
    // ncclEpGroupGetDispatchWindow: the fake groups have no receive cap (and no window): refused, whatever the
    // dtype and hidden, and NULL group or tensor refused first; the tensor is left alone on failure.
    ncclEpTensor_t win = NCCL_EP_TENSOR_INIT;
    win.ndim = 77;
    const int wCase = (int)rng.below(3);
    // Only ncclDataType_t's own values: another one, by value, is undefined behaviour in C++ (UBSan) before the call.
    const ncclDataType_t types[] = {ncclBfloat16, ncclFloat16, ncclFloat32, ncclUint8, ncclInt64, ncclFloat8e5m2};
    const ncclDataType_t wType = rng.pick(types);
    const int64_t wHidden = rng.chance(1, 4) ? (int64_t)rng.next() : (int64_t)rng.range(1, 8192);
    const ncclResult_t rw = c.call(Lib::kEp, "ncclEpGroupGetDispatchWindow", [&] {
      return ncclEpGroupGetDispatchWindow(wCase == 0 ? nullptr : &f.group, wType, wHidden,
                                          wCase == 1 ? nullptr : &win);
    });
    c.expectRejected(rw, "ncclEpGroupGetDispatchWindow",
                     wCase == 0 ? "group NULL" : wCase == 1 ? "tensor NULL" : "no receive cap");
    if (win.ndim != 77) c.fail("ncclEpGroupGetDispatchWindow wrote the tensor on failure");
    if (c.call(Lib::kEp, "ncclEpHandleDestroy", [&] { return ncclEpHandleDestroy(nullptr); }) != ncclSuccess)
      c.fail("ncclEpHandleDestroy(NULL) failed");
    if (c.call(Lib::kEp, "ncclEpGroupDestroy", [&] { return ncclEpGroupDestroy(nullptr); }) != ncclSuccess)
      c.fail("ncclEpGroupDestroy(NULL) failed");
  });
}

// A hidden size that breaks the row rules (a positive multiple of 16 bytes, at most max_token_bytes, fp8: of 128
// columns), including one whose int64 byte count wraps to 16.
int64_t badHidden(Rng& rng, ncclDataType_t dt, int64_t H, int mtb, Breaks* b) {
  const int64_t e = dtypeBytes(dt);
  const int64_t bad[] = {0, 1, 3, H + 1, mtb / e + 16, INT64_MAX / 2, (int64_t(1) << 62) + 4};
  const int64_t h = rng.pick(bad);
  const __int128 bytes = (__int128)h * e;
  const bool wraps = (int64_t)(uint64_t)bytes == 16 && bytes != 16;
  if ((bytes % 16 != 0 || h == 0 || bytes > mtb || (dt == ncclFloat8e4m3 && h % 128 != 0)) &&
      (!wraps || kRowBytesOverflowRejected))
    b->sure(wraps ? "inputs.tokens: row bytes (2^64 + 16) overflow int64" : "inputs.tokens: row bytes");
  return h;
}

// A valid hidden size for `dt` under the group's max_token_bytes (0 if none: fp8 needs 128 columns).
int64_t validHidden(Rng& rng, ncclDataType_t dt, int maxTokenBytes) {
  const int64_t e = dtypeBytes(dt);
  const int64_t step = dt == ncclFloat8e4m3 ? 128 : 16 / e;
  const int64_t most = maxTokenBytes / (step * e);
  return most < 1 ? 0 : step * rng.range(1, std::min<int64_t>(most, 64));
}

TEST(EpFuzz, DispatchCombine) {
  Campaign c("EpFuzz.DispatchCombine", 60000);
  c.run([&](Rng& rng, int64_t) {
    Fake f(rng, false);
    const int mtb = f.group.config.max_token_bytes;
    const int64_t T = f.handle.view.numTokens, K = f.handle.topk, need = f.need();
    const bool flat = f.handle.layout == NCCL_EP_LAYOUT_FLAT;
    {  // ncclEpDispatch
      Breaks b;
      const ncclDataType_t types[] = {ncclBfloat16, ncclFloat16, ncclFloat32, ncclFloat8e4m3};
      ncclDataType_t dt = rng.pick(types);
      int64_t H = validHidden(rng, dt, mtb);
      if (H == 0) H = validHidden(rng, dt = ncclBfloat16, mtb);
      if (rng.chance(1, 12)) H = badHidden(rng, dt, H, mtb, &b);
      const bool fp8 = dt == ncclFloat8e4m3;
      // Scale words: fp8 rows need theirs (one a 128 columns); rows of other dtypes may carry side words (here as
      // many, at least one), up to max_token_bytes / 128 of them.
      const int64_t S = fp8 ? H / 128 : std::max<int64_t>(1, H / 128);
      ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
      ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
      makeHeader(rng, &in, true, &b);
      makeHeader(rng, &out, true, &b);
      in.tokens = makeTensor(rng,
                             {"inputs.tokens",
                              2,
                              {dt},
                              {ncclBfloat16, ncclFloat16, ncclFloat32, ncclFloat8e4m3, ncclUint8},
                              {T, H},
                              {true, false},
                              false,
                              false},
                             true, &b);
      if (in.tokens.ndim != 2 ||
          !oneOf(in.tokens.datatype, {ncclBfloat16, ncclFloat16, ncclFloat32, ncclFloat8e4m3, ncclUint8}))
        b.hard("inputs.tokens rank or dtype");
      if (rng.chance(1, 2))
        in.topk_weights =
            makeTensor(rng, {"inputs.topk_weights", 2, {ncclFloat32}, {}, {T, K}, {true, true}, true, false}, true, &b);
      if (fp8 ? !rng.chance(1, 20) : rng.chance(1, 20)) {  // S is the caller's: a size break changes T only
        in.scales = makeTensor(
            rng, {"inputs.scales", 2, {ncclFloat32, ncclInt32}, {}, {T, S}, {true, false}, true, false}, true, &b);
      }
      if (fp8 && !present(in.scales)) b.sure("fp8 tokens without inputs.scales");
      if (present(in.scales) && S > f.group.view.meta.maxScales)
        b.sure("inputs.scales: more words than the group holds");
      const ncclDataType_t scaleType =
          oneOf(in.scales.datatype, {ncclFloat32, ncclInt32}) ? in.scales.datatype : ncclFloat32;
      const int64_t N = rng.chance(1, 10) ? rng.range(0, std::max<int64_t>(0, need - 1)) : need + (int64_t)rng.below(3);
      out.tokens = makeTensor(rng, {"outputs.tokens", 2, {dt}, {}, {N, H}, {false, true}, false, true}, true, &b);
      // (not over a dtype break, which it could undo)
      if (rng.chance(1, 20) && fuzz::dtypeInt(out.tokens.datatype) == (int)dt) {
        ncclDataType_t odt = dt;
        while (odt == dt) odt = rng.pick(kAllDtypes);
        out.tokens.datatype = odt;
        b.sure("outputs.tokens: dtype differs from the input's");
      }
      const int64_t Nout = out.tokens.sizes[0];
      if (Nout < need) b.sure("outputs.tokens: fewer rows than the handle needs");
      if (rng.chance(1, 2)) {
        out.topk_weights =
            flat ? makeTensor(rng, {"outputs.topk_weights", 2, {ncclFloat32}, {}, {Nout, K}, {true, true}, true, false},
                              true, &b)
                 : makeTensor(rng, {"outputs.topk_weights", 1, {ncclFloat32}, {}, {Nout}, {true}, true, false}, true,
                              &b);
      }
      if (rng.chance(1, flat ? 2 : 10)) {
        out.topk_idx =
            makeTensor(rng, {"outputs.topk_idx", 2, {ncclInt32}, {}, {Nout, K}, {true, true}, true, false}, true, &b);
        if (!flat && (out.topk_idx.ndim != 0 || out.topk_idx.data)) b.sure("outputs.topk_idx with EXPERT_MAJOR");
      }
      if (present(in.scales) ? !rng.chance(1, 20) : rng.chance(1, 20))
        out.scales =
            makeTensor(rng, {"outputs.scales", 2, {scaleType}, {}, {Nout, S}, {true, true}, true, false}, true, &b);
      if (present(in.scales) != present(out.scales)) b.sure("outputs.scales without inputs.scales, or the reverse");
      const bool withInfo = rng.chance(1, 4), withConfig = rng.chance(1, 2), nullIn = rng.chance(1, 40),
                 nullOut = rng.chance(1, 40), nullHandle = rng.chance(1, 40);
      ncclEpLayoutInfo_t info = withInfo ? makeLayoutInfo(rng, f, &b) : ncclEpLayoutInfo_t{};
      ncclEpDispatchConfig_t dc = NCCL_EP_DISPATCH_CONFIG_INIT;
      if (withConfig) {
        makeHeader(rng, &dc, true, &b);
        dc.num_sms = rng.chance(1, 2) ? 0 : (int)rng.next();
      }
      if (nullIn || nullOut || nullHandle) b.hard("handle, inputs or outputs NULL");
      if (mustHarden(b)) {
        in.magic = 0;
        b.hard("inputs magic 0 (a GPU is visible)");
      }
      c.describe([&] {
        return f.describe() + "\n    ncclEpDispatch(" + (nullHandle ? "NULL" : "fake") + ", inputs " +
               (nullIn ? "NULL"
                       : describeHeader(&in) + " tokens " + describeTensor(in.tokens) + " topk_weights " +
                             describeTensor(in.topk_weights) + " scales " + describeTensor(in.scales)) +
               ", outputs " +
               (nullOut ? "NULL"
                        : describeHeader(&out) + " tokens " + describeTensor(out.tokens) + " topk_weights " +
                              describeTensor(out.topk_weights) + " topk_idx " + describeTensor(out.topk_idx) +
                              " scales " + describeTensor(out.scales)) +
               ", layout_info " + (withInfo ? describeHeader(&info) : std::string("NULL")) + ", config " +
               (withConfig ? describeHeader(&dc) + " num_sms " + std::to_string(dc.num_sms) : std::string("NULL")) +
               ")" + b.suffix();
      });
      const ncclResult_t r = c.call(Lib::kEp, "ncclEpDispatch", [&] {
        return ncclEpDispatch(nullHandle ? nullptr : &f.handle, nullIn ? nullptr : &in, nullOut ? nullptr : &out,
                              withInfo ? &info : nullptr, withConfig ? &dc : nullptr, nullptr);
      });
      c.expectRejected(r, "ncclEpDispatch", b.poison());
    }
    {  // ncclEpCombine
      Breaks b;
      const ncclDataType_t types[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
      ncclDataType_t dt = rng.pick(types);
      int64_t H = validHidden(rng, dt, mtb);
      if (rng.chance(1, 12)) H = badHidden(rng, dt, H, mtb, &b);
      const int64_t rows =
          rng.chance(1, 10) ? rng.range(0, std::max<int64_t>(0, need - 1)) : need + (int64_t)rng.below(3);
      ncclEpCombineInputs_t in = NCCL_EP_COMBINE_INPUTS_INIT;
      ncclEpCombineOutputs_t out = NCCL_EP_COMBINE_OUTPUTS_INIT;
      makeHeader(rng, &in, true, &b);
      makeHeader(rng, &out, true, &b);
      in.tokens = makeTensor(
          rng,
          {"inputs.tokens", 2, {dt}, {ncclBfloat16, ncclFloat16, ncclFloat32}, {rows, H}, {false, false}, false, true},
          true, &b);
      if (in.tokens.sizes[0] < need) b.sure("inputs.tokens: fewer rows than the dispatch output");
      if (in.tokens.ndim != 2 || !oneOf(in.tokens.datatype, {ncclBfloat16, ncclFloat16, ncclFloat32}))
        b.hard("inputs.tokens rank or dtype");
      if (rng.chance(1, 20)) {
        in.tokens.datatype = rng.chance(1, 2) ? ncclFloat8e4m3 : ncclInt32;  // no combine of these
        b.hard("inputs.tokens dtype not combinable");
      }
      // The input's dtype, or any where the input's is no dtype at all (that input is refused anyway).
      const int inType = fuzz::dtypeInt(in.tokens.datatype);
      const ncclDataType_t outType = inType >= 0 && inType < ncclNumTypes ? (ncclDataType_t)inType : ncclBfloat16;
      out.tokens = makeTensor(
          rng, {"outputs.tokens", 2, {outType}, {}, {T, in.tokens.sizes[1]}, {true, true}, false, false}, true, &b);
      const bool withConfig = rng.chance(1, 2), nullIn = rng.chance(1, 40), nullOut = rng.chance(1, 40),
                 nullHandle = rng.chance(1, 40);
      ncclEpCombineConfig_t cc = NCCL_EP_COMBINE_CONFIG_INIT;
      if (withConfig) {
        makeHeader(rng, &cc, true, &b);
        cc.num_sms = rng.chance(1, 2) ? 0 : (int)rng.next();
      }
      if (nullIn || nullOut || nullHandle) b.hard("handle, inputs or outputs NULL");
      if (mustHarden(b)) {
        out.size = 0;
        b.hard("outputs size 0 (a GPU is visible)");
      }
      c.describe([&] {
        return f.describe() + "\n    ncclEpCombine(" + (nullHandle ? "NULL" : "fake") + ", inputs " +
               (nullIn ? "NULL" : describeHeader(&in) + " tokens " + describeTensor(in.tokens)) + ", outputs " +
               (nullOut ? "NULL" : describeHeader(&out) + " tokens " + describeTensor(out.tokens)) + ", config " +
               (withConfig ? describeHeader(&cc) + " num_sms " + std::to_string(cc.num_sms) : std::string("NULL")) +
               ")" + b.suffix();
      });
      const ncclResult_t r = c.call(Lib::kEp, "ncclEpCombine", [&] {
        return ncclEpCombine(nullHandle ? nullptr : &f.handle, nullIn ? nullptr : &in, nullOut ? nullptr : &out,
                             withConfig ? &cc : nullptr, nullptr);
      });
      c.expectRejected(r, "ncclEpCombine", b.poison());
    }
  });
}

// ncclEpGroupInfoQuery: host arithmetic on any config, rank count and LSA team size (valid ones and hostile ones),
// rail round and staging budget. It answers or rejects with a message, never crashes (this runs under ASan), and
// what it answers holds together: the ranks tile into the domains, the round is in [1, max_tokens_per_rank], the
// staging fits the budget, a rail exists exactly with several domains.
TEST(EpFuzz, InfoQuery) {
  Campaign c("EpFuzz.InfoQuery", 20000);
  c.run([&](Rng& rng, int64_t) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = rng.chance(1, 2) ? NCCL_EP_ALGO_HIGH_THROUGHPUT : NCCL_EP_ALGO_LOW_LATENCY;
    const int nRanks = rng.chance(1, 20) ? (int)rng.next() : (int)rng.range(1, 64);
    const int lsa = rng.chance(1, 20) ? (int)rng.next() : rng.chance(1, 3) ? 1 : (int)rng.range(1, 8);
    cfg.num_experts = rng.chance(1, 20) ? (int)rng.next() : (int)(nRanks * rng.range(1, 8));  // wraps past int
    cfg.max_tokens_per_rank = rng.chance(1, 20) ? (int)rng.next() : (int)rng.range(1, 4096);
    cfg.max_token_bytes = rng.chance(1, 20) ? (int)rng.next() : 16 * (int)rng.range(1, 1024);
    cfg.max_topk = rng.chance(1, 20) ? (int)rng.next() : (int)rng.range(1, 32);
    cfg.lsa_domain_size = rng.chance(1, 4) ? (int)rng.range(0, 8) : 0;
    cfg.rail_round_tokens = rng.chance(1, 2) ? 0 : rng.chance(1, 20) ? (int)rng.next() : (int)rng.range(1, 2048);
    cfg.rail_staging_bytes_max = rng.chance(1, 2) ? 0 : rng.chance(1, 4) ? rng.next() : rng.next() % (1ull << 30);
    ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
    c.describe([&] {
      char buf[400];
      snprintf(buf, sizeof(buf),
               "n_ranks %d lsa_size %d config{algorithm %d num_experts %d max_tokens_per_rank %d max_token_bytes %d "
               "max_topk %d lsa_domain_size %d rail_round_tokens %d rail_staging_bytes_max %zu}",
               nRanks, lsa, (int)cfg.algorithm, cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_token_bytes,
               cfg.max_topk, cfg.lsa_domain_size, cfg.rail_round_tokens, cfg.rail_staging_bytes_max);
      return std::string(buf);
    });
    const ncclResult_t r =
        c.call(Lib::kEp, "ncclEpGroupInfoQuery", [&] { return ncclEpGroupInfoQuery(&cfg, nRanks, lsa, &info); });
    if (r != ncclSuccess) {
      if (r != ncclInvalidArgument && r != ncclInvalidUsage) c.fail("neither an answer nor a rejection");
      return;
    }
    const bool rail = info.n_domains > 1;
    if (info.n_domains * info.domain_size != nRanks) c.fail("the domains do not tile the ranks");
    if (info.rail_round_tokens < 1 || info.rail_round_tokens > cfg.max_tokens_per_rank) c.fail("round out of range");
    if (cfg.rail_staging_bytes_max && rail && info.rail_staging_bytes > cfg.rail_staging_bytes_max)
      c.fail("the staging exceeds the budget it was given");
    if (rail != (info.rail_staging_bytes > 0) || rail != (info.rail_dispatch_bytes > 0))
      c.fail("a rail exactly with several domains");
    if (info.window_bytes == 0) c.fail("no window");
  });
}

TEST(EpFuzz, VersionAndErrors) {
  Campaign c("EpFuzz.VersionAndErrors", 2000);
  c.run([&](Rng& rng, int64_t) {
    int v = -5, built = -5, loaded = -5;
    const bool nullV = rng.chance(1, 2), nb = rng.chance(1, 2), nl = rng.chance(1, 2);
    c.describe([&] { return std::string("version ") + (nullV ? "NULL" : "&v"); });
    const ncclResult_t r = c.call(Lib::kEp, "ncclEpGetVersion", [&] { return ncclEpGetVersion(nullV ? nullptr : &v); });
    if (nullV)
      c.expectRejected(r, "ncclEpGetVersion", "version NULL");
    else if (r != ncclSuccess || v != NCCL_EP_VERSION_CODE)
      c.fail("ncclEpGetVersion: " + std::to_string(v));
    const ncclResult_t rr = c.call(Lib::kEp, "ncclEpCheckNcclRuntime", [&] {
      return ncclEpCheckNcclRuntime(nb ? nullptr : &built, nl ? nullptr : &loaded);
    });
    if (rr == ncclSuccess && ((!nb && built <= 0) || (!nl && loaded <= 0)))
      c.fail("ncclEpCheckNcclRuntime succeeded without versions");
    if (ncclEpGetLastError() == nullptr) c.fail("ncclEpGetLastError returned NULL");
  });
}

// ncclEpVirtualDomainCreate/Destroy, and group creation naming a domain (ncclEpCreateGroupTesting's virtual_*).
TEST(EpFuzz, VirtualDomain) {
  Campaign c("EpFuzz.VirtualDomain", 10000);
  c.run([&](Rng& rng, int64_t) {
    const int valid = (int)rng.range(1, 8);
    const int bad[] = {0, -1, 9, 64, INT_MIN, INT_MAX};
    const int n = rng.chance(1, 3) ? rng.pick(bad) : valid;
    const bool nullOut = rng.chance(1, 20);
    ncclEpVirtualDomain_t d = reinterpret_cast<ncclEpVirtualDomain_t>(0x1);
    c.describe([&] {
      return std::string("ncclEpVirtualDomainCreate(") + (nullOut ? "NULL" : "&d") + ", " + std::to_string(n) + ")";
    });
    const ncclResult_t r = c.call(Lib::kEp, "ncclEpVirtualDomainCreate",
                                  [&] { return ncclEpVirtualDomainCreate(nullOut ? nullptr : &d, n); });
    c.expectRejected(r, "ncclEpVirtualDomainCreate",
                     nullOut          ? "domain NULL"
                     : n < 1 || n > 8 ? "n_ranks not in 1..8"
                                      : nullptr);
    if (r != ncclSuccess) {
      if (!nullOut && d != nullptr && d != reinterpret_cast<ncclEpVirtualDomain_t>(0x1))
        c.fail("ncclEpVirtualDomainCreate failed but wrote a domain");
      d = nullptr;
    } else if (d == nullptr || d == reinterpret_cast<ncclEpVirtualDomain_t>(0x1)) {
      c.fail("ncclEpVirtualDomainCreate succeeded without a domain");
      return;
    }
    // Group creation naming the domain (or none) with a virtual rank in or out of it; a fake comm only with a
    // config that fails a classic check, as in CreateGroup.
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = 64;
    cfg.max_tokens_per_rank = 128;
    cfg.max_token_bytes = 1024;
    ncclEpTestingConfig_t tc = NCCL_EP_TESTING_CONFIG_INIT;
    tc.virtual_domain = d;
    tc.virtual_rank = rng.chance(1, 2) ? (int)rng.range(0, valid - 1) : rng.pick(bad);
    const bool fake = rng.chance(1, 2);
    // A virtual rank outside the domain (or any but 0 without one) is a config check too, made before the comm
    // is used; otherwise break a classic field.
    const bool rankBad = d ? tc.virtual_rank < 0 || tc.virtual_rank >= n : tc.virtual_rank != 0;
    if (fake && !rankBad) {
      switch (rng.below(4)) {
        case 0:
          cfg.magic = 0;
          break;
        case 1:
          cfg.num_experts = 0;
          break;
        case 2:
          cfg.max_topk = 0;
          break;
        default:
          cfg.lsa_domain_size = -1;
          break;
      }
    }
    ncclEpGroup_t g = reinterpret_cast<ncclEpGroup_t>(0x1);
    c.describe([&] {
      return "domain of " + std::to_string(n) + (d ? "" : " (not made)") + ", ncclEpCreateGroupTesting(&g, " +
             (fake ? "fake" : "NULL") + ", {magic " + std::to_string(cfg.magic) + " num_experts " +
             std::to_string(cfg.num_experts) + " max_topk " + std::to_string(cfg.max_topk) + " lsa_domain_size " +
             std::to_string(cfg.lsa_domain_size) + "}, {virtual_rank " + std::to_string(tc.virtual_rank) + "})";
    });
    const ncclResult_t rg = c.call(Lib::kEp, "ncclEpCreateGroupTesting", [&] {
      return ncclEpCreateGroupTesting(&g, fake ? fakeComm() : nullptr, &cfg, &tc);
    });
    c.expectRejected(rg, "ncclEpCreateGroupTesting", "no comm, or a config that fails its checks");
    if (g != nullptr) c.fail("ncclEpCreateGroupTesting failed but left *group non-NULL");
    // A domain with no groups is destroyed; NULL is a no-op or rejected, like any other NULL argument.
    const ncclResult_t rd =
        c.call(Lib::kEp, "ncclEpVirtualDomainDestroy", [&] { return ncclEpVirtualDomainDestroy(d); });
    if (d ? rd != ncclSuccess : rd != ncclSuccess && rd != ncclInvalidArgument)
      c.fail("ncclEpVirtualDomainDestroy returned " + std::string(ncclGetErrorString(rd)));
  });
}

}  // namespace
