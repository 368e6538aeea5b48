// ep_ll_bench: Low-Latency dispatch/combine latency (decode shapes), one process per GPU through tests/harness, or
// N virtual ranks on one GPU (--one-gpu virtual: the protocol's cost with every rank sharing one GPU's SMs and
// memory; no NVLink, so not a link measurement).
//
// For each shape (tokens per rank 1, 8, 32, 64, 128, 256, hidden 7168 (and 4096 at 128 and 256 tokens), top-8, 256
// experts over the ranks): random top-k routing without repeats, a handle bound once, then, each timed with its own
// pair of CUDA events on the call's stream and reported as the median of 100 calls after 20 warm-up calls, back to
// back:
//   dispatch (bf16 out, or fp8 e4m3 or NVFP4 (global scale 1) quantised by the sender), combine (RANK_MAJOR: rows
//   as given; EXPERT_MAJOR: the owner-weighted path, DeepEP's), the pair dispatch + combine, and graphs (dispatch,
//   combine, and the pair, each captured once and replayed);
// and, in the same run, the floor: an empty kernel with the same grid (launch + completion, the least any
// kernel-based call costs), and the copy engine moving this rank's dispatch payload device to device.
// Bytes: payload = rows this rank sends (one per (token, destination rank), its own included) x row bytes (fp8:
// + 4 bytes per 128 columns; NVFP4: H / 2 + one byte per 16 columns). Every rank reports; rank 0 prints.
//
// Across NVLink domains (--one-gpu nodes: every rank a domain of its own, loopback sockets between them; or several
// nodes): the group's rail exchange moves fixed-size slices per call (ncclEpGroupGetInfo), and the baseline in the
// same run is one NCCL group of ncclSend/ncclRecv moving exactly those bytes to and from every rank of another domain
// on the same communicator: dispatch_us / rail_dispatch_us is our cost over the transport (issue 12: <= 1.1). Fewer
// shapes (bf16, 1 and 128 tokens) and iterations (5 warm-up, 20 timed) there: every call crosses the sockets.
//
// Usage: ep_ll_bench [--nranks N] [--one-gpu off|nodes|virtual] [--sms N] [--json FILE] [--quick]
// (also: ep_bench --mode ll). --sms: the calls' num_sms (default: the group's, 64 capped by the GPU).

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/timing.cuh"
#include "nccl_ep.h"
#include "tests/harness/cli.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/ep_tensor.h"
#include "tests/harness/launcher.h"

