// The GPU tests' soak (--soak CALLS): memory measured with every rank at the same point, so that a run of many
// dispatch + combine pairs can show the device and host memory flat. Header-only; used by ep_ht_test and ep_ll_test.
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "common/device_status.h"
#include "common/status.h"
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
// measured between two barriers of every rank, after `stream` drained and the default memory pool gave back what
// it holds unused. False (with a message) when a wait or a CUDA call fails.
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
  *rss = residentBytes();
  if (barrier(ctx, 60) != ncclSuccess) return false;
  if (!ok) fprintf(stderr, "rank %d soak: cudaMemGetInfo failed\n", ctx.rank);
  return ok;
}

}  // namespace ncclext::harness
