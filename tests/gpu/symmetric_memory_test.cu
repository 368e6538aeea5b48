// GPU tests of the foundation (common/): symmetric memory, LSA pushes, the flag barrier and its timeout.
//
// The windows live on the NVLink-domain communicator that ncclext::Domain splits from the world (common/domain.h).
//
//   smoke    Every rank's kernel pushes a pattern that names (iteration, source rank, destination rank, element)
//            into its slot of every domain peer's window over LSA, meets the peers in the flag barrier, and checks
//            every element of its own window; the host then copies the window back and checks every element again
//            against a host-computed pattern. The window is poisoned before every iteration, so a missing store
//            or a missing barrier shows up as poison or as a previous iteration's value. With several domains
//            (one-GPU nodes, NCCL_EXT_LSA_DOMAIN_SIZE) every rank also sends a pattern to its peer in every other
//            domain over the rail communicator (ncclSend/ncclRecv) and checks what it receives, poisoned first.
//   timeout  One rank of the domain never signals (a domain of 1: a flag nobody writes). The other ranks' waits
//            must give up after the configured budget, come back through the host API as ncclRemoteError naming
//            the silent peer, leave the GPU usable, and the processes must exit cleanly.
//   dead-peer  A loop of smoke iterations (LSA pushes and barriers inside the domain, and the rail exchange across
//            domains) in which the last rank dies after `--die-at` iterations: SIGKILL of its process (real GPUs,
//            one-GPU nodes), or its thread making no more calls (virtual ranks). Every survivor must get
//            ncclRemoteError or ncclSystemError within the budget (--timeout-s) plus the host margin, abort its
//            domain, free its window without the collective deregistration, and exit cleanly. With one-GPU nodes
//            this is the rail's path (NCCL over sockets) to a killed process; inside a domain the flag barrier's.
//            Not in the mixed mode.
//
// --one-gpu mixed --domain-size D (launcher.h): N / D one-GPU nodes of D virtual ranks each, so that the smoke test
// runs LSA inside domains of D ranks and the rail between them at once (each rank's rail: the ranks of its index).
//
// Usage: symmetric_memory_test [--test smoke|timeout|dead-peer|all] [--nranks N]
//                              [--one-gpu off|nodes|virtual|mixed] [--domain-size D] [--iters I] [--ctas C]
//                              [--threads T] [--slot-elems E] [--rail-elems E] [--timeout-s S] [--die-at K]
//                              [--json FILE] [--break store|barrier]
// (`all` is smoke and timeout.)
// --break store skips the kernel's stores and --break barrier skips its exit barrier: both must make the smoke test
// FAIL (the oracle can fail); gpu-check never passes --break.
// Exit status: 0 pass, 1 fail, 77 no GPU.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/checks.h"
#include "common/device/sync.cuh"
#include "common/device_status.h"
#include "common/launch.h"
#include "common/symmetric_memory.h"
#include "tests/harness/cli.h"
#include "tests/harness/launcher.h"

