// A dead peer in the middle of a loop of nccl_ep dispatch + combine.
//
// Rank `--victim` (default: the last) runs `--die-at` iterations, launches the next dispatch and then dies: with real
// GPUs its process SIGKILLs itself (the launcher lets the others go on); with virtual ranks its thread stops making
// calls, as a killed process would, and only tears down once the survivors are done. Every survivor must
//   1. get ncclRemoteError or ncclSystemError from the group within its timeout plus the host margin of the last
//      call that succeeded (a loop that runs to its end with no error fails: the death went unnoticed);
//   2. destroy its handle and group within a bounded time (the destruction's barrier finds the peer gone);
//   3. exit cleanly (its communicator aborted, no CUDA error left).
// As one-GPU nodes (every rank a domain of its own) the victim's process dies too, and the survivors notice it in the
// rail exchange (NCCL's error, or the watchdog aborting the rail communicator past the budget).
//
// --algo ll runs the loop in the Low-Latency mode (RANK_MAJOR), else High-Throughput (FLAT).
//
// Usage: ep_dead_peer_test [--nranks N] [--one-gpu off|nodes|virtual] [--algo ht|ll] [--iters I] [--die-at K]
//                          [--victim R] [--timeout-s S] [--sms N] [--json FILE]
// --sms N: the group's num_sms (default 16).                                   Exit: 0 pass, 1 fail, 77 no GPU.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/device_status.h"
#include "common/status.h"
#include "nccl_ep.h"
#include "tests/harness/cli.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/ep_tensor.h"
#include "tests/harness/launcher.h"

