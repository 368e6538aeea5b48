// m2n_bench: nccl_m2n execute time for single tensors over layout pairs, beside baselines measured in the same run,
// one process per GPU through tests/harness, or on one GPU as N one-GPU nodes (--one-gpu nodes: every piece between
// ranks by ncclSend/ncclRecv over loopback sockets) or N virtual ranks (--one-gpu virtual: every piece over LSA
// through the plans' windows, all ranks sharing one GPU; neither measures NVLink).
//
// Tensors: bf16 [R, C], 1 MiB to 1 GiB ([256, 2048], [2048, 4096], [16384, 8192], [16384, 16384] = the 2-GPU
// issue's co-located case, [32768, 16384]; --large adds 4 GiB, --max-mib caps them). Layout pairs:
//   1 rank:   copy      Replicate -> Replicate (one contiguous local copy)
//             transpose Replicate -> Replicate into a column-major destination (a strided local copy)
//             to_fp8    Replicate bf16 -> Replicate fp8 e4m3 with one fp32 scale per 128 columns of a row (the
//                       quantiser, then the local copy of its bytes; checked byte for byte, scales too, against
//                       common/numeric.h's fp8QuantizeRow; baseline: the copy engine moving the bf16 source's bytes)
//             to_fp8_tiles  the same with one scale per 128 x 128 block (DeepSeek-V3's weight blocks; checked
//                       against the same definition over the block: its largest magnitude / 448, numeric.h's
//                       rounding)
//   N ranks:  s0_s1     Shard(0) -> Shard(1) over every rank (co-located)
//             s0_rep    Shard(0) -> Replicate over every rank
//             rep_s0    Replicate -> Shard(0) (every piece local)
//             tp4_tp2   Shard(1) over every rank -> Shard(1) over the first half (N >= 4: TP4 -> TP2)
// Each case: a plan (created once), a check of every destination element after the first execute (sources filled
// with a value that names the element, destinations poisoned first), then the median of the executes, each between
// its own pair of CUDA events on the rank's stream, after a harness barrier. Baselines in the same run, on the same
// ranks and bytes: 1 rank, the copy engine (cudaMemcpyAsync device to device) moving the tensor's bytes; one-GPU
// nodes and real ranks, one NCCL group of ncclSend/ncclRecv on the same communicator moving exactly the bytes the
// plan sends to and receives from each peer (ncclM2nHostPlanGetTransfers), between plain buffers; virtual ranks, the
// copy engine moving every rank's destination bytes (received and local) in one copy on rank 0, the others idle: the
// floor of the one GPU's memory that the ranks share (each rank timing a copy of its own bytes would depend on how
// the ranks' timing loops overlap: at 4 ranks rank 0 saw about two of the four at once). Bytes: each destination
// element once (GB/s per destination rank: the bytes it receives, its local copies included, over its median). Every
// rank times; rank 0 prints and writes one JSON line per case with its own median and the mean of every rank's
// median.
//
// Usage: m2n_bench [--nranks N] [--one-gpu off|nodes|virtual] [--lsa] [--zero-copy pull|push] [--iters I]
//                  [--max-mib M] [--min-mib M] [--case NAME] [--large] [--stages] [--json FILE]
// (--lsa: the plans' config lsa = 1 on real ranks; virtual ranks always use LSA. --zero-copy: the config's zeroCopy,
// with lsa; on real ranks the published side, sources for pull and destinations for push, lies in an ncclMemAlloc
// buffer of the same size on every rank, registered with ncclM2nRegister. --case / --min-mib: one case, the sizes
// from M MiB on: a profiler's run, bench/experiments/m2n_profile.sh. --stages: after the timed executes, as many
// again with ncclM2nPlanSetStageHookTesting recording an event after each stage; rank 0 prints the median GPU time
// of each stage, from the end of the one before, and the JSON line gets them as stages_us_rank0.) Exit: 0 pass, 1 a
// failure or a wrong element, 77 no GPU.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/timing.cuh"
#include "common/numeric.h"
#include "nccl_m2n.h"
#include "nccl_m2n_testing.h"
#include "tests/harness/cli.h"
#include "tests/harness/launcher.h"

