// ep_bench: HT dispatch/combine timing on the local GPUs (one process per GPU through tests/harness).
//
// For each shape: random top-k routing without repeats (uniform over experts), a handle bound once (cached
// routing), then for each SM count: 10 warm-up calls and 60 timed calls of dispatch and of combine, each timed
// with its own pair of CUDA events on the call's stream, inputs rotated over 3 buffers; the median is reported,
// back to back (every call enqueued right after the previous one, no host synchronisation until the last) and
// "synced" (all ranks meet in an NCCL all-reduce before each timed call, outside the events, and the host waits
// for each call). Also timed, back to back: ncclEpUpdateHandle + dispatch (routing not cached, an existing handle
// re-bound) and ncclEpUpdateHandle alone, medians of 20, at the group's default SMs (JSON
// update_handle_plus_dispatch_us_median, update_handle_us_median: on the dispatch rows).
//
// Byte conventions (per rank, printed with every row):
//   nvlink_bytes  = rows this rank writes to OTHER ranks x row payload bytes (tokens; fp8: + 4 bytes per 128
//                   columns of scales; nvfp4, packed two columns a byte as uint8: H / 2 + one e4m3 scale byte per 16
//                   columns, forwarded as int32 words). What crosses NVLink out of this GPU. Combine: the same count, returning.
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
// --one-gpu virtual: N virtual ranks of one NVLink domain on the GPU (LSA between them, the shapes above); the
// copy-engine row then copies the same bytes on the GPU, every rank at once.
//
// Usage: ep_bench [--mode ht|ll] [--nranks N] [--one-gpu off|nodes|virtual|mixed] [--json FILE] [--quick]
//                 [--max-tokens M]
//                 [--recv-cap C [--zero-copy]]
// --quick: the first shape only (across domains: both of theirs).
// --recv-cap C: the group's max_recv_rows_per_rank (rows past it dropped; across domains, the flat exchange's per-peer
// inboxes and their scatter): the dense staging's speed beside the default's (the JSON's recv_cap and window_bytes).
// --zero-copy: FLAT shapes whose rows are the window's (max_token_bytes) dispatch into ncclEpGroupGetDispatchWindow's
// tensor (the JSON's zero_copy).
// --max-tokens M: the group's max_tokens_per_rank (default: the shapes' most tokens), for calls below the group's
// size: across domains the fixed rail messages (worst-case handles, the update+d column) grow with M, those of the
// EXACT handles timed in the other columns with the routing.
// --mode ll runs the Low-Latency benchmark, ep_ll_bench (beside this binary), with the other arguments.
// A JSON row's "pass": every call of the row returned ncclSuccess (the outputs' values are ep_ht_test's to check).
#include <cuda_bf16.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/timing.cuh"
#include "common/device_status.h"
#include "nccl_ep.h"
#include "tests/harness/cli.h"
#include "tests/harness/ep_tensor.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/launcher.h"