namespace {

using ncclext::harness::epTensor;

struct Options {
  int nRanks = 2, iters = 50, dieAt = 5, victim = -1, sms = 16;
  double timeoutSeconds = 3;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  std::string algo = "ht", json;
  bool lowLatency() const { return algo == "ll"; }
};

constexpr int kTokens = 256, kTopk = 8, kHidden = 1024, kExpertsPerRank = 8;

// Virtual ranks: survivors that finished (the victim's thread tears down only after them).
std::atomic<int> gSurvivorsDone{0};

bool parse(int argc, char** argv, Options* o) {
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", &o->nRanks);
  cli.oneGpu(&o->oneGpu);
  cli.option("iters", &o->iters);
  cli.option("die-at", &o->dieAt);
  cli.option("victim", &o->victim);
  cli.option("timeout-s", &o->timeoutSeconds);
  cli.option("sms", &o->sms);
  cli.option("algo", &o->algo, "ht|ll");
  cli.option("json", &o->json);
  if (!cli.parse(argc, argv)) return false;
  if (o->victim < 0) o->victim = o->nRanks - 1;
  return cli.require(o->nRanks >= 2 && o->victim < o->nRanks && o->dieAt >= 0 && o->dieAt < o->iters &&
                         o->timeoutSeconds > 0 && o->sms > 0 && (o->algo == "ht" || o->algo == "ll"),
                     "needs --nranks >= 2, --victim < nranks, 0 <= --die-at < --iters, --timeout-s > 0, --sms > 0 and "
                     "--algo ht or ll");
}

struct Buffers {
  void *topk = nullptr, *x = nullptr, *y = nullptr, *out = nullptr;
  cudaStream_t s = nullptr;
  ~Buffers() {
    for (void* p : {topk, x, y, out})
      if (p) cudaFreeAsync(p, s);
  }
};

int body(ncclext::harness::RankContext& ctx, const Options& o, ncclEpVirtualDomain_t virt) {
  const bool victim = ctx.rank == o.victim;
  ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
  cfg.num_experts = kExpertsPerRank * ctx.nRanks;
  cfg.max_tokens_per_rank = kTokens;
  cfg.max_token_bytes = kHidden * 2;
  cfg.max_topk = kTopk;
  cfg.num_sms = o.sms;
  cfg.timeout_ns = (uint64_t)(o.timeoutSeconds * 1e9);
  if (o.lowLatency()) cfg.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
  ncclext::harness::setEpTesting(virt, ctx.rank, nullptr);
  ncclEpGroup_t group = nullptr;
  if (ncclext::harness::createEpGroup(&group, ctx.comm, &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclEpCreateGroup: %s\n", ctx.rank, ncclEpGetLastError());
    return 1;
  }
  Buffers b;
  b.s = ctx.stream;
  std::vector<int> idx(kTokens * kTopk);
  for (int t = 0; t < kTokens; t++)
    for (int k = 0; k < kTopk; k++) idx[t * kTopk + k] = (t + k * 3 + ctx.rank) % cfg.num_experts;
  ncclEpHandle_t h = nullptr;
  int64_t rows = 0;
  bool setup = cudaMallocAsync(&b.topk, idx.size() * 4, ctx.stream) == cudaSuccess &&
               cudaMemcpyAsync(b.topk, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, ctx.stream) == cudaSuccess &&
               cudaMallocAsync(&b.x, (size_t)kTokens * kHidden * 2, ctx.stream) == cudaSuccess &&
               cudaMemsetAsync(b.x, 0x3c, (size_t)kTokens * kHidden * 2, ctx.stream) == cudaSuccess &&
               cudaMallocAsync(&b.out, (size_t)kTokens * kHidden * 2, ctx.stream) == cudaSuccess &&
               cudaStreamSynchronize(ctx.stream) == cudaSuccess;
  ncclEpTensor_t ti = epTensor(b.topk, ncclInt32, {kTokens, kTopk});
  const ncclEpLayout_t layout = o.lowLatency() ? NCCL_EP_LAYOUT_RANK_MAJOR : NCCL_EP_LAYOUT_FLAT;
  setup = setup && ncclEpCreateHandle(&h, group, layout, &ti, nullptr, nullptr, ctx.stream) == ncclSuccess &&
          ncclEpHandleGetMaxRecvRows(h, &rows) == ncclSuccess &&
          cudaMallocAsync(&b.y, (size_t)rows * kHidden * 2, ctx.stream) == cudaSuccess;
  if (!setup) {
    fprintf(stderr, "rank %d: setup failed: %s\n", ctx.rank, ncclEpGetLastError());
    return 1;
  }
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(b.x, ncclBfloat16, {kTokens, kHidden});
  ncclEpDispatchOutputs_t dout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  dout.tokens = epTensor(b.y, ncclBfloat16, {rows, kHidden});
  ncclEpCombineInputs_t cin = NCCL_EP_COMBINE_INPUTS_INIT;
  cin.tokens = epTensor(b.y, ncclBfloat16, {rows, kHidden});
  ncclEpCombineOutputs_t cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
  cout.tokens = epTensor(b.out, ncclBfloat16, {kTokens, kHidden});

  using Clock = std::chrono::steady_clock;
  auto lastOk = Clock::now();
  ncclResult_t seen = ncclSuccess;
  std::string msg;
  int it = 0;
  for (; it < o.iters; it++) {
    ncclResult_t r = ncclEpDispatch(h, &in, &dout, nullptr, nullptr, ctx.stream);
    if (victim && it == o.dieAt) {
      if (!virt) {
        fprintf(stderr, "rank %d: dying now (iteration %d, a dispatch in flight)\n", ctx.rank, it);
        fflush(stderr);
        kill(getpid(), SIGKILL);
      }
      // Virtual ranks: a dead thread makes no more calls. Wait (bounded) for the survivors, then tear down.
      const auto until = Clock::now() + std::chrono::duration<double>(4 * o.timeoutSeconds + 60);
      while (gSurvivorsDone.load() < ctx.nRanks - 1 && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ncclEpHandleDestroy(h);
      ncclEpGroupDestroy(group);  // its domain is broken by now: returns an error at once, and frees
      ctx.peerDied = true;
      printf("rank %d: the victim (stopped at iteration %d)\n", ctx.rank, it);
      return 0;
    }
    if (r == ncclSuccess) r = ncclEpCombine(h, &cin, &cout, nullptr, ctx.stream);
    if (r == ncclSuccess) r = ncclext::waitStream(ctx.stream, o.timeoutSeconds, "dead-peer loop");
    if (r == ncclSuccess) r = ncclEpGroupGetAsyncError(group);
    if (r != ncclSuccess) {
      seen = r;
      msg = ncclEpGetLastError();
      if (msg.empty()) msg = ncclext::lastError();
      break;
    }
    lastOk = Clock::now();
  }
  const double noticed = std::chrono::duration<double>(Clock::now() - lastOk).count();
  const auto t0 = Clock::now();
  ncclEpHandleDestroy(h);
  const ncclResult_t destroyed = ncclEpGroupDestroy(group);
  const double teardown = std::chrono::duration<double>(Clock::now() - t0).count();
  ctx.peerDied = true;
  if (virt) gSurvivorsDone.fetch_add(1);
  const double bound = o.timeoutSeconds + ncclext::kHostMarginSeconds + 2;
  const bool ok = (seen == ncclRemoteError || seen == ncclSystemError) && noticed <= bound &&
                  teardown <= 2 * bound + 5;
  printf("rank %d: after iteration %d -> %s %.2f s after the last good call (bound %.1f s): \"%s\"; group destroyed "
         "in %.2f s (%s) -> %s\n",
         ctx.rank, it, ncclGetErrorString(seen), noticed, bound, msg.c_str(), teardown, ncclGetErrorString(destroyed),
         ok ? "PASS" : "FAIL");
  if (ctx.rank == 0) {
    char line[320];
    snprintf(line, sizeof(line),
             "{\"test\": \"ep_dead_peer\", \"algo\": \"%s\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, "
             "\"victim\": %d, \"die_at\": %d, \"noticed_s\": %.3f, \"teardown_s\": %.3f, \"budget_s\": %.3f}",
             o.algo.c_str(), ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), ok ? "true" : "false", o.victim,
             o.dieAt, noticed, teardown, o.timeoutSeconds);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = o.nRanks;
  lo.oneGpu = o.oneGpu;
  lo.mayDie = o.victim;
  ncclEpVirtualDomain_t virt = nullptr;
  if (o.oneGpu == ncclext::harness::OneGpu::kVirtual && ncclEpVirtualDomainCreate(&virt, o.nRanks) != ncclSuccess) {
    fprintf(stderr, "ncclEpVirtualDomainCreate: %s\n", ncclEpGetLastError());
    return 1;
  }
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) { return body(ctx, o, virt); });
  if (virt) ncclEpVirtualDomainDestroy(virt);
  return rc;
}
