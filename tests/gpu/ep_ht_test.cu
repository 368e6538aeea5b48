// GPU tests of nccl_ep High-Throughput dispatch/combine against the host reference (tests/unit/ep_reference.h).
//
// Every case: all ranks derive the same global routing from the case's seed; token rows carry hashed bytes that
// name (source rank, token, column); every output is poisoned (0xff) before the call; dispatch outputs are compared
// byte for byte (rows past the receive count must stay poisoned, EXPERT_MAJOR pads must be zero), the layout-info
// counts exactly, and combine against a double-precision reference with a stated tolerance: FLAT sums of values
// with 3 significant bits are exact in every dtype (tolerance 0); EXPERT_MAJOR applies fp32 weights and rounds the
// per-rank partial to the dtype: |err| <= tol * (1 + |ref|) with tol 2e-2 (bf16), 4e-3 (fp16), 1e-5 (fp32).
// fp8 rows carry hashed scales, and two cases carry 17 hashed side words beside bf16 and fp16 rows: compared bit for
// bit too. Then: a CUDA-graph-captured dispatch + combine replayed with fresh inputs; two handles with different
// routings used alternately, back to back, on one group; an invalid expert id reported by an EXACT handle; and (2+
// ranks) the timeout path: one rank skips a dispatch, the others get ncclRemoteError.
//
// With several domains (--one-gpu nodes: every rank a domain of its own) the same suite runs over the rail exchange
// (every row to or from another rank through ncclSend/ncclRecv; the receive cap's rows through the inboxes and the
// scatter), but for the limits group (its fixed per-peer
// slices, 16384 rows of 32 KiB, would move 1 GiB a call per peer over loopback sockets); the timeout test then
// expects the rail's watchdog. Any CUDA error of the test's own calls, and any left at the end (tests/harness),
// fails the run.
//
// Usage: ep_ht_test [--nranks N] [--one-gpu off|nodes|virtual|mixed] [--seed S] [--timeout-s S] [--silent-peer-s S]
//                   [--sms N] [--quick] [--silent-relay] [--soak PAIRS] [--json FILE]
// --one-gpu mixed (launcher.h): one-GPU nodes of 2 virtual ranks each, the groups made with virtual_rail: domains of
// two ranks and the relayed exchange between them at once (at 4 ranks).
// --sms N: the groups' num_sms (default 24; the sanitizer's rows of virtual ranks take fewer). --quick (the sanitizer
// runs): a few cases, no limits group, 2 graph replays. --silent-peer-s: the timeout test's budget, on a group of its
// own (default: --timeout-s, on the test's group). --soak PAIRS: only the soak (soakMain), its JSON line test
// ep_ht_soak.                                                                   Exit: 0 pass, 1 fail, 77 no GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/device_status.h"
#include "common/status.h"
#include "nccl_ep.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/cli.h"
#include "tests/harness/cuda_check.h"
#include "tests/harness/launcher.h"
#include "tests/harness/ep_tensor.h"
#include "tests/harness/silent_peer.h"
#include "tests/harness/soak.h"
#include "tests/unit/ep_reference.h"

namespace {

using ncclep::ref::Routing;

constexpr int kExpertsPerRank = 16;
constexpr int kMaxTokens = 512;
constexpr int kMaxRowBytes = 7168 * 2;  // a bf16 row of hidden 7168
// The group's device-wait budget (--timeout-s; the sanitizer runs raise it, their kernels being far slower).
double gTimeoutSeconds = 3;
double gSilentPeerSeconds = 0;  // the timeout test's budget (--silent-peer-s; 0: the group's --timeout-s)
int gSoak = 0;                  // --soak PAIRS: only the soak (soakMain)
int gSms = 24;                  // --sms N: the groups' num_sms (the limits group's: NCCL_EP_AUTO)
bool gSilentRelay = false;      // --silent-relay: silentRelay's check after the timeout test

enum RoutingKind { kRandom, kAllToLastRank, kOneExpert, kFirstRankEmpty };

struct Case {
  std::string name;
  RoutingKind routing;
  ncclDataType_t dtype;
  ncclEpLayout_t layout;
  int align;
  ncclEpSizing_t sizing;
  bool idx64;
  int topk;
  int hidden;
  bool weights;
  int expertsPerRank = kExpertsPerRank;  // must match the group the case runs on
  int maxTokens = kMaxTokens;            // tokens per rank are drawn in [1, maxTokens]
  bool allFull = false;                  // every rank sends maxTokens
  bool windowOut = false;                // FLAT tokens into ncclEpGroupGetDispatchWindow's tensor (zero-copy)
  int sideWords = 0;                     // non-fp8 rows: per-token words forwarded as scales (0: none)
};

// The scale words a row of case c carries: fp8's per 128 columns, else its side words.
int scaleWords(const Case& c) { return c.dtype == ncclFloat8e4m3 ? c.hidden / 128 : c.sideWords; }

uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

size_t esize(ncclDataType_t t) { return t == ncclFloat32 ? 4 : t == ncclFloat8e4m3 ? 1 : 2; }

Routing makeRouting(const Case& c, int nRanks, uint64_t seed) {
  Routing r;
  r.nRanks = nRanks;
  r.numExperts = c.expertsPerRank * nRanks;
  r.topk = c.topk;
  std::mt19937_64 rng(seed);
  r.numTokens.resize(nRanks);
  r.topkIdx.resize(nRanks);
  for (int s = 0; s < nRanks; s++) {
    int T = c.allFull ? c.maxTokens : 1 + (int)(rng() % c.maxTokens);
    if (c.routing == kFirstRankEmpty && s == 0) T = 0;
    if (s == nRanks - 1 && c.routing == kRandom && seed % 3 == 0) T = c.maxTokens;  // a full rank now and then
    r.numTokens[s] = T;
    for (int t = 0; t < T; t++) {
      std::vector<int> pool;
      if (c.routing == kAllToLastRank) {
        for (int e = 0; e < c.expertsPerRank; e++) pool.push_back((nRanks - 1) * c.expertsPerRank + e);
      } else {
        for (int e = 0; e < r.numExperts; e++) pool.push_back(e);
      }
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int k = 0; k < c.topk; k++) {
        int e = pool[k];
        if (c.routing == kOneExpert) e = k == 0 ? 3 : -1;
        if (c.routing == kRandom && rng() % 10 == 0) e = -1;  // "no expert" entries
        r.topkIdx[s].push_back(e);
      }
    }
  }
  return r;
}

// Token bytes of (source, token) at byte j, and the fp8 scales and weights: all hashed from the case seed.
uint8_t tokenByte(uint64_t seed, int s, int t, int j) { return (uint8_t)(mix(seed ^ (uint64_t)s << 48 ^ (uint64_t)t << 24 ^ (j >> 2)) >> ((j & 3) * 8)); }
float scaleOf(uint64_t seed, int s, int t, int i) { return 1.0f + (mix(seed * 7 + s * 131071 + t * 8191 + i) % 1000) / 250.0f; }
float weightOf(uint64_t seed, int s, int t, int k) { return (1 + mix(seed * 13 + s * 524287 + t * 97 + k) % 255) / 256.0f; }
// Combine input values: 3 significant bits, so that FLAT sums are exact in bf16, fp16 and fp32.
double combineValue(uint64_t seed, int d, int s, int t, int k, int col) {
  return ((int)(mix(seed * 31 + (uint64_t)d << 56 ^ (uint64_t)s << 48 ^ (uint64_t)t << 20 ^ (uint64_t)(k + 1) << 14 ^ col) % 15) - 7) / 8.0;
}