namespace {

using ncclext::bench::median;
using ncclext::harness::epTensor;
using ncclext::harness::OneGpu;
using ncclext::harness::RankContext;
using Call = std::function<ncclResult_t(int)>;

struct Shape {
  int tokens, hidden, topk, experts;
  ncclDataType_t dtype;
  ncclEpLayout_t layout;
  std::vector<int> sms;
};

struct Options {
  int nRanks = 0, maxTokens = 0;  // maxTokens 0: the shapes' most
  int recvCap = 0;                // --recv-cap: the group's max_recv_rows_per_rank (DROP); 0: none
  bool zeroCopy = false;          // --zero-copy (with --recv-cap): FLAT rows of the window's size land in place
  bool quick = false;
  std::string json;
  OneGpu oneGpu = OneGpu::kOff;
  bool mixed() const { return oneGpu == OneGpu::kMixed; }
  // Ranks that share a process (virtual ranks, alone or in mixed nodes): they meet on the host.
  bool virtualRanks() const { return oneGpu == OneGpu::kVirtual || mixed(); }
  // Across domains on one GPU (one-GPU nodes, or mixed): loopback sockets between the domains.
  bool acrossOnOneGpu() const { return oneGpu == OneGpu::kNodes || mixed(); }
};

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

// The High-Throughput options (--mode ll went to ep_ll_bench before).
bool parseOptions(int argc, char** argv, Options* o) {
  ncclext::harness::Cli cli(argv[0]);
  cli.custom("mode", "ht|ll", [](const char* s) { return std::string(s) == "ht"; });
  cli.option("nranks", &o->nRanks);
  cli.oneGpu(&o->oneGpu, /*mixedToo=*/true);
  cli.option("max-tokens", &o->maxTokens);
  cli.option("recv-cap", &o->recvCap);
  cli.flag("zero-copy", &o->zeroCopy);
  cli.flag("quick", &o->quick);
  cli.option("json", &o->json);
  return cli.parse(argc, argv) && cli.require(o->recvCap >= 0, "--recv-cap must be >= 0") &&
         cli.require(!o->zeroCopy || o->recvCap > 0, "--zero-copy needs --recv-cap (its window's rows are FLAT)");
}

std::vector<Shape> shapesFor(const Options& o) {
  if (o.acrossOnOneGpu())  // over loopback sockets: what the rail moves is sized by max_tokens_per_rank
    return {{512, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {24}},
            {512, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, {24}}};
  std::vector<Shape> shapes = {
      {4096, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {16, 24, 32, 64, 132}},
      {4096, 7168, 8, 256, ncclFloat8e4m3, NCCL_EP_LAYOUT_FLAT, {24, 64, 132}},
      {4096, 7168, 8, 256, ncclUint8, NCCL_EP_LAYOUT_FLAT, {24, 64, 132}},  // nvfp4: packed rows, block scales
      {4096, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_EXPERT_MAJOR, {64, 132}},
      {1024, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {32, 132}},
      {16384, 7168, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {64, 132}},
      {4096, 4096, 8, 256, ncclBfloat16, NCCL_EP_LAYOUT_FLAT, {64, 132}},
  };
  if (o.quick) shapes.resize(1);
  return shapes;
}

// How many calls each row times.
struct Counts {
  int warm, iters, warmSynced;
  explicit Counts(const Options& o)
      : warm(o.acrossOnOneGpu() ? 3 : 10),
        iters(o.acrossOnOneGpu() ? 20 : 60),
        warmSynced(o.acrossOnOneGpu() ? 3 : 5) {}
};

// A rank's group and what its rail baseline needs (the ranks of other domains, the communicator and buffers).
struct RankSetup {
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  ncclEpGroup_t group = nullptr;
  ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
  std::vector<int> remote;  // the ranks of other domains
  bool relayed = false, hierarchical = false;
  const char* exchange = "none";
  ncclComm_t railOfIndex = nullptr;  // a relayed exchange's baseline: the ranks of my index
  size_t railMost = 0, railSlots = 0;
  void *railSend = nullptr, *railRecv = nullptr;
  int smCount = 0;
  cudaDeviceProp prop;
};

int setUpRank(RankContext& ctx, const Options& o, int maxTokens, ncclEpVirtualDomain_t virt, RankSetup* r) {
  r->cfg.num_experts = 256;
  r->cfg.max_tokens_per_rank = maxTokens;
  r->cfg.max_token_bytes = 7168 * 2;
  r->cfg.max_topk = 8;
  r->cfg.num_sms = 132;
  r->cfg.max_recv_rows_per_rank = o.recvCap;
  r->cfg.recv_overflow = NCCL_EP_RECV_OVERFLOW_DROP;
  ncclext::harness::setEpTesting(virt, ctx.localRank, ctx.rail);  // mixed: the rail of my index (relayed)
  NCCLEXT_BENCH_EP(ncclext::harness::createEpGroup(&r->group, ctx.comm, &r->cfg));
  NCCLEXT_BENCH_EP(ncclEpGroupGetInfo(r->group, &r->info));
  const ncclEpGroupInfo_t& info = r->info;
  for (int p = 0; p < ctx.nRanks; p++)
    if (p / info.domain_size != ctx.rank / info.domain_size) r->remote.push_back(p);
  // A relayed exchange (mixed, or real ranks with the hierarchical HT): its baseline goes over the ranks of my index
  // (mixed: the harness's rail; real ranks: split from the world here, ranked by domain).
  r->relayed = info.rail_relayed != 0;
  r->railOfIndex = o.mixed() ? ctx.rail : nullptr;
  if (r->relayed && !o.mixed()) {
    ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
    const ncclResult_t split =
        ncclCommSplit(ctx.comm, ctx.rank % info.domain_size, ctx.rank / info.domain_size, &r->railOfIndex, &cc);
    if (split != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclCommSplit (the ranks of my index): %s\n", ctx.rank, ncclGetErrorString(split));
      return 1;
    }
  }
  // The rail baseline's buffers: one slice per remote rank each way (relayed: every other domain's messages).
  r->railMost = r->relayed ? std::max({info.rail_dispatch_domain_bytes, info.rail_combine_domain_bytes, (size_t)16})
                           : std::max({info.rail_dispatch_bytes, info.rail_combine_bytes, (size_t)16});
  r->railSlots = r->relayed ? (size_t)info.n_domains - 1 : r->remote.size();
  // What crosses the rail, for the output and the baseline.
  r->hierarchical = info.rail_hierarchical != 0;
  r->exchange = r->remote.empty() ? "none" : !r->relayed ? "flat" : r->hierarchical ? "hierarchical" : "relayed";
  if (!r->remote.empty()) {
    cudaMalloc(&r->railSend, r->railMost * r->railSlots);
    cudaMalloc(&r->railRecv, r->railMost * r->railSlots);
  }
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&r->smCount, cudaDevAttrMultiProcessorCount, dev);
  cudaGetDeviceProperties(&r->prop, dev);
  return 0;
}

int tearDownRank(RankContext& ctx, RankSetup* r) {
  cudaFree(r->railSend);
  cudaFree(r->railRecv);
  if (r->railOfIndex && r->railOfIndex != ctx.rail) ncclCommDestroy(r->railOfIndex);
  NCCLEXT_BENCH_EP(ncclEpGroupGetAsyncError(r->group));
  ncclEpGroupDestroy(r->group);
  return 0;
}

// A shape's routing: top-k distinct experts per token, uniform, seeded by the rank (so that every rank can derive
// every rank's); toRank[r] / fromRank[r]: my tokens that go to rank r, rank r's that come to me; toDomain[d] /
// fromDomain[d]: my tokens that hit a rank of domain d, and the tokens of domain d's rank of my index that hit my
// domain (the hierarchical HT's rail rows of an EXACT handle, out and in).
struct Routing {
  std::vector<int> idx;
  std::vector<int64_t> toRank, fromRank, toDomain, fromDomain;
  int64_t domainMostRail = 0;  // the hierarchical HT's rounds: the most rail rows of my domain's ranks to or from one
                               // domain (rail/view.h railRoundsOf)
  int64_t sentRows = 0;        // rows to other ranks
};

