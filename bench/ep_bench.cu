// ep_bench: HT dispatch/combine timing on the local GPUs (one process per GPU through tests/harness).
//
// For each shape: random top-k routing without repeats (uniform over experts), a handle bound once (cached
// routing), then for each SM count: 10 warm-up calls and 60 timed calls of dispatch and of combine, each timed
// with its own pair of CUDA events on the call's stream, inputs rotated over 3 buffers; the median is reported,
// back to back (every call enqueued right after the previous one, no host synchronisation until the last) and
// "synced" (all ranks meet in an NCCL all-reduce before each timed call, outside the events, and the host waits
// for each call). Also timed, back to back: ncclEpUpdateHandle + dispatch (routing not cached, an existing handle
// re-bound), median of 20.
//
// Byte conventions (per rank, printed with every row):
//   nvlink_bytes  = rows this rank writes to OTHER ranks x row payload bytes (tokens; fp8: + 4 bytes per 128
//                   columns of scales). What crosses NVLink out of this GPU. Combine: the same count, returning.
//   logical_bytes = rows this rank receives (its own included) x row payload bytes: DeepEP's convention.
//   GB/s = bytes / median time / 1e9.
//
// Same run, per shape: the copy engine moving the dispatch's NVLink bytes from every rank to the next at once
// (cudaMemcpyPeerAsync, ranks synced; ce_same_bytes*), the practical limit at that size.
//
// Across NVLink domains (--one-gpu nodes: every rank a domain of its own, every row over the rail exchange and
// loopback sockets): 512 tokens a rank (the group sized for them: its rail slices are max_tokens_per_rank rows per
// peer), 24 SMs, 3 warm-up and 20 timed calls, no copy-engine row (one GPU); beside each row, in the same run, one
// NCCL group of ncclSend/ncclRecv moving exactly the exchange's bytes to and from every rank of another domain
// (ncclEpGroupGetInfo): rail_bytes_per_peer, rail_us_median, and the ratio of our call to it is issue 12's overhead
// over the transport. Loopback sockets drift by tens of percent between blocks of calls, so the two are also timed
// interleaved (our call, then the baseline, 20 pairs back to back on the rank's stream, each timed by its own
// events): paired_ratio_median is the median of the pairs' ratios, both sides sampled over the same seconds.
// --one-gpu mixed (4+ ranks: one-GPU nodes of 2 virtual ranks, tests/harness/launcher.h): the same shapes over
// relayed exchanges (the group's virtual_rail; with NCCL_EXT_HT_HIERARCHICAL=1 the hierarchical HT), LSA inside each
// domain of 2 and the rail between them; the baseline is NCCL send/recv on that rail of exactly the messages the
// exchange sends, to and from the rank of my index in every other domain: relayed flat, ncclEpGroupGetInfo's
// rail_messages_per_domain and rail_*_domain_bytes (fixed, whatever the routing); hierarchical, the rail rows of the
// EXACT handle timed here (its tokens that hit each domain, a row each, derived from every rank's routing).
// "Synced" meets the ranks on the host. The same baseline serves real ranks whose group relays
// (ncclEpGroupInfo_t::rail_relayed: NCCL_EXT_HT_HIERARCHICAL=1 on domains of several ranks), on a communicator of the
// ranks of my index split here.
//
// Usage: ep_bench [--mode ht|ll] [--nranks N] [--one-gpu off|nodes|mixed] [--json FILE] [--quick] [--max-tokens M]
// --quick: the first shape only (across domains: both of theirs).
// --max-tokens M: the group's max_tokens_per_rank (default: the shapes' most tokens), for calls below the group's
// size: across domains the fixed rail messages (worst-case handles, the update+d column) grow with M, those of the
// EXACT handles timed in the other columns with the routing.
// --mode ll runs the Low-Latency benchmark, ep_ll_bench (beside this binary), with the other arguments.
// A JSON row's "pass": every call of the row returned ncclSuccess (the outputs' values are ep_ht_test's to check).
#include <cuda_bf16.h>
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/device_status.h"
#include "bench/timing.cuh"
#include "nccl_ep.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/launcher.h"
#include "tests/harness/ep_tensor.h"

namespace {

struct Shape {
  int tokens, hidden, topk, experts;
  ncclDataType_t dtype;
  ncclEpLayout_t layout;
  std::vector<int> sms;
};

using ncclext::harness::epTensor;

using ncclext::bench::median;

}  // namespace

// --mode ll: replaces this process with ep_ll_bench from this binary's folder, the other arguments passed on.
int runLowLatency(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      i++;
      continue;
    }
    if (a.rfind("--mode=", 0) == 0) continue;
    args.push_back(argv[i]);
  }
  std::string self = argv[0];
  const size_t slash = self.rfind('/');
  const std::string path = (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "ep_ll_bench";
  args[0] = const_cast<char*>(path.c_str());
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  fprintf(stderr, "ep_bench --mode ll: cannot run %s\n", path.c_str());
  return 1;
}