void storeValue(ncclDataType_t dt, void* base, size_t i, double v) {
  if (dt == ncclBfloat16) static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16((float)v);
  else if (dt == ncclFloat16) static_cast<__half*>(base)[i] = __float2half((float)v);
  else static_cast<float*>(base)[i] = (float)v;
}
double loadValue(ncclDataType_t dt, const void* base, size_t i) {
  if (dt == ncclBfloat16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  if (dt == ncclFloat16) return __half2float(static_cast<const __half*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

using ncclext::harness::epTensor;

// This rank's stream and the count of failed CUDA calls of the test itself (any fails the run). Thread-local: the
// virtual-rank mode runs every rank as a thread of one process.
thread_local cudaStream_t tStream = nullptr;
using ncclext::harness::cudaOk;
using ncclext::harness::tCudaErrors;

// Device memory of the test, stream-ordered on the rank's stream: a cudaFree would wait for every kernel on the GPU,
// which with virtual ranks includes peers' kernels that wait for this rank's next call.
struct DeviceBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(std::max<size_t>(n, 16)) {
    cudaOk(cudaMallocAsync(&p, bytes, tStream), "cudaMallocAsync");
  }
  ~DeviceBuf() {
    if (p) cudaOk(cudaFreeAsync(p, tStream), "cudaFreeAsync");
  }
  void poison() {
    cudaOk(cudaMemsetAsync(p, 0xff, bytes, tStream), "poison");
    cudaOk(cudaStreamSynchronize(tStream), "poison sync");
  }
  template <typename T> std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    if (n) {
      cudaOk(cudaMemcpyAsync(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, tStream), "copy to host");
      cudaOk(cudaStreamSynchronize(tStream), "copy to host sync");
    }
    return v;
  }
  void put(const void* src, size_t n) {
    if (n == 0) return;  // an empty tensor: nothing to copy (and its host vector may have no storage)
    cudaOk(cudaMemcpyAsync(p, src, n, cudaMemcpyHostToDevice, tStream), "copy to device");
    cudaOk(cudaStreamSynchronize(tStream), "copy to device sync");
  }
};

#define EXPECT_OK(call)                                                                                 \
  do {                                                                                                  \
    ncclResult_t r_ = (call);                                                                           \
    if (r_ != ncclSuccess) {                                                                            \
      fprintf(stderr, "rank %d [%s] %s -> %s: %s\n", rank, c.name.c_str(), #call, ncclGetErrorString(r_), \
              ncclEpGetLastError());                                                                    \
      return 1;                                                                                         \
    }                                                                                                   \
  } while (0)

struct Runner {
  ncclext::harness::RankContext& ctx;
  ncclEpGroup_t group;
  uint64_t seed;
  int errors = 0;
  std::string lastBadCase;
  int cap = 0;  // the group's max_recv_rows_per_rank (0: none): the reference keeps each rank's first `cap` rows
  void bad(const Case& c, const char* what, long a = 0, long b = 0) {
    if (errors++ < 10 || lastBadCase != c.name)
      fprintf(stderr, "rank %d [%s] %s (%ld, %ld)\n", ctx.rank, c.name.c_str(), what, a, b);
    lastBadCase = c.name;
  }
  int wait(const char* what) {
    ncclResult_t r = ncclext::waitStream(ctx.stream, gTimeoutSeconds + 30, what);
    if (r == ncclSuccess) r = ncclEpGroupGetAsyncError(group);
    if (r != ncclSuccess) fprintf(stderr, "rank %d %s: %s\n", ctx.rank, what, ncclEpGetLastError());
    return r == ncclSuccess ? 0 : 1;
  }

  // Fills the inputs of this rank for `r` (and the case seed `cs`).
  void fillInputs(const Case& c, const Routing& r, uint64_t cs, DeviceBuf& x, DeviceBuf& w, DeviceBuf& sc) {
    const int me = ctx.rank, T = r.numTokens[me], K = c.topk;
    const size_t rowBytes = c.hidden * esize(c.dtype);
    const int nScales = scaleWords(c);
    std::vector<uint8_t> hx(T * rowBytes);
    for (int t = 0; t < T; t++)
      for (size_t j = 0; j < rowBytes; j++) hx[t * rowBytes + j] = tokenByte(cs, me, t, (int)j);
    x.put(hx.data(), hx.size());
    std::vector<float> hw(T * K), hs(T * std::max(nScales, 1));
    for (int t = 0; t < T; t++)
      for (int k = 0; k < K; k++) hw[t * K + k] = weightOf(cs, me, t, k);
    w.put(hw.data(), hw.size() * 4);
    for (int t = 0; t < T; t++)
      for (int i = 0; i < nScales; i++) hs[t * nScales + i] = scaleOf(cs, me, t, i);
    if (nScales) sc.put(hs.data(), (size_t)T * nScales * 4);
  }

  // Checks the dispatch outputs of this rank against the reference.
  void checkDispatch(const Case& c, const Routing& r, const ncclep::ref::RankRecv& rr, uint64_t cs, int64_t rows,
                     const DeviceBuf& y, const DeviceBuf& yw, const DeviceBuf& yi, const DeviceBuf& ys,
                     const void* yWindow = nullptr) {
    const int K = c.topk, L = r.localExperts(), me = ctx.rank;
    const size_t rowBytes = c.hidden * esize(c.dtype);
    const int nScales = scaleWords(c);
    const bool flat = c.layout == NCCL_EP_LAYOUT_FLAT;
    const int64_t used = flat ? (int64_t)rr.flat.size() : (int64_t)rr.em.size();
    std::vector<uint8_t> hy = y.get<uint8_t>(yWindow ? 0 : rows * rowBytes);
    if (yWindow) {  // the window's rows: read after the stream, as DeviceBuf::get does
      hy.resize(rows * rowBytes);
      if (ncclext::copyToHostAfter(tStream, hy.data(), yWindow, hy.size(), gTimeoutSeconds + 30, "window to host") !=
          ncclSuccess)
        bad(c, "copy of the dispatch window failed");
    }
    auto hw = yw.get<float>(flat ? rows * K : rows);
    auto hi = yi.get<int>(rows * K);
    const auto hs = nScales ? ys.get<float>(rows * nScales) : std::vector<float>();  // ys holds scales only with fp8
    for (int64_t i = 0; i < rows; i++) {
      const uint8_t* row = &hy[i * rowBytes];
      if (i >= used) {  // past the receive count: nothing may have been written (the window holds older calls')
        if (yWindow) continue;
        for (size_t j = 0; j < rowBytes; j++)
          if (row[j] != 0xff) { bad(c, "write past the receive count, row", i); break; }
        continue;
      }
      int s, t, kk = -1;
      if (flat) {
        s = rr.flat[i].src;
        t = rr.flat[i].token;
      } else {
        s = rr.em[i].src;
        t = rr.em[i].token;
        kk = rr.em[i].k;
      }
      if (s < 0) {  // EXPERT_MAJOR pad
        for (size_t j = 0; j < rowBytes; j++)
          if (row[j] != 0) { bad(c, "pad row not zero", i); break; }
        if (hw[i] != 0.f) bad(c, "pad weight not zero", i);
        continue;
      }
      for (size_t j = 0; j < rowBytes; j++)
        if (row[j] != tokenByte(cs, s, t, (int)j)) { bad(c, "token bytes differ at row/byte", i, (long)j); break; }
      for (int q = 0; q < nScales; q++)
        if (hs[i * nScales + q] != scaleOf(cs, s, t, q)) { bad(c, "scale differs at row", i, q); break; }
      if (flat) {
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[s][(size_t)t * K + k];
          const int local = e >= 0 && r.owner(e) == me ? e - me * L : -1;
          if (hi[i * K + k] != local) bad(c, "topk_idx differs at row/k", i, k);
          const float want = local >= 0 ? (c.weights ? weightOf(cs, s, t, k) : 1.f) : 0.f;
          if (hw[i * K + k] != want) bad(c, "topk_weights differ at row/k", i, k);
        }
      } else if (hw[i] != (c.weights ? weightOf(cs, s, t, kk) : 1.f)) {
        bad(c, "EXPERT_MAJOR weight differs at row", i);
      }
    }
  }

  int runCase(const Case& c, uint64_t caseSeed) {
    const int rank = ctx.rank, R = ctx.nRanks, K = c.topk, L = c.expertsPerRank;
    const Routing r = makeRouting(c, R, caseSeed);
    const auto recv = ncclep::ref::dispatchLayout(r, std::max(1, c.align), cap);
    const ncclep::ref::RankRecv& rr = recv[rank];
    const int T = r.numTokens[rank];
    const size_t rowBytes = c.hidden * esize(c.dtype);
    const int nScales = scaleWords(c);
    // kept[d][t]: my token t's row reached rank d (it has an expert there and, under a cap, fit)
    std::vector<std::vector<char>> kept(R, std::vector<char>(T, 0));
    for (int d = 0; d < R; d++)
      for (const ncclep::ref::FlatRow& f : recv[d].flat)
        if (f.src == rank) kept[d][f.token] = 1;
    // Routing to the device.
    DeviceBuf topk((size_t)T * K * (c.idx64 ? 8 : 4));
    if (c.idx64) {
      std::vector<int64_t> v(r.topkIdx[rank].begin(), r.topkIdx[rank].end());
      topk.put(v.data(), v.size() * 8);
    } else {
      topk.put(r.topkIdx[rank].data(), r.topkIdx[rank].size() * 4);
    }
    DeviceBuf cntE(L * 4), cntS(R * 4), offE(L * 4), total(4), dropped(4);
    for (DeviceBuf* b : {&cntE, &cntS, &offE, &total, &dropped}) b->poison();
    ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
    info.expert_counters = epTensor(cntE.p, ncclInt32, {L});
    info.src_rank_counters = epTensor(cntS.p, ncclInt32, {R});
    info.expert_offsets = epTensor(offE.p, ncclInt32, {L});
    info.recv_total_counter = epTensor(total.p, ncclInt32, {1});
    info.recv_dropped_counter = epTensor(dropped.p, ncclInt32, {1});
    ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
    hc.dispatch_output_per_expert_alignment = c.align;
    hc.sizing = c.sizing;
    ncclEpTensor_t ti = epTensor(topk.p, c.idx64 ? ncclInt64 : ncclInt32, {T, K});
    ncclEpHandle_t h = nullptr;
    EXPECT_OK(ncclEpCreateHandle(&h, group, c.layout, &ti, &info, &hc, ctx.stream));
    int64_t rows = 0;
    const bool flat = c.layout == NCCL_EP_LAYOUT_FLAT;
    const int64_t want = flat ? (int64_t)rr.flat.size() : (int64_t)rr.em.size();
    if (c.sizing == NCCL_EP_SIZING_EXACT) {
      EXPECT_OK(ncclEpHandleGetRecvRows(h, &rows));
      if (rows != want) bad(c, "exact receive count differs", rows, want);
    } else {
      EXPECT_OK(ncclEpHandleGetMaxRecvRows(h, &rows));
      if (rows < want) bad(c, "worst-case rows below the receive count", rows, want);
    }
    // Inputs and poisoned outputs.
    DeviceBuf x((size_t)T * rowBytes), w((size_t)T * K * 4), sc((size_t)T * std::max(nScales, 1) * 4);
    fillInputs(c, r, caseSeed, x, w, sc);
    DeviceBuf y(c.windowOut ? 0 : rows * rowBytes), yw(rows * K * 4), yi(rows * K * 4),
        ys(rows * std::max(nScales, 1) * 4);
    for (DeviceBuf* b : {&y, &yw, &yi, &ys}) b->poison();  // not the window: a peer may be writing it already
    ncclEpTensor_t window = NCCL_EP_TENSOR_INIT;
    if (c.windowOut) {
      EXPECT_OK(ncclEpGroupGetDispatchWindow(group, c.dtype, c.hidden, &window));
      if (window.sizes[0] < rows) bad(c, "the dispatch window holds fewer rows than the output", window.sizes[0], rows);
    }
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, c.dtype, {T, c.hidden});
    if (c.weights) in.topk_weights = epTensor(w.p, ncclFloat32, {T, K});
    if (nScales) in.scales = epTensor(sc.p, ncclFloat32, {T, nScales});
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = c.windowOut ? window : epTensor(y.p, c.dtype, {rows, c.hidden});
    out.topk_weights = flat ? epTensor(yw.p, ncclFloat32, {rows, K}) : epTensor(yw.p, ncclFloat32, {rows});
    if (flat) out.topk_idx = epTensor(yi.p, ncclInt32, {rows, K});
    if (nScales) out.scales = epTensor(ys.p, ncclFloat32, {rows, nScales});
    EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
    if (wait("dispatch")) return 1;
    checkDispatch(c, r, rr, caseSeed, rows, y, yw, yi, ys, c.windowOut ? window.data : nullptr);
    // Layout-info counts.
    auto he = cntE.get<int>(L), hsrc = cntS.get<int>(R), ho = offE.get<int>(L), ht = total.get<int>(1);
    for (int l = 0; l < L; l++) {
      if (he[l] != rr.expertCounts[l]) bad(c, "expert_counters differ at", l, he[l]);
      if (ho[l] != rr.zoneStart[l]) bad(c, "expert_offsets differ at", l, ho[l]);
    }
    for (int s = 0; s < R; s++)
      if (hsrc[s] != rr.srcCounts[s]) bad(c, "src_rank_counters differ at", s, hsrc[s]);
    if (ht[0] != want) bad(c, "recv_total_counter differs", ht[0], want);
    const int hd = dropped.get<int>(1)[0];
    if (hd != rr.dropped) bad(c, "recv_dropped_counter differs", hd, rr.dropped);

    // Combine: a numeric dtype (fp8 cases combine in bf16).
    const ncclDataType_t cd = c.dtype == ncclFloat8e4m3 ? ncclBfloat16 : c.dtype;
    const size_t cRow = c.hidden * esize(cd);
    std::vector<uint8_t> hin(rows * cRow, 0);
    for (int64_t i = 0; i < want; i++) {
      int s, t, k = -1;
      if (flat) { s = rr.flat[i].src; t = rr.flat[i].token; }
      else { s = rr.em[i].src; t = rr.em[i].token; k = rr.em[i].k; }
      if (s < 0) continue;
      for (int col = 0; col < c.hidden; col++)
        storeValue(cd, hin.data(), i * c.hidden + col, combineValue(caseSeed, rank, s, t, k, col));
    }
    DeviceBuf cin(rows * cRow), cout((size_t)T * cRow), missing((size_t)T * 4);
    cin.put(hin.data(), hin.size());
    cout.poison();
    missing.poison();
    ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
    ci.tokens = epTensor(cin.p, cd, {rows, c.hidden});
    ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
    co.tokens = epTensor(cout.p, cd, {T, c.hidden});
    if (cap) co.missing_experts = epTensor(missing.p, ncclInt32, {T});
    EXPECT_OK(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream));
    if (wait("combine")) return 1;
    auto hc2 = cout.get<uint8_t>((size_t)T * cRow);
    if (cap) {  // per token: its experts on ranks its row did not reach
      auto hm = missing.get<int>(T);
      for (int t = 0; t < T; t++) {
        int n = 0;
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[rank][(size_t)t * K + k];
          n += e >= 0 && !kept[r.owner(e)][t];
        }
        if (hm[t] != n) { bad(c, "missing_experts differs at token", t, hm[t]); break; }
      }
    }
    const double tol = flat ? 0.0 : cd == ncclBfloat16 ? 2e-2 : cd == ncclFloat16 ? 4e-3 : 1e-5;
    for (int t = 0; t < T; t++) {
      for (int col = 0; col < c.hidden; col++) {
        double ref = 0;
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[rank][(size_t)t * K + k];
          if (e < 0) continue;
          const int d = r.owner(e);
          if (!kept[d][t]) continue;  // past the receive cap at d: not in the sum
          if (flat) {
            // Each destination rank contributes its one row once.
            bool first = true;
            for (int k2 = 0; k2 < k; k2++) {
              const int e2 = r.topkIdx[rank][(size_t)t * K + k2];
              first &= !(e2 >= 0 && r.owner(e2) == d);
            }
            if (first) ref += combineValue(caseSeed, d, rank, t, -1, col);
          } else {
            ref += (double)(c.weights ? weightOf(caseSeed, rank, t, k) : 1.f) * combineValue(caseSeed, d, rank, t, k, col);
          }
        }
        const double got = loadValue(cd, hc2.data(), (size_t)t * c.hidden + col);
        if (!(std::fabs(got - ref) <= tol * (1 + std::fabs(ref)))) {
          if (errors < 10) fprintf(stderr, "    got %.6f want %.6f\n", got, ref);
          bad(c, "combine differs at token/col", t, col);
          break;
        }
      }
    }
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  // dispatch + combine captured once in a CUDA graph, replayed with fresh token bytes and combine inputs.
  int runGraph(const Case& c, uint64_t caseSeed, int replays) {
    const int rank = ctx.rank, R = ctx.nRanks, K = c.topk;
    const Routing r = makeRouting(c, R, caseSeed);
    const auto recv = ncclep::ref::dispatchLayout(r, 1);
    const auto& rr = recv[rank];
    const int T = r.numTokens[rank];
    const size_t rowBytes = c.hidden * esize(c.dtype);
    DeviceBuf topk((size_t)T * K * 4);
    topk.put(r.topkIdx[rank].data(), r.topkIdx[rank].size() * 4);
    ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
    ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;  // worst-case sizing: no host synchronisation
    ncclEpHandle_t h = nullptr;
    EXPECT_OK(ncclEpCreateHandle(&h, group, c.layout, &ti, nullptr, &hc, ctx.stream));
    int64_t rows = 0;
    EXPECT_OK(ncclEpHandleGetMaxRecvRows(h, &rows));
    DeviceBuf x((size_t)T * rowBytes), w((size_t)T * K * 4), sc(16), y(rows * rowBytes), yw(rows * K * 4),
        yi(rows * K * 4), ys(16), cin(rows * rowBytes), cout((size_t)T * rowBytes);
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, c.dtype, {T, c.hidden});
    in.topk_weights = epTensor(w.p, ncclFloat32, {T, K});
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = epTensor(y.p, c.dtype, {rows, c.hidden});
    out.topk_weights = epTensor(yw.p, ncclFloat32, {rows, K});
    out.topk_idx = epTensor(yi.p, ncclInt32, {rows, K});
    ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
    ci.tokens = epTensor(cin.p, c.dtype, {rows, c.hidden});
    ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
    co.tokens = epTensor(cout.p, c.dtype, {T, c.hidden});
    if (wait("graph setup")) return 1;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return bad(c, "capture"), 1;
    EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
    EXPECT_OK(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream));
    if (cudaStreamEndCapture(ctx.stream, &graph) != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      return bad(c, "graph instantiate"), 1;
    for (int rep = 0; rep < replays; rep++) {
      const uint64_t rs = caseSeed * 1000 + rep;  // fresh bytes every replay
      fillInputs(c, r, rs, x, w, sc);
      std::vector<uint8_t> hin(rows * rowBytes, 0);
      for (size_t i = 0; i < rr.flat.size(); i++)
        for (int col = 0; col < c.hidden; col++)
          storeValue(c.dtype, hin.data(), i * c.hidden + col, combineValue(rs, rank, rr.flat[i].src, rr.flat[i].token, -1, col));
      cin.put(hin.data(), hin.size());
      y.poison();
      yw.poison();
      yi.poison();
      cout.poison();
      if (cudaGraphLaunch(exec, ctx.stream) != cudaSuccess) return bad(c, "graph launch"), 1;
      if (wait("graph replay")) return 1;
      checkDispatch(c, r, rr, rs, rows, y, yw, yi, ys);
      auto hc2 = cout.get<uint8_t>((size_t)T * rowBytes);
      for (int t = 0; t < T; t++) {
        double ref = 0;
        std::vector<char> seen(R, 0);
        for (int k = 0; k < K; k++) {
          const int e = r.topkIdx[rank][(size_t)t * K + k];
          if (e >= 0 && !seen[r.owner(e)]++) ref += combineValue(rs, r.owner(e), rank, t, -1, 0);
        }
        if (loadValue(c.dtype, hc2.data(), (size_t)t * c.hidden) != ref) { bad(c, "graph combine differs at token", t, rep); break; }
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  // Two handles with different routings on one group, used alternately with no host synchronisation: dispatch A,
  // B, A, B, then combine A, B, A, B, all enqueued back to back, each into its own outputs. A sender of one call
  // must not overwrite a peer's staging rows that the peer is still reading from the previous call, although the
  // two calls place their rows differently.
  int runAlternating(const Case& c, uint64_t caseSeed) {
    const int rank = ctx.rank, R = ctx.nRanks, K = c.topk;
    const size_t rowBytes = c.hidden * esize(c.dtype);
    constexpr int kCalls = 4;
    struct Side {
      Routing r;
      std::vector<ncclep::ref::RankRecv> recv;
      uint64_t cs;
      int64_t rows = 0;
      ncclEpHandle_t h = nullptr;
      std::unique_ptr<DeviceBuf> topk, x, w, sc, cin;
    } side[2];
    for (int i = 0; i < 2; i++) {
      Side& sd = side[i];
      sd.cs = caseSeed * 2 + i;
      sd.r = makeRouting(c, R, sd.cs);
      sd.recv = ncclep::ref::dispatchLayout(sd.r, 1);
      const int T = sd.r.numTokens[rank];
      sd.topk.reset(new DeviceBuf((size_t)T * K * 4));
      sd.topk->put(sd.r.topkIdx[rank].data(), (size_t)T * K * 4);
      ncclEpTensor_t ti = epTensor(sd.topk->p, ncclInt32, {T, K});
      ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
      hc.sizing = NCCL_EP_SIZING_EXACT;
      EXPECT_OK(ncclEpCreateHandle(&sd.h, group, c.layout, &ti, nullptr, &hc, ctx.stream));
      EXPECT_OK(ncclEpHandleGetRecvRows(sd.h, &sd.rows));
      sd.x.reset(new DeviceBuf((size_t)T * rowBytes));
      sd.w.reset(new DeviceBuf((size_t)T * K * 4));
      sd.sc.reset(new DeviceBuf(16));
      fillInputs(c, sd.r, sd.cs, *sd.x, *sd.w, *sd.sc);
      const auto& flat = sd.recv[rank].flat;
      std::vector<uint8_t> hin(sd.rows * rowBytes, 0);
      for (size_t row = 0; row < flat.size(); row++)
        for (int col = 0; col < c.hidden; col++)
          storeValue(c.dtype, hin.data(), row * c.hidden + col,
                     combineValue(sd.cs, rank, flat[row].src, flat[row].token, -1, col));
      sd.cin.reset(new DeviceBuf(sd.rows * rowBytes));
      sd.cin->put(hin.data(), hin.size());
    }
    std::vector<std::unique_ptr<DeviceBuf>> y, yw, yi, cout;
    for (int call = 0; call < kCalls; call++) {
      const Side& sd = side[call % 2];
      y.emplace_back(new DeviceBuf(sd.rows * rowBytes));
      yw.emplace_back(new DeviceBuf(sd.rows * K * 4));
      yi.emplace_back(new DeviceBuf(sd.rows * K * 4));
      cout.emplace_back(new DeviceBuf((size_t)sd.r.numTokens[rank] * rowBytes));
      for (DeviceBuf* b : {y.back().get(), yw.back().get(), yi.back().get(), cout.back().get()}) b->poison();
    }
    if (wait("alternating setup")) return 1;
    for (int call = 0; call < kCalls; call++) {
      const Side& sd = side[call % 2];
      const int T = sd.r.numTokens[rank];
      ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
      in.tokens = epTensor(sd.x->p, c.dtype, {T, c.hidden});
      in.topk_weights = epTensor(sd.w->p, ncclFloat32, {T, K});
      ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
      out.tokens = epTensor(y[call]->p, c.dtype, {sd.rows, c.hidden});
      out.topk_weights = epTensor(yw[call]->p, ncclFloat32, {sd.rows, K});
      out.topk_idx = epTensor(yi[call]->p, ncclInt32, {sd.rows, K});
      EXPECT_OK(ncclEpDispatch(sd.h, &in, &out, nullptr, nullptr, ctx.stream));
    }
    for (int call = 0; call < kCalls; call++) {
      const Side& sd = side[call % 2];
      ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
      ci.tokens = epTensor(sd.cin->p, c.dtype, {sd.rows, c.hidden});
      ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
      co.tokens = epTensor(cout[call]->p, c.dtype, {sd.r.numTokens[rank], c.hidden});
      EXPECT_OK(ncclEpCombine(sd.h, &ci, &co, nullptr, ctx.stream));
    }
    if (wait("alternating calls")) return 1;
    DeviceBuf noScales(16);
    for (int call = 0; call < kCalls; call++) {
      const Side& sd = side[call % 2];
      const int T = sd.r.numTokens[rank];
      checkDispatch(c, sd.r, sd.recv[rank], sd.cs, sd.rows, *y[call], *yw[call], *yi[call], noScales);
      auto hc2 = cout[call]->get<uint8_t>((size_t)T * rowBytes);
      for (int t = 0; t < T; t++) {
        std::vector<char> seen(R, 0);
        std::vector<int> owners;
        for (int k = 0; k < K; k++) {
          const int e = sd.r.topkIdx[rank][(size_t)t * K + k];
          if (e >= 0 && !seen[sd.r.owner(e)]++) owners.push_back(sd.r.owner(e));
        }
        bool ok = true;
        for (int col = 0; col < c.hidden && ok; col++) {
          double ref = 0;
          for (int d : owners) ref += combineValue(sd.cs, d, rank, t, -1, col);
          ok = loadValue(c.dtype, hc2.data(), (size_t)t * c.hidden + col) == ref;
        }
        if (!ok) { bad(c, "alternating combine differs at call/token", call, t); break; }
      }
    }
    for (Side& sd : side) EXPECT_OK(ncclEpHandleDestroy(sd.h));
    return 0;
  }

  // A group with a receive cap of `cap` rows and the ERROR policy, every rank's M tokens to the last rank's
  // experts: the last rank gets more rows than the cap. A worst-case handle's creation returns everywhere; every
  // rank's next look at the group (ncclEpGroupGetAsyncError, after its stream) reports the rows that did not fit at
  // the last rank. An EXACT handle's creation fails on every rank with the same message (none is left waiting for
  // a peer whose creation failed).
  int runCapError(int cap) {
    const int R = ctx.nRanks, K = 8, T = kMaxTokens;
    const Case c{"cap: ERROR policy", kAllToLastRank, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_WORST_CASE,
                 false, K, 8, true};
    std::vector<int> idx(T * K);
    for (int t = 0; t < T; t++)
      for (int k = 0; k < K; k++) idx[t * K + k] = (R - 1) * kExpertsPerRank + (t + k) % kExpertsPerRank;
    DeviceBuf topk(idx.size() * 4);
    topk.put(idx.data(), idx.size() * 4);
    ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
    const std::string want = "routes " + std::to_string((long long)T * R) + " rows to rank " + std::to_string(R - 1) +
                             ", above max_recv_rows_per_rank " + std::to_string(cap);
    for (ncclEpSizing_t sizing : {NCCL_EP_SIZING_WORST_CASE, NCCL_EP_SIZING_EXACT}) {
      ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
      hc.sizing = sizing;
      ncclEpHandle_t h = nullptr;
      ncclResult_t res = ncclEpCreateHandle(&h, group, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, &hc, ctx.stream);
      if (sizing == NCCL_EP_SIZING_WORST_CASE && res == ncclSuccess) {
        if (ncclext::waitStream(ctx.stream, gTimeoutSeconds + 30, "cap handle") != ncclSuccess) return 1;
        res = ncclEpGroupGetAsyncError(group);
      }
      const std::string msg = ncclEpGetLastError();
      if (res != ncclInvalidArgument || msg.find(want) == std::string::npos)
        bad(c, ("receive cap overflow not reported as \"" + want + "\": " + msg).c_str(), res, sizing);
      if (sizing == NCCL_EP_SIZING_EXACT && h) bad(c, "an EXACT handle was returned past the cap");
      if (h) ncclEpHandleDestroy(h);
    }
    return 0;
  }

  // The group's zero_copy mode (a capped group): ON refuses an EXPERT_MAJOR handle and a FLAT dispatch into
  // anything but the window; OFF refuses the window. Every refusal is the host's, before any launch, on every rank.
  int runZeroCopyMode(ncclEpZeroCopyMode_t mode) {
    const int rank = ctx.rank, K = 2, T = 16, hidden = kMaxRowBytes / 2;
    const Case c{mode == NCCL_EP_ZERO_COPY_ON ? "zero_copy ON refusals" : "zero_copy OFF refusals", kRandom,
                 ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_WORST_CASE, false, K, hidden, true};
    auto refused = [&](ncclResult_t res, const char* want) {
      const std::string msg = ncclEpGetLastError();
      if (res != ncclInvalidUsage || msg.find(want) == std::string::npos)
        bad(c, ("not refused with \"" + std::string(want) + "\": " + msg).c_str(), res);
    };
    ncclEpTensor_t window = NCCL_EP_TENSOR_INIT;
    if (mode == NCCL_EP_ZERO_COPY_OFF) {
      refused(ncclEpGroupGetDispatchWindow(group, ncclBfloat16, hidden, &window), "zero_copy is OFF");
      return 0;
    }
    std::vector<int> idx(T * K);
    for (int t = 0; t < T; t++)
      for (int k = 0; k < K; k++) idx[t * K + k] = (t * K + k) % (kExpertsPerRank * ctx.nRanks);
    DeviceBuf topk(idx.size() * 4), x((size_t)T * hidden * 2);
    topk.put(idx.data(), idx.size() * 4);
    ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
    ncclEpHandle_t h = nullptr;
    refused(ncclEpCreateHandle(&h, group, NCCL_EP_LAYOUT_EXPERT_MAJOR, &ti, nullptr, nullptr, ctx.stream),
            "zero_copy ON: FLAT handles only");
    if (h) ncclEpHandleDestroy(h);
    h = nullptr;
    EXPECT_OK(ncclEpCreateHandle(&h, group, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, nullptr, ctx.stream));
    int64_t rows = 0;
    EXPECT_OK(ncclEpHandleGetMaxRecvRows(h, &rows));
    DeviceBuf y((size_t)rows * hidden * 2);
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, ncclBfloat16, {T, hidden});
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = epTensor(y.p, ncclBfloat16, {rows, hidden});
    refused(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream), "outputs.tokens must be");
    const int res = wait("zero_copy ON handle");
    EXPECT_OK(ncclEpHandleDestroy(h));
    return res;
  }

  // Zero-copy rows hold until this rank's next call: rank 0 dispatches handle H1 into its window (every rank's tokens
  // to its own experts, so no other rank has a row there); the others combine H1 (nothing from rank 0 needed) and
  // at once dispatch H2, whose routing sends their tokens to rank 0's experts (rank 0's go nowhere, so their rows
  // would land at rank 0's window positions 0.. of H1's rows). Rank 0 waits on the host, then reads its window:
  // H1's rows must still be its own tokens (the peers' H2 dispatch waits for rank 0's next call, its combine of
  // H1). Then everyone finishes H2. Needs a capped group (the window) of 2 ranks or more, in one domain.
  int runWindowHeld(uint64_t cs) {
    const int rank = ctx.rank, K = 2, T = 64, hidden = kMaxRowBytes / 2;
    const Case c{"cap: zero-copy rows held until the next call", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1,
                 NCCL_EP_SIZING_EXACT, false, K, hidden, true};
    const size_t rowBytes = (size_t)hidden * 2;
    std::vector<int> own(T * K), toZero(T * K, -1);
    for (int t = 0; t < T; t++)
      for (int k = 0; k < K; k++) {
        own[t * K + k] = rank * kExpertsPerRank + (t + k) % kExpertsPerRank;
        if (rank != 0) toZero[t * K + k] = (t + k) % kExpertsPerRank;  // rank 0's experts
      }
    DeviceBuf i1(own.size() * 4), i2(toZero.size() * 4), x((size_t)T * rowBytes);
    i1.put(own.data(), own.size() * 4);
    i2.put(toZero.data(), toZero.size() * 4);
    std::vector<uint8_t> hx((size_t)T * rowBytes);
    for (int t = 0; t < T; t++)
      for (size_t j = 0; j < rowBytes; j++) hx[t * rowBytes + j] = tokenByte(cs, rank, t, (int)j);
    x.put(hx.data(), hx.size());
    ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
    hc.sizing = NCCL_EP_SIZING_EXACT;
    ncclEpHandle_t h1 = nullptr, h2 = nullptr;
    ncclEpTensor_t t1 = epTensor(i1.p, ncclInt32, {T, K}), t2 = epTensor(i2.p, ncclInt32, {T, K});
    EXPECT_OK(ncclEpCreateHandle(&h1, group, NCCL_EP_LAYOUT_FLAT, &t1, nullptr, &hc, ctx.stream));
    EXPECT_OK(ncclEpCreateHandle(&h2, group, NCCL_EP_LAYOUT_FLAT, &t2, nullptr, &hc, ctx.stream));
    if (!h1 || !h2 || wait("window-held handles")) return 1;
    int64_t rows1 = 0, rows2 = 0;
    EXPECT_OK(ncclEpHandleGetRecvRows(h1, &rows1));
    EXPECT_OK(ncclEpHandleGetRecvRows(h2, &rows2));
    DeviceBuf y((size_t)std::max<int64_t>(std::max(rows1, rows2), 1) * rowBytes), cout((size_t)T * rowBytes);
    ncclEpTensor_t window = NCCL_EP_TENSOR_INIT;
    EXPECT_OK(ncclEpGroupGetDispatchWindow(group, ncclBfloat16, hidden, &window));
    auto dispatch = [&](ncclEpHandle_t h, int64_t rows, bool intoWindow) {
      ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
      in.tokens = epTensor(x.p, ncclBfloat16, {T, hidden});
      ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
      out.tokens = intoWindow ? window : epTensor(y.p, ncclBfloat16, {rows, hidden});
      EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
      return 0;
    };
    auto combine = [&](ncclEpHandle_t h, int64_t rows) {
      ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
      ci.tokens = epTensor(y.p, ncclBfloat16, {rows, hidden});
      ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
      co.tokens = epTensor(cout.p, ncclBfloat16, {T, hidden});
      EXPECT_OK(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream));
      return 0;
    };
    auto windowRows = [&]() {  // rank 0's first T rows of the window, as bytes
      std::vector<uint8_t> got((size_t)T * rowBytes);
      if (cudaMemcpyAsync(got.data(), window.data, got.size(), cudaMemcpyDeviceToHost, ctx.stream) != cudaSuccess ||
          cudaStreamSynchronize(ctx.stream) != cudaSuccess)
        bad(c, "reading the window failed");
      return got;
    };
    if (dispatch(h1, rows1, rank == 0) || wait("dispatch H1")) return 1;
    if (rank == 0 && rows1 != T) bad(c, "H1 rows at rank 0", rows1, T);
    if (rank == 0 && windowRows() != hx) bad(c, "H1's rows are not rank 0's tokens after dispatch");
    // (a failed call returns before the barrier: the peers' barrier then times out, and they fail too)
    if (rank != 0 && (combine(h1, rows1) || dispatch(h2, rows2, false)))  // H2 enqueued, not waited for: it writes
      return 1;                                                             // into rank 0's window once allowed
    if (ncclext::harness::barrier(ctx, gTimeoutSeconds) != ncclSuccess) return 1;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a peer's H2 rows to land too early
      if (windowRows() != hx) bad(c, "H1's rows in the window were overwritten before rank 0's next call");
      std::vector<uint8_t> zeros(std::max<int64_t>(rows1, 1) * rowBytes, 0);
      y.put(zeros.data(), zeros.size());
      if (combine(h1, rows1) || dispatch(h2, rows2, false)) return 1;
    }
    if (wait("dispatch H2") || combine(h2, rows2) || wait("combine H2")) return 1;
    EXPECT_OK(ncclEpHandleDestroy(h1));
    EXPECT_OK(ncclEpHandleDestroy(h2));
    return 0;
  }

  // EXACT handles whose routing holds, on rank 0, an id >= num_experts (token 1, column 0) and then an id that
  // an earlier column of the token already names (token 2, column 3 repeats column 1): that rank gets
  // ncclInvalidArgument with token and column named; the collective still completes everywhere and the group stays
  // usable.
  int runBadExpert(const Case& c) {
    const int rank = ctx.rank, K = c.topk, T = 4;
    struct Bad {
      int token, column, value;
      std::string message;
    } const cases[] = {
        {1, 0, kExpertsPerRank * ctx.nRanks, "topk_idx[1][0] = " + std::to_string(kExpertsPerRank * ctx.nRanks)},
        {2, 3, 1, "topk_idx[2][3] = 1 repeats topk_idx[2][1]"},
    };
    for (const Bad& b : cases) {
      std::vector<int> idx(T * K);
      for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) idx[t * K + k] = k;  // distinct ids in every row
      if (rank == 0) idx[b.token * K + b.column] = b.value;
      DeviceBuf topk(idx.size() * 4);
      topk.put(idx.data(), idx.size() * 4);
      ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
      ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
      hc.sizing = NCCL_EP_SIZING_EXACT;
      ncclEpHandle_t h = nullptr;
      ncclResult_t res = ncclEpCreateHandle(&h, group, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, &hc, ctx.stream);
      if (rank == 0) {
        const std::string msg = ncclEpGetLastError();
        if (res != ncclInvalidArgument || msg.find(b.message) == std::string::npos)
          bad(c, ("bad expert id not reported as \"" + b.message + "\": " + msg).c_str(), res);
        if (h) bad(c, "a handle was returned for a bad routing");
      } else if (res != ncclSuccess) {
        bad(c, "a rank with valid routing failed", res);
      }
      if (h) ncclEpHandleDestroy(h);
    }
    return 0;
  }
};