Routing routeShape(const RankContext& ctx, const Shape& s, const RankSetup& setup) {
  const int T = s.tokens, K = s.topk, E = s.experts, R = ctx.nRanks;
  const int G = setup.info.domain_size, myDomain = ctx.rank / G, myIndex = ctx.rank % G, nDomains = R / G;
  auto routingOf = [&](int rank, std::vector<int>* idx, std::vector<int64_t>* toRank, std::vector<int64_t>* toDomain) {
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
  Routing rt;
  rt.fromRank.assign(R, 0);
  rt.fromDomain.assign(nDomains, 0);
  std::vector<int> other;
  std::vector<int64_t> theirs;
  std::vector<std::vector<int64_t>> domainsOf(R);  // every rank's toDomain
  routingOf(ctx.rank, &rt.idx, &rt.toRank, &rt.toDomain);
  const bool across = !setup.remote.empty();
  for (int r = 0; r < R && across; r++) {
    routingOf(r, &other, &theirs, &domainsOf[r]);
    rt.fromRank[r] = theirs[ctx.rank];
    if (r % G == myIndex) rt.fromDomain[r / G] = domainsOf[r][myDomain];
  }
  for (int p = myDomain * G; p < (myDomain + 1) * G && across; p++)
    for (int d = 0; d < nDomains; d++)
      if (d != myDomain)
        rt.domainMostRail = std::max({rt.domainMostRail, domainsOf[p][d], domainsOf[d * G + p % G][myDomain]});
  for (int r = 0; r < R; r++)
    if (r != ctx.rank) rt.sentRows += rt.toRank[r];
  return rt;
}

// The timed calls of a rank: every call between its own pair of events on the rank's stream.
class Timer {
 public:
  static constexpr int kMaxIters = 80;

  Timer(RankContext& ctx, bool hostBarrier)
      : ctx_(ctx), hostBarrier_(hostBarrier), e0_(kMaxIters), e1_(kMaxIters), e2_(kMaxIters) {
    for (int i = 0; i < kMaxIters; i++) {
      cudaEventCreate(&e0_[i]);
      cudaEventCreate(&e1_[i]);
      cudaEventCreate(&e2_[i]);
    }
    cudaMalloc(&barrierWord_, sizeof(float));
  }
  ~Timer() {
    cudaFree(barrierWord_);
    for (int i = 0; i < kMaxIters; i++) {
      cudaEventDestroy(e0_[i]);
      cudaEventDestroy(e1_[i]);
      cudaEventDestroy(e2_[i]);
    }
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Back to back: every call enqueued after the previous one with no host synchronisation in between, each timed
  // by its own pair of events (DeepEP's method), one wait at the end. `synced`: all ranks meet in an NCCL
  // all-reduce before each timed call (outside the events) and the host waits after each call, so a call is
  // neither overlapped with nor charged for a peer's previous call. 0, or 1 when a call failed.
  template <typename F>
  int time(F&& call, int warm, int iters, std::vector<float>* ts, bool synced = false) {
    if (warm + iters > kMaxIters) return 1;
    for (int i = 0; i < warm + iters; i++) {
      // Virtual ranks (alone or in mixed nodes): ctx.comm is the rank's own: the ranks meet on the host, the stream
      // idle.
      if (synced && hostBarrier_ && ncclext::harness::barrier(ctx_, 60) != ncclSuccess) return 1;
      if (synced && !hostBarrier_ &&
          ncclAllReduce(barrierWord_, barrierWord_, 1, ncclFloat32, ncclSum, ctx_.comm, ctx_.stream) != ncclSuccess)
        return 1;
      cudaEventRecord(e0_[i], ctx_.stream);
      if (call(i) != ncclSuccess) return 1;
      cudaEventRecord(e1_[i], ctx_.stream);
      if (synced && ncclext::waitStream(ctx_.stream, 120, "bench") != ncclSuccess) return 1;
    }
    if (ncclext::waitStream(ctx_.stream, 120, "bench") != ncclSuccess) return 1;
    for (int i = warm; i < warm + iters; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, e0_[i], e1_[i]);
      ts->push_back(ms * 1000.f);
    }
    return 0;
  }

  // Interleaved: call a then call b, `iters` pairs back to back after `warm`, each timed by its own events (a from
  // e0 to e1, b from e1 to e2): both sampled over the same seconds, whatever the transport's drift.
  int pairs(const Call& a, const Call& b, int warm, int iters, std::vector<float>* ta, std::vector<float>* tb) {
    if (warm + iters > kMaxIters) return 1;
    for (int i = 0; i < warm + iters; i++) {
      cudaEventRecord(e0_[i], ctx_.stream);
      if (a(i) != ncclSuccess) return 1;
      cudaEventRecord(e1_[i], ctx_.stream);
      if (b(i) != ncclSuccess) return 1;
      cudaEventRecord(e2_[i], ctx_.stream);
    }
    if (ncclext::waitStream(ctx_.stream, 120, "bench") != ncclSuccess) return 1;
    for (int i = warm; i < warm + iters; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, e0_[i], e1_[i]);
      ta->push_back(ms * 1000.f);
      cudaEventElapsedTime(&ms, e1_[i], e2_[i]);
      tb->push_back(ms * 1000.f);
    }
    return 0;
  }

 private:
  RankContext& ctx_;
  bool hostBarrier_;
  std::vector<cudaEvent_t> e0_, e1_, e2_;
  float* barrierWord_ = nullptr;
};

