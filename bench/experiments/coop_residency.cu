// Whether a kernel grid that fills the GPU can be made safe by a cooperative launch (issue 39's Low-Latency SM
// default; docs/PERFORMANCE.md, "SMs"). nccl_ep's kernels wait on CTAs of their own launch, so the whole grid must be
// resident at once. Three questions, each answered by a run that either finishes or times out (2 s, %globaltimer):
//   concurrent  two cooperative launches on two streams, half the SMs each, each waiting for the other to start
//               (what the virtual ranks' kernels need: every rank's kernel resident at once): "both ran" or
//               "serialised" (the first timed out);
//   waits       a kernel of one CTA that spins for 200 ms on another stream, then a cooperative launch of every SM
//               whose CTAs each wait for the last CTA: the grid starts whole once the spinner ends ("started whole":
//               its CTAs' start times within 50 ms) or part of it started before ("partial");
//   plain       the same with an ordinary launch of every SM: "partial" is the hazard the default of 64 avoids
//               (here the spinner ends by itself; a kernel that waited on this rank's peers would not).
// Every CTA takes over half an SM's shared memory, so that one fills an SM, as nccl_ep's do by their registers.
// One JSON line per question on stdout. Build and run on the GPU machine:
//   nvcc -std=c++17 -arch=sm_90 -o /tmp/coop bench/experiments/coop_residency.cu && /tmp/coop
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

__device__ unsigned long long nowNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits until *flag != 0, for at most `ns`; true if it came.
__device__ bool waitFlag(const volatile int* flag, unsigned long long ns) {
  const unsigned long long t0 = nowNs();
  while (*flag == 0)
    if (nowNs() - t0 > ns) return false;
  return true;
}

constexpr unsigned long long kTimeout = 2000000000ull;  // 2 s

// concurrent: CTA 0 raises `mine`, then every CTA waits for `theirs`; `late` counts the CTAs that timed out.
__global__ void pairKernel(int* mine, const int* theirs, int* late) {
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) atomicExch(mine, 1);
    if (!waitFlag(theirs, kTimeout)) atomicAdd(late, 1);
  }
}

// waits / plain: every CTA records when it started; the last CTA raises `start`, every CTA waits for it.
__global__ void gridKernel(int* start, int* late, unsigned long long* starts) {
  if (threadIdx.x == 0) {
    starts[blockIdx.x] = nowNs();
    if (blockIdx.x == gridDim.x - 1) atomicExch(start, 1);
    if (!waitFlag(start, kTimeout)) atomicAdd(late, 1);
  }
}

__global__ void spinKernel(unsigned long long ns) {
  const unsigned long long t0 = nowNs();
  while (nowNs() - t0 < ns) {
  }
}

int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    printf("{\"question\": \"%s\", \"error\": \"%s\"}\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

size_t smemPerCta = 0;  // over half an SM's: one CTA an SM

// Launches `kernel` on `grid` CTAs of 1024 threads, one an SM, cooperatively or not.
template <typename... A>
cudaError_t launch(void (*kernel)(A...), int grid, bool cooperative, cudaStream_t s, A... args) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemPerCta);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(1024);
  cfg.dynamicSmemBytes = smemPerCta;
  cfg.stream = s;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = cooperative ? 1 : 0;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace

int main() {
  int sms = 0, coop = 0, smemSm = 0, smemOptin = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0);
  cudaDeviceGetAttribute(&smemSm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0);
  cudaDeviceGetAttribute(&smemOptin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  smemPerCta = (size_t)smemSm / 2 + 4096;
  if (smemPerCta > (size_t)smemOptin) smemPerCta = smemOptin;
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  int* f = nullptr;  // [0..1] the pair's flags, [2] late CTAs, [3] the grid's start flag
  unsigned long long* starts = nullptr;
  if (check(cudaMalloc(&f, 4 * sizeof(int)), "setup") ||
      check(cudaMalloc(&starts, sms * sizeof(unsigned long long)), "setup"))
    return 1;
  std::vector<unsigned long long> hostStarts(sms);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  int late = 0, rc = 0;

  // concurrent
  cudaMemset(f, 0, 4 * sizeof(int));
  cudaDeviceSynchronize();
  if (check(launch(pairKernel, sms / 2, true, a, f, (const int*)f + 1, f + 2), "concurrent") ||
      check(launch(pairKernel, sms / 2, true, b, f + 1, (const int*)f, f + 2), "concurrent") ||
      check(cudaDeviceSynchronize(), "concurrent"))
    return 1;
  cudaMemcpy(&late, f + 2, sizeof(int), cudaMemcpyDeviceToHost);
  printf("{\"question\": \"concurrent\", \"sms\": %d, \"cooperative_launch\": %d, \"grid_each\": %d, "
         "\"late_ctas\": %d, \"answer\": \"%s\"}\n",
         sms, coop, sms / 2, late, late == 0 ? "both ran" : "serialised");

  // waits, then plain
  for (int cooperative = 1; cooperative >= 0; cooperative--) {
    const char* q = cooperative ? "waits" : "plain";
    cudaMemset(f, 0, 4 * sizeof(int));
    cudaDeviceSynchronize();
    if (check(launch(spinKernel, 1, false, b, 200000000ull), q)) return 1;
    cudaEventRecord(e0, a);
    if (check(launch(gridKernel, sms, cooperative == 1, a, f + 3, f + 2, starts), q)) return 1;
    cudaEventRecord(e1, a);
    if (check(cudaDeviceSynchronize(), q)) return 1;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaMemcpy(&late, f + 2, sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(hostStarts.data(), starts, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    const auto [lo, hi] = std::minmax_element(hostStarts.begin(), hostStarts.end());
    const double spreadMs = (*hi - *lo) / 1e6;
    printf("{\"question\": \"%s\", \"grid\": %d, \"smem_per_cta\": %zu, \"late_ctas\": %d, \"ms\": %.1f, "
           "\"start_spread_ms\": %.1f, \"answer\": \"%s\"}\n",
           q, sms, smemPerCta, late, ms, spreadMs, late == 0 && spreadMs < 50 ? "started whole" : "partial");
    rc |= (late != 0 || spreadMs >= 50) && cooperative;
  }
  cudaFree(f);
  cudaFree(starts);
  return rc;
}
