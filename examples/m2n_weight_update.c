/* An RL weight update through nccl_m2n's C API: trainer ranks hold each weight sharded by rows (FSDP-like, fp32);
 * inference ranks want it in bf16 as tensor-parallel shards (column-parallel, by the last dim; row-parallel, by
 * the first). One plan is made once; every "training step" changes the weights and one execute moves them all,
 * converting fp32 to bf16 on the way. Every inference element is checked against the step's value.
 *
 * Ranks: the first half of the world trains, the second half serves (one rank: both on the same rank, as a
 * co-located setup). Launch one process per rank with torchrun (RANK / WORLD_SIZE / LOCAL_RANK) or mpirun (Open
 * MPI's variables); the communicator's id comes from NCCL_COMM_ID (default: MASTER_ADDR:MASTER_PORT+1 under torchrun,
 * else 127.0.0.1:29519). `--one-gpu nodes`: every rank on GPU 0 as its own node (NCCL_HOSTID), to run on one GPU.
 *
 *   torchrun --standalone --nproc_per_node 4 --no-python build/bin/m2n_weight_update [--steps 3]
 *            [--one-gpu nodes] [--json FILE]
 *
 * Exit: 0 when every inference element of every step on every rank was right (rank 0 appends a JSON line to FILE).
 * Plain C99 on the public headers. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_m2n.h"

#define CHECK(call, what)                                                                \
  do {                                                                                   \
    if (!(call)) {                                                                       \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, ncclM2nGetLastError());    \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

enum { kTensors = 3, kMaxRanks = 64 };

static int envInt(const char* a, const char* b, int fallback) {
  const char* v = getenv(a);
  if (!v && b) v = getenv(b);
  return v ? atoi(v) : fallback;
}

/* The value of element i of tensor t at a step (exact in fp32; its bf16 rounding is what inference gets). */
static float valueAt(int step, int t, int64_t i) {
  return (float)((i * 7 + t * 131 + step * 1009) % 4099) / 64.0f - 32.0f;
}

/* fp32 -> bf16, round to nearest even (finite values). */
static uint16_t toBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* One side of one tensor: a 1-D mesh of ranks and one placement. */
typedef struct {
  int dims[1];
  int ranks[kMaxRanks];
  int placement[1];
  ncclM2nMesh_t mesh;
  ncclM2nLayout_t layout;
} Side;

static void makeSide(Side* s, const int64_t* shape, ncclDataType_t dtype, int first, int count, int placement) {
  ncclM2nMesh_t m = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t l = NCCL_M2N_LAYOUT_INITIALIZER;
  int r;
  s->dims[0] = count;
  for (r = 0; r < count; r++) s->ranks[r] = first + r;
  s->placement[0] = placement;
  m.ndims = 1;
  m.dims = s->dims;
  m.ranks = s->ranks;
  s->mesh = m;
  l.ndims = 2;
  l.globalShape = shape;
  l.dtype = dtype;
  l.mesh = &s->mesh;
  l.placements = s->placement;
  s->layout = l;
}