// A shape's device buffers: the routing, 3 rotating input sets, the outputs (sized for a worst-case handle).
struct ShapeBuffers {
  static constexpr int kSets = 3;
  int *dIdx = nullptr, *dTotal = nullptr;
  std::vector<void*> xs = std::vector<void*>(kSets), ws = std::vector<void*>(kSets), ss = std::vector<void*>(kSets),
                     cins = std::vector<void*>(kSets);
  void *y = nullptr, *yw = nullptr, *ys = nullptr, *cout = nullptr;
  ShapeBuffers() = default;
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;
  ~ShapeBuffers() {
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
  }
};

// Across domains: NCCL send/recv of exactly what the exchange of an EXACT handle moves (the rows the routing fills,
// a message per region: dispatch rows and metadata, combine flags and rows), same communicator, timed alone here and
// interleaved with our calls by the rows. The rounds (rail_round_tokens rows a peer, ncclEpGroupConfig_t;
// hierarchical: rail rows a domain): the baseline moves the same rows in the same rounds, one NCCL group each, as
// ours does (the kernels between them aside).
struct RailBaseline {
  Call call[2];  // dispatch, combine; empty within one domain
  double us[2] = {0, 0};
  size_t sent[2] = {0, 0};
};

int railBaselines(RankContext& ctx, const RankSetup& setup, const Routing& rt, Timer& timer, const Counts& n,
                  RailBaseline* b) {
  const ncclEpGroupInfo_t& info = setup.info;
  const ncclEpGroupConfig_t& cfg = setup.cfg;
  if (setup.remote.empty()) return 0;
  const int myDomain = ctx.rank / info.domain_size;
  const size_t rowStride = cfg.max_token_bytes;
  const size_t metaBytes = info.rail_dispatch_bytes / cfg.max_tokens_per_rank - rowStride;
  const int64_t roundRows = info.rail_round_tokens > 0 ? info.rail_round_tokens : cfg.max_tokens_per_rank;
  auto roundsOf = [&](int64_t most) { return (int)std::max<int64_t>(1, (most + roundRows - 1) / roundRows); };
  const size_t railMost = setup.railMost;
  void* const railSend = setup.railSend;
  void* const railRecv = setup.railRecv;
  std::vector<int> otherDomains;
  for (int d = 0; d < info.n_domains; d++)
    if (d != myDomain) otherDomains.push_back(d);
  for (int op = 0; op < 2 && setup.relayed; op++) {
    // Relayed: the exchange's own messages on the rail of my index, to and from the rank of my index (rail rank d)
    // in every other domain d: relayed flat, fixed (one round); hierarchical, as the EXACT handle timed here sends
    // them: its rail rows to d (dispatch; combine: the partials back for the rows it relays), from d the other way,
    // in rounds, no message where there are none.
    const bool hierarchical = setup.hierarchical;
    const int nMsg = hierarchical ? 1 : std::max(info.rail_messages_per_domain, 1);
    const size_t domainBytes = op == 0 ? info.rail_dispatch_domain_bytes : info.rail_combine_domain_bytes;
    const size_t msgBytes = domainBytes / nMsg, hierRow = domainBytes / (size_t)cfg.max_tokens_per_rank;
    const int rounds = hierarchical ? roundsOf(rt.domainMostRail) : 1;
    const std::vector<int64_t> toDomain = rt.toDomain, fromDomain = rt.fromDomain;
    auto bytesOf = [=](int d, bool out, int k) {
      if (!hierarchical) return msgBytes;
      const int64_t rows = (op == 0) == out ? toDomain[d] : fromDomain[d];
      return (size_t)std::max<int64_t>(0, std::min(rows - k * roundRows, roundRows)) * hierRow;
    };
    const ncclComm_t railOfIndex = setup.railOfIndex;
    b->call[op] = [=, &ctx](int) {
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
            if (out > 0) ok = ok && ncclSend(send + m * out, out, ncclUint8, d, railOfIndex, ctx.stream) == ncclSuccess;
            if (in > 0) ok = ok && ncclRecv(recv + m * in, in, ncclUint8, d, railOfIndex, ctx.stream) == ncclSuccess;
          }
        }
        ok = ncclGroupEnd() == ncclSuccess && ok;
      }
      return ok ? ncclSuccess : ncclSystemError;
    };
    b->sent[op] = 0;
    for (const int d : otherDomains)
      for (int k = 0; k < rounds; k++) b->sent[op] += nMsg * bytesOf(d, true, k);
    std::vector<float> tr;
    if (timer.time(b->call[op], n.warm, n.iters, &tr)) return 1;
    b->us[op] = median(tr);
  }
  // The flat exchange's rounds.
  int64_t most = 0;
  for (const int r : setup.remote) most = std::max({most, rt.toRank[r], rt.fromRank[r]});
  const int rounds = roundsOf(most);
  for (int op = 0; op < 2 && !setup.relayed; op++) {
    const size_t per[2] = {op == 0 ? rowStride : 8, op == 0 ? metaBytes : rowStride};  // a slot of each region
    const size_t maxTokens = (size_t)cfg.max_tokens_per_rank;
    const std::vector<int> remote = setup.remote;
    const std::vector<int64_t> toRank = rt.toRank, fromRank = rt.fromRank;
    b->call[op] = [=, &ctx](int) {
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
          for (const size_t bytes : per) {
            char* send = static_cast<char*>(railSend) + i * railMost + at + lo * bytes;
            char* recv = static_cast<char*>(railRecv) + i * railMost + at + lo * bytes;
            if (out > 0) ok = ok && ncclSend(send, out * bytes, ncclUint8, r, ctx.comm, ctx.stream) == ncclSuccess;
            if (in > 0) ok = ok && ncclRecv(recv, in * bytes, ncclUint8, r, ctx.comm, ctx.stream) == ncclSuccess;
            at += maxTokens * bytes;
          }
        }
        ok = ncclGroupEnd() == ncclSuccess && ok;
      }
      return ok ? ncclSuccess : ncclSystemError;
    };
    for (const int r : remote) b->sent[op] += (size_t)(op == 0 ? toRank[r] : fromRank[r]) * (per[0] + per[1]);
    std::vector<float> tr;
    if (timer.time(b->call[op], n.warm, n.iters, &tr)) return 1;
    b->us[op] = median(tr);
  }
  return 0;
}