namespace {

struct Options {
  int nRanks = 0, iters = 0, zeroCopy = NCCL_M2N_ZERO_COPY_OFF;
  bool lsa = false, large = false, stages = false;
  int64_t maxMiB = 1024, minMiB = 0;
  std::string json, only;  // --case: that case alone (a profiler's run)
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  ncclM2nVirtualDomain_t virt = nullptr;
};

// One side of a 2-D bf16 tensor: the mesh, the placement (or Replicate), and column-major local strides.
struct Side {
  std::vector<int> ranks;
  int placement = NCCL_M2N_REPLICATE;
  bool columnMajor = false;
};

struct Case {
  const char* name;
  Side src, dst;
};

// The public descriptors of one side, with the arrays they point into.
struct CSide {
  int64_t shape[2];
  int dims[1];
  std::vector<int> ranks;
  int placement[1];
  std::vector<int64_t> strides;
  ncclM2nMesh_t mesh = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t layout = NCCL_M2N_LAYOUT_INITIALIZER;
  void build(const Side& s, int64_t rows, int64_t cols) {
    shape[0] = rows;
    shape[1] = cols;
    ranks = s.ranks;
    dims[0] = (int)ranks.size();
    placement[0] = s.placement;
    mesh.ndims = 1;
    mesh.dims = dims;
    mesh.ranks = ranks.data();
    layout.ndims = 2;
    layout.globalShape = shape;
    layout.dtype = ncclBfloat16;
    layout.mesh = &mesh;
    layout.placements = placement;
    layout.localStrides = nullptr;
    if (s.columnMajor) {
      strides.clear();
      for (size_t pos = 0; pos < ranks.size(); pos++) {
        int64_t off[2], shp[2];
        int holds = 0;
        ncclM2nLayoutLocalBox(&layout, ranks[pos], off, shp, &holds);
        strides.push_back(1);
        strides.push_back(std::max<int64_t>(1, shp[0]));
      }
      layout.localStrides = strides.data();
    }
  }
};

// This rank's part of one side: its box and element strides.
struct Local {
  bool holds = false;
  int64_t off[2] = {0, 0}, shape[2] = {0, 0}, stride[2] = {0, 1};
  __host__ __device__ int64_t elements() const { return shape[0] * shape[1]; }
  int64_t span() const { return holds ? (shape[0] - 1) * stride[0] + (shape[1] - 1) * stride[1] + 1 : 0; }
};

Local localOf(const CSide& c, const Side& s, int rank) {
  Local l;
  int holds = 0;
  ncclM2nLayoutLocalBox(&c.layout, rank, l.off, l.shape, &holds);
  l.holds = holds && l.shape[0] > 0 && l.shape[1] > 0;
  l.stride[0] = s.columnMajor ? 1 : l.shape[1];
  l.stride[1] = s.columnMajor ? std::max<int64_t>(1, l.shape[0]) : 1;
  return l;
}

// The value of global element (r, c): a bf16 bit pattern that names it (16 bits of a hash; what matters is that a
// misplaced element is caught with high probability, and every element is checked).
__host__ __device__ inline uint16_t valueAt(int64_t r, int64_t c, uint32_t seed) {
  uint64_t x = (uint64_t)r * 0x9E3779B97F4A7C15ull ^ (uint64_t)c * 0xC2B2AE3D27D4EB4Full ^ seed;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (uint16_t)(x & 0x7f7f);  // never 0xffff (the poison)
}

__global__ void fillKernel(uint16_t* p, Local l, uint32_t seed) {
  const int64_t n = l.elements();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / l.shape[1], c = i % l.shape[1];
    p[r * l.stride[0] + c * l.stride[1]] = valueAt(l.off[0] + r, l.off[1] + c, seed);
  }
}

__global__ void checkKernel(const uint16_t* p, Local l, uint32_t seed, unsigned long long* wrong) {
  const int64_t n = l.elements();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / l.shape[1], c = i % l.shape[1];
    if (p[r * l.stride[0] + c * l.stride[1]] != valueAt(l.off[0] + r, l.off[1] + c, seed)) atomicAdd(wrong, 1ull);
  }
}

using ncclext::bench::median;
using ncclext::bench::timeCalls;

// The fp8 cases' checks. 1 x 128 blocks: one thread per 128-column block of a row quantises the bf16 source's
// block with numeric.h's reference (the definition the library promises) and counts every byte and scale that
// differs.
__global__ void checkFp8Kernel(const uint16_t* src, const uint8_t* q, const float* scales, int64_t rows, int64_t cols,
                               unsigned long long* wrong) {
  const int64_t blocks = cols / ncclext::kFp8BlockElems;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < rows * blocks;
       b += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = b / blocks, c0 = (b % blocks) * ncclext::kFp8BlockElems;
    float x[ncclext::kFp8BlockElems], s = 0;
    uint8_t want[ncclext::kFp8BlockElems];
    for (int i = 0; i < ncclext::kFp8BlockElems; i++) x[i] = ncclext::bf16ToFloat(src[r * cols + c0 + i]);
    ncclext::fp8QuantizeRow(x, ncclext::kFp8BlockElems, false, want, &s);
    unsigned long long bad = ncclext::floatBits(scales[b]) != ncclext::floatBits(s);
    for (int i = 0; i < ncclext::kFp8BlockElems; i++) bad += q[r * cols + c0 + i] != want[i];
    if (bad) atomicAdd(wrong, bad);
  }
}