namespace {

using ncclext::dev::LsaBarrier;

// --break: deliberately broken variants that show the oracle can fail (they must FAIL; never used in gpu-check).
enum BreakMode : int { kBreakNone = 0, kBreakStore = 1, kBreakBarrier = 2 };

struct Options {
  std::string test = "all";
  int nRanks = 0;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  int domainSize = 2;  // --one-gpu mixed: virtual ranks a node
  size_t railElems = (size_t)1 << 15;  // uint64 per rail peer: 256 KiB
  int iters = 20;
  int ctas = 16;
  int threads = 512;
  size_t slotElems = (size_t)1 << 20;  // uint64 per (source, destination): 8 MiB
  double timeoutSeconds = 2.0;
  int dieAt = 3;  // dead-peer: iterations the last rank completes before it dies
  std::string json;
  int breakMode = kBreakNone;
};

__host__ __device__ inline uint64_t pattern(uint32_t iter, uint32_t src, uint32_t dst, uint64_t i) {
  return (uint64_t)(iter + 1) << 48 | (uint64_t)src << 40 | (uint64_t)dst << 32 | (i & 0xffffffffu);
}
constexpr uint64_t kPoison = 0xffffffffffffffffull;

struct SmokeParams {
  LsaBarrier bar;
  size_t slotElems;
  uint32_t iter;
  unsigned long long* errors;
  int breakMode;
};

// Window: uint64 data[lsaSize][slotElems] (slot s written by LSA rank s), then the barrier flags.
// CTA b handles elements [lo, hi) of every slot and uses barrier index b: it meets exactly the peer CTAs that
// wrote the range it checks.
__global__ void smokeKernel(SmokeParams p) {
  ncclext::dev::CoopCta cta;
  const int me = p.bar.lsaRank;
  const int n = p.bar.lsaSize;
  const size_t per = (p.slotElems + gridDim.x - 1) / gridDim.x;
  const size_t lo = min(p.slotElems, (size_t)blockIdx.x * per);
  const size_t hi = min(p.slotElems, lo + per);
  // (1) Entry: peers are done with the previous iteration.
  if (!ncclext::dev::lsaBarrierSync(cta, p.bar, blockIdx.x)) return;
  // (2) Push my slot into every peer (staggered so that ranks do not all hit one peer at once).
  for (int k = 0; k < n; k++) {
    const int dst = (me + k) % n;
    uint64_t* remote = static_cast<uint64_t*>(p.bar.peers.at((size_t)me * p.slotElems * 8, dst));
    if (p.breakMode == kBreakStore) continue;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) remote[i] = pattern(p.iter, me, dst, i);
  }
  // (3) Exit: my stores released, the peers' acquired.
  if (p.breakMode != kBreakBarrier && !ncclext::dev::lsaBarrierSync(cta, p.bar, blockIdx.x)) return;
  // (4) Check what arrived: peers' slots first and from the top down (what a peer writes last), so that a missing
  // exit barrier is caught rather than hidden by the time my own slot takes to check.
  const uint64_t* local = static_cast<const uint64_t*>(p.bar.peers.local(0));
  unsigned long long bad = 0;
  for (int k = n - 1; k >= 0; k--) {
    const int src = (me + k) % n;
    for (size_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
      const size_t i = hi - 1 - (j - lo);
      bad += local[(size_t)src * p.slotElems + i] != pattern(p.iter, src, me, i);
    }
  }
  if (bad) atomicAdd(p.errors, bad);
}

// The timeout test's waits: with peers, one barrier that the silent rank never joins; alone, a flag nobody writes.
__global__ void timeoutKernel(LsaBarrier bar, int alone) {
  ncclext::dev::CoopCta cta;
  if (alone) {
    if (threadIdx.x == 0) {
      const uint64_t* flag = static_cast<const uint64_t*>(bar.peers.local(bar.flagsOffset));
      ncclext::dev::waitFlagAtLeast(flag, 1, bar.wait, bar.wait.rank, ncclext::kSiteFlag, 0);
    }
    return;
  }
  ncclext::dev::lsaBarrierSync(cta, bar, 0);
}

#define TEST_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s failed: %s\n", ctx.rank, #call, ncclext::lastError()); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

// Everything a test needs on one rank: the domain, its window with the barrier flags after `dataBytes`, epochs, the
// error word. Members are destroyed in reverse order: the window before the domain's communicators.
struct Fixture {
  std::unique_ptr<ncclext::Domain> domain;
  std::unique_ptr<ncclext::SymmetricMemory> mem;
  std::unique_ptr<ncclext::DeviceStatus> status;
  uint64_t* epochs = nullptr;  // stream-ordered: a cudaFree would wait for the other virtual ranks' kernels
  cudaStream_t stream = nullptr;
  LsaBarrier bar{};
  ~Fixture() {
    if (epochs) cudaFreeAsync(epochs, stream);
  }
};