// The practical limit at this size: the copy engine moving the same NVLink bytes (dispatch payload) from every rank
// to the next at once, ranks synced before each copy (virtual ranks: on the one GPU, every rank's copy at once). 0
// with one rank, and across domains on one GPU.
int copyEngineUs(RankContext& ctx, const Options& o, size_t bytes, Timer& timer, double* us) {
  *us = 0;
  if (ctx.nRanks <= 1 || bytes == 0 || o.acrossOnOneGpu()) return 0;
  const int peer = o.oneGpu == OneGpu::kVirtual ? ctx.device : (ctx.device + 1) % ctx.nRanks;
  void *src = nullptr, *dst = nullptr;
  cudaMalloc(&src, bytes);
  cudaSetDevice(peer);
  cudaMalloc(&dst, bytes);
  cudaSetDevice(ctx.device);
  if (peer != ctx.device && cudaDeviceEnablePeerAccess(peer, 0) != cudaSuccess)
    cudaGetLastError();  // already enabled is fine
  std::vector<float> t;
  const int failed = timer.time(
      [&](int) {
        return cudaMemcpyPeerAsync(dst, peer, src, ctx.device, bytes, ctx.stream) == cudaSuccess
                   ? ncclSuccess
                   : ncclUnhandledCudaError;
      },
      5, 40, &t, true);
  if (failed) return 1;
  *us = median(t);
  cudaFree(src);
  cudaFree(dst);
  if (ctx.rank == 0)
    printf("copy engine, the same %.1f MB from every rank to the next at once: %.1f us (%.1f GB/s per rank)\n",
           bytes / 1e6, *us, bytes / *us / 1e3);
  return 0;
}

// One row's numbers (a shape, an SM count, dispatch or combine).
struct Row {
  const Shape* s;
  int sms, op;  // op 0: dispatch, 1: combine
  double us, usSynced, updateUs, updateAloneUs;  // update + dispatch, and the update alone (dispatch rows)
  int64_t sentRows, logicalRows;
  size_t payload, ceBytes;
  double ceUs;
  double pairedUs, pairedRailUs, pairedRatio;
  bool zeroCopy;  // the dispatch's FLAT output was the group's window (--zero-copy)
};

// Prints a row (rank 0) and appends it to the JSON lines (`out`, rank 0's).
void reportRow(const RankContext& ctx, const RankSetup& setup, const Counts& n, const RailBaseline& rail, const Row& w,
               FILE* out) {
  if (ctx.rank != 0) return;
  const Shape& s = *w.s;
  const ncclEpGroupInfo_t& info = setup.info;
  const int T = s.tokens, H = s.hidden, K = s.topk, E = s.experts, R = ctx.nRanks, op = w.op;
  const bool fp8 = s.dtype == ncclFloat8e4m3, fp4 = s.dtype == ncclUint8;
  const char* dn = fp8 ? "fp8" : fp4 ? "nvfp4" : "bf16";
  const char* ln = s.layout == NCCL_EP_LAYOUT_FLAT ? "flat" : "expert_major";
  // Byte conventions: see the file comment. Combine moves bf16 rows back.
  const double rowB = op == 0 ? (double)w.payload : (double)H * 2;
  const double nvB = w.sentRows * rowB, logB = w.logicalRows * rowB;
  printf("%-6s %-5s %-12s %6d %5d %4d %9.1f %9.1f %9.1f %7.1f GB/s %7.1f GB/s %9.1f\n", op ? "comb" : "disp", dn, ln, T,
         H, w.sms, w.us, w.usSynced, op == 0 ? w.updateUs : 0.0, nvB / w.us / 1e3, logB / w.us / 1e3, nvB / 1e6);
  if (!setup.remote.empty() && setup.relayed)
    printf(
        "       rail: %zu bytes sent to %zu domains (%d messages each, %s); NCCL send/recv of them %.1f us; ours / "
        "that %.2f\n",
        rail.sent[op], setup.railSlots, info.rail_messages_per_domain, setup.exchange, rail.us[op],
        rail.us[op] > 0 ? w.us / rail.us[op] : 0.0);
  else if (!setup.remote.empty())
    printf(
        "       rail: %zu bytes sent to %zu ranks (at most %zu each); NCCL send/recv of them %.1f us; ours / that "
        "%.2f\n",
        rail.sent[op], setup.remote.size(), op == 0 ? info.rail_dispatch_bytes : info.rail_combine_bytes, rail.us[op],
        rail.us[op] > 0 ? w.us / rail.us[op] : 0.0);
  if (rail.call[op])
    printf("       interleaved, %d pairs: ours %.1f us, NCCL %.1f us; median of the pairs' ratios %.2f\n", n.iters,
           w.pairedUs, w.pairedRailUs, w.pairedRatio);
  if (!out) return;
  fprintf(out,
          "{\"what\": \"ep_%s\", \"pass\": true, \"dtype\": \"%s\", \"layout\": \"%s\", \"tokens\": %d, "
          "\"hidden\": %d, "
          "\"topk\": %d, \"experts\": %d, \"nranks\": %d, \"sms\": %d, \"us_median\": %.2f, "
          "\"us_median_synced\": %.2f, "
          "\"update_handle_plus_dispatch_us_median\": %.2f, \"update_handle_us_median\": %.2f, "
          "\"nvlink_bytes\": %.0f, \"nvlink_GBps\": %.2f, "
          "\"logical_bytes\": %.0f, \"logical_GBps\": %.2f, \"ce_same_bytes\": %zu, "
          "\"ce_same_bytes_us_median\": %.2f, \"iters\": %d, \"gpu\": \"%s\", \"mode\": \"%s\", "
          "\"domains\": %d, \"max_tokens_per_rank\": %d, \"rail_peers\": %zu, \"rail_bytes_sent\": %zu, "
          "\"rail_fixed_bytes_per_peer\": %zu, \"rail_fixed_bytes_per_domain\": %zu, "
          "\"rail_us_median\": %.2f, \"paired_us_median\": %.2f, \"paired_rail_us_median\": %.2f, "
          "\"paired_ratio_median\": %.3f, "
          "\"rail_messages_per_domain\": %d, \"rail_staging_bytes\": %zu, \"window_bytes\": %zu, "
          "\"rail_round_tokens\": %d, \"rail_overlapped\": %d, \"recv_cap\": %d, \"zero_copy\": %d, "
          "\"exchange\": \"%s\", "
          "\"byte_convention\": \"nvlink = rows sent to other ranks x payload; logical = rows received "
          "incl. local x payload; rail_bytes_sent = rows to other domains' ranks x (row stride + "
          "metadata); relayed: the exchange's messages to every other domain (flat: fixed; "
          "hierarchical: its rail rows, the EXACT handle's)\"}\n",
          op ? "combine" : "dispatch", dn, ln, T, H, K, E, R, w.sms, w.us, w.usSynced, op == 0 ? w.updateUs : 0.0,
          op == 0 ? w.updateAloneUs : 0.0, nvB,
          nvB / w.us / 1e3, logB, logB / w.us / 1e3, w.ceBytes, w.ceUs, n.iters, setup.prop.name,
          ncclext::harness::oneGpuName(ctx.mode), info.n_domains, setup.cfg.max_tokens_per_rank, setup.remote.size(),
          rail.sent[op], op == 0 ? info.rail_dispatch_bytes : info.rail_combine_bytes,
          op == 0 ? info.rail_dispatch_domain_bytes : info.rail_combine_domain_bytes, rail.us[op], w.pairedUs,
          w.pairedRailUs, w.pairedRatio, info.rail_messages_per_domain, info.rail_staging_bytes, info.window_bytes,
          info.rail_round_tokens, info.rail_overlapped, setup.cfg.max_recv_rows_per_rank, w.zeroCopy ? 1 : 0,
          setup.exchange);
}

