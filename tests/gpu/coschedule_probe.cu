// coschedule_probe: whether the kernels of N streams of one process, launched from N host threads as the one-GPU
// virtual ranks launch theirs, run at once under whatever runs the process (make gpu-sanitize runs it under each
// compute-sanitizer tool, beside the rows of virtual ranks).
//
//   coschedule_probe [--nranks N] [--one-gpu off|virtual|mixed] [--ctas C] [--threads T] [--rounds K] [--wait-s S]
//                    [--json FILE]
//
// Thread r runs K rounds on its own stream, one kernel of C CTAs a round, waiting for each before the next (as the
// tests wait for each call). CTA b of round k publishes k into its flag, then waits until CTA b of every other
// thread's kernel has published k too: a budget of S seconds on %globaltimer, after which it counts a stall and
// ends. No call or kernel of the libraries runs: a stall shows the runner holding back a CTA that another kernel's CTA
// waits for (the kernels always end, since the held CTA finds every flag published once it runs). The flags are
// published and read with the libraries' own primitives (common/device/sync.cuh: release and acquire at system scope,
// %globaltimer). The threads stop after the round in which any CTA stalled. Exit 0 when no CTA stalled.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/device/sync.cuh"
#include "tests/harness/cli.h"
#include "tests/harness/cuda_check.h"