int main(int argc, char** argv) {
  int nRanks = 0, maxTokensArg = 0;
  bool quick = false;
  std::string json;
  // --mode first: the Low-Latency benchmark takes options of its own.
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const std::string mode = a == "--mode" && i + 1 < argc ? argv[i + 1] : a.rfind("--mode=", 0) == 0 ? a.substr(7) : "";
    if (mode == "ll") return runLowLatency(argc, argv);
    if (!mode.empty() && mode != "ht") {
      fprintf(stderr, "ep_bench: --mode %s: ht or ll\n", mode.c_str());
      return 2;
    }
  }
  static const option kLong[] = {{"nranks", required_argument, nullptr, 'n'}, {"json", required_argument, nullptr, 'j'},
                                 {"quick", no_argument, nullptr, 'q'},        {"mode", required_argument, nullptr, 'm'},
                                 {"one-gpu", required_argument, nullptr, 'g'},
                                 {"max-tokens", required_argument, nullptr, 't'},
                                 {nullptr, 0, nullptr, 0}};
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  for (int c; (c = getopt_long(argc, argv, "", kLong, nullptr)) != -1;) {
    if (c == 'n') nRanks = atoi(optarg);
    else if (c == 'j') json = optarg;
    else if (c == 'q') quick = true;
    else if (c == 't') maxTokensArg = atoi(optarg);
    else if (c == 'g' && ncclext::harness::parseOneGpu(optarg, &oneGpu, /*mixedToo=*/true)) continue;
    else if (c != 'm') return 2;
  }
  if (oneGpu == ncclext::harness::OneGpu::kVirtual) {
    fprintf(stderr, "ep_bench: --one-gpu virtual: not for the High-Throughput benchmark (off, nodes or mixed)\n");
    return 2;
  }
  const bool mixed = oneGpu == ncclext::harness::OneGpu::kMixed;
  // Across domains on one GPU (one-GPU nodes, or mixed): loopback sockets between the domains.
  const bool oneGpuAcross = oneGpu == ncclext::harness::OneGpu::kNodes || mixed;
  std::vector<Shape> shapes = {
      {4096, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {16, 24, 32, 64, 132}},
      {4096, 7168, 8, 256, ncclFloat8e4m3, NCCL_EP_LAYOUT_FLAT, {24, 64, 132}},
      {4096, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, {64, 132}},
      {1024, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {32, 132}},
      {16384, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {64, 132}},
      {4096, 4096, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {64, 132}},
  };
  if (oneGpuAcross)  // over loopback sockets: what the rail moves is sized by max_tokens_per_rank
    shapes = {{512, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {24}},
              {512, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, {24}}};
  if (quick && !oneGpuAcross) shapes.resize(1);
  int shapeTokens = 0;
  for (const Shape& s : shapes) shapeTokens = std::max(shapeTokens, s.tokens);
  if (maxTokensArg != 0 && maxTokensArg < shapeTokens) {
    fprintf(stderr, "ep_bench: --max-tokens %d: the group must hold the shapes' %d tokens a rank\n", maxTokensArg,
            shapeTokens);
    return 2;
  }
  const int warm = oneGpuAcross ? 3 : 10, iters = oneGpuAcross ? 20 : 60, warmSynced = oneGpuAcross ? 3 : 5;
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = nRanks;
  lo.oneGpu = oneGpu;
  // Mixed: the library's in-process domain, made before the launcher forks (each node's process gets its copy).
  ncclEpVirtualDomain_t virt = nullptr;
  if (mixed && ncclEpVirtualDomainCreate(&virt, lo.domainSize) != ncclSuccess) {
    fprintf(stderr, "ncclEpVirtualDomainCreate: %s\n", ncclEpGetLastError());
    return 1;
  }
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    cfg.num_experts = 256;
    cfg.max_tokens_per_rank = maxTokensArg ? maxTokensArg : shapeTokens;
    cfg.max_token_bytes = 7168 * 2;
    cfg.max_topk = 8;
    cfg.num_sms = 132;
    ncclext::harness::setEpTesting(virt, ctx.localRank, ctx.rail);  // mixed: the rail of my index (relayed)
    ncclEpGroup_t group = nullptr;
    NCCLEXT_BENCH_EP(ncclext::harness::createEpGroup(&group, ctx.comm, &cfg));
    ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
    NCCLEXT_BENCH_EP(ncclEpGroupGetInfo(group, &info));
    std::vector<int> remote;  // the ranks of other domains
    for (int r = 0; r < ctx.nRanks; r++)
      if (r / info.domain_size != ctx.rank / info.domain_size) remote.push_back(r);
    // A relayed exchange (mixed, or real ranks with the hierarchical HT): its baseline goes over the ranks of my index
    // (mixed: the harness's rail; real ranks: split from the world here, ranked by domain).
    const bool relayed = info.rail_relayed != 0;
    ncclComm_t railOfIndex = mixed ? ctx.rail : nullptr;
    if (relayed && !mixed) {
      ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
      const ncclResult_t split =
          ncclCommSplit(ctx.comm, ctx.rank % info.domain_size, ctx.rank / info.domain_size, &railOfIndex, &cc);
      if (split != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommSplit (the ranks of my index): %s\n", ctx.rank, ncclGetErrorString(split));
        return 1;
      }
    }
    // The rail baseline's buffers: one slice per remote rank each way (relayed: every other domain's messages).
    const size_t railMost =
        relayed ? std::max({info.rail_dispatch_domain_bytes, info.rail_combine_domain_bytes, (size_t)16})
                : std::max({info.rail_dispatch_bytes, info.rail_combine_bytes, (size_t)16});
    const size_t railSlots = relayed ? (size_t)info.n_domains - 1 : remote.size();
    // What crosses the rail, for the output and the baseline.
    const bool hierarchical = info.rail_hierarchical != 0;
    const char* exchange = remote.empty() ? "none" : !relayed ? "flat" : hierarchical ? "hierarchical" : "relayed";
    void *railSend = nullptr, *railRecv = nullptr;
    if (!remote.empty()) {
      cudaMalloc(&railSend, railMost * railSlots);
      cudaMalloc(&railRecv, railMost * railSlots);
    }
    int dev = 0, smCount = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&smCount, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    FILE* out = ctx.rank == 0 && !json.empty() ? fopen(json.c_str(), "a") : nullptr;
    if (ctx.rank == 0)
      printf("%-6s %-5s %-12s %6s %5s %4s %9s %9s %9s %10s %10s %12s\n", "op", "dtype", "layout", "tokens", "hidden",
             "SMs", "median_us", "synced_us", "update+d", "NVLink", "logical", "NVLink_MB");
    for (const Shape& s : shapes) {
      const int T = s.tokens, H = s.hidden, K = s.topk, E = s.experts, R = ctx.nRanks;
      const bool fp8 = s.dtype == ncclFloat8e4m3;
      const size_t esz = fp8 ? 1 : 2;
      const size_t payload = H * esz + (fp8 ? H / 128 * 4 : 0);
      // Routing: top-k distinct experts per token, uniform, seeded by the rank (so that every rank can derive every
      // rank's); toRank[r] / fromRank[r]: my tokens that go to rank r, rank r's that come to me; toDomain[d] /
      // fromDomain[d]: my tokens that hit a rank of domain d, and the tokens of domain d's rank of my index that hit
      // my domain (the hierarchical HT's rail rows of an EXACT handle, out and in).
      const int G = info.domain_size, myDomain = ctx.rank / G, myIndex = ctx.rank % G, nDomains = R / G;
      auto routingOf = [&](int rank, std::vector<int>* idx, std::vector<int64_t>* toRank,
                           std::vector<int64_t>* toDomain) {
        std::mt19937 rng(1234 + rank);
        std::vector<int> pool(E);
        std::iota(pool.begin(), pool.end(), 0);
        idx->assign((size_t)T * K, 0);
        toRank->assign(R, 0);
        toDomain->assign(nDomains, 0);
        for (int t = 0; t < T; t++) {
          for (int k = 0; k < K; k++) std::swap(pool[k], pool[k + rng() % (E - k)]);
          uint64_t mask = 0;
          for (int k = 0; k < K; k++) {
            (*idx)[(size_t)t * K + k] = pool[k];
            mask |= 1ull << (pool[k] / (E / R));
          }
          for (int r = 0; r < R; r++) (*toRank)[r] += mask >> r & 1;
          const uint64_t domainBits = G >= 64 ? ~0ull : (1ull << G) - 1;
          for (int d = 0; d < nDomains; d++) (*toDomain)[d] += (mask >> (d * G) & domainBits) != 0;
        }
      };
      std::vector<int> idx, other;
      std::vector<int64_t> toRank, fromRank(R, 0), theirs, toDomain, fromDomain(nDomains, 0);
      std::vector<std::vector<int64_t>> domainsOf(R);  // every rank's toDomain
      routingOf(ctx.rank, &idx, &toRank, &toDomain);
      for (int r = 0; r < R && !remote.empty(); r++) {
        routingOf(r, &other, &theirs, &domainsOf[r]);
        fromRank[r] = theirs[ctx.rank];
        if (r % G == myIndex) fromDomain[r / G] = domainsOf[r][myDomain];
      }
      // The hierarchical HT's rounds: every rank of my domain takes those of the most rail rows any of them sends
      // to or receives from one domain (rail/view.h railRoundsOf).
      int64_t domainMostRail = 0;
      for (int p = myDomain * G; p < (myDomain + 1) * G && !remote.empty(); p++)
        for (int d = 0; d < nDomains; d++)
          if (d != myDomain)
            domainMostRail = std::max({domainMostRail, domainsOf[p][d], domainsOf[d * G + p % G][myDomain]});
      int64_t sentRows = 0, logicalRows = 0;
      for (int r = 0; r < R; r++)
        if (r != ctx.rank) sentRows += toRank[r];
      int *dIdx = nullptr, *dTotal = nullptr;
      cudaMalloc(&dIdx, idx.size() * 4);
      cudaMalloc(&dTotal, 4);
      // On the rank's stream and waited for: a plain cudaMemcpy from pageable memory may return before its DMA is
      // done, and the legacy stream it runs on does not order the rank's non-blocking stream after it.
      cudaMemcpyAsync(dIdx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, ctx.stream);
      cudaStreamSynchronize(ctx.stream);
      ncclEpTensor_t ti = epTensor(dIdx, ncclInt32, {T, K});
      ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
      hc.sizing = NCCL_EP_SIZING_EXACT;
      ncclEpHandle_t h = nullptr;
      NCCLEXT_BENCH_EP(ncclEpCreateHandle(&h, group, s.layout, &ti, nullptr, &hc, ctx.stream));
      int64_t rows = 0, flatRows = 0;
      NCCLEXT_BENCH_EP(ncclEpHandleGetRecvRows(h, &rows));
      if (s.layout == NCCL_EP_LAYOUT_FLAT) {
        flatRows = rows;
      } else {  // FLAT count of the same routing, for the byte conventions
        ncclEpHandle_t hf = nullptr;
        NCCLEXT_BENCH_EP(ncclEpCreateHandle(&hf, group, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, &hc, ctx.stream));
        ncclEpHandleGetRecvRows(hf, &flatRows);
        ncclEpHandleDestroy(hf);
      }
      logicalRows = flatRows;
      // Buffers: 3 rotating input sets; outputs.
      const int kSets = 3;
      std::vector<void*> xs(kSets), ws(kSets), ss(kSets), cins(kSets);
      const size_t nScales = fp8 ? H / 128 : 0;
      for (int i = 0; i < kSets; i++) {
        cudaMalloc(&xs[i], (size_t)T * H * esz);
        cudaMalloc(&ws[i], (size_t)T * K * 4);
        cudaMalloc(&ss[i], (size_t)T * std::max<size_t>(nScales, 1) * 4);
        cudaMalloc(&cins[i], (size_t)std::max<int64_t>(rows, 1) * H * 2);
        cudaMemset(xs[i], 0x11 * (i + 1), (size_t)T * H * esz);
        cudaMemset(ws[i], 0, (size_t)T * K * 4);
        cudaMemset(ss[i], 0, (size_t)T * std::max<size_t>(nScales, 1) * 4);
        cudaMemset(cins[i], 0x01 * (i + 1), (size_t)std::max<int64_t>(rows, 1) * H * 2);
      }
      cudaDeviceSynchronize();  // the fills (on the legacy stream) before the rank's stream reads them
      void *y = nullptr, *yw = nullptr, *ys = nullptr, *cout = nullptr;
      const bool flat = s.layout == NCCL_EP_LAYOUT_FLAT;
      int64_t maxRows = 0;  // a worst-case output, for the handle-creation timing
      NCCLEXT_BENCH_EP(ncclEpHandleGetMaxRecvRows(h, &maxRows));
      cudaMalloc(&y, (size_t)std::max<int64_t>(maxRows, 1) * H * esz);
      cudaMalloc(&yw, (size_t)std::max<int64_t>(maxRows, 1) * K * 4);
      cudaMalloc(&ys, (size_t)std::max<int64_t>(maxRows, 1) * std::max<size_t>(nScales, 1) * 4);
      cudaMalloc(&cout, (size_t)T * H * 2);
      auto dispatchArgs = [&](int i, ncclEpDispatchInputs_t* in, ncclEpDispatchOutputs_t* o, int64_t rows) {
        *in = NCCL_EP_DISPATCH_INPUTS_INIT;
        in->tokens = epTensor(xs[i], s.dtype, {T, H});
        in->topk_weights = epTensor(ws[i], ncclFloat32, {T, K});
        if (fp8) in->scales = epTensor(ss[i], ncclFloat32, {T, (int64_t)nScales});
        *o = NCCL_EP_DISPATCH_OUTPUTS_INIT;
        o->tokens = epTensor(y, s.dtype, {rows, H});
        o->topk_weights = flat ? epTensor(yw, ncclFloat32, {rows, K}) : epTensor(yw, ncclFloat32, {rows});
        if (fp8) o->scales = epTensor(ys, ncclFloat32, {rows, (int64_t)nScales});
      };
      // Back to back: every call enqueued after the previous one with no host synchronisation in between, each
      // timed by its own pair of events (DeepEP's method), one wait at the end. `synced`: all ranks meet in an NCCL
      // all-reduce before each timed call (outside the events) and the host waits after each call, so a call is
      // neither overlapped with nor charged for a peer's previous call.
      const int kMaxIters = 80;
      std::vector<cudaEvent_t> e0(kMaxIters), e1(kMaxIters), e2(kMaxIters);
      for (int i = 0; i < kMaxIters; i++) {
        cudaEventCreate(&e0[i]);
        cudaEventCreate(&e1[i]);
        cudaEventCreate(&e2[i]);
      }
      float* barrierWord = nullptr;
      cudaMalloc(&barrierWord, sizeof(float));
      auto timeIt = [&](auto&& call, int warm, int iters, std::vector<float>* ts, bool synced = false) -> int {
        if (warm + iters > kMaxIters) return 1;
        for (int i = 0; i < warm + iters; i++) {
          // Mixed: ctx.comm is the rank's own (virtual ranks): the ranks meet on the host, the stream idle.
          if (synced && mixed && ncclext::harness::barrier(ctx, 60) != ncclSuccess) return 1;
          if (synced && !mixed &&
              ncclAllReduce(barrierWord, barrierWord, 1, ncclFloat32, ncclSum, ctx.comm, ctx.stream) != ncclSuccess)
            return 1;
          cudaEventRecord(e0[i], ctx.stream);
          if (call(i) != ncclSuccess) return 1;
          cudaEventRecord(e1[i], ctx.stream);
          if (synced && ncclext::waitStream(ctx.stream, 120, "bench") != ncclSuccess) return 1;
        }
        if (ncclext::waitStream(ctx.stream, 120, "bench") != ncclSuccess) return 1;
        for (int i = warm; i < warm + iters; i++) {
          float ms = 0;
          cudaEventElapsedTime(&ms, e0[i], e1[i]);
          ts->push_back(ms * 1000.f);
        }
        return 0;
      };
      // Interleaved: call a then call b, `iters` pairs back to back after `warm`, each timed by its own events (a from
      // e0 to e1, b from e1 to e2): both sampled over the same seconds, whatever the transport's drift.
      using Call = std::function<ncclResult_t(int)>;
      auto timePairs = [&](const Call& a, const Call& b, int warm, int iters, std::vector<float>* ta,
                           std::vector<float>* tb) -> int {
        if (warm + iters > kMaxIters) return 1;
        for (int i = 0; i < warm + iters; i++) {
          cudaEventRecord(e0[i], ctx.stream);
          if (a(i) != ncclSuccess) return 1;
          cudaEventRecord(e1[i], ctx.stream);
          if (b(i) != ncclSuccess) return 1;
          cudaEventRecord(e2[i], ctx.stream);
        }
        if (ncclext::waitStream(ctx.stream, 120, "bench") != ncclSuccess) return 1;
        for (int i = warm; i < warm + iters; i++) {
          float ms = 0;
          cudaEventElapsedTime(&ms, e0[i], e1[i]);
          ta->push_back(ms * 1000.f);
          cudaEventElapsedTime(&ms, e1[i], e2[i]);
          tb->push_back(ms * 1000.f);
        }
        return 0;
      };
      // Routing not cached: ncclEpUpdateHandle (new routing bound to an existing handle, worst-case sizing, no
      // host synchronisation) + dispatch, as a training step that re-routes every iteration does.
      std::vector<float> tHandle;
      ncclEpHandleConfig_t worst = NCCL_EP_HANDLE_CONFIG_INIT;
      ncclEpHandle_t hw = nullptr;
      NCCLEXT_BENCH_EP(ncclEpCreateHandle(&hw, group, s.layout, &ti, nullptr, &worst, ctx.stream));
      if (timeIt([&](int i) {
            ncclResult_t r = ncclEpUpdateHandle(hw, &ti, nullptr, ctx.stream);
            if (r != ncclSuccess) return r;
            ncclEpDispatchInputs_t in;
            ncclEpDispatchOutputs_t o;
            dispatchArgs(i % kSets, &in, &o, maxRows);
            return ncclEpDispatch(hw, &in, &o, nullptr, nullptr, ctx.stream);
          }, 3, 20, &tHandle))
        return 1;
      // Across domains: NCCL send/recv of exactly what the exchange of an EXACT handle moves (the rows the routing
      // fills, a message per region: dispatch rows and metadata, combine flags and rows), same communicator.
      double railUs[2] = {0, 0};
      size_t railSent[2] = {0, 0};
      Call railCall[2];  // the baselines, timed alone here and interleaved with our calls below
      const size_t rowStride = cfg.max_token_bytes;
      const size_t metaBytes = info.rail_dispatch_bytes / cfg.max_tokens_per_rank - rowStride;
      // The rounds (rail_round_tokens rows a peer, ncclEpGroupConfig_t; hierarchical: rail rows a domain): the
      // baseline moves the same rows in the same rounds, one NCCL group each, as ours does (the kernels between them
      // aside).
      const int64_t roundRows = info.rail_round_tokens > 0 ? info.rail_round_tokens : cfg.max_tokens_per_rank;
      auto roundsOf = [&](int64_t most) { return (int)std::max<int64_t>(1, (most + roundRows - 1) / roundRows); };
      auto roundsFor = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int>& of) {
        int64_t most = 0;
        for (const int i : of) most = std::max({most, a[i], b[i]});
        return roundsOf(most);
      };
      std::vector<int> otherDomains;
      for (int d = 0; d < info.n_domains; d++)
        if (d != myDomain) otherDomains.push_back(d);
      for (int op = 0; op < 2 && relayed && !remote.empty(); op++) {
        // Relayed: the exchange's own messages on the rail of my index, to and from the rank of my index (rail rank
        // d) in every other domain d: relayed flat, fixed (one round); hierarchical, as the EXACT handle timed here
        // sends them: its rail rows to d (dispatch; combine: the partials back for the rows it relays), from d the
        // other way, in rounds, no message where there are none.
        const int nMsg = hierarchical ? 1 : std::max(info.rail_messages_per_domain, 1);
        const size_t domainBytes = op == 0 ? info.rail_dispatch_domain_bytes : info.rail_combine_domain_bytes;
        const size_t msgBytes = domainBytes / nMsg, hierRow = domainBytes / (size_t)cfg.max_tokens_per_rank;
        const int rounds = hierarchical ? roundsOf(domainMostRail) : 1;
        auto bytesOf = [=](int d, bool out, int k) {
          if (!hierarchical) return msgBytes;
          const int64_t rows = (op == 0) == out ? toDomain[d] : fromDomain[d];
          return (size_t)std::max<int64_t>(0, std::min(rows - k * roundRows, roundRows)) * hierRow;
        };
        railCall[op] = [=, &ctx](int) {
          bool ok = true;
          for (int k = 0; k < rounds; k++) {
            ok = ok && ncclGroupStart() == ncclSuccess;
            for (size_t i = 0; i < otherDomains.size(); i++) {
              const int d = otherDomains[i];
              const size_t at = i * railMost + (size_t)k * roundRows * hierRow;
              char* send = static_cast<char*>(railSend) + at;
              char* recv = static_cast<char*>(railRecv) + at;
              const size_t out = bytesOf(d, true, k), in = bytesOf(d, false, k);
              for (int m = 0; m < nMsg; m++) {
                if (out > 0)
                  ok = ok && ncclSend(send + m * out, out, ncclUint8, d, railOfIndex, ctx.stream) == ncclSuccess;
                if (in > 0)
                  ok = ok && ncclRecv(recv + m * in, in, ncclUint8, d, railOfIndex, ctx.stream) == ncclSuccess;
              }
            }
            ok = ncclGroupEnd() == ncclSuccess && ok;
          }
          return ok ? ncclSuccess : ncclSystemError;
        };
        railSent[op] = 0;
        for (const int d : otherDomains)
          for (int k = 0; k < rounds; k++) railSent[op] += nMsg * bytesOf(d, true, k);
        std::vector<float> tr;
        if (timeIt(railCall[op], warm, iters, &tr)) return 1;
        railUs[op] = median(tr);
      }
      // The flat exchange's rounds.
      const int rounds = roundsFor(toRank, fromRank, remote);
      for (int op = 0; op < 2 && !relayed && !remote.empty(); op++) {
        const size_t per[2] = {op == 0 ? rowStride : 8, op == 0 ? metaBytes : rowStride};  // a slot of each region
        const size_t maxTokens = (size_t)cfg.max_tokens_per_rank;
        railCall[op] = [=, &ctx](int) {
          bool ok = true;
          for (int k = 0; k < rounds; k++) {
            const int64_t lo = k * roundRows;
            auto inRound = [&](int64_t rows) { return std::max<int64_t>(0, std::min(rows - lo, roundRows)); };
            ok = ok && ncclGroupStart() == ncclSuccess;
            for (size_t i = 0; i < remote.size(); i++) {
              const int r = remote[i];
              const int64_t out = inRound(op == 0 ? toRank[r] : fromRank[r]);
              const int64_t in = inRound(op == 0 ? fromRank[r] : toRank[r]);
              size_t at = 0;
              for (const size_t b : per) {
                char* send = static_cast<char*>(railSend) + i * railMost + at + lo * b;
                char* recv = static_cast<char*>(railRecv) + i * railMost + at + lo * b;
                if (out > 0) ok = ok && ncclSend(send, out * b, ncclUint8, r, ctx.comm, ctx.stream) == ncclSuccess;
                if (in > 0) ok = ok && ncclRecv(recv, in * b, ncclUint8, r, ctx.comm, ctx.stream) == ncclSuccess;
                at += maxTokens * b;
              }
            }
            ok = ncclGroupEnd() == ncclSuccess && ok;
          }
          return ok ? ncclSuccess : ncclSystemError;
        };
        for (const int r : remote) railSent[op] += (size_t)(op == 0 ? toRank[r] : fromRank[r]) * (per[0] + per[1]);
        std::vector<float> tr;
        if (timeIt(railCall[op], warm, iters, &tr)) return 1;
        railUs[op] = median(tr);
      }
      ncclEpHandleDestroy(hw);
      // The practical limit at this size: the copy engine moving the same NVLink bytes (dispatch payload) from every
      // rank to the next at once, ranks synced before each copy. 0 with one rank.
      double ceUs = 0;
      const size_t ceBytes = (size_t)sentRows * payload;
      if (R > 1 && ceBytes > 0 && !oneGpuAcross) {  // one-GPU nodes share one GPU: no peer to copy to
        const int peer = (ctx.device + 1) % R;
        void *ceSrc = nullptr, *ceDst = nullptr;
        cudaMalloc(&ceSrc, ceBytes);
        cudaSetDevice(peer);
        cudaMalloc(&ceDst, ceBytes);
        cudaSetDevice(ctx.device);
        if (cudaDeviceEnablePeerAccess(peer, 0) != cudaSuccess) cudaGetLastError();  // already enabled is fine
        std::vector<float> tce;
        if (timeIt([&](int) {
              return cudaMemcpyPeerAsync(ceDst, peer, ceSrc, ctx.device, ceBytes, ctx.stream) == cudaSuccess
                         ? ncclSuccess
                         : ncclUnhandledCudaError;
            }, 5, 40, &tce, true))
          return 1;
        ceUs = median(tce);
        cudaFree(ceSrc);
        cudaFree(ceDst);
        if (ctx.rank == 0)
          printf("copy engine, the same %.1f MB from every rank to the next at once: %.1f us (%.1f GB/s per rank)\n",
                 ceBytes / 1e6, ceUs, ceBytes / ceUs / 1e3);
      }
      for (int sms : s.sms) {
        if (sms > smCount) sms = smCount;
        ncclEpDispatchConfig_t dc = NCCL_EP_DISPATCH_CONFIG_INIT;
        dc.num_sms = sms;
        ncclEpCombineConfig_t cc = NCCL_EP_COMBINE_CONFIG_INIT;
        cc.num_sms = sms;
        std::vector<float> td, tc, tds, tcs;
        auto dispatchCall = [&](int i) {
          ncclEpDispatchInputs_t in;
          ncclEpDispatchOutputs_t o;
          dispatchArgs(i % kSets, &in, &o, rows);
          return ncclEpDispatch(h, &in, &o, nullptr, &dc, ctx.stream);
        };
        auto combineCall = [&](int i) {
          ncclEpCombineInputs_t in = NCCL_EP_COMBINE_INPUTS_INIT;
          in.tokens = epTensor(cins[i % kSets], ncclBfloat16, {rows, H});
          ncclEpCombineOutputs_t o = NCCL_EP_COMBINE_OUTPUTS_INIT;
          o.tokens = epTensor(cout, ncclBfloat16, {T, H});
          return ncclEpCombine(h, &in, &o, &cc, ctx.stream);
        };
        if (timeIt(dispatchCall, warm, iters, &td) || timeIt(dispatchCall, warmSynced, iters, &tds, true)) return 1;
        if (!fp8 && (timeIt(combineCall, warm, iters, &tc) || timeIt(combineCall, warmSynced, iters, &tcs, true)))
          return 1;
        // Across domains: each call interleaved with its baseline (timePairs), the pairs' ratios' median.
        double pairedUs[2] = {0, 0}, pairedRailUs[2] = {0, 0}, pairedRatio[2] = {0, 0};
        for (int op = 0; op < (fp8 ? 1 : 2); op++) {
          if (!railCall[op]) continue;
          std::vector<float> ours, theirs, ratios;
          if (timePairs(op == 0 ? Call(dispatchCall) : Call(combineCall), railCall[op], warm, iters, &ours, &theirs))
            return 1;
          for (size_t i = 0; i < ours.size(); i++) ratios.push_back(theirs[i] > 0 ? ours[i] / theirs[i] : 0.f);
          pairedUs[op] = median(ours);
          pairedRailUs[op] = median(theirs);
          pairedRatio[op] = median(ratios);
        }
        const char* dn = fp8 ? "fp8" : "bf16";
        const char* ln = flat ? "flat" : "expert_major";
        for (int op = 0; op < (fp8 ? 1 : 2); op++) {
          const double us = median(op == 0 ? td : tc), usSynced = median(op == 0 ? tds : tcs);
          // Byte conventions: see the file comment. Combine moves bf16 rows back.
          const double rowB = op == 0 ? (double)payload : (double)H * 2;
          const double nvB = sentRows * rowB, logB = logicalRows * rowB;
          if (ctx.rank == 0) {
            printf("%-6s %-5s %-12s %6d %5d %4d %9.1f %9.1f %9.1f %7.1f GB/s %7.1f GB/s %9.1f\n", op ? "comb" : "disp", dn,
                   ln, T, H, sms, us, usSynced, op == 0 ? median(tHandle) : 0.0, nvB / us / 1e3, logB / us / 1e3,
                   nvB / 1e6);
            if (!remote.empty() && relayed)
              printf("       rail: %zu bytes sent to %zu domains (%d messages each, %s); NCCL send/recv of them "
                     "%.1f us; ours / that %.2f\n",
                     railSent[op], railSlots, info.rail_messages_per_domain, exchange, railUs[op],
                     railUs[op] > 0 ? us / railUs[op] : 0.0);
            else if (!remote.empty())
              printf("       rail: %zu bytes sent to %zu ranks (at most %zu each); NCCL send/recv of them %.1f us; "
                     "ours / that %.2f\n",
                     railSent[op], remote.size(), op == 0 ? info.rail_dispatch_bytes : info.rail_combine_bytes,
                     railUs[op], railUs[op] > 0 ? us / railUs[op] : 0.0);
            if (railCall[op])
              printf("       interleaved, %d pairs: ours %.1f us, NCCL %.1f us; median of the pairs' ratios %.2f\n",
                     iters, pairedUs[op], pairedRailUs[op], pairedRatio[op]);
            if (out)
              fprintf(out,
                      "{\"what\": \"ep_%s\", \"pass\": true, \"dtype\": \"%s\", \"layout\": \"%s\", \"tokens\": %d, "
                      "\"hidden\": %d, "
                      "\"topk\": %d, \"experts\": %d, \"nranks\": %d, \"sms\": %d, \"us_median\": %.2f, "
                      "\"us_median_synced\": %.2f, "
                      "\"update_handle_plus_dispatch_us_median\": %.2f, \"nvlink_bytes\": %.0f, \"nvlink_GBps\": %.2f, "
                      "\"logical_bytes\": %.0f, \"logical_GBps\": %.2f, \"ce_same_bytes\": %zu, "
                      "\"ce_same_bytes_us_median\": %.2f, \"iters\": %d, \"gpu\": \"%s\", \"mode\": \"%s\", "
                      "\"domains\": %d, \"max_tokens_per_rank\": %d, \"rail_peers\": %zu, \"rail_bytes_sent\": %zu, "
                      "\"rail_fixed_bytes_per_peer\": %zu, \"rail_fixed_bytes_per_domain\": %zu, "
                      "\"rail_us_median\": %.2f, \"paired_us_median\": %.2f, \"paired_rail_us_median\": %.2f, "
                      "\"paired_ratio_median\": %.3f, "
                      "\"rail_messages_per_domain\": %d, \"rail_staging_bytes\": %zu, \"window_bytes\": %zu, "
                      "\"rail_round_tokens\": %d, \"rail_overlapped\": %d, "
                      "\"exchange\": \"%s\", "
                      "\"byte_convention\": \"nvlink = rows sent to other ranks x payload; logical = rows received "
                      "incl. local x payload; rail_bytes_sent = rows to other domains' ranks x (row stride + "
                      "metadata); relayed: the exchange's messages to every other domain (flat: fixed; "
                      "hierarchical: its rail rows, the EXACT handle's)\"}\n",
                      op ? "combine" : "dispatch", dn, ln, T, H, K, E, R, sms, us, usSynced,
                      op == 0 ? median(tHandle) : 0.0, nvB,
                      nvB / us / 1e3, logB, logB / us / 1e3, ceBytes, ceUs, iters, prop.name,
                      ncclext::harness::oneGpuName(ctx.mode), info.n_domains, cfg.max_tokens_per_rank, remote.size(),
                      railSent[op],
                      op == 0 ? info.rail_dispatch_bytes : info.rail_combine_bytes,
                      op == 0 ? info.rail_dispatch_domain_bytes : info.rail_combine_domain_bytes, railUs[op],
                      pairedUs[op], pairedRailUs[op], pairedRatio[op], info.rail_messages_per_domain,
                      info.rail_staging_bytes, info.window_bytes,
                      info.rail_round_tokens, info.rail_overlapped, exchange);
          }
        }
      }
      cudaFree(barrierWord);
      for (int i = 0; i < kMaxIters; i++) {
        cudaEventDestroy(e0[i]);
        cudaEventDestroy(e1[i]);
        cudaEventDestroy(e2[i]);
      }
      for (int i = 0; i < kSets; i++) {
        cudaFree(xs[i]);
        cudaFree(ws[i]);
        cudaFree(ss[i]);
        cudaFree(cins[i]);
      }
      cudaFree(y);
      cudaFree(yw);
      cudaFree(ys);
      cudaFree(cout);
      cudaFree(dIdx);
      cudaFree(dTotal);
      ncclEpHandleDestroy(h);
    }
    if (out) fclose(out);
    cudaFree(railSend);
    cudaFree(railRecv);
    if (railOfIndex && railOfIndex != ctx.rail) ncclCommDestroy(railOfIndex);
    NCCLEXT_BENCH_EP(ncclEpGroupGetAsyncError(group));
    ncclEpGroupDestroy(group);
    return 0;
  });
  if (virt) ncclEpVirtualDomainDestroy(virt);
  return rc;
}