ncclResult_t makeFixture(ncclext::harness::RankContext& ctx, size_t dataBytesPerRank, int nBarriers,
                         double timeoutSeconds, Fixture* f) {
  ncclext::DomainOptions dopt;
  dopt.virt = ctx.virt;
  dopt.virtualRank = ctx.localRank;
  dopt.rail = ctx.rail;
  dopt.timeoutSeconds = 60;
  NCCLEXT_CHECK(ncclext::Domain::create(ctx.comm, dopt, &f->domain));
  const ncclext::Topology& t = f->domain->topo();
  NCCLEXT_CHECK(ncclext::DeviceStatus::create(&f->status));
  ncclext::SymmetricMemoryOptions o;
  o.bytes = dataBytesPerRank * t.domainSize + LsaBarrier::flagBytes(nBarriers, t.domainSize);
  NCCLEXT_CHECK(ncclext::SymmetricMemory::create(*f->domain, o, ctx.stream, &f->mem));
  f->stream = ctx.stream;
  NCCLEXT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&f->epochs), sizeof(uint64_t) * nBarriers, ctx.stream));
  NCCLEXT_CUDA(cudaMemsetAsync(f->epochs, 0, sizeof(uint64_t) * nBarriers, ctx.stream));
  NCCLEXT_CUDA(cudaStreamSynchronize(ctx.stream));
  f->bar.peers = f->mem->peers();
  f->bar.flagsOffset = dataBytesPerRank * t.domainSize;
  f->bar.epochs = f->epochs;
  f->bar.lsaRank = t.domainRank;
  f->bar.lsaSize = t.domainSize;
  f->bar.worldRankOfLsa0 = t.rank - t.domainRank;
  f->bar.wait.err = f->status->sink();
  f->bar.wait.timeoutNs = (uint64_t)(timeoutSeconds * 1e9);
  f->bar.wait.rank = t.rank;
  return ncclSuccess;
}

using ncclext::harness::sumOverRanks;

// The rail part of the smoke test: rank (domain d, index i) sends pattern(iter, d, d', j) to (d', i) for every other
// domain d' and checks what (d', i) sent it. False on a mismatch; errors counted in *bad.
ncclResult_t railExchange(ncclext::harness::RankContext& ctx, const Fixture& f, const Options& o, uint32_t iter,
                          unsigned long long* bad, double budgetSeconds = 60) {
  const ncclext::Topology& t = f.domain->topo();
  ncclComm_t rail = f.domain->railComm();
  if (!rail) return ncclSuccess;
  const size_t n = o.railElems, bytes = n * sizeof(uint64_t);
  std::vector<uint64_t> send((size_t)t.nDomains * n), recv((size_t)t.nDomains * n, kPoison);
  // The pattern names my index in my domain too (the same as my rail peers'): a rail that linked ranks of different
  // indices (the mixed mode's rails are one communicator per index) would deliver the wrong pattern.
  const uint32_t tag = iter + 1000003u * (uint32_t)t.domainRank;
  for (int d = 0; d < t.nDomains; d++)
    for (size_t i = 0; i < n; i++) send[(size_t)d * n + i] = pattern(tag, t.domainIndex, d, i);
  uint64_t *dSend = nullptr, *dRecv = nullptr;
  NCCLEXT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&dSend), bytes * t.nDomains, ctx.stream));
  NCCLEXT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&dRecv), bytes * t.nDomains, ctx.stream));
  NCCLEXT_CUDA(cudaMemcpyAsync(dSend, send.data(), bytes * t.nDomains, cudaMemcpyHostToDevice, ctx.stream));
  NCCLEXT_CUDA(cudaMemcpyAsync(dRecv, recv.data(), bytes * t.nDomains, cudaMemcpyHostToDevice, ctx.stream));
  NCCLEXT_NCCL(ncclGroupStart());
  for (int d = 0; d < t.nDomains; d++) {
    if (d == t.domainIndex) continue;
    NCCLEXT_NCCL(ncclSend(dSend + (size_t)d * n, bytes, ncclUint8, d, rail, ctx.stream));
    NCCLEXT_NCCL(ncclRecv(dRecv + (size_t)d * n, bytes, ncclUint8, d, rail, ctx.stream));
  }
  NCCLEXT_NCCL(ncclGroupEnd());
  // Bounded wait first: a copy to pageable memory queued behind a peer that is gone would block for ever.
  NCCLEXT_CHECK(ncclext::copyToHostAfter(ctx.stream, recv.data(), dRecv, bytes * t.nDomains, budgetSeconds,
                                         "rail exchange"));
  cudaFreeAsync(dSend, ctx.stream);
  cudaFreeAsync(dRecv, ctx.stream);
  for (int d = 0; d < t.nDomains; d++) {
    if (d == t.domainIndex) continue;
    for (size_t i = 0; i < n; i++)
      if (recv[(size_t)d * n + i] != pattern(tag, d, t.domainIndex, i) && (*bad)++ < 3)
        fprintf(stderr, "rank %d: rail from domain %d elem %zu: got %016llx\n", ctx.rank, d, i,
                (unsigned long long)recv[(size_t)d * n + i]);
  }
  return ncclSuccess;
}