// 128 x 128 blocks: one thread per block, its scale from the block's largest magnitude (numeric.h's
// fp8BlockScale) and every value divided by it and rounded with floatToE4m3, as fp8QuantizeRow does for a row.
__global__ void checkFp8TilesKernel(const uint16_t* src, const uint8_t* q, const float* scales, int64_t rows,
                                    int64_t cols, unsigned long long* wrong) {
  constexpr int64_t E = ncclext::kFp8BlockElems;
  const int64_t perRow = cols / E, blocks = rows / E * perRow;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r0 = b / perRow * E, c0 = b % perRow * E;
    float amax = 0.0f;
    for (int64_t r = r0; r < r0 + E; r++)
      for (int64_t c = c0; c < c0 + E; c++) {
        const float x = ncclext::bf16ToFloat(src[r * cols + c]), a = x < 0 ? -x : x;
        amax = a > amax ? a : amax;
      }
    const float s = ncclext::fp8BlockScale(amax, false);
    unsigned long long bad = ncclext::floatBits(scales[b]) != ncclext::floatBits(s);
    for (int64_t r = r0; r < r0 + E; r++)
      for (int64_t c = c0; c < c0 + E; c++)
        bad += q[r * cols + c] != ncclext::floatToE4m3(ncclext::bf16ToFloat(src[r * cols + c]) / s);
    if (bad) atomicAdd(wrong, bad);
  }
}

// Bytes as a bf16 bit pattern of a value in [-8, 8) (no NaN, no infinity: a quantiser's input), from valueAt.
__global__ void fillBf16Kernel(uint16_t* p, int64_t rows, int64_t cols, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = ((int)(valueAt(i / cols, i % cols, seed) & 0x3fff) - 8192) / 1024.0f;
    p[i] = (uint16_t)(ncclext::floatBits(v) >> 16);
  }
}

// Bytes this rank's plan sends to / receives from each peer, and its local bytes (the host planner's lists).
bool peerBytes(const ncclM2nTensorSpec_t& spec, int rank, int nRanks, std::vector<int64_t>* send,
               std::vector<int64_t>* recv, int64_t* local) {
  ncclM2nPlanConfig_t pc = NCCL_M2N_PLAN_CONFIG_INITIALIZER;
  pc.nRanks = nRanks;
  ncclM2nHostPlan_t hp = nullptr;
  if (ncclM2nHostPlanCreate(&hp, rank, 1, &spec, &pc) != ncclSuccess) return false;
  send->assign(nRanks, 0);
  recv->assign(nRanks, 0);
  *local = 0;
  for (ncclM2nTransferKind_t kind : {ncclM2nSends, ncclM2nRecvs, ncclM2nLocalCopies}) {
    const ncclM2nTransfer_t* t = nullptr;
    int64_t n = 0;
    ncclM2nHostPlanGetTransfers(hp, kind, &t, &n);
    for (int64_t i = 0; i < n; i++) {
      int64_t bytes = 2;
      for (int d = 0; d < t[i].ndims; d++) bytes *= t[i].extent[d];
      if (kind == ncclM2nSends) (*send)[t[i].dstRank] += bytes;
      else if (kind == ncclM2nRecvs) (*recv)[t[i].srcRank] += bytes;
      else *local += bytes;
    }
  }
  ncclM2nHostPlanDestroy(hp);
  return true;
}

#define BENCH_CHECK(cond, ...)                         \
  do {                                                 \
    if (!(cond)) {                                     \
      fprintf(stderr, "rank %d: ", ctx.rank);          \
      fprintf(stderr, __VA_ARGS__);                    \
      fprintf(stderr, "\n");                           \
      return 1;                                        \
    }                                                  \
  } while (0)