// --soak PAIRS: dispatch + combine pairs of one small case, each with a new routing on a new handle and every output
// checked (Runner::runCase), on groups of kSoakPairsPerGroup pairs each; a warm-up of one whole group (what a
// group's life takes at its most is then taken once), then the memory measured with no group open, the pairs, and
// the memory again. One verdict over the ranks: every check right, no error, the memory flat
// (ncclext::harness::SoakNumbers::flat on every rank).
int soakMain(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& cfg, uint64_t seed,
             const std::string& json) {
  Case c{"soak: bf16/flat/worst", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_WORST_CASE, false, 8,
         128, true};
  c.maxTokens = 128;
  int errors = 0;
  auto cycle = [&](uint64_t s, int pairs, ncclext::harness::SoakNumbers* n) {
    for (int done = 0; done < pairs;) {
      ncclEpGroup_t g = nullptr;
      if (ncclext::harness::createEpGroup(&g, ctx.comm, &cfg) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpCreateGroup (soak): %s\n", ctx.rank, ncclEpGetLastError());
        return 1;
      }
      Runner r{ctx, g, seed, 0, {}};
      const int m = std::min(ncclext::harness::kSoakPairsPerGroup, pairs - done);
      int res = 0;
      for (int i = 0; i < m && !res; i++) {  // a handle of its own and every output checked (runCase)
        res = r.runCase(c, s * 1000003 + done + i);
        n->calls++;
        n->handles++;
        n->checks++;
      }
      errors += r.errors;
      if (ncclEpGroupDestroy(g) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpGroupDestroy (soak): %s\n", ctx.rank, ncclEpGetLastError());
        res = 1;
      }
      if (res) return 1;
      done += m;
    }
    return 0;
  };
  ncclext::harness::SoakNumbers warm, n;
  const double budget = gTimeoutSeconds + 30;
  int rc = cycle(seed, ncclext::harness::kSoakPairsPerGroup, &warm);
  if (!rc && !ncclext::harness::measureMemory(ctx, budget, &n.deviceUsed0, &n.rss0)) rc = 1;
  const auto t0 = std::chrono::steady_clock::now();
  if (!rc) rc = cycle(seed + 1, gSoak, &n);
  n.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!rc && !ncclext::harness::measureMemory(ctx, budget, &n.deviceUsed1, &n.rss1)) rc = 1;
  // rc (a failed call, wait or measure) fails the run as an error does.
  const bool pass = ncclext::harness::reportSoak(ctx, "ep_ht_soak", c.name, n, 1, ncclext::harness::kSoakPairsPerGroup,
                                                 1, errors + rc + tCudaErrors, seed, json);
  return pass ? 0 : 1;
}