int runSmoke(ncclext::harness::RankContext& ctx, const Options& o) {
  Fixture f;
  TEST_CHECK(makeFixture(ctx, o.slotElems * sizeof(uint64_t), o.ctas, 60.0, &f));
  const ncclext::Topology& topo = f.domain->topo();
  const int n = topo.domainSize, me = topo.domainRank;
  const size_t dataBytes = (size_t)n * o.slotElems * sizeof(uint64_t);
  unsigned long long* dErrors = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&dErrors), sizeof(*dErrors), ctx.stream) != cudaSuccess ||
      cudaMemsetAsync(dErrors, 0, sizeof(*dErrors), ctx.stream) != cudaSuccess)
    return 1;
  unsigned long long railBad = 0;

  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < o.iters; it++) {
    // Poison my data, then a barrier of the domain so that no peer pushes before my poison has landed.
    if (cudaMemsetAsync(f.mem->localPtr(), 0xff, dataBytes, ctx.stream) != cudaSuccess) return 1;
    if (cudaStreamSynchronize(ctx.stream) != cudaSuccess) return 1;
    TEST_CHECK(f.domain->barrier());
    SmokeParams p{f.bar, o.slotElems, (uint32_t)it, dErrors, o.breakMode};
    TEST_CHECK(ncclext::launchKernel("smokeKernel", smokeKernel, dim3(o.ctas), dim3(o.threads), 0, ctx.stream, p));
    TEST_CHECK(ncclext::waitStream(ctx.stream, 60, "smoke kernel", f.status.get()));
    TEST_CHECK(railExchange(ctx, f, o, (uint32_t)it, &railBad));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Host oracle on the last iteration: every element of every slot.
  std::vector<uint64_t> host(dataBytes / sizeof(uint64_t));
  unsigned long long devBad = 0;
  if (cudaMemcpyAsync(host.data(), f.mem->localPtr(), dataBytes, cudaMemcpyDeviceToHost, ctx.stream) != cudaSuccess ||
      cudaMemcpyAsync(&devBad, dErrors, sizeof(devBad), cudaMemcpyDeviceToHost, ctx.stream) != cudaSuccess ||
      cudaStreamSynchronize(ctx.stream) != cudaSuccess)
    return 1;
  cudaFreeAsync(dErrors, ctx.stream);
  unsigned long long hostBad = 0, firstShown = 0;
  const uint32_t last = o.iters - 1;
  for (int src = 0; src < n; src++) {
    for (size_t i = 0; i < o.slotElems; i++) {
      const uint64_t want = pattern(last, src, me, i), got = host[(size_t)src * o.slotElems + i];
      if (got != want) {
        if (firstShown++ < 5)
          fprintf(stderr, "rank %d: slot %d elem %zu: got %016llx want %016llx%s\n", ctx.rank, src, i,
                  (unsigned long long)got, (unsigned long long)want, got == kPoison ? " (poison)" : "");
        hostBad++;
      }
    }
  }
  uint64_t total = 0;
  TEST_CHECK(sumOverRanks(ctx, hostBad + devBad + railBad, &total, 60));
  TEST_CHECK(f.domain->barrier());  // nobody touches a peer's window after this
  const bool pass = total == 0;
  printf("rank %d: smoke %d ranks (%s: %d domain(s) of %d), %d iterations, %zu B per LSA peer, %zu B per rail peer: "
         "device errors %llu, host errors %llu, rail errors %llu, all ranks %llu -> %s\n",
         ctx.rank, ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), topo.nDomains, n, o.iters, o.slotElems * 8,
         f.domain->railComm() ? o.railElems * 8 : (size_t)0, devBad, hostBad, railBad, (unsigned long long)total,
         pass ? "PASS" : "FAIL");
  if (ctx.rank == 0) {
    int v = 0;
    ncclGetVersion(&v);
    char line[640];
    snprintf(line, sizeof(line),
             "{\"test\": \"symmem_smoke\", \"nranks\": %d, \"mode\": \"%s\", \"domains\": %d, \"pass\": %s, "
             "\"iters\": %d, \"ctas\": %d, \"bytes_per_peer\": %zu, \"rail_bytes_per_peer\": %zu, "
             "\"elements_checked_per_rank\": %zu, \"errors\": %llu, \"seconds\": %.3f, \"nccl_runtime\": %d, "
             "\"nccl_built\": %d}",
             ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), topo.nDomains, pass ? "true" : "false", o.iters,
             o.ctas, o.slotElems * 8, f.domain->railComm() ? o.railElems * 8 : (size_t)0, (size_t)n * o.slotElems,
             (unsigned long long)total, seconds, v, NCCL_VERSION_CODE);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return pass ? 0 : 1;
}

