// The GPU tests' soak (--soak CALLS): memory measured with every rank at the same point, so that a run of many
// dispatch + combine pairs can show the device and host memory flat. Header-only; used by ep_ht_test and ep_ll_test.
#pragma once

#include <cuda_runtime.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/device_status.h"
#include "common/status.h"
#include "tests/harness/cli.h"
#include "tests/harness/launcher.h"

namespace ncclext::harness {

constexpr int kSoakHandleEvery = 50;  // pairs per handle: then a new routing on a new handle
constexpr int kSoakCheckEvery = 97;   // prime to kSoakHandleEvery: checked pairs fall at every position of a handle
// Pairs per group where every pair opens a handle of its own (ep_ht_test): virtual ranks keep the memory a handle
// frees until its group goes (docs/ARCHITECTURE.md, "One GPU, many ranks"), so the soak makes a new group this often.
constexpr int kSoakPairsPerGroup = 500;
constexpr int64_t kSoakDeviceTolerance = 1 << 20;  // bytes: growth of the GPU's used memory
constexpr int64_t kSoakRssTolerance = 16 << 20;    // bytes: growth of this process's resident set

// This process's resident bytes (/proc/self/statm), or -1.
inline int64_t residentBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : (int64_t)resident * sysconf(_SC_PAGESIZE);
}

// What a soak reports: its counts, time and the growths between its two measures.
struct SoakNumbers {
  int calls = 0, handles = 0, checks = 0;
  double seconds = 0;
  int64_t deviceUsed0 = 0, deviceUsed1 = 0, rss0 = 0, rss1 = 0;
  int64_t deviceGrowth() const { return deviceUsed1 - deviceUsed0; }
  int64_t rssGrowth() const { return rss1 - rss0; }
  bool flat() const { return deviceGrowth() <= kSoakDeviceTolerance && rssGrowth() <= kSoakRssTolerance; }
};

// The GPU's used bytes (every process's: one-GPU nodes and virtual ranks share it) and this process's resident bytes,
// measured between two barriers of every rank, after `stream` drained, the default memory pool gave back what it
// holds unused and the C heap its free pages (malloc_trim): what is resident is then what is live, not what an
// allocator keeps for later. False (with a message) when a wait or a CUDA call fails.
inline bool measureMemory(RankContext& ctx, double waitSeconds, int64_t* deviceUsed, int64_t* rss) {
  if (ncclext::waitStream(ctx.stream, waitSeconds, "soak: memory measure") != ncclSuccess) {
    fprintf(stderr, "rank %d soak: the stream did not drain: %s\n", ctx.rank, ncclext::lastError());
    return false;
  }
  int dev = 0;
  cudaMemPool_t pool = nullptr;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
      cudaMemPoolTrimTo(pool, 0) != cudaSuccess) {
    fprintf(stderr, "rank %d soak: trimming the default memory pool failed\n", ctx.rank);
    return false;
  }
  if (barrier(ctx, 60) != ncclSuccess) return false;
  size_t freeBytes = 0, totalBytes = 0;
  const bool ok = cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess;
  *deviceUsed = (int64_t)(totalBytes - freeBytes);
  malloc_trim(0);
  *rss = residentBytes();
  if (barrier(ctx, 60) != ncclSuccess) return false;
  if (!ok) fprintf(stderr, "rank %d soak: cudaMemGetInfo failed\n", ctx.rank);
  return ok;
}

// The soak's verdict over the ranks: no error on any rank (`errors`: its checks, calls and CUDA errors) and the
// memory flat on every rank. Then each rank's line, and rank 0's JSON line (test `test`; handleEvery / groupEvery /
// checkEvery: pairs per handle, per group (0: one group), between checks).
inline bool reportSoak(RankContext& ctx, const char* test, const std::string& caseName, const SoakNumbers& n,
                       int handleEvery, int groupEvery, int checkEvery, int errors, uint64_t seed,
                       const std::string& json) {
  uint64_t total = 0;
  const uint64_t mine = (uint64_t)errors + (n.flat() ? 0 : 1);
  if (sumOverRanks(ctx, mine, &total, 60) != ncclSuccess) total = 1 + mine;
  const bool pass = total == 0;
  const double usPerPair = n.calls ? n.seconds * 1e6 / n.calls : 0;
  printf(
      "rank %d: %s of %s: %d pairs, %d handles, %d checked, %.1f us a pair (checks included), device used "
      "%+lld B, resident %+lld B, %d errors, %s -> %s (seed %llu)\n",
      ctx.rank, test, caseName.c_str(), n.calls, n.handles, n.checks, usPerPair, (long long)n.deviceGrowth(),
      (long long)n.rssGrowth(), errors, oneGpuName(ctx.mode), pass ? "PASS" : "FAIL", (unsigned long long)seed);
  if (ctx.rank == 0) {
    char line[768];
    snprintf(line, sizeof(line),
             "{\"test\": \"%s\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"case\": \"%s\", "
             "\"calls\": %d, \"handle_every\": %d, \"handles\": %d, \"group_every\": %d, \"check_every\": %d, "
             "\"checks\": %d, \"seconds\": %.3f, \"us_per_pair\": %.1f, \"device_used_bytes\": [%lld, %lld], "
             "\"device_used_growth_bytes\": %lld, \"host_rss_bytes\": [%lld, %lld], \"host_rss_growth_bytes\": %lld, "
             "\"device_tolerance_bytes\": %lld, \"rss_tolerance_bytes\": %lld, \"errors\": %d, \"seed\": %llu}",
             test, ctx.nRanks, oneGpuName(ctx.mode), pass ? "true" : "false", caseName.c_str(), n.calls, handleEvery,
             n.handles, groupEvery, checkEvery, n.checks, n.seconds, usPerPair, (long long)n.deviceUsed0,
             (long long)n.deviceUsed1, (long long)n.deviceGrowth(), (long long)n.rss0, (long long)n.rss1,
             (long long)n.rssGrowth(), (long long)kSoakDeviceTolerance, (long long)kSoakRssTolerance, errors,
             (unsigned long long)seed);
    writeJsonLine(json, line);
  }
  return pass;
}

}  // namespace ncclext::harness