// The silent-peer tests' routing: T tokens of top-K, token t's k-th expert (t + 3 k) mod the experts, so that every
// rank's tokens hit every rank's experts.
std::vector<int> spreadRouting(int T, int K, int nRanks) {
  std::vector<int> idx((size_t)T * K);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) idx[(size_t)t * K + k] = (t + k * 3) % (kExpertsPerRank * nRanks);
  return idx;
}

// --silent-relay (the hierarchical HT at 4 mixed ranks: NCCL_EXT_HT_HIERARCHICAL=1 --one-gpu mixed --nranks 4), on a
// group of its own with the silent-peer budget B: every rank dispatches; then the last rank (3) skips the combine. Rank
// 2, the relay of rank 0's tokens in their domain, reduces the rows its domain's ranks hold for them: its wait for rank
// 3's gives up after B, and its exchange, queued behind its launch fence (which gives up after B too), still sends rank
// 0 what its partials hold, an earlier call's. Ranks 0 and 1 call the combine B / 2 late, so that rank 0's rail
// exchange is inside its budget when rank 2's partials come. Every rank but 3 must report ncclRemoteError within 3 B +
// 10 s: rank 0 the refused partials, naming its relay (a build whose partials carry no call number sums them and
// returns success), rank 1 its rail's abort (its relay is rank 3), rank 2 its wait for rank 3. gpu-check's ep_ht_hier
// row runs it (on one H200: rank 0 named its relay 1.5 s into its combine, ranks 1 and 2 reported after 3.0 s with B =
// 3 s; with the scatter's check taken out rank 0 returned success:
// bench/results/ep_ht_silent_relay-20261207T0525Z-h200.log).
bool silentRelay(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& base) {
  const int rank = ctx.rank, silent = 3;
  if (ctx.nRanks != 4) {
    printf("rank %d: --silent-relay: skipped (it needs 4 ranks, the mixed mode)\n", rank);
    return true;
  }
  ncclEpGroupConfig_t cfg = base;
  cfg.timeout_ns = (uint64_t)(gSilentPeerSeconds * 1e9);
  ncclEpGroup_t g = nullptr;
  if (ncclext::harness::createEpGroup(&g, ctx.comm, &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: --silent-relay: ncclEpCreateGroup: %s\n", rank, ncclEpGetLastError());
    return false;
  }
  ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
  bool ok = ncclEpGroupGetInfo(g, &info) == ncclSuccess;
  if (ok && !info.rail_hierarchical) {
    printf("rank %d: --silent-relay: skipped (not hierarchical: NCCL_EXT_HT_HIERARCHICAL=1 --one-gpu mixed)\n", rank);
    return ncclEpGroupDestroy(g) == ncclSuccess;
  }
  const double budget = gSilentPeerSeconds;
  const int K = 8, T = 64, H = 512;
  const std::vector<int> idx = spreadRouting(T, K, ctx.nRanks);
  DeviceBuf topk(idx.size() * 4), x((size_t)T * H * 2), out((size_t)T * H * 2);
  topk.put(idx.data(), idx.size() * 4);
  cudaOk(cudaMemsetAsync(x.p, 0, x.bytes, tStream), "zero x");
  ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
  ncclEpHandle_t h = nullptr;
  int64_t rows = 0;
  ok = ok && ncclEpCreateHandle(&h, g, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, nullptr, ctx.stream) == ncclSuccess &&
       ncclEpHandleGetMaxRecvRows(h, &rows) == ncclSuccess;
  DeviceBuf y((size_t)std::max<int64_t>(rows, 1) * H * 2);
  if (ok) {
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, ncclBfloat16, {T, H});
    ncclEpDispatchOutputs_t dout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = epTensor(y.p, ncclBfloat16, {rows, H});
    ok = ncclEpDispatch(h, &in, &dout, nullptr, nullptr, ctx.stream) == ncclSuccess &&
         ncclext::waitStream(ctx.stream, budget + 30, "silent relay: dispatch") == ncclSuccess &&
         ncclEpGroupGetAsyncError(g) == ncclSuccess;
    if (!ok) fprintf(stderr, "rank %d: --silent-relay: the dispatch failed: %s\n", rank, ncclEpGetLastError());
  }
  if (ok && rank != silent) {
    if (rank < 2) std::this_thread::sleep_for(std::chrono::duration<double>(budget / 2));
    ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
    ci.tokens = epTensor(y.p, ncclBfloat16, {rows, H});
    ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
    co.tokens = epTensor(out.p, ncclBfloat16, {T, H});
    const auto t0 = std::chrono::steady_clock::now();
    ncclResult_t res = ncclEpCombine(h, &ci, &co, nullptr, ctx.stream);
    ncclext::waitStream(ctx.stream, 3 * budget + 30, "silent relay: combine");
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (res == ncclSuccess) res = ncclEpGroupGetAsyncError(g);
    const std::string msg = ncclEpGetLastError();
    printf("rank %d: combine whose relay's domain has a silent rank -> %s after %.2f s: %s\n", rank,
           ncclGetErrorString(res), waited, res == ncclSuccess ? "" : msg.c_str());
    // Rank 0's must be the refused partials (a rail abort there would mean the stagger missed: nothing shown).
    if (res != ncclRemoteError || waited > 3 * budget + 10 ||
        (rank == 0 && msg.find("relay, rank 2,") == std::string::npos)) {
      fprintf(stderr, "rank %d: --silent-relay: want ncclRemoteError within %.0f s%s\n", rank, 3 * budget + 10,
              rank == 0 ? " naming the relay, rank 2" : "");
      ok = false;
    }
  }
  // Every rank is past its combine before any frees (virtual ranks free together).
  if (ncclext::harness::barrier(ctx, 3 * budget + 60) != ncclSuccess) ok = false;
  if (h) ncclEpHandleDestroy(h);
  if (ncclEpGroupDestroy(g) != ncclSuccess) {
    fprintf(stderr, "rank %d: --silent-relay: ncclEpGroupDestroy: %s\n", rank, ncclEpGetLastError());
    ok = false;
  }
  return ok;
}