int runTimeout(ncclext::harness::RankContext& ctx, const Options& o) {
  Fixture f;
  TEST_CHECK(makeFixture(ctx, 0, 1, o.timeoutSeconds, &f));
  const ncclext::Topology& topo = f.domain->topo();
  const bool alone = topo.domainSize == 1;
  const int silent = topo.rank - topo.domainRank + topo.domainSize - 1;  // the last rank of my domain
  unsigned long long bad = 0;
  double waited = 0;
  if (alone || ctx.rank != silent) {
    const auto t0 = std::chrono::steady_clock::now();
    TEST_CHECK(ncclext::launchKernel("timeoutKernel", timeoutKernel, dim3(1), dim3(128), 0, ctx.stream, f.bar,
                                     (int)alone));
    const ncclResult_t res = ncclext::waitStream(ctx.stream, o.timeoutSeconds, "timeout test", f.status.get());
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string msg = ncclext::lastError();
    const std::string wantPeer = "peer " + std::to_string(alone ? ctx.rank : silent);
    const bool okCode = res == ncclRemoteError;
    const bool okMsg = msg.find("timed out") != std::string::npos && msg.find(wantPeer) != std::string::npos;
    const bool okTime = waited >= o.timeoutSeconds * 0.99 && waited <= o.timeoutSeconds + 5.0;
    // The stream, not the device: other virtual ranks' kernels share the device and may still be waiting.
    const cudaError_t sticky = cudaStreamSynchronize(ctx.stream);
    const bool okGpu = sticky == cudaSuccess && cudaGetLastError() == cudaSuccess;
    printf("rank %d: wait returned %s after %.2f s (budget %.2f s): \"%s\"; GPU %s\n", ctx.rank,
           ncclGetErrorString(res), waited, o.timeoutSeconds, msg.c_str(), okGpu ? "usable" : "in error");
    bad = !(okCode && okMsg && okTime && okGpu);
  }
  uint64_t total = 0;
  TEST_CHECK(sumOverRanks(ctx, bad, &total, o.timeoutSeconds + 60));  // the silent rank waits here meanwhile
  const bool pass = total == 0;
  printf("rank %d: timeout %d ranks (%s) -> %s\n", ctx.rank, ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode),
         pass ? "PASS" : "FAIL");
  if (ctx.rank == 0) {
    char line[320];
    snprintf(line, sizeof(line),
             "{\"test\": \"symmem_timeout\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"budget_s\": %.3f, "
             "\"waited_s\": %.3f}",
             ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), pass ? "true" : "false", o.timeoutSeconds, waited);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return pass ? 0 : 1;
}