// Virtual ranks (alone or in mixed nodes) share one device: a rank's cudaFree or cudaDeviceSynchronize waits for
// every stream of it, a peer's kernel waiting for this rank's next call of the group included. So they meet on the
// host, streams drained, after such steps and before their next call of the group. 0, or 1 after a timeout.
int meetVirtual(RankContext& ctx, const Options& o) {
  if (!o.virtualRanks()) return 0;
  if (ncclext::waitStream(ctx.stream, 120, "bench") != ncclSuccess) return 1;
  return ncclext::harness::barrier(ctx, 60) == ncclSuccess ? 0 : 1;
}

// One shape: its routing bound once to an EXACT handle (cached routing), the update-handle + dispatch timing, the
// baselines, then dispatch and combine at each SM count.
int benchShape(RankContext& ctx, const Options& o, const RankSetup& setup, const Shape& s, const Counts& n, FILE* out) {
  const int T = s.tokens, H = s.hidden, K = s.topk;
  // bf16 rows; fp8 rows with an fp32 scale per 128 columns; nvfp4 rows (uint8, two columns a byte) with their e4m3
  // block scales as int32 words (four a word, one per 16 columns): opaque bytes to the library, forwarded.
  const bool fp8 = s.dtype == ncclFloat8e4m3, fp4 = s.dtype == ncclUint8, flat = s.layout == NCCL_EP_LAYOUT_FLAT;
  const bool quantised = fp8 || fp4;
  const int64_t cols = fp4 ? H / 2 : H;  // the token tensor's columns
  const size_t esz = quantised ? 1 : 2;
  const size_t nScales = fp8 ? H / 128 : fp4 ? H / 64 : 0;
  const ncclDataType_t scaleType = fp4 ? ncclInt32 : ncclFloat32;
  const size_t payload = cols * esz + nScales * 4;
  const ncclEpGroup_t group = setup.group;
  const Routing rt = routeShape(ctx, s, setup);
  ShapeBuffers buf;
  cudaMalloc(&buf.dIdx, rt.idx.size() * 4);
  cudaMalloc(&buf.dTotal, 4);
  // On the rank's stream and waited for: a plain cudaMemcpy from pageable memory may return before its DMA is done,
  // and the legacy stream it runs on does not order the rank's non-blocking stream after it.
  cudaMemcpyAsync(buf.dIdx, rt.idx.data(), rt.idx.size() * 4, cudaMemcpyHostToDevice, ctx.stream);
  cudaStreamSynchronize(ctx.stream);
  ncclEpTensor_t ti = epTensor(buf.dIdx, ncclInt32, {T, K});
  ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
  hc.sizing = NCCL_EP_SIZING_EXACT;
  ncclEpHandle_t h = nullptr;
  NCCLEXT_BENCH_EP(ncclEpCreateHandle(&h, group, s.layout, &ti, nullptr, &hc, ctx.stream));
  struct HandleGuard {
    ncclEpHandle_t h;
    ~HandleGuard() {
      if (h) ncclEpHandleDestroy(h);
    }
  } hGuard{h};
  int64_t rows = 0, flatRows = 0;
  NCCLEXT_BENCH_EP(ncclEpHandleGetRecvRows(h, &rows));
  if (flat) {
    flatRows = rows;
  } else {  // FLAT count of the same routing, for the byte conventions
    ncclEpHandle_t hf = nullptr;
    NCCLEXT_BENCH_EP(ncclEpCreateHandle(&hf, group, NCCL_EP_LAYOUT_FLAT, &ti, nullptr, &hc, ctx.stream));
    ncclEpHandleGetRecvRows(hf, &flatRows);
    ncclEpHandleDestroy(hf);
  }
  const int64_t logicalRows = flatRows;
  const int kSets = ShapeBuffers::kSets;
  for (int i = 0; i < kSets; i++) {
    cudaMalloc(&buf.xs[i], (size_t)T * cols * esz);
    cudaMalloc(&buf.ws[i], (size_t)T * K * 4);
    cudaMalloc(&buf.ss[i], (size_t)T * std::max<size_t>(nScales, 1) * 4);
    cudaMalloc(&buf.cins[i], (size_t)std::max<int64_t>(rows, 1) * H * 2);
    cudaMemset(buf.xs[i], 0x11 * (i + 1), (size_t)T * cols * esz);
    cudaMemset(buf.ws[i], 0, (size_t)T * K * 4);
    cudaMemset(buf.ss[i], 0, (size_t)T * std::max<size_t>(nScales, 1) * 4);
    cudaMemset(buf.cins[i], 0x01 * (i + 1), (size_t)std::max<int64_t>(rows, 1) * H * 2);
  }
  cudaDeviceSynchronize();  // the fills (on the legacy stream) before the rank's stream reads them
  int64_t maxRows = 0;      // a worst-case output, for the handle-creation timing
  NCCLEXT_BENCH_EP(ncclEpHandleGetMaxRecvRows(h, &maxRows));
  cudaMalloc(&buf.y, (size_t)std::max<int64_t>(maxRows, 1) * cols * esz);
  cudaMalloc(&buf.yw, (size_t)std::max<int64_t>(maxRows, 1) * K * 4);
  cudaMalloc(&buf.ys, (size_t)std::max<int64_t>(maxRows, 1) * std::max<size_t>(nScales, 1) * 4);
  cudaMalloc(&buf.cout, (size_t)T * H * 2);
  // --zero-copy: the window's rows as the FLAT output, where their rows are the window's.
  ncclEpTensor_t window = NCCL_EP_TENSOR_INIT;
  const bool zeroCopy = o.zeroCopy && flat && (int64_t)(cols * esz) == setup.cfg.max_token_bytes;
  if (zeroCopy) NCCLEXT_BENCH_EP(ncclEpGroupGetDispatchWindow(group, s.dtype, cols, &window));
  auto dispatchArgs = [&](int i, ncclEpDispatchInputs_t* in, ncclEpDispatchOutputs_t* od, int64_t outRows) {
    *in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in->tokens = epTensor(buf.xs[i], s.dtype, {T, cols});
    in->topk_weights = epTensor(buf.ws[i], ncclFloat32, {T, K});
    if (quantised) in->scales = epTensor(buf.ss[i], scaleType, {T, (int64_t)nScales});
    *od = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    od->tokens = zeroCopy ? window : epTensor(buf.y, s.dtype, {outRows, cols});
    od->topk_weights = flat ? epTensor(buf.yw, ncclFloat32, {outRows, K}) : epTensor(buf.yw, ncclFloat32, {outRows});
    if (quantised) od->scales = epTensor(buf.ys, scaleType, {outRows, (int64_t)nScales});
  };
  Timer timer(ctx, o.virtualRanks());
  // Routing not cached: ncclEpUpdateHandle (new routing bound to an existing handle, worst-case sizing, no host
  // synchronisation) + dispatch, as a training step that re-routes every iteration does.
  std::vector<float> tHandle;
  ncclEpHandleConfig_t worst = NCCL_EP_HANDLE_CONFIG_INIT;
  ncclEpHandle_t hw = nullptr;
  if (meetVirtual(ctx, o)) return 1;  // after the cudaDeviceSynchronize above
  NCCLEXT_BENCH_EP(ncclEpCreateHandle(&hw, group, s.layout, &ti, nullptr, &worst, ctx.stream));
  if (timer.time(
          [&](int i) {
            ncclResult_t r = ncclEpUpdateHandle(hw, &ti, nullptr, ctx.stream);
            if (r != ncclSuccess) return r;
            ncclEpDispatchInputs_t in;
            ncclEpDispatchOutputs_t od;
            dispatchArgs(i % kSets, &in, &od, maxRows);
            return ncclEpDispatch(hw, &in, &od, nullptr, nullptr, ctx.stream);
          },
          3, 20, &tHandle))
    return 1;
  // The update alone, back to back (the same routing bound anew each time; collective, as every update).
  std::vector<float> tUpdate;
  if (timer.time([&](int) { return ncclEpUpdateHandle(hw, &ti, nullptr, ctx.stream); }, 3, 20, &tUpdate)) return 1;
  RailBaseline rail;
  if (railBaselines(ctx, setup, rt, timer, n, &rail)) return 1;
  ncclEpHandleDestroy(hw);
  const size_t ceBytes = (size_t)rt.sentRows * payload;
  double ceUs = 0;
  if (copyEngineUs(ctx, o, ceBytes, timer, &ceUs) || meetVirtual(ctx, o)) return 1;  // (it frees its buffers)
  for (int sms : s.sms) {
    if (sms > setup.smCount) sms = setup.smCount;
    ncclEpDispatchConfig_t dc = NCCL_EP_DISPATCH_CONFIG_INIT;
    dc.num_sms = sms;
    ncclEpCombineConfig_t cc = NCCL_EP_COMBINE_CONFIG_INIT;
    cc.num_sms = sms;
    std::vector<float> td, tc, tds, tcs;
    auto dispatchCall = [&](int i) {
      ncclEpDispatchInputs_t in;
      ncclEpDispatchOutputs_t od;
      dispatchArgs(i % kSets, &in, &od, rows);
      return ncclEpDispatch(h, &in, &od, nullptr, &dc, ctx.stream);
    };
    auto combineCall = [&](int i) {
      ncclEpCombineInputs_t in = NCCL_EP_COMBINE_INPUTS_INIT;
      in.tokens = epTensor(buf.cins[i % kSets], ncclBfloat16, {rows, H});
      ncclEpCombineOutputs_t oc = NCCL_EP_COMBINE_OUTPUTS_INIT;
      oc.tokens = epTensor(buf.cout, ncclBfloat16, {T, H});
      return ncclEpCombine(h, &in, &oc, &cc, ctx.stream);
    };
    if (timer.time(dispatchCall, n.warm, n.iters, &td) || timer.time(dispatchCall, n.warmSynced, n.iters, &tds, true))
      return 1;
    if (!quantised &&
        (timer.time(combineCall, n.warm, n.iters, &tc) || timer.time(combineCall, n.warmSynced, n.iters, &tcs, true)))
      return 1;
    Row w[2];
    for (int op = 0; op < (quantised ? 1 : 2); op++) {
      w[op] = Row{&s,
                  sms,
                  op,
                  median(op == 0 ? td : tc),
                  median(op == 0 ? tds : tcs),
                  median(tHandle),
                  median(tUpdate),
                  rt.sentRows,
                  logicalRows,
                  payload,
                  ceBytes,
                  ceUs,
                  0,
                  0,
                  0,
                  zeroCopy && op == 0};
      // Across domains: each call interleaved with its baseline, the pairs' ratios' median.
      if (!rail.call[op]) continue;
      std::vector<float> ours, theirs, ratios;
      if (timer.pairs(op == 0 ? Call(dispatchCall) : Call(combineCall), rail.call[op], n.warm, n.iters, &ours, &theirs))
        return 1;
      for (size_t i = 0; i < ours.size(); i++) ratios.push_back(theirs[i] > 0 ? ours[i] / theirs[i] : 0.f);
      w[op].pairedUs = median(ours);
      w[op].pairedRailUs = median(theirs);
      w[op].pairedRatio = median(ratios);
    }
    for (int op = 0; op < (quantised ? 1 : 2); op++) reportRow(ctx, setup, n, rail, w[op], out);
  }
  return 0;
}