// A 1-rank fp8 case (see the header) for one shape, blocks of blockRows x 128 (1 or 128): plan, check, time, print
// and write its JSON line. False when a call failed; *wrong: the wrong bytes and scales.
bool fp8Case(ncclext::harness::RankContext& ctx, int64_t rows, int64_t cols, int blockRows, int iters, const char* gpu,
             FILE* js, unsigned long long* wrongDev, uint64_t* wrong) {
  const char* name = blockRows == 1 ? "to_fp8" : "to_fp8_tiles";
  int64_t shape[2] = {rows, cols};
  int dims[1] = {1}, ranks[1] = {0}, placement[1] = {NCCL_M2N_REPLICATE};
  ncclM2nMesh_t mesh = NCCL_M2N_MESH_INITIALIZER;
  mesh.ndims = 1;
  mesh.dims = dims;
  mesh.ranks = ranks;
  ncclM2nLayout_t src = NCCL_M2N_LAYOUT_INITIALIZER;
  src.ndims = 2;
  src.globalShape = shape;
  src.dtype = ncclBfloat16;
  src.mesh = &mesh;
  src.placements = placement;
  ncclM2nLayout_t dst = src;
  dst.dtype = ncclFloat8e4m3;
  const ncclM2nTensorSpec_t specs[2] = {{name, &src, &dst}, {"scales", nullptr, nullptr}};
  ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  cfg.timeoutSeconds = 120;
  cfg.fp8BlockRows = blockRows;
  ncclM2nPlan_t plan = nullptr;
  if (ncclM2nPlanCreate(&plan, ctx.comm, 2, specs, &cfg) != ncclSuccess) {
    fprintf(stderr, "%s: ncclM2nPlanCreate: %s\n", name, ncclM2nGetLastError());
    return false;
  }
  const int64_t n = rows * cols, nScales = n / ncclext::kFp8BlockElems / blockRows;
  void *x = nullptr, *q = nullptr, *sc = nullptr, *bs = nullptr, *br = nullptr;
  bool ok = cudaMallocAsync(&x, n * 2, ctx.stream) == cudaSuccess &&
            cudaMallocAsync(&q, n, ctx.stream) == cudaSuccess &&
            cudaMallocAsync(&sc, nScales * 4, ctx.stream) == cudaSuccess &&
            cudaMallocAsync(&bs, n * 2, ctx.stream) == cudaSuccess &&
            cudaMallocAsync(&br, n * 2, ctx.stream) == cudaSuccess;
  unsigned long long bad = ~0ull;
  if (ok) {
    fillBf16Kernel<<<1024, 256, 0, ctx.stream>>>(static_cast<uint16_t*>(x), rows, cols, 0x5eedf8u + (uint32_t)rows);
    ok = cudaMemsetAsync(q, 0xff, n, ctx.stream) == cudaSuccess &&
         cudaMemsetAsync(sc, 0xff, nScales * 4, ctx.stream) == cudaSuccess &&
         cudaMemsetAsync(wrongDev, 0, sizeof(*wrongDev), ctx.stream) == cudaSuccess;
  }
  const void* sp[2] = {x, nullptr};
  void* dp[2] = {q, sc};
  auto exec = [&] { return ncclM2nExecute(plan, sp, dp, ctx.stream) == ncclSuccess; };
  ok = ok && exec();
  if (ok) {
    if (blockRows == 1)
      checkFp8Kernel<<<1024, 128, 0, ctx.stream>>>(static_cast<const uint16_t*>(x), static_cast<const uint8_t*>(q),
                                                   static_cast<const float*>(sc), rows, cols, wrongDev);
    else
      checkFp8TilesKernel<<<256, 64, 0, ctx.stream>>>(static_cast<const uint16_t*>(x),
                                                      static_cast<const uint8_t*>(q), static_cast<const float*>(sc),
                                                      rows, cols, wrongDev);
    ok = cudaMemcpyAsync(&bad, wrongDev, sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream) == cudaSuccess &&
         cudaStreamSynchronize(ctx.stream) == cudaSuccess && ncclM2nPlanGetAsyncError(plan) == ncclSuccess;
  }
  if (!ok) fprintf(stderr, "%s %lldx%lld: %s / %s\n", name, (long long)rows, (long long)cols, ncclM2nGetLastError(),
                   cudaGetErrorString(cudaGetLastError()));
  bool failed = !ok;
  double us = 0, baseUs = 0;
  if (ok) {
    us = timeCalls(ctx.stream, 2, iters, exec, &failed);
    baseUs = timeCalls(ctx.stream, 2, iters, [&] {
      return cudaMemcpyAsync(br, bs, n * 2, cudaMemcpyDeviceToDevice, ctx.stream) == cudaSuccess;
    }, &failed);
  }
  *wrong += ok ? bad : 0;
  const int64_t dstBytes = n + nScales * 4;
  char shp[32];
  snprintf(shp, sizeof(shp), "%lldx%lld", (long long)rows, (long long)cols);
  const char* mode = ncclext::harness::oneGpuName(ctx.mode);
  printf("%-6d %-8s %-10s %12s %12.1f %12.1f %10.1f %12.1f %10.1f %8.3f%s\n", 1, mode, name, shp,
         n * 2 / 1048576.0, us, us > 0 ? dstBytes / us * 1e-3 : 0, baseUs, baseUs > 0 ? n * 2 / baseUs * 1e-3 : 0,
         baseUs > 0 ? us / baseUs : 0, ok && bad ? "  WRONG" : "");
  if (js)
    fprintf(js,
            "{\"bench\": \"m2n\", \"gpu\": \"%s\", \"nranks\": 1, \"mode\": \"%s\", \"lsa\": false, \"zero_copy\": "
            "\"off\", \"case\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"dtype\": \"bf16->fp8e4m3\", "
            "\"fp8_block_rows\": %d, \"tensor_bytes\": %lld, \"dst_bytes_rank0\": %lld, \"iters\": %d, "
            "\"execute_us\": %.2f, \"gbps_per_dst\": %.2f, \"baseline\": \"copy_engine_bf16_source_bytes\", "
            "\"baseline_bytes\": %lld, \"baseline_us\": %.2f, \"baseline_gbps\": %.2f, \"ratio\": %.4f, "
            "\"wrong_elements\": %llu, \"pass\": %s}\n",
            gpu, mode, name, (long long)rows, (long long)cols, blockRows, (long long)(n * 2), (long long)dstBytes,
            iters, us,
            us > 0 ? dstBytes / us * 1e-3 : 0, (long long)(n * 2), baseUs, baseUs > 0 ? n * 2 / baseUs * 1e-3 : 0,
            baseUs > 0 ? us / baseUs : 0, ok ? bad : 0ull, ok && !failed && bad == 0 ? "true" : "false");
  cudaStreamSynchronize(ctx.stream);
  ncclM2nPlanDestroy(plan);
  for (void* p : {x, q, sc, bs, br})
    if (p) cudaFreeAsync(p, ctx.stream);
  return ok && !failed;
}