// Virtual ranks (threads of one process): survivors that have seen the death and drained their stream. Nobody frees
// a window before every survivor's kernels have stopped touching it.
std::atomic<int> gSurvivorsDrained{0};

bool waitForSurvivors(int survivors, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (gSurvivorsDrained.load() < survivors) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

int runDeadPeer(ncclext::harness::RankContext& ctx, const Options& o) {
  const int victim = ctx.nRanks - 1;
  const bool virt = ctx.virt != nullptr;
  Fixture f;
  TEST_CHECK(makeFixture(ctx, o.slotElems * sizeof(uint64_t), o.ctas, o.timeoutSeconds, &f));
  unsigned long long* dErrors = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&dErrors), sizeof(*dErrors), ctx.stream) != cudaSuccess ||
      cudaMemsetAsync(dErrors, 0, sizeof(*dErrors), ctx.stream) != cudaSuccess)
    return 1;
  using Clock = std::chrono::steady_clock;
  auto lastOk = Clock::now();
  ncclResult_t seen = ncclSuccess;
  std::string msg;
  unsigned long long railBad = 0;
  int it = 0;
  for (; it < o.iters; it++) {
    if (ctx.rank == victim && it == o.dieAt) {
      if (!virt) {
        fprintf(stderr, "rank %d: dying now (iteration %d)\n", ctx.rank, it);
        fflush(stderr);
        kill(getpid(), SIGKILL);
      }
      // A dead thread makes no more calls; its window stays until every survivor has drained.
      const bool drained = waitForSurvivors(ctx.nRanks - 1, 4 * o.timeoutSeconds + 60);
      cudaFreeAsync(dErrors, ctx.stream);
      ctx.peerDied = true;
      printf("rank %d: the victim (stopped at iteration %d); survivors drained: %s\n", ctx.rank, it,
             drained ? "yes" : "NO");
      return drained ? 0 : 1;
    }
    SmokeParams p{f.bar, o.slotElems, (uint32_t)it, dErrors, kBreakNone};
    ncclResult_t r = ncclext::launchKernel("smokeKernel", smokeKernel, dim3(o.ctas), dim3(o.threads), 0, ctx.stream, p);
    if (r == ncclSuccess)
      r = ncclext::waitStream(ctx.stream, o.timeoutSeconds, "dead-peer smoke kernel", f.status.get());
    if (r == ncclSuccess) r = railExchange(ctx, f, o, (uint32_t)it, &railBad, o.timeoutSeconds);
    if (r != ncclSuccess) {
      seen = r;
      msg = ncclext::lastError();
      break;
    }
    lastOk = Clock::now();
  }
  const double noticed = std::chrono::duration<double>(Clock::now() - lastOk).count();
  // Teardown: the domain (and rail) communicators aborted first, which ends NCCL's kernels that wait for the dead
  // peer; then my kernels have ended too (every wait of theirs is bounded by the budget).
  const auto t0 = Clock::now();
  if (f.domain->abort()) f.mem->abandon();
  const ncclResult_t drained = ncclext::waitStream(ctx.stream, o.timeoutSeconds + ncclext::kHostMarginSeconds,
                                                   "dead-peer teardown");
  printf("rank %d: noticed %s after %.2f s; domain aborted, stream %s\n", ctx.rank, ncclGetErrorString(seen),
         noticed, drained == ncclSuccess ? "drained" : "NOT drained");
  fflush(stdout);
  if (virt) gSurvivorsDrained.fetch_add(1);
  const bool allDrained = !virt || waitForSurvivors(ctx.nRanks - 1, 2 * o.timeoutSeconds + 30);
  if (drained == ncclSuccess && allDrained) {  // else a kernel may still touch them: leave them to the exit
    cudaFreeAsync(dErrors, ctx.stream);
    f.mem.reset();
    f.domain.reset();
  } else {
    f.mem.release();
    f.domain.release();
  }
  const double teardown = std::chrono::duration<double>(Clock::now() - t0).count();
  ctx.peerDied = true;
  const double bound = o.timeoutSeconds + ncclext::kHostMarginSeconds + 2;
  const bool ok = (seen == ncclRemoteError || seen == ncclSystemError) && it == o.dieAt && noticed <= bound &&
                  drained == ncclSuccess && allDrained && railBad == 0;
  printf("rank %d: dead peer (%s, %d ranks): after iteration %d -> %s %.2f s after the last good one (bound %.1f s): "
         "\"%s\"; torn down in %.2f s -> %s\n",
         ctx.rank, ncclext::harness::oneGpuName(ctx.mode), ctx.nRanks, it, ncclGetErrorString(seen), noticed, bound,
         msg.c_str(), teardown, ok ? "PASS" : "FAIL");
  if (ctx.rank == 0) {
    char line[320];
    snprintf(line, sizeof(line),
             "{\"test\": \"symmem_dead_peer\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"die_at\": %d, "
             "\"noticed_s\": %.3f, \"teardown_s\": %.3f, \"budget_s\": %.3f}",
             ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), ok ? "true" : "false", o.dieAt, noticed, teardown,
             o.timeoutSeconds);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return ok ? 0 : 1;
}