bool parse(int argc, char** argv, int* nRanks, uint64_t* seed, std::string* json, ncclext::harness::OneGpu* oneGpu,
           bool* quick) {
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", nRanks);
  cli.oneGpu(oneGpu, /*mixedToo=*/true);
  cli.option("seed", seed);
  cli.option("timeout-s", &gTimeoutSeconds);
  cli.option("silent-peer-s", &gSilentPeerSeconds);
  cli.option("sms", &gSms);
  cli.flag("silent-relay", &gSilentRelay);
  cli.flag("quick", quick);
  cli.option("soak", &gSoak);
  cli.option("json", json);
  if (!cli.parse(argc, argv)) return false;
  if (gSilentPeerSeconds <= 0) gSilentPeerSeconds = gTimeoutSeconds;
  return cli.require(gTimeoutSeconds > 0, "--timeout-s must be > 0") &&
         cli.require(gSoak >= 0, "--soak must be >= 0") && cli.require(gSms > 0, "--sms must be > 0");
}

}  // namespace

int main(int argc, char** argv) {
  int nRanks = 0;
  uint64_t seed = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();  // fresh every run
  std::string json;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  bool quick = false;
  if (!parse(argc, argv, &nRanks, &seed, &json, &oneGpu, &quick)) return 2;
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = nRanks;
  lo.oneGpu = oneGpu;
  ncclEpVirtualDomain_t virt = nullptr;
  if (!ncclext::harness::makeVirtualDomain(lo, &virt)) return 1;
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) {
    tStream = ctx.stream;
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = kExpertsPerRank * ctx.nRanks;
    cfg.max_tokens_per_rank = kMaxTokens;
    cfg.max_token_bytes = kMaxRowBytes;
    cfg.max_topk = 8;
    cfg.num_sms = gSms;
    cfg.timeout_ns = (uint64_t)(gTimeoutSeconds * 1e9);
    ncclext::harness::setEpTesting(virt, ctx.localRank, ctx.rail);  // mixed: the rail of my index (relayed)
    if (gSoak > 0) return soakMain(ctx, cfg, seed, json);
    ncclEpGroup_t group = nullptr;
    if (ncclext::harness::createEpGroup(&group, ctx.comm, &cfg) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclEpCreateGroup: %s\n", ctx.rank, ncclEpGetLastError());
      return 1;
    }
    // Several NVLink domains: one-GPU nodes, the mixed mode, or real GPUs split by NCCL_EXT_LSA_DOMAIN_SIZE.
    const ncclext::harness::GroupShape shape = ncclext::harness::groupShape(group);
    const bool acrossDomains = shape.nDomains > 1;
    Runner run{ctx, group, seed, 0, {}};
    std::vector<Case> cases;
    const ncclDataType_t dtypes[] = {ncclBfloat16, ncclFloat16, ncclFloat32, ncclFloat8e4m3};
    const char* dn[] = {"bf16", "fp16", "fp32", "fp8"};
    for (int di = 0; di < 4; di++)
      for (ncclEpLayout_t layout : {NCCL_EP_LAYOUT_FLAT, NCCL_EP_LAYOUT_EXPERT_MAJOR})
        for (ncclEpSizing_t sizing : {NCCL_EP_SIZING_EXACT, NCCL_EP_SIZING_WORST_CASE}) {
          const bool em = layout == NCCL_EP_LAYOUT_EXPERT_MAJOR;
          cases.push_back({std::string(dn[di]) + (em ? "/em" : "/flat") + (sizing ? "/exact" : "/worst"), kRandom,
                           dtypes[di], layout, em ? 8 : 1, sizing, di % 2 == 1, 8, di == 3 ? 1024 : 384, di != 2});
        }
    cases.push_back({"skew: all to the last rank", kAllToLastRank, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1,
                     NCCL_EP_SIZING_EXACT, false, 8, 512, true});
    cases.push_back({"skew: all to the last rank, em", kAllToLastRank, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, 4,
                     NCCL_EP_SIZING_EXACT, true, 8, 512, true});
    cases.push_back({"one expert", kOneExpert, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, 16, NCCL_EP_SIZING_EXACT,
                     false, 4, 256, true});
    // An alignment that is no power of two (DeepGEMM's M tile on sm_100 is 224; 24 keeps the zones small).
    cases.push_back({"align 24, em", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, 24, NCCL_EP_SIZING_WORST_CASE,
                     true, 8, 256, true});
    cases.push_back({"first rank empty", kFirstRankEmpty, ncclFloat16, NCCL_EP_LAYOUT_FLAT, 1,
                     NCCL_EP_SIZING_WORST_CASE, false, 6, 256, true});
    cases.push_back({"top-1", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_EXACT, false, 1, 2048, true});
    cases.push_back({"hidden 7168 bf16", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_EXACT, false, 8,
                     7168, true});
    // Rows whose vector count is not a multiple of the reduction's 32 x 4 per warp step (hidden 8: 1 vector;
    // hidden 1160: 145): combine's shuffles once left lanes out and hung.
    cases.push_back({"hidden 8 bf16, em", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, 1, NCCL_EP_SIZING_EXACT,
                     false, 8, 8, true});
    cases.push_back({"hidden 8 bf16, flat", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_WORST_CASE,
                     false, 8, 8, true});
    cases.push_back({"hidden 1160 bf16, em", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, 4,
                     NCCL_EP_SIZING_EXACT, false, 8, 1160, true});
    // Side words with rows that need no scales (the V2 drop-in's routing rows beside bf16 tokens): forwarded bit
    // for bit, as fp8's scales are.
    for (ncclEpLayout_t layout : {NCCL_EP_LAYOUT_FLAT, NCCL_EP_LAYOUT_EXPERT_MAJOR}) {
      Case sw{layout == NCCL_EP_LAYOUT_FLAT ? "bf16 + 17 side words, flat" : "fp16 + 17 side words, em", kRandom,
              layout == NCCL_EP_LAYOUT_FLAT ? ncclBfloat16 : ncclFloat16, layout, 1, NCCL_EP_SIZING_WORST_CASE, false,
              8, 256, true};
      sw.sideWords = 17;
      cases.push_back(sw);
    }
    if (quick) {  // the sanitizer runs: one case per layout and kind of row, the short rows, no limits group
      std::vector<Case> few;
      for (const Case& c : cases)
        if (c.name == "bf16/flat/exact" || c.name == "fp8/em/worst" || c.name == "fp32/em/exact" ||
            c.name.rfind("hidden 8", 0) == 0 || c.name == "first rank empty")
          few.push_back(c);
      cases.swap(few);
    }
    int failedCases = 0, rc = 0;
    for (size_t i = 0; i < cases.size(); i++) {
      const int before = run.errors;
      rc |= run.runCase(cases[i], seed * 100 + i);
      if (run.errors != before) failedCases++;
      if (rc) break;
    }
    // A run on a group of its own (`gc`; the reference keeps its receive cap): made, `body` on a Runner of it, the
    // Runner's errors added to the test's, destroyed; a group that cannot be made or destroyed fails the run.
    auto onOwnGroup = [&](const char* what, const ncclEpGroupConfig_t& gc, const std::function<int(Runner&)>& body) {
      ncclEpGroup_t own = nullptr;
      if (ncclext::harness::createEpGroup(&own, ctx.comm, &gc) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpCreateGroup (%s): %s\n", ctx.rank, what, ncclEpGetLastError());
        return 1;
      }
      Runner r{ctx, own, seed, 0, {}, gc.max_recv_rows_per_rank};
      int res = body(r);
      run.errors += r.errors;
      if (ncclEpGroupDestroy(own) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpGroupDestroy (%s): %s\n", ctx.rank, what, ncclEpGetLastError());
        res = 1;
      }
      return res;
    };
    // `list` on runner `r` (case i with seed seedBase + i, stopping at a failed run), a case that added errors
    // counted as failed; the cases join the run's report.
    auto runCases = [&](Runner& r, const std::vector<Case>& list, uint64_t seedBase) {
      int res = 0;
      for (size_t i = 0; i < list.size() && !res; i++) {
        const int before = r.errors;
        res |= r.runCase(list[i], seedBase + i);
        if (r.errors != before) failedCases++;
      }
      cases.insert(cases.end(), list.begin(), list.end());
      return res;
    };
    // The limits, on a second group: 16384 tokens per rank, top-32, 1024 experts in all (the group's limit; all on
    // one rank when there is one), and rows of 16384 bf16 columns.
    if (!rc && !quick && !acrossDomains) {
      ncclEpGroupConfig_t big = cfg;
      const int bigExpertsPerRank = 1024 / ctx.nRanks;
      big.num_experts = bigExpertsPerRank * ctx.nRanks;
      big.max_tokens_per_rank = 16384;
      big.max_token_bytes = 16384 * 2;
      big.max_topk = 32;
      big.num_sms = NCCL_EP_AUTO;
      std::vector<Case> limits;
      Case full{"limits: 16384 tokens, top-32, flat", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1,
                NCCL_EP_SIZING_EXACT, true, 32, 256, true};
      full.expertsPerRank = bigExpertsPerRank;
      full.maxTokens = 16384;
      full.allFull = true;
      limits.push_back(full);
      Case em = full;
      em.name = "limits: 16384 tokens, top-32, expert-major, align 16";
      em.layout = NCCL_EP_LAYOUT_EXPERT_MAJOR;
      em.align = 16;
      em.sizing = NCCL_EP_SIZING_WORST_CASE;
      em.allFull = false;
      limits.push_back(em);
      Case wide{"limits: hidden 16384 bf16", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_EXACT,
                false, 32, 16384, true};
      wide.expertsPerRank = bigExpertsPerRank;
      wide.maxTokens = 48;
      limits.push_back(wide);
      // The reported hang: every token on the last rank's experts (all 1024 of them with one rank), top-32, 257
      // tokens, 16-byte rows.
      for (ncclEpLayout_t layout : {NCCL_EP_LAYOUT_EXPERT_MAJOR, NCCL_EP_LAYOUT_FLAT}) {
        Case tiny{layout == NCCL_EP_LAYOUT_FLAT ? "all on the last rank, top-32, 257 x 16 B rows, flat"
                                                 : "all on the last rank, top-32, 257 x 16 B rows, em",
                  kAllToLastRank, ncclBfloat16, layout, 1, NCCL_EP_SIZING_EXACT, false, 32, 8, true};
        tiny.expertsPerRank = bigExpertsPerRank;
        tiny.maxTokens = 257;
        tiny.allFull = true;
        limits.push_back(tiny);
      }
      rc = onOwnGroup("limits", big, [&](Runner& r) { return runCases(r, limits, seed * 100 + 50); });
    }
    // The receive cap (inside one domain, or across domains over the flat exchange: one-GPU nodes; the mixed mode's
    // relayed exchange takes none): a group whose ranks keep max_recv_rows_per_rank = M x R / 2 rows, DROP: random
    // routings overflow some ranks now and then, the skewed ones (every token to the last rank) always; every output,
    // count, combine and missing_experts against the reference that keeps each rank's first rows. Then, ERROR: every
    // rank is told that the last rank overflows.
    if (!rc && !shape.relayed) {
      ncclEpGroupConfig_t capCfg = cfg;
      capCfg.max_recv_rows_per_rank = std::max(1, kMaxTokens * ctx.nRanks / 2);
      capCfg.recv_overflow = NCCL_EP_RECV_OVERFLOW_DROP;
      std::vector<Case> capped;
      capped.push_back({"cap: bf16/flat/exact", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_EXACT,
                        false, 8, 384, true});
      capped.push_back({"cap: fp8/em/worst", kRandom, ncclFloat8e4m3, NCCL_EP_LAYOUT_EXPERT_MAJOR, 8,
                        NCCL_EP_SIZING_WORST_CASE, true, 8, 1024, true});
      Case skew{"cap: skew, flat/worst", kAllToLastRank, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1,
                NCCL_EP_SIZING_WORST_CASE, false, 8, 512, true};
      skew.allFull = true;
      capped.push_back(skew);
      skew.name = "cap: skew, em/exact, fp32";
      skew.layout = NCCL_EP_LAYOUT_EXPERT_MAJOR;
      skew.align = 4;
      skew.sizing = NCCL_EP_SIZING_EXACT;
      skew.dtype = ncclFloat32;
      capped.push_back(skew);
      // Zero-copy: FLAT rows of the window's row size (7168 bf16) straight into the window, random and skewed.
      Case zc{"cap: zero-copy flat, bf16 7168", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1,
              NCCL_EP_SIZING_WORST_CASE, false, 8, kMaxRowBytes / 2, true};
      zc.windowOut = true;
      capped.push_back(zc);
      zc.name = "cap: zero-copy flat, skew, exact";
      zc.routing = kAllToLastRank;
      zc.allFull = true;
      zc.sizing = NCCL_EP_SIZING_EXACT;
      capped.push_back(zc);
      if (quick) {  // the sanitizer runs: one FLAT and one EXPERT_MAJOR case, both past the cap now and then
        std::vector<Case> few;
        for (const Case& c : capped)
          if (c.name == "cap: bf16/flat/exact" || c.name == "cap: skew, em/exact, fp32") few.push_back(c);
        capped.swap(few);
      }
      rc = onOwnGroup("receive cap", capCfg, [&](Runner& r) { return runCases(r, capped, seed * 100 + 70); });
      // (Not across domains: there a peer's rows reach rank 0's window only through rank 0's own next dispatch on
      // its stream, and the peers' H2, waiting in its rail exchange for rank 0's, would hold the test's barrier, an
      // NCCL collective on the same stream.)
      if (!rc && ctx.nRanks > 1 && !acrossDomains)
        rc = onOwnGroup("receive cap, zero-copy rows held", capCfg,
                        [&](Runner& r) { return r.runWindowHeld(seed * 100 + 90); });
      // zero_copy ON: the window cases again, and its refusals; OFF: its refusal.
      if (!rc && !quick) {
        ncclEpGroupConfig_t on = capCfg;
        on.zero_copy = NCCL_EP_ZERO_COPY_ON;
        std::vector<Case> inWindow;
        for (const Case& c : capped)
          if (c.windowOut) inWindow.push_back(c), inWindow.back().name = "zero_copy ON, " + c.name;
        rc = onOwnGroup("zero_copy ON", on, [&](Runner& r) {
          return runCases(r, inWindow, seed * 100 + 80) || r.runZeroCopyMode(NCCL_EP_ZERO_COPY_ON);
        });
        on.zero_copy = NCCL_EP_ZERO_COPY_OFF;
        if (!rc)
          rc = onOwnGroup("zero_copy OFF", on, [&](Runner& r) { return r.runZeroCopyMode(NCCL_EP_ZERO_COPY_OFF); });
      }
      capCfg.recv_overflow = NCCL_EP_RECV_OVERFLOW_ERROR;
      if (!rc)
        rc = onOwnGroup("receive cap, ERROR", capCfg,
                        [&](Runner& r) { return r.runCapError(capCfg.max_recv_rows_per_rank); });
    }
    const Case graphCase{"graph replay", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_WORST_CASE,
                         false, 8, 512, true};
    const int replays = quick ? 2 : 20;
    if (!rc) rc |= run.runGraph(graphCase, seed * 7 + 1, replays);
    Case alternating{"two handles alternating", kRandom, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, 1, NCCL_EP_SIZING_EXACT,
                     false, 8, quick ? 512 : 7168, true};
    alternating.allFull = true;
    if (!rc) rc |= run.runAlternating(alternating, seed * 11 + 3);
    if (!rc) rc |= run.runBadExpert(graphCase);
    // Agree on the outcome before the timeout test breaks the group's sequence. A failed agreement fails the run.
    uint64_t total = 0;
    const int mine = run.errors + rc + tCudaErrors;
    if (ncclext::harness::sumOverRanks(ctx, (uint64_t)mine, &total, 60) != ncclSuccess) {
      fprintf(stderr, "rank %d: the ranks could not agree on the outcome: %s\n", ctx.rank, ncclext::lastError());
      total = 1 + mine;
    }
    bool timeoutOk = true;
    double waited = 0;
    if (ctx.nRanks > 1) {
      // One rank skips a dispatch: the others' waits give up after the group's budget with ncclRemoteError. With
      // --silent-peer-s (the sanitizer runs: long budgets for slow instrumented kernels, a short one here) on a group
      // of its own. Across domains the rail exchange waits first: the watchdog aborts it after the budget, then the
      // receive half's waits for the silent peer's rows time out too, and the group reports the rail's abort.
      const Case c = graphCase;
      const int rank = ctx.rank;
      ncclEpGroup_t silent = group;
      if (gSilentPeerSeconds != gTimeoutSeconds) {
        ncclEpGroupConfig_t scfg = cfg;
        scfg.timeout_ns = (uint64_t)(gSilentPeerSeconds * 1e9);
        silent = nullptr;
        EXPECT_OK(ncclext::harness::createEpGroup(&silent, ctx.comm, &scfg));
      }
      const double budget = gSilentPeerSeconds;
      const int K = 8, T = 64;
      const std::vector<int> idx = spreadRouting(T, K, ctx.nRanks);
      DeviceBuf topk(idx.size() * 4), x((size_t)T * 512 * 2);
      topk.put(idx.data(), idx.size() * 4);
      cudaOk(cudaMemsetAsync(x.p, 0, x.bytes, tStream), "zero x");  // dispatch reads them: set (any values)
      ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {T, K});
      ncclEpHandle_t h = nullptr;
      EXPECT_OK(ncclEpCreateHandle(&h, silent, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, nullptr, ctx.stream));
      int64_t rows = 0;
      ncclEpHandleGetMaxRecvRows(h, &rows);
      DeviceBuf y(rows * 512 * 2);
      const ncclext::harness::GroupShape shape = ncclext::harness::groupShape(silent);  // what the verdict allows
      if (rank != ctx.nRanks - 1) {
        ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
        in.tokens = epTensor(x.p, ncclBfloat16, {T, 512});
        ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
        out.tokens = epTensor(y.p, ncclBfloat16, {rows, 512});
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
        ncclext::waitStream(ctx.stream, budget + 30, "timeout dispatch");
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const ncclResult_t res = ncclEpGroupGetAsyncError(silent);
        const std::string msg = ncclEpGetLastError();
        // Relayed exchanges (mixed): the silent rank's rail peers see the rail's abort; every other rank, whose
        // exchanges complete, a device wait for the silent rank's rows (or those it relays) timing out.
        timeoutOk = ncclext::harness::silentPeerVerdict(ctx.nRanks, shape, ctx.nRanks - 1, res, msg, waited, budget);
        printf("rank %d: dispatch with a silent peer -> %s after %.2f s: %s\n", rank, ncclGetErrorString(res), waited,
               msg.c_str());
        // Later calls report the same error instead of hanging.
        timeoutOk &= ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream) == ncclRemoteError;
      }
      ncclEpHandleDestroy(h);
      if (silent != group && ncclEpGroupDestroy(silent) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpGroupDestroy (silent peer): %s\n", ctx.rank, ncclEpGetLastError());
        timeoutOk = false;
      }
    }
    if (gSilentRelay) timeoutOk &= silentRelay(ctx, cfg);
    if (ncclEpGroupDestroy(group) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclEpGroupDestroy: %s\n", ctx.rank, ncclEpGetLastError());
      timeoutOk = false;
    }
    const bool pass = total == 0 && timeoutOk && tCudaErrors == 0;
    printf("rank %d: %zu cases (%d failed), graph replays, alternating handles, bad expert ids, timeout %s, %s, CUDA "
           "errors in the test %d -> %s (seed %llu)\n",
           ctx.rank, cases.size(), failedCases, ctx.nRanks > 1 ? (timeoutOk ? "ok" : "FAILED") : "n/a (1 rank)",
           ncclext::harness::oneGpuName(ctx.mode), tCudaErrors, pass ? "PASS" : "FAIL", (unsigned long long)seed);
    if (ctx.rank == 0) {
      char line[512];
      snprintf(line, sizeof(line),
               "{\"test\": \"ep_ht\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"cases\": %zu, "
               "\"graph_replays\": %d, \"timeout_tested\": %s, \"timeout_waited_s\": %.3f, "
               "\"across_domains\": %s, \"seed\": %llu}",
               ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), pass ? "true" : "false", cases.size(), replays,
               ctx.nRanks > 1 ? "true" : "false", waited, acrossDomains ? "true" : "false", (unsigned long long)seed);
      ncclext::harness::writeJsonLine(json, line);
    }
    return pass ? 0 : 1;
  });
  if (virt) ncclEpVirtualDomainDestroy(virt);
  return rc;
}