namespace {

using ncclext::harness::epTensor;

constexpr int kHidden = 7168, kTopk = 8, kExperts = 256, kMaxTokens = 256;
int gWarm = 20, gIters = 100;  // across domains: 5 and 20

enum Format { kBf16, kFp8, kNvfp4 };  // what dispatch delivers: bf16, or quantised by the sender
const char* formatName(int f) { return f == kBf16 ? "bf16" : f == kFp8 ? "fp8_e4m3" : "nvfp4"; }

struct Shape {
  int tokens, hidden;
  ncclEpLayout_t layout;
  int fmt;  // Format
};

using ncclext::bench::median;

__global__ void emptyKernel() {}

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "rank %d: %s -> %s\n", ctx.rank, #call, cudaGetErrorString(e_));         \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

// Median microseconds of `fn` (which enqueues one call on `stream` and returns 0 when it was enqueued), after
// gWarm untimed calls: bench/timing.cuh with this file's iteration counts.
template <typename F>
double timeCalls(cudaStream_t stream, F fn, int* failed) {
  bool bad = false;
  const double us = ncclext::bench::timeCalls(stream, gWarm, gIters, [&]() { return fn() == 0; }, &bad);
  *failed |= bad ? 1 : 0;
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int nRanks = 0, sms = 0;
  bool quick = false;
  std::string json;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", &nRanks);
  cli.oneGpu(&oneGpu);
  cli.option("sms", &sms);
  cli.flag("quick", &quick);
  cli.option("json", &json);
  if (!cli.parse(argc, argv)) return 2;
  std::vector<Shape> shapes;
  for (int t : {1, 8, 32, 64, 128, 256})
    for (ncclEpLayout_t l : {NCCL_EP_LAYOUT_EXPERT_MAJOR, NCCL_EP_LAYOUT_RANK_MAJOR})
      for (int fmt : {kBf16, kFp8, kNvfp4}) shapes.push_back({t, kHidden, l, fmt});
  for (int t : {128, 256})
    for (ncclEpLayout_t l : {NCCL_EP_LAYOUT_EXPERT_MAJOR, NCCL_EP_LAYOUT_RANK_MAJOR})
      for (int fmt : {kBf16, kFp8, kNvfp4}) shapes.push_back({t, 4096, l, fmt});
  if (quick) shapes.resize(2);
  // Across domains (known once the group exists, below): bf16 at 1 and 128 tokens only.
  auto acrossDomainsShape = [](const Shape& s) {
    return s.fmt == kBf16 && s.hidden == kHidden && (s.tokens == 1 || s.tokens == 128);
  };
  static ncclEpVirtualDomain_t virtualDomain = nullptr;
  if (oneGpu == ncclext::harness::OneGpu::kVirtual &&
      ncclEpVirtualDomainCreate(&virtualDomain, nRanks > 0 ? nRanks : 1) != ncclSuccess)
    return 1;
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = nRanks;
  lo.oneGpu = oneGpu;
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) {
    const int R = ctx.nRanks;
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
    cfg.num_experts = kExperts;
    cfg.max_tokens_per_rank = kMaxTokens;
    cfg.max_token_bytes = kHidden * 2;
    cfg.max_topk = kTopk;
    ncclext::harness::setEpTesting(virtualDomain, ctx.rank, nullptr);
    ncclEpGroup_t group = nullptr;
    NCCLEXT_BENCH_EP(ncclext::harness::createEpGroup(&group, ctx.comm, &cfg));
    ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
    NCCLEXT_BENCH_EP(ncclEpGroupGetInfo(group, &info));
    const bool rail = info.n_domains > 1;
    if (rail) {
      gWarm = 5;
      gIters = 20;
    }
    std::vector<int> remote;  // the ranks of other domains
    for (int r = 0; r < R; r++)
      if (r / info.domain_size != ctx.rank / info.domain_size) remote.push_back(r);
    const size_t railMost =
        std::max({info.rail_dispatch_bytes, info.rail_combine_bytes, info.rail_combine_owner_bytes, (size_t)16});
    cudaStream_t st = ctx.stream;
    const int L = kExperts / R;
    const int64_t rmRows = (int64_t)R * kMaxTokens, emRows = rmRows * L;
    // Outputs and inputs sized for the larger layout, allocated stream-ordered (virtual ranks: see ARCHITECTURE).
    void *x, *w, *idxBuf, *y, *scales, *comb, *out, *globalScale;
    CHECK_CUDA(cudaMallocAsync(&x, (size_t)kMaxTokens * kHidden * 2, st));
    CHECK_CUDA(cudaMallocAsync(&w, (size_t)kMaxTokens * kTopk * 4, st));
    CHECK_CUDA(cudaMallocAsync(&idxBuf, (size_t)kMaxTokens * kTopk * 4, st));
    CHECK_CUDA(cudaMallocAsync(&y, (size_t)emRows * kHidden * 2, st));
    CHECK_CUDA(cudaMallocAsync(&scales, (size_t)emRows * (kHidden / 128) * 4, st));
    CHECK_CUDA(cudaMallocAsync(&comb, (size_t)emRows * kHidden * 2, st));
    CHECK_CUDA(cudaMallocAsync(&out, (size_t)kMaxTokens * kHidden * 2, st));
    CHECK_CUDA(cudaMallocAsync(&globalScale, 4, st));
    const float one = 1.0f;
    CHECK_CUDA(cudaMemcpyAsync(globalScale, &one, 4, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaMemsetAsync(x, 0x3c, (size_t)kMaxTokens * kHidden * 2, st));  // bf16 ~ 0.0115: finite
    CHECK_CUDA(cudaMemsetAsync(comb, 0x3c, (size_t)emRows * kHidden * 2, st));
    std::vector<float> hw((size_t)kMaxTokens * kTopk, 1.0f / kTopk);
    CHECK_CUDA(cudaMemcpyAsync(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice, st));
    void* copyDst = nullptr;
    CHECK_CUDA(cudaMallocAsync(&copyDst, (size_t)kMaxTokens * R * (kHidden * 2), st));
    // The rail baseline's buffers: one slice per remote rank each way.
    void *railSend = nullptr, *railRecv = nullptr;
    if (rail) {
      CHECK_CUDA(cudaMallocAsync(&railSend, railMost * remote.size(), st));
      CHECK_CUDA(cudaMallocAsync(&railRecv, railMost * remote.size(), st));
    }
    // One NCCL group moving `bytes` to and from every rank of another domain (the exchange's bytes, not its calls).
    auto railBaseline = [&](size_t bytes) {
      return ncclext::bench::railSendRecv(ctx.comm, remote, railSend, railRecv, railMost, bytes, st) ? 0 : 1;
    };
    CHECK_CUDA(cudaStreamSynchronize(st));
    NCCLEXT_BENCH_EP(ncclext::harness::barrier(ctx, 60));
    FILE* js = ctx.rank == 0 && !json.empty() ? fopen(json.c_str(), "a") : nullptr;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, ctx.device);
    if (ctx.rank == 0)
      printf("%-6s %-12s %-5s %6s %6s %4s %10s %10s %10s %10s %9s %9s %11s\n", "ranks", "layout", "dtype", "tokens",
             "hidden", "SMs", "dispatch", "combine", "d+c", "graph_d+c", "floor", "ce_copy", "payload_KB");
    for (const Shape& s : shapes) {
      if (rail && !acrossDomainsShape(s)) continue;
      const int T = s.tokens, K = kTopk, H = s.hidden;
      std::mt19937 rng(4321 + ctx.rank * 7 + T);
      std::vector<int> idx((size_t)T * K), pool(kExperts);
      std::iota(pool.begin(), pool.end(), 0);
      int64_t sentRows = 0;
      for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) std::swap(pool[k], pool[k + rng() % (kExperts - k)]);
        uint64_t mask = 0;
        for (int k = 0; k < K; k++) {
          idx[(size_t)t * K + k] = pool[k];
          mask |= 1ull << (pool[k] / L);
        }
        sentRows += __builtin_popcountll(mask);
      }
      CHECK_CUDA(cudaMemcpyAsync(idxBuf, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, st));
      ncclEpTensor_t ti = epTensor(idxBuf, ncclInt32, {T, K});
      ncclEpHandle_t h = nullptr;
      NCCLEXT_BENCH_EP(ncclEpCreateHandle(&h, group, s.layout, &ti, nullptr, nullptr, st));
      const bool rm = s.layout == NCCL_EP_LAYOUT_RANK_MAJOR;
      const int64_t N = rm ? rmRows : emRows;
      ncclEpDispatchInputs_t din = NCCL_EP_DISPATCH_INPUTS_INIT;
      din.tokens = epTensor(x, ncclBfloat16, {T, H});
      din.topk_weights = epTensor(w, ncclFloat32, {T, K});
      ncclEpDispatchOutputs_t dout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
      if (s.fmt == kNvfp4) {
        din.global_scale = epTensor(globalScale, ncclFloat32, {1});
        dout.tokens = epTensor(y, ncclUint8, {N, H / 2});
        dout.scales = epTensor(scales, ncclUint8, {N, H / 16});
      } else {
        dout.tokens = epTensor(y, s.fmt == kFp8 ? ncclFloat8e4m3 : ncclBfloat16, {N, H});
        if (s.fmt == kFp8) dout.scales = epTensor(scales, ncclFloat32, {N, H / 128});
      }
      ncclEpCombineInputs_t cin = NCCL_EP_COMBINE_INPUTS_INIT;
      cin.tokens = epTensor(comb, ncclBfloat16, {N, H});
      if (!rm) cin.topk_weights = epTensor(w, ncclFloat32, {T, K});
      ncclEpCombineOutputs_t cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
      cout.tokens = epTensor(out, ncclBfloat16, {T, H});
      ncclEpDispatchConfig_t dcfg = NCCL_EP_DISPATCH_CONFIG_INIT;
      ncclEpCombineConfig_t ccfg = NCCL_EP_COMBINE_CONFIG_INIT;
      dcfg.num_sms = ccfg.num_sms = sms;
      auto dispatch = [&]() { return (int)ncclEpDispatch(h, &din, &dout, nullptr, &dcfg, st); };
      auto combine = [&]() { return (int)ncclEpCombine(h, &cin, &cout, &ccfg, st); };
      int failed = 0;
      const double dUs = timeCalls(st, dispatch, &failed);
      const double pairUs = timeCalls(st, [&]() { return dispatch() | combine(); }, &failed);
      // combine alone: each timed combine follows an untimed dispatch (combine needs that dispatch's counts)
      std::vector<float> cMs;
      {
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        for (int i = 0; i < gWarm + gIters; i++) {
          failed |= dispatch();
          cudaEventRecord(a, st);
          failed |= combine();
          cudaEventRecord(b, st);
          failed |= cudaEventSynchronize(b) != cudaSuccess;
          float ms = 0;
          cudaEventElapsedTime(&ms, a, b);
          if (i >= gWarm) cMs.push_back(ms);
        }
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      const double cUs = median(cMs) * 1e3;
      // Graph replays: dispatch alone, combine alone (it reuses the last dispatch's counts, kept by the handle) and
      // the pair, each captured once.
      double graphUs[3] = {};
      for (int which = 0; which < 3; which++) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        if (which != 1) failed |= dispatch();
        if (which != 0) failed |= combine();
        CHECK_CUDA(cudaStreamEndCapture(st, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        graphUs[which] = timeCalls(st, [&]() { return (int)cudaGraphLaunch(exec, st); }, &failed);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
      const double gUs = graphUs[2];
      const int share = prop.multiProcessorCount / (virtualDomain ? R : 1);
      const int ctas = sms > 0 ? std::min(sms, share) : std::min(64, share);  // the calls' grid
      const double floorUs = timeCalls(st, [&]() {
        emptyKernel<<<ctas, 512, 0, st>>>();
        return (int)cudaGetLastError();
      }, &failed);
      const size_t rowBytes = s.fmt == kFp8 ? H + H / 128 * 4 : s.fmt == kNvfp4 ? H / 2 + H / 16 : H * 2;
      const size_t payload = (size_t)sentRows * rowBytes;
      const double ceUs = timeCalls(st, [&]() {
        return payload ? (int)cudaMemcpyAsync(copyDst, y, payload, cudaMemcpyDeviceToDevice, st) : 0;
      }, &failed);
      // Across domains: the same bytes over the same transport, dispatch's and this layout's combine's.
      const size_t railD = info.rail_dispatch_bytes, railC = rm ? info.rail_combine_bytes : info.rail_combine_owner_bytes;
      double railDUs = 0, railCUs = 0;
      if (rail) {
        railDUs = timeCalls(st, [&]() { return railBaseline(railD); }, &failed);
        railCUs = timeCalls(st, [&]() { return railBaseline(railC); }, &failed);
      }
      if (ncclEpGroupGetAsyncError(group) != ncclSuccess || failed) {
        fprintf(stderr, "rank %d: a timed call failed: %s\n", ctx.rank, ncclEpGetLastError());
        return 1;
      }
      const char* layout = rm ? "RANK_MAJOR" : "EXPERT_MAJOR";
      if (ctx.rank == 0) {
        printf("%-6d %-12s %-5s %6d %6d %4d %10.1f %10.1f %10.1f %10.1f %9.1f %9.1f %11.1f\n", R, layout,
               s.fmt == kFp8 ? "fp8" : s.fmt == kNvfp4 ? "nvfp4" : "bf16", T, H, ctas, dUs, cUs, pairUs, gUs, floorUs,
               ceUs, payload / 1024.0);
        if (rail)
          printf("       rail: %zu + %zu bytes per remote rank x %zu ranks; NCCL send/recv of them %.1f / %.1f us; "
                 "ratio %.3f / %.3f\n",
                 railD, railC, remote.size(), railDUs, railCUs, railDUs > 0 ? dUs / railDUs : 0,
                 railCUs > 0 ? cUs / railCUs : 0);
        if (js)
          fprintf(js,
                  "{\"bench\": \"ep_ll\", \"pass\": true, \"gpu\": \"%s\", \"mode\": \"%s\", \"ranks\": %d, "
                  "\"layout\": \"%s\", "
                  "\"dispatch_dtype\": \"%s\", \"tokens\": %d, \"hidden\": %d, \"topk\": %d, \"experts\": %d, "
                  "\"sms\": %d, "
                  "\"dispatch_us\": %.2f, \"combine_us\": %.2f, \"dispatch_combine_us\": %.2f, "
                  "\"graph_dispatch_combine_us\": %.2f, \"graph_dispatch_us\": %.2f, \"graph_combine_us\": %.2f, "
                  "\"empty_kernel_us\": %.2f, \"ce_copy_us\": %.2f, \"payload_bytes\": %zu, \"iters\": %d, "
                  "\"domains\": %d, \"rail_dispatch_bytes_per_peer\": %zu, \"rail_combine_bytes_per_peer\": %zu, "
                  "\"rail_peers\": %zu, \"rail_dispatch_us\": %.2f, \"rail_combine_us\": %.2f}\n",
                  prop.name,
                  virtualDomain ? "virtual ranks on one GPU"
                  : ctx.mode == ncclext::harness::OneGpu::kNodes ? "one-GPU nodes" : "real GPUs",
                  R, layout, formatName(s.fmt), T, H, K, kExperts, ctas, dUs, cUs, pairUs, gUs, graphUs[0],
                  graphUs[1], floorUs, ceUs, payload, gIters, info.n_domains, rail ? railD : (size_t)0,
                  rail ? railC : (size_t)0, remote.size(), railDUs, railCUs);
      }
      CHECK_CUDA(cudaStreamSynchronize(st));
      NCCLEXT_BENCH_EP(ncclEpHandleDestroy(h));
    }
    if (js) fclose(js);
    for (void* p : {x, w, idxBuf, y, scales, comb, out, globalScale, copyDst, railSend, railRecv})
      if (p) cudaFreeAsync(p, st);
    CHECK_CUDA(cudaStreamSynchronize(st));
    NCCLEXT_BENCH_EP(ncclEpGroupDestroy(group));
    return 0;
  });
  if (virtualDomain) ncclEpVirtualDomainDestroy(virtualDomain);
  return rc;
}