namespace {

struct Probe {
  uint64_t* flags;          // [ctas][nRanks]: the last round CTA b of rank r published
  unsigned long long* out;  // [nRanks][3], mapped host memory: stalls, the first stalled round, the flag seen there
  int rank, nRanks;
  uint64_t round, budgetNs;
};

__global__ void probeKernel(Probe p) {
  if (threadIdx.x == 0) {
    uint64_t* row = p.flags + (size_t)blockIdx.x * p.nRanks;
    ncclext::dev::storeRelease(&row[p.rank], p.round);
    const uint64_t t0 = ncclext::dev::globalTimerNs();
    for (int r = 0; r < p.nRanks; r++) {
      if (r == p.rank) continue;
      uint64_t seen;
      while ((seen = ncclext::dev::loadAcquire(&row[r])) < p.round) {
        if (ncclext::dev::globalTimerNs() - t0 > p.budgetNs) {
          unsigned long long* mine = p.out + (size_t)p.rank * 3;
          if (atomicAdd(&mine[0], 1ull) == 0) {
            mine[1] = p.round;
            mine[2] = seen;
          }
          __threadfence_system();
          break;
        }
        __nanosleep(256);
      }
    }
  }
  __syncthreads();
}

struct Options {
  int nRanks = 2, ctas = 4, threads = 256, rounds = 50;
  double waitSeconds = 5;
  std::string json;
};

bool parse(int argc, char** argv, Options* o) {
  ncclext::harness::Cli cli(argv[0]);
  ncclext::harness::OneGpu mode = ncclext::harness::OneGpu::kOff;
  cli.option("nranks", &o->nRanks);
  cli.oneGpu(&mode, /*mixedToo=*/true);
  cli.option("ctas", &o->ctas);
  cli.option("threads", &o->threads);
  cli.option("rounds", &o->rounds);
  cli.option("wait-s", &o->waitSeconds);
  cli.option("json", &o->json);
  if (!cli.parse(argc, argv)) return false;
  return cli.require(mode != ncclext::harness::OneGpu::kNodes,
                     "--one-gpu nodes: the probe's ranks are threads of one process (off, virtual or mixed)") &&
         cli.require(o->nRanks >= 1 && o->nRanks <= 64, "--nranks must be in [1, 64]") &&
         cli.require(o->ctas >= 1 && o->ctas <= 1024, "--ctas must be in [1, 1024]") &&
         cli.require(o->threads >= 32 && o->threads <= 1024 && o->threads % 32 == 0,
                     "--threads must be a multiple of 32 in [32, 1024]") &&
         cli.require(o->rounds >= 1, "--rounds must be >= 1") &&
         cli.require(o->waitSeconds > 0, "--wait-s must be > 0");
}

using ncclext::harness::cudaOk;

bool anyStall(const Options& o, const volatile unsigned long long* out) {
  for (int r = 0; r < o.nRanks; r++)
    if (out[3 * r]) return true;
  return false;
}

// Thread `rank`: its rounds on a stream of its own, until one stalls. False on a CUDA error or a stream that outlived
// its bound.
bool runRank(const Options& o, int rank, uint64_t* flags, unsigned long long* out, std::atomic<int>* ready,
             int* roundsRun) {
  cudaStream_t s = nullptr;
  const bool made = cudaOk(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  ready->fetch_add(1);  // (also on failure: the others wait for every thread here)
  if (!made) return false;
  while (ready->load() < o.nRanks) std::this_thread::yield();  // every thread's first launch at about the same time
  bool ok = true;
  // A round's kernel ends within the budget a peer (every CTA's waits together), plus the runner's own slowness.
  const double bound = o.waitSeconds * o.nRanks + 60;
  for (int k = 1; ok && k <= o.rounds && !anyStall(o, out); k++) {
    Probe p{flags, out, rank, o.nRanks, (uint64_t)k, (uint64_t)(o.waitSeconds * 1e9)};
    probeKernel<<<o.ctas, o.threads, 0, s>>>(p);
    ok = cudaOk(cudaGetLastError(), "probeKernel launch");
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound);
    cudaError_t e = cudaErrorNotReady;
    while (ok && (e = cudaStreamQuery(s)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > until) {
        fprintf(stderr, "rank %d: round %d's kernel still running after %.0f s\n", rank, k, bound);
        return false;  // the stream is left as it is: destroying it would wait for the kernel
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ok = ok && cudaOk(e, "cudaStreamQuery");
    *roundsRun = k;
  }
  return cudaOk(cudaStreamDestroy(s), "cudaStreamDestroy") && ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  uint64_t* flags = nullptr;
  unsigned long long* out = nullptr;  // mapped host memory, zeroed
  const size_t flagBytes = sizeof(uint64_t) * o.ctas * o.nRanks, outBytes = sizeof(unsigned long long) * 3 * o.nRanks;
  if (!cudaOk(cudaMalloc(&flags, flagBytes), "cudaMalloc") || !cudaOk(cudaMemset(flags, 0, flagBytes), "cudaMemset") ||
      !cudaOk(cudaHostAlloc(&out, outBytes, cudaHostAllocMapped), "cudaHostAlloc"))
    return 1;
  memset(out, 0, outBytes);
  std::atomic<int> ready{0};
  std::vector<char> ok(o.nRanks, 0);
  std::vector<int> roundsRun(o.nRanks, 0);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < o.nRanks; r++)
    threads.emplace_back([&, r] { ok[r] = runRank(o, r, flags, out, &ready, &roundsRun[r]); });
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool allOk = true;
  for (char c : ok) allOk = allOk && c;
  const unsigned long long* h = out;  // every kernel has ended
  unsigned long long stalls = 0, firstRound = 0;
  int rounds = 0;
  for (int k : roundsRun) rounds = std::max(rounds, k);
  for (int r = 0; r < o.nRanks; r++) {
    const unsigned long long* m = &h[3 * r];
    stalls += m[0];
    if (m[0] && (!firstRound || m[1] < firstRound)) firstRound = m[1];
    if (m[0])
      fprintf(stderr,
              "rank %d: %llu CTA wait(s) timed out after %.1f s, the first in round %llu (a peer's flag expected >= "
              "%llu, seen %llu): a CTA of another stream's kernel did not run meanwhile\n",
              r, m[0], o.waitSeconds, m[1], m[1], m[2]);
  }
  const bool pass = allOk && stalls == 0;
  printf(
      "coschedule_probe: %d ranks (threads of one process, a stream each), %d of %d rounds of %d CTAs x %d "
      "threads: %llu stalled CTA wait(s) in %.2f s -> %s\n",
      o.nRanks, rounds, o.rounds, o.ctas, o.threads, stalls, seconds, pass ? "PASS" : "FAIL");
  char line[320];
  snprintf(line, sizeof(line),
           "{\"test\": \"coschedule_probe\", \"nranks\": %d, \"ctas\": %d, \"threads\": %d, \"rounds\": %d, "
           "\"rounds_run\": %d, \"wait_s\": %.1f, \"stalls\": %llu, \"first_stalled_round\": %llu, \"seconds\": %.3f, "
           "\"pass\": %s}",
           o.nRanks, o.ctas, o.threads, o.rounds, rounds, o.waitSeconds, stalls, firstRound, seconds,
           pass ? "true" : "false");
  if (!ncclext::harness::writeJsonLine(o.json, line)) allOk = false;
  cudaFree(flags);
  cudaFreeHost(out);
  return pass && allOk ? 0 : 1;
}