bool parse(int argc, char** argv, Options* o) {
  ncclext::harness::Cli cli(argv[0]);
  cli.option("test", &o->test, "smoke|timeout|dead-peer|all");
  cli.option("nranks", &o->nRanks);
  cli.oneGpu(&o->oneGpu, /*mixedToo=*/true);
  cli.option("domain-size", &o->domainSize);
  cli.option("rail-elems", &o->railElems);
  cli.option("iters", &o->iters);
  cli.option("ctas", &o->ctas);
  cli.option("threads", &o->threads);
  cli.option("slot-elems", &o->slotElems);
  cli.option("timeout-s", &o->timeoutSeconds);
  cli.option("die-at", &o->dieAt);
  cli.custom("break", "store|barrier", [o](const char* s) {
    if (!strcmp(s, "store")) o->breakMode = kBreakStore;
    else if (!strcmp(s, "barrier")) o->breakMode = kBreakBarrier;
    else return false;
    return true;
  });
  cli.option("json", &o->json);
  if (!cli.parse(argc, argv)) return false;
  const bool deadPeer = o->test == "dead-peer";
  if (!cli.require(!deadPeer || (o->nRanks >= 2 && o->dieAt >= 0 && o->dieAt < o->iters),
                   "--test dead-peer needs --nranks >= 2 and 0 <= --die-at < --iters"))
    return false;
  if (!cli.require(!deadPeer || o->oneGpu != ncclext::harness::OneGpu::kMixed,
                   "--test dead-peer does not run in the mixed mode"))
    return false;
  return cli.require(o->test == "smoke" || o->test == "timeout" || deadPeer || o->test == "all", "unknown --test") &&
         cli.require(o->nRanks >= 0 && o->iters >= 1 && o->railElems >= 1 && o->ctas >= 1 && o->threads >= 32 &&
                         o->threads <= 1024 && o->slotElems >= 1 && o->timeoutSeconds > 0,
                     "a count out of range (iters, rail-elems, ctas, slot-elems >= 1; 32 <= threads <= 1024; "
                     "timeout-s > 0)");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = o.nRanks;
  lo.oneGpu = o.oneGpu;
  lo.domainSize = o.domainSize;
  if (o.test == "dead-peer") lo.mayDie = o.nRanks - 1;
  return ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) {
    if (o.test == "dead-peer") return runDeadPeer(ctx, o);
    int rc = 0;
    if (o.test == "smoke" || o.test == "all") rc |= runSmoke(ctx, o);
    if (o.test == "timeout" || o.test == "all") rc |= runTimeout(ctx, o);
    return rc;
  });
}