int main(int argc, char** argv) {
  int rank = envInt("RANK", "OMPI_COMM_WORLD_RANK", 0), n = envInt("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
  int local = envInt("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", 0), steps = 3, oneGpu = 0, a, t, s;
  const char* json = NULL;
  for (a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--steps") && a + 1 < argc) steps = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--one-gpu") && a + 1 < argc && !strcmp(argv[a + 1], "nodes")) oneGpu = 1, a++;
    else if (!strcmp(argv[a], "--json") && a + 1 < argc) json = argv[++a];
    else {
      fprintf(stderr, "usage: %s [--steps S] [--one-gpu nodes] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (n < 1 || n > kMaxRanks || rank < 0 || rank >= n || steps < 1) {
    fprintf(stderr, "m2n_weight_update: rank %d of %d (at most %d ranks), %d steps\n", rank, n, kMaxRanks, steps);
    return 2;
  }
  char buf[128];
  if (oneGpu) { /* every rank its own node on GPU 0: NCCL over loopback sockets */
    snprintf(buf, sizeof(buf), "m2n-example-node-%d", rank);
    setenv("NCCL_HOSTID", buf, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    local = 0;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (!getenv("NCCL_COMM_ID")) {
    if (getenv("MASTER_ADDR") && getenv("MASTER_PORT"))
      snprintf(buf, sizeof(buf), "%s:%d", getenv("MASTER_ADDR"), atoi(getenv("MASTER_PORT")) + 1);
    else
      snprintf(buf, sizeof(buf), "127.0.0.1:29519");
    setenv("NCCL_COMM_ID", buf, 1);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= local) {
    fprintf(stderr, "rank %d: needs GPU %d, %d visible\n", rank, local, devices);
    return 77;
  }
  cudaSetDevice(local);
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: NCCL communicator: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  /* The batch: a column-parallel, a row-parallel and a replicated weight (think qkv, o_proj, a norm). */
  const int trainers = n > 1 ? n / 2 : 1, firstInf = n > 1 ? trainers : 0, inference = n > 1 ? n - trainers : 1;
  static const char* names[kTensors] = {"layers.0.attn.qkv_proj.weight", "layers.0.attn.o_proj.weight",
                                        "layers.0.input_layernorm.weight"};
  const int64_t shapes[kTensors][2] = {{3 * 512, 1024}, {1024, 512}, {1, 1024}};
  const int dstPlacement[kTensors] = {NCCL_M2N_SHARD(0), NCCL_M2N_SHARD(1), NCCL_M2N_REPLICATE};
  Side src[kTensors], dst[kTensors];
  ncclM2nTensorSpec_t specs[kTensors];
  for (t = 0; t < kTensors; t++) {
    makeSide(&src[t], shapes[t], ncclFloat32, 0, trainers, NCCL_M2N_SHARD(0));
    makeSide(&dst[t], shapes[t], ncclBfloat16, firstInf, inference, dstPlacement[t]);
    specs[t].name = names[t];
    specs[t].src = &src[t].layout;
    specs[t].dst = &dst[t].layout;
  }
  ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  ncclM2nPlan_t plan = NULL;
  CHECK(ncclM2nPlanCreate(&plan, comm, kTensors, specs, &cfg) == ncclSuccess, "ncclM2nPlanCreate");

  /* This rank's local tensors: dense over its part (ncclM2nLayoutLocalBox says which). */
  void* srcDev[kTensors] = {NULL};
  void* dstDev[kTensors] = {NULL};
  int64_t srcOff[kTensors][2], srcShape[kTensors][2], dstOff[kTensors][2], dstShape[kTensors][2];
  for (t = 0; t < kTensors; t++) {
    int holds = 0;
    CHECK(ncclM2nLayoutLocalBox(&src[t].layout, rank, srcOff[t], srcShape[t], &holds) == ncclSuccess, "local box");
    if (holds && srcShape[t][0] * srcShape[t][1] > 0)
      CHECK(cudaMalloc(&srcDev[t], (size_t)(srcShape[t][0] * srcShape[t][1]) * 4) == cudaSuccess, "cudaMalloc");
    CHECK(ncclM2nLayoutLocalBox(&dst[t].layout, rank, dstOff[t], dstShape[t], &holds) == ncclSuccess, "local box");
    if (holds && dstShape[t][0] * dstShape[t][1] > 0)
      CHECK(cudaMalloc(&dstDev[t], (size_t)(dstShape[t][0] * dstShape[t][1]) * 2) == cudaSuccess, "cudaMalloc");
  }
  int64_t wrong = 0, checked = 0;
  for (s = 0; s < steps; s++) {
    /* "Training": this step's weights on the trainer ranks. */
    for (t = 0; t < kTensors; t++) {
      if (!srcDev[t]) continue;
      const int64_t rows = srcShape[t][0], cols = srcShape[t][1];
      float* h = (float*)malloc((size_t)(rows * cols) * 4);
      int64_t r, c;
      for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++)
          h[r * cols + c] = valueAt(s, t, (srcOff[t][0] + r) * shapes[t][1] + srcOff[t][1] + c);
      cudaMemcpyAsync(srcDev[t], h, (size_t)(rows * cols) * 4, cudaMemcpyHostToDevice, stream);
      cudaStreamSynchronize(stream);
      free(h);
    }
    /* The update: every tensor in one call, fp32 -> bf16 on the way. */
    CHECK(ncclM2nExecute(plan, (const void* const*)srcDev, dstDev, stream) == ncclSuccess, "ncclM2nExecute");
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess && ncclM2nPlanGetAsyncError(plan) == ncclSuccess,
          "the update's exchanges");
    /* Serving: every element of this rank's inference shards. */
    for (t = 0; t < kTensors; t++) {
      if (!dstDev[t]) continue;
      const int64_t rows = dstShape[t][0], cols = dstShape[t][1];
      uint16_t* h = (uint16_t*)malloc((size_t)(rows * cols) * 2);
      int64_t r, c;
      cudaMemcpy(h, dstDev[t], (size_t)(rows * cols) * 2, cudaMemcpyDeviceToHost);
      for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++) {
          const float want = valueAt(s, t, (dstOff[t][0] + r) * shapes[t][1] + dstOff[t][1] + c);
          wrong += h[r * cols + c] != toBf16(want);
          checked++;
        }
      free(h);
    }
  }
  printf("rank %d (%s): %d steps, %lld inference elements checked, %lld wrong -> %s\n", rank,
         rank < trainers && rank >= firstInf ? "trainer and inference" : rank < trainers ? "trainer" : "inference",
         steps, (long long)checked, (long long)wrong, wrong ? "FAIL" : "PASS");
  /* Every rank's wrong elements, summed (the verdict of the whole update). */
  int64_t* dev = NULL;
  int64_t all[2] = {wrong, checked};
  CHECK(cudaMalloc((void**)&dev, sizeof(all)) == cudaSuccess &&
            cudaMemcpy(dev, all, sizeof(all), cudaMemcpyHostToDevice) == cudaSuccess &&
            ncclAllReduce(dev, dev, 2, ncclInt64, ncclSum, comm, stream) == ncclSuccess &&
            cudaStreamSynchronize(stream) == cudaSuccess &&
            cudaMemcpy(all, dev, sizeof(all), cudaMemcpyDeviceToHost) == cudaSuccess,
        "summing the verdicts");
  cudaFree(dev);
  wrong = all[0];
  if (rank == 0 && json) {
    FILE* f = fopen(json, "a");
    if (f) {
      fprintf(f, "{\"test\": \"m2n_weight_update\", \"nranks\": %d, \"trainers\": %d, \"inference\": %d, "
              "\"steps\": %d, \"checked\": %lld, \"wrong\": %lld, \"pass\": %s}\n", n, trainers, inference,
              steps, (long long)all[1], (long long)wrong, wrong == 0 && all[1] > 0 ? "true" : "false");
      fclose(f);
    }
  }
  ncclM2nPlanDestroy(plan);
  for (t = 0; t < kTensors; t++) {
    if (srcDev[t]) cudaFree(srcDev[t]);
    if (dstDev[t]) cudaFree(dstDev[t]);
  }
  ncclM2nCommRelease(comm);
  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
  return wrong ? 1 : 0;
}