// A rank's run: its group, then every shape.
int runRank(RankContext& ctx, const Options& o, const std::vector<Shape>& shapes, int maxTokens,
            ncclEpVirtualDomain_t virt) {
  RankSetup setup;
  if (setUpRank(ctx, o, maxTokens, virt, &setup)) return 1;
  FILE* out = ctx.rank == 0 && !o.json.empty() ? fopen(o.json.c_str(), "a") : nullptr;
  if (ctx.rank == 0)
    printf("%-6s %-5s %-12s %6s %5s %4s %9s %9s %9s %10s %10s %12s\n", "op", "dtype", "layout", "tokens", "hidden",
           "SMs", "median_us", "synced_us", "update+d", "NVLink", "logical", "NVLink_MB");
  const Counts n(o);
  for (const Shape& s : shapes)  // (a shape frees its buffers and handles on return)
    if (meetVirtual(ctx, o) || benchShape(ctx, o, setup, s, n, out)) return 1;
  if (out) fclose(out);
  return meetVirtual(ctx, o) || tearDownRank(ctx, &setup);
}

}  // namespace

int main(int argc, char** argv) {
  // --mode first: the Low-Latency benchmark takes options of its own.
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const std::string mode = a == "--mode" && i + 1 < argc ? argv[i + 1]
                             : a.rfind("--mode=", 0) == 0  ? a.substr(7)
                                                           : "";
    if (mode == "ll") return runLowLatency(argc, argv);
  }
  Options o;
  if (!parseOptions(argc, argv, &o)) return 2;
  const std::vector<Shape> shapes = shapesFor(o);
  int shapeTokens = 0;
  for (const Shape& s : shapes) shapeTokens = std::max(shapeTokens, s.tokens);
  if (o.maxTokens != 0 && o.maxTokens < shapeTokens) {
    fprintf(stderr, "ep_bench: --max-tokens %d: the group must hold the shapes' %d tokens a rank\n", o.maxTokens,
            shapeTokens);
    return 2;
  }
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = o.nRanks;
  lo.oneGpu = o.oneGpu;
  ncclEpVirtualDomain_t virt = nullptr;
  if (!ncclext::harness::makeVirtualDomain(lo, &virt)) return 1;
  const int maxTokens = o.maxTokens ? o.maxTokens : shapeTokens;
  const int rc =
      ncclext::harness::launch(lo, [&](RankContext& ctx) { return runRank(ctx, o, shapes, maxTokens, virt); });
  if (virt) ncclEpVirtualDomainDestroy(virt);
  return rc;
}