// --stages: the GPU time of each stage of an execute (ncclM2nPlanSetStageHookTesting), from an event recorded before
// the execute and one after each stage, median over `iters` executes. Stages that repeat (the rounds) are numbered.
struct StageLog {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  static void hook(void* user, const char* stage, cudaStream_t stream) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    cudaEventRecord(e, stream);
    static_cast<StageLog*>(user)->marks.emplace_back(stage, e);
  }
};

std::vector<std::pair<std::string, double>> timeStages(cudaStream_t stream, ncclM2nPlan_t plan, int iters,
                                                       const std::function<bool()>& exec, bool* failed) {
  std::vector<StageLog> logs(iters);
  std::vector<cudaEvent_t> starts(iters);
  for (int i = 0; i < iters; i++) {
    cudaEventCreate(&starts[i]);
    cudaEventRecord(starts[i], stream);
    *failed |= ncclM2nPlanSetStageHookTesting(plan, StageLog::hook, &logs[i]) != ncclSuccess;
    *failed |= !exec();
  }
  *failed |= ncclM2nPlanSetStageHookTesting(plan, nullptr, nullptr) != ncclSuccess;
  *failed |= cudaStreamSynchronize(stream) != cudaSuccess;
  std::vector<std::pair<std::string, double>> out;
  const auto& first = logs[0].marks;
  for (size_t j = 0; j < first.size(); j++) {
    std::vector<float> ms;
    for (int i = 0; i < iters; i++) {
      const auto& m = logs[i].marks;
      if (m.size() != first.size() || m[j].first != first[j].first) continue;  // another sequence: not comparable
      float t = 0;
      cudaEventElapsedTime(&t, j == 0 ? starts[i] : m[j - 1].second, m[j].second);
      ms.push_back(t);
    }
    int seen = 0, total = 0;
    for (size_t k = 0; k < first.size(); k++) {
      total += first[k].first == first[j].first;
      seen += k < j && first[k].first == first[j].first;
    }
    out.emplace_back(total > 1 ? first[j].first + "#" + std::to_string(seen) : first[j].first,
                     ncclext::bench::median(ms) * 1e3);
  }
  for (int i = 0; i < iters; i++) {
    cudaEventDestroy(starts[i]);
    for (auto& m : logs[i].marks) cudaEventDestroy(m.second);
  }
  return out;
}

int body(ncclext::harness::RankContext& ctx, const Options& o) {
  const int n = ctx.nRanks;
  const bool virt = ctx.mode == ncclext::harness::OneGpu::kVirtual;
  std::vector<int> all(n), half(std::max(1, n / 2));
  for (int r = 0; r < n; r++) all[r] = r;
  for (size_t r = 0; r < half.size(); r++) half[r] = (int)r;
  std::vector<Case> cases;
  if (n == 1) {
    cases.push_back({"copy", {{0}, NCCL_M2N_REPLICATE, false}, {{0}, NCCL_M2N_REPLICATE, false}});
    cases.push_back({"transpose", {{0}, NCCL_M2N_REPLICATE, false}, {{0}, NCCL_M2N_REPLICATE, true}});
  } else {
    cases.push_back({"s0_s1", {all, 0, false}, {all, 1, false}});
    cases.push_back({"s0_rep", {all, 0, false}, {all, NCCL_M2N_REPLICATE, false}});
    cases.push_back({"rep_s0", {all, NCCL_M2N_REPLICATE, false}, {all, 0, false}});
    if (n >= 4) cases.push_back({"tp4_tp2", {all, 1, false}, {half, 1, false}});
  }
  const bool fp8 = n == 1 && (o.only.empty() || o.only == "to_fp8");
  const bool fp8Tiles = n == 1 && (o.only.empty() || o.only == "to_fp8_tiles");
  if (!o.only.empty() && !fp8 && !fp8Tiles &&
      std::none_of(cases.begin(), cases.end(), [&](const Case& k) { return o.only == k.name; })) {
    if (ctx.rank == 0) fprintf(stderr, "m2n_bench: no case '%s' at %d rank(s)\n", o.only.c_str(), n);
    return 1;
  }
  std::vector<std::pair<int64_t, int64_t>> shapes = {
      {256, 2048}, {2048, 4096}, {16384, 8192}, {16384, 16384}, {32768, 16384}};
  if (o.large) shapes.push_back({131072, 16384});
  FILE* js = ctx.rank == 0 && !o.json.empty() ? fopen(o.json.c_str(), "a") : nullptr;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, ctx.device);
  const char* mode = ncclext::harness::oneGpuName(ctx.mode);
  if (ctx.rank == 0)
    printf("%-6s %-8s %-10s %12s %12s %12s %10s %12s %10s %8s\n", "ranks", "mode", "case", "shape", "MiB",
           "execute_us", "GB/s/dst", "baseline_us", "base_GB/s", "ratio");
  unsigned long long* wrong = nullptr;
  BENCH_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wrong), sizeof(*wrong), ctx.stream) == cudaSuccess,
              "cudaMallocAsync");
  bool failed = false;
  uint64_t wrongAll = 0;
  for (const auto& [rows, cols] : shapes) {
    const int64_t bytes = rows * cols * 2;
    if (bytes > o.maxMiB * (1ll << 20) && !(o.large && rows == 131072)) continue;
    if (bytes < o.minMiB * (1ll << 20)) continue;
    const int iters = o.iters > 0 ? o.iters : bytes <= (64ll << 20) ? 20 : 5;
    for (const Case& k : cases) {
      if (!o.only.empty() && o.only != k.name) continue;
      CSide cs, cd;
      cs.build(k.src, rows, cols);
      cd.build(k.dst, rows, cols);
      const ncclM2nTensorSpec_t spec = {k.name, &cs.layout, &cd.layout};
      const Local ls = localOf(cs, k.src, ctx.rank), ld = localOf(cd, k.dst, ctx.rank);
      ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
      cfg.timeoutSeconds = 120;
      cfg.lsa = o.lsa ? 1 : 0;
      cfg.zeroCopy = o.zeroCopy;
      ncclM2nTestingConfig_t testing = NCCL_M2N_TESTING_CONFIG_INITIALIZER;
      testing.virtualDomain = o.virt;
      testing.virtualRank = o.virt ? ctx.rank : 0;
      ncclM2nPlan_t plan = nullptr;
      BENCH_CHECK(ncclM2nPlanCreateTesting(&plan, ctx.comm, 1, &spec, &cfg, &testing) == ncclSuccess,
                  "%s: ncclM2nPlanCreate: %s", k.name, ncclM2nGetLastError());
      // Stream-ordered allocations (virtual ranks: a synchronous free would wait for the others' kernels).
      void *src = nullptr, *dst = nullptr;
      // Zero-copy on real ranks: the published side in a registered ncclMemAlloc buffer, as large as the largest
      // part of any rank (NCCL 2.28 maps every peer's buffer with its own size).
      const bool registered = o.zeroCopy != NCCL_M2N_ZERO_COPY_OFF && !virt;
      const bool pull = o.zeroCopy == NCCL_M2N_ZERO_COPY_PULL;
      void* regBuf = nullptr;
      ncclM2nRegistration_t reg = nullptr;
      if (registered) {
        int64_t most = 0;
        for (int r = 0; r < n; r++)
          most = std::max(most, (pull ? localOf(cs, k.src, r) : localOf(cd, k.dst, r)).span() * 2);
        const size_t granule = 1 << 21;  // whole 2 MiB pages
        const size_t regBytes = ((size_t)std::max<int64_t>(most, 1) + granule - 1) / granule * granule;
        BENCH_CHECK(ncclMemAlloc(&regBuf, regBytes) == ncclSuccess, "ncclMemAlloc");
        BENCH_CHECK(ncclM2nRegister(ctx.comm, regBuf, regBytes, &reg) == ncclSuccess, "ncclM2nRegister: %s",
                    ncclM2nGetLastError());
        (pull ? src : dst) = regBuf;
      }
      if (ls.holds && !src) BENCH_CHECK(cudaMallocAsync(&src, ls.span() * 2, ctx.stream) == cudaSuccess, "alloc src");
      if (ld.holds && !dst) BENCH_CHECK(cudaMallocAsync(&dst, ld.span() * 2, ctx.stream) == cudaSuccess, "alloc dst");
      const uint32_t seed = 0x5eed0000u + (uint32_t)rows + (uint32_t)(&k - cases.data());
      if (ls.holds) fillKernel<<<1024, 256, 0, ctx.stream>>>(static_cast<uint16_t*>(src), ls, seed);
      if (ld.holds) BENCH_CHECK(cudaMemsetAsync(dst, 0xff, ld.span() * 2, ctx.stream) == cudaSuccess, "poison");
      BENCH_CHECK(cudaMemsetAsync(wrong, 0, sizeof(*wrong), ctx.stream) == cudaSuccess, "memset");
      BENCH_CHECK(cudaStreamSynchronize(ctx.stream) == cudaSuccess, "sync");
      BENCH_CHECK(ncclext::harness::barrier(ctx, 120) == ncclSuccess, "barrier");
      const void* sp = src;
      void* dp = dst;
      auto exec = [&] { return ncclM2nExecute(plan, &sp, &dp, ctx.stream) == ncclSuccess; };
      failed |= !exec();
      BENCH_CHECK(cudaStreamSynchronize(ctx.stream) == cudaSuccess, "execute: %s",
                  cudaGetErrorString(cudaGetLastError()));
      BENCH_CHECK(ncclM2nPlanGetAsyncError(plan) == ncclSuccess, "execute: %s", ncclM2nGetLastError());
      unsigned long long bad = 0;
      if (ld.holds) checkKernel<<<1024, 256, 0, ctx.stream>>>(static_cast<const uint16_t*>(dst), ld, seed, wrong);
      BENCH_CHECK(cudaMemcpyAsync(&bad, wrong, sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream) == cudaSuccess &&
                      cudaStreamSynchronize(ctx.stream) == cudaSuccess,
                  "check");
      uint64_t badAll = 0;
      BENCH_CHECK(ncclext::harness::sumOverRanks(ctx, bad, &badAll, 120) == ncclSuccess, "sum");
      wrongAll += badAll;
      BENCH_CHECK(ncclext::harness::barrier(ctx, 120) == ncclSuccess, "barrier");
      const double us = timeCalls(ctx.stream, 2, iters, exec, &failed);
      std::vector<std::pair<std::string, double>> stages;
      if (o.stages) stages = timeStages(ctx.stream, plan, iters, exec, &failed);
      // The baseline: the same bytes over the same transport (see the header).
      std::vector<int64_t> send, recv;
      int64_t local = 0;
      BENCH_CHECK(peerBytes(spec, ctx.rank, n, &send, &recv, &local), "peer bytes: %s", ncclM2nGetLastError());
      int64_t sent = 0, received = 0;
      for (int r = 0; r < n; r++) sent += send[r], received += recv[r];
      uint64_t allDst = 0;  // virtual ranks: every rank's destination bytes, which rank 0's one copy moves
      if (virt)
        BENCH_CHECK(ncclext::harness::sumOverRanks(ctx, (uint64_t)(received + local), &allDst, 120) == ncclSuccess,
                    "sum");
      const int64_t baseBytes =
          n == 1 ? bytes : virt ? (ctx.rank == 0 ? (int64_t)allDst : 0) : std::max(sent, received);
      void *bs = nullptr, *br = nullptr;
      BENCH_CHECK(cudaMallocAsync(&bs, std::max<int64_t>(1, std::max(sent, baseBytes)), ctx.stream) == cudaSuccess &&
                      cudaMallocAsync(&br, std::max<int64_t>(1, std::max(received, baseBytes)), ctx.stream) ==
                          cudaSuccess,
                  "alloc baseline");
      BENCH_CHECK(ncclext::harness::barrier(ctx, 120) == ncclSuccess, "barrier");
      auto baseline = [&] {
        if (n == 1 || virt)
          return baseBytes == 0 || cudaMemcpyAsync(br, bs, baseBytes, cudaMemcpyDeviceToDevice, ctx.stream) ==
                                       cudaSuccess;
        bool ok = ncclGroupStart() == ncclSuccess;
        int64_t so = 0, ro = 0;
        for (int r = 0; r < n; r++) {
          if (send[r]) ok = ok && ncclSend(static_cast<char*>(bs) + so, send[r], ncclUint8, r, ctx.comm, ctx.stream) ==
                                      ncclSuccess;
          if (recv[r]) ok = ok && ncclRecv(static_cast<char*>(br) + ro, recv[r], ncclUint8, r, ctx.comm, ctx.stream) ==
                                      ncclSuccess;
          so += send[r];
          ro += recv[r];
        }
        return ncclGroupEnd() == ncclSuccess && ok;
      };
      const double baseUs = timeCalls(ctx.stream, 2, iters, baseline, &failed);
      uint64_t usSum = 0;
      BENCH_CHECK(ncclext::harness::sumOverRanks(ctx, (uint64_t)(us * 1000), &usSum, 120) == ncclSuccess, "sum");
      const double meanUs = usSum / 1000.0 / n;
      const int64_t dstBytes = received + local;
      const double gbps = us > 0 ? dstBytes / us * 1e-3 : 0, baseGbps = baseUs > 0 ? baseBytes / baseUs * 1e-3 : 0;
      const char* baseName = n == 1 ? "copy_engine" : virt ? "copy_engine_all_dst_bytes" : "nccl_send_recv";
      if (ctx.rank == 0) {
        char shape[32];
        snprintf(shape, sizeof(shape), "%lldx%lld", (long long)rows, (long long)cols);
        printf("%-6d %-8s %-10s %12s %12.1f %12.1f %10.1f %12.1f %10.1f %8.3f%s\n", n, mode, k.name, shape,
               bytes / 1048576.0, us, gbps, baseUs, baseGbps, baseUs > 0 ? us / baseUs : 0,
               badAll ? "  WRONG" : "");
        std::string stagesJson;
        if (!stages.empty()) {
          printf("       stages (rank 0, us):");
          for (const auto& [name, t] : stages) {
            printf(" %s %.1f", name.c_str(), t);
            char item[96];
            snprintf(item, sizeof(item), "%s\"%s\": %.2f", stagesJson.empty() ? "" : ", ", name.c_str(), t);
            stagesJson += item;
          }
          printf("\n");
          stagesJson = ", \"stages_us_rank0\": {" + stagesJson + "}";
        }
        if (js)
          fprintf(js,
                  "{\"bench\": \"m2n\", \"gpu\": \"%s\", \"nranks\": %d, \"mode\": \"%s\", \"lsa\": %s, "
                  "\"zero_copy\": \"%s\", \"case\": "
                  "\"%s\", \"rows\": %lld, \"cols\": %lld, \"dtype\": \"bf16\", \"tensor_bytes\": %lld, "
                  "\"dst_bytes_rank0\": %lld, \"sent_bytes_rank0\": %lld, \"received_bytes_rank0\": %lld, "
                  "\"iters\": %d, \"execute_us\": %.2f, \"execute_us_mean_over_ranks\": %.2f, \"gbps_per_dst\": %.2f, "
                  "\"baseline\": \"%s\", \"baseline_bytes\": %lld, \"baseline_us\": %.2f, \"baseline_gbps\": %.2f, "
                  "\"ratio\": %.4f, \"wrong_elements\": %llu, \"pass\": %s%s}\n",
                  prop.name, n, mode, (o.lsa || virt) ? "true" : "false",
                  o.zeroCopy == NCCL_M2N_ZERO_COPY_PULL ? "pull" : o.zeroCopy == NCCL_M2N_ZERO_COPY_PUSH ? "push" : "off",
                  k.name, (long long)rows, (long long)cols,
                  (long long)bytes, (long long)dstBytes, (long long)sent, (long long)received, iters, us, meanUs,
                  gbps, baseName, (long long)baseBytes, baseUs, baseGbps, baseUs > 0 ? us / baseUs : 0,
                  (unsigned long long)badAll, badAll == 0 && !failed ? "true" : "false", stagesJson.c_str());
      }
      BENCH_CHECK(cudaStreamSynchronize(ctx.stream) == cudaSuccess, "sync");
      BENCH_CHECK(ncclM2nPlanDestroy(plan) == ncclSuccess, "ncclM2nPlanDestroy: %s", ncclM2nGetLastError());
      for (void* p : {src, dst, bs, br})
        if (p && p != regBuf) cudaFreeAsync(p, ctx.stream);
      if (reg) {
        BENCH_CHECK(cudaStreamSynchronize(ctx.stream) == cudaSuccess, "sync");
        BENCH_CHECK(ncclM2nDeregister(reg) == ncclSuccess, "ncclM2nDeregister: %s", ncclM2nGetLastError());
        ncclMemFree(regBuf);
      }
    }
    if (fp8) failed |= !fp8Case(ctx, rows, cols, 1, iters, prop.name, js, wrong, &wrongAll);
    if (fp8Tiles) failed |= !fp8Case(ctx, rows, cols, ncclext::kFp8BlockElems, iters, prop.name, js, wrong, &wrongAll);
  }
  cudaFreeAsync(wrong, ctx.stream);
  cudaStreamSynchronize(ctx.stream);
  if (js) fclose(js);
  if (ctx.rank == 0)
    printf("m2n_bench: %s (%llu wrong elements over every rank and case)\n",
           failed || wrongAll ? "FAIL" : "PASS", (unsigned long long)wrongAll);
  return failed || wrongAll ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", &o.nRanks);
  cli.oneGpu(&o.oneGpu);
  cli.flag("lsa", &o.lsa);
  cli.custom("zero-copy", "pull|push", [&o](const char* v) {
    if (!strcmp(v, "pull")) o.zeroCopy = NCCL_M2N_ZERO_COPY_PULL;
    else if (!strcmp(v, "push")) o.zeroCopy = NCCL_M2N_ZERO_COPY_PUSH;
    else return false;
    return true;
  });
  cli.option("iters", &o.iters);
  cli.option("max-mib", &o.maxMiB);
  cli.option("min-mib", &o.minMiB);
  cli.option("case", &o.only, "NAME");
  cli.flag("large", &o.large);
  cli.flag("stages", &o.stages);
  cli.option("json", &o.json);
  if (!cli.parse(argc, argv)) return 2;
  const bool virt = o.oneGpu == ncclext::harness::OneGpu::kVirtual;
  if (!cli.require(o.iters >= 0 && o.maxMiB >= 1 && o.minMiB >= 0 && (!virt || o.nRanks >= 1) &&
                       (!o.zeroCopy || o.lsa || virt),
                   "needs --iters >= 0, --max-mib >= 1, --min-mib >= 0, --nranks with --one-gpu virtual, and --lsa "
                   "(or virtual ranks) with --zero-copy"))
    return 2;
  if (virt && ncclM2nVirtualDomainCreate(&o.virt, o.nRanks) != ncclSuccess) {
    fprintf(stderr, "ncclM2nVirtualDomainCreate: %s\n", ncclM2nGetLastError());
    return 1;
  }
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = o.nRanks;
  lo.oneGpu = o.oneGpu;
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) { return body(ctx, o); });
  if (o.virt) ncclM2nVirtualDomainDestroy(o.virt);
  return rc;
}
