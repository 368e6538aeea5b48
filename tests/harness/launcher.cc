#include "tests/harness/launcher.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/log.h"
#include "common/version.h"

namespace ncclext {
namespace harness {
namespace {

struct SharedBlock {
  std::atomic<int> idReady;
  std::atomic<int> gpuCount;
  ncclUniqueId id;
  ncclUniqueId railIds[VirtualDomain::kMaxRanks];  // mixed: one rail communicator per thread index
};

// Waits (bounded) until process 0 published the ids in `shm`.
bool waitForIds(SharedBlock* shm, int rank) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!shm->idReady.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
      fprintf(stderr, "rank %d: no unique id from rank 0\n", rank);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

int envInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

void forceNvlsOff() {
  const char* v = getenv("NCCL_NVLS_ENABLE");
  if (v && strcmp(v, "0") != 0) fprintf(stderr, "launcher: NCCL_NVLS_ENABLE=%s overridden to 0\n", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

// One GPU, many nodes: this process claims a host of its own, so NCCL sees a node with one GPU and talks to the
// others over loopback sockets. Must run before NCCL reads its environment (the first NCCL call).
void becomeOneGpuNode(int rank) {
  const std::string host = "ncclext-node-" + std::to_string(rank);
  setenv("NCCL_HOSTID", host.c_str(), 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
}

// Creates the communicator (`init`, called after cudaSetDevice), runs the body, tears down.
int runRank(RankContext ctx, const std::function<bool(RankContext&)>& init,
            const std::function<int(RankContext&)>& body) {
  setLogRank(ctx.rank);
  if (cudaSetDevice(ctx.device) != cudaSuccess) {
    fprintf(stderr, "rank %d: cudaSetDevice(%d) failed\n", ctx.rank, ctx.device);
    return 1;
  }
  if (checkNcclRuntime() != ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", ctx.rank, lastError());
    return 1;
  }
  if (!init(ctx)) return 1;
  if (cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  int rc = body(ctx);
  // Bounded: a body that left a kernel hanging must not hang the teardown's wait too.
  if (waitStream(ctx.stream, 60, "end of the test body") != ncclSuccess) {
    fprintf(stderr, "rank %d: the stream did not drain: %s\n", ctx.rank, lastError());
    fflush(stderr);
    _exit(1);  // cudaStreamDestroy and ncclCommDestroy would wait for the stuck kernel forever
  }
  cudaStreamDestroy(ctx.stream);
  for (ncclComm_t c : {ctx.rail, ctx.comm}) {
    if (!c) continue;
    if (rc == 0 && !ctx.peerDied) {
      ncclCommFinalize(c);
      ncclCommDestroy(c);
    } else {
      ncclCommAbort(c);  // a failed body may leave peers waiting: do not wait for them
    }
  }
  // Any CUDA error left behind (an asynchronous fault, a failed call nobody checked) fails the rank.
  const cudaError_t sticky = cudaDeviceSynchronize();
  const cudaError_t last = cudaGetLastError();
  if (sticky != cudaSuccess || last != cudaSuccess) {
    fprintf(stderr, "rank %d: CUDA error at the end of the test: %s / %s\n", ctx.rank, cudaGetErrorString(sticky),
            cudaGetErrorString(last));
    rc = 1;
  }
  return rc;
}

// The world communicator from a unique id that `getId` hands over.
std::function<bool(RankContext&)> initFromId(const std::function<bool(ncclUniqueId*)>& getId) {
  return [getId](RankContext& ctx) {
    ncclUniqueId id;
    if (!getId(&id)) return false;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    ncclResult_t res = ncclCommInitRankConfig(&ctx.comm, ctx.nRanks, id, ctx.rank, &cfg);
    if (res != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclCommInitRankConfig: %s\n", ctx.rank, ncclGetErrorString(res));
      return false;
    }
    return true;
  };
}

// Virtual ranks: `perNode` threads of this process on GPU 0, each with its own single-rank communicator. Mixed
// (nodes > 1, or `shm` given): this process is node `node` of `nodes`, and thread i also joins the rail
// communicator of index i (its id from process 0 through `shm`).
int runVirtual(int perNode, int node, int nodes, SharedBlock* shm, const std::function<int(RankContext&)>& body) {
  // Before CUDA starts in this process: every kernel loaded at once. With lazy loading, the first launch of a kernel
  // may wait for the context to go idle, and a peer's kernel that spins for this rank's next call then never lets it
  // (CUDA's lazy-loading notes: kernels that rely on running concurrently must be loaded first). Seen: the LL
  // dispatch of one virtual rank timed out while the other's first launch of a test kernel waited for it.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  // The ranks' streams share the GPU's hardware work queues (8 by default), which start work in order: a rank's
  // kernel that waits on its own spinning kernel can hold up a peer's kernel queued behind it in the same queue
  // (docs/ARCHITECTURE.md, "One GPU, many ranks"). nccl_m2n meets that with launch fences; for everything else, as
  // many queues as CUDA allows makes such sharing rarer. An explicit setting (e.g. 1, the worst case) is kept.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  if (shm && node == 0) {  // the rail communicators' ids, before any thread needs one
    for (int i = 0; i < perNode; i++)
      if (ncclGetUniqueId(&shm->railIds[i]) != ncclSuccess) {
        fprintf(stderr, "node 0: ncclGetUniqueId failed\n");
        return 1;
      }
    shm->idReady.store(1, std::memory_order_release);
  }
  VirtualDomain domain(perNode);
  std::vector<int> rcs(perNode, 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < perNode; r++) {
    threads.emplace_back([&, r] {
      RankContext ctx;
      ctx.rank = node * perNode + r;
      ctx.nRanks = nodes * perNode;
      ctx.localRank = r;
      ctx.device = 0;
      ctx.mode = shm ? OneGpu::kMixed : OneGpu::kVirtual;
      ctx.virt = &domain;
      auto init = [shm, node, nodes, r](RankContext& c) {
        int dev = 0;
        ncclResult_t res = ncclCommInitAll(&c.comm, 1, &dev);
        if (res != ncclSuccess) {
          fprintf(stderr, "rank %d: ncclCommInitAll: %s\n", c.rank, ncclGetErrorString(res));
          return false;
        }
        if (!shm) return true;
        if (!waitForIds(shm, c.rank)) return false;
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 1;
        res = ncclCommInitRankConfig(&c.rail, nodes, shm->railIds[r], node, &cfg);
        if (res != ncclSuccess) fprintf(stderr, "rank %d: the rail: ncclCommInitRankConfig: %s\n", c.rank,
                                        ncclGetErrorString(res));
        return res == ncclSuccess;
      };
      rcs[r] = runRank(ctx, init, body);
    });
  }
  int rc = 0;
  for (int r = 0; r < perNode; r++) {
    threads[r].join();
    if (rcs[r] != 0 && rc == 0) rc = rcs[r];
  }
  return rc;
}

int launchExternal(const LaunchOptions& opts, const std::function<int(RankContext&)>& body) {
  RankContext ctx;
  if (opts.oneGpu == OneGpu::kVirtual || opts.oneGpu == OneGpu::kMixed) {
    fprintf(stderr, "launcher: --one-gpu %s starts its own processes and threads; do not start it under mpirun or "
                    "torchrun\n", opts.oneGpu == OneGpu::kVirtual ? "virtual" : "mixed");
    return 1;
  }
  int localSize = 0;
  if (getenv("OMPI_COMM_WORLD_SIZE")) {  // Open MPI
    ctx.rank = envInt("OMPI_COMM_WORLD_RANK", 0);
    ctx.nRanks = envInt("OMPI_COMM_WORLD_SIZE", 1);
    ctx.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    localSize = envInt("OMPI_COMM_WORLD_LOCAL_SIZE", ctx.nRanks);
  } else if (getenv("PMI_SIZE")) {  // MPICH / Hydra
    ctx.rank = envInt("PMI_RANK", 0);
    ctx.nRanks = envInt("PMI_SIZE", 1);
    ctx.localRank = envInt("MPI_LOCALRANKID", ctx.rank);
    localSize = envInt("MPI_LOCALNRANKS", ctx.nRanks);
  } else {  // torchrun
    ctx.rank = envInt("RANK", 0);
    ctx.nRanks = envInt("WORLD_SIZE", 1);
    ctx.localRank = envInt("LOCAL_RANK", 0);
    localSize = envInt("LOCAL_WORLD_SIZE", ctx.nRanks);
  }
  ctx.device = ctx.localRank;
  if (opts.oneGpu == OneGpu::kNodes) {
    ctx.device = 0;
    ctx.mode = OneGpu::kNodes;
    becomeOneGpuNode(ctx.rank);
  }
  if (!getenv("NCCL_COMM_ID")) {
    std::string id;
    if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
      id = std::string(getenv("MASTER_ADDR")) + ":" + std::to_string(envInt("MASTER_PORT", 29500) + 1);
    } else if (localSize == ctx.nRanks) {
      id = "127.0.0.1:" + std::to_string(envInt("NCCL_EXT_PORT", 29517));
    } else {
      fprintf(stderr, "launcher: ranks on several hosts need NCCL_COMM_ID=<host>:<port> of rank 0\n");
      return 1;
    }
    setenv("NCCL_COMM_ID", id.c_str(), 1);
  }
  int nDev = 0;
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev <= ctx.device) {
    fprintf(stderr, "launcher: rank %d needs GPU %d, %d visible\n", ctx.rank, ctx.device, nDev);
    return kExitNoGpu;
  }
  // With NCCL_COMM_ID set, every rank derives the same id and rank 0 runs the bootstrap root.
  return runRank(ctx, initFromId([](ncclUniqueId* id) { return ncclGetUniqueId(id) == ncclSuccess; }), body);
}

}  // namespace

int countGpus() {
  void* mem = mmap(nullptr, sizeof(SharedBlock), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return -1;
  SharedBlock* shm = new (mem) SharedBlock();
  shm->gpuCount.store(-1);
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    shm->gpuCount.store(n);
    _exit(0);
  }
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  int n = pid > 0 ? shm->gpuCount.load() : -1;
  munmap(mem, sizeof(SharedBlock));
  return n;
}

bool parseOneGpu(const char* s, OneGpu* out, bool mixedToo) {
  if (!strcmp(s, "off")) *out = OneGpu::kOff;
  else if (!strcmp(s, "nodes")) *out = OneGpu::kNodes;
  else if (!strcmp(s, "virtual")) *out = OneGpu::kVirtual;
  else if (mixedToo && !strcmp(s, "mixed")) *out = OneGpu::kMixed;
  else return false;
  return true;
}

const char* oneGpuName(OneGpu m) {
  switch (m) {
    case OneGpu::kNodes: return "one-GPU nodes";
    case OneGpu::kVirtual: return "virtual ranks";
    case OneGpu::kMixed: return "one-GPU nodes of virtual ranks";
    default: return "real GPUs";
  }
}

ncclResult_t sumOverRanks(RankContext& ctx, uint64_t mine, uint64_t* total, double timeoutSeconds) {
  if (ctx.virt) {  // the node's ranks here; mixed: then the nodes' sums over the rail of my index
    std::vector<uint64_t> all(ctx.virt->size());
    ncclResult_t res = ctx.virt->allGather(ctx.localRank, &mine, sizeof(mine), all.data(), timeoutSeconds);
    if (res != ncclSuccess) return res;
    *total = 0;
    for (uint64_t v : all) *total += v;
    if (!ctx.rail) return ncclSuccess;
    mine = *total;
  }
  ncclComm_t comm = ctx.rail ? ctx.rail : ctx.comm;
  uint64_t* d = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(*d), ctx.stream) != cudaSuccess ||
      cudaMemcpyAsync(d, &mine, sizeof(mine), cudaMemcpyHostToDevice, ctx.stream) != cudaSuccess)
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "sumOverRanks: device buffer");
  NCCLEXT_NCCL(ncclAllReduce(d, d, 1, ncclUint64, ncclSum, comm, ctx.stream));
  NCCLEXT_CHECK(copyToHostAfter(ctx.stream, total, d, sizeof(*d), timeoutSeconds, "sum over ranks"));
  cudaFreeAsync(d, ctx.stream);
  return ncclSuccess;
}

ncclResult_t barrier(RankContext& ctx, double timeoutSeconds) {
  uint64_t total = 0;
  return sumOverRanks(ctx, 0, &total, timeoutSeconds);
}

int launch(const LaunchOptions& opts, const std::function<int(RankContext&)>& body) {
  forceNvlsOff();
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || (getenv("WORLD_SIZE") && getenv("RANK")))
    return launchExternal(opts, body);

  const int nGpus = countGpus();
  if (nGpus <= 0) {
    fprintf(stderr, "launcher: no GPU visible: nothing to run\n");
    return kExitNoGpu;
  }
  const bool oneGpu = opts.oneGpu != OneGpu::kOff;
  const int nRanks = opts.nRanks > 0 ? opts.nRanks : oneGpu ? 2 : nGpus;
  if (opts.oneGpu == OneGpu::kVirtual && nRanks > VirtualDomain::kMaxRanks) {
    fprintf(stderr, "launcher: at most %d virtual ranks\n", VirtualDomain::kMaxRanks);
    return 1;
  }
  const int perNode = opts.oneGpu == OneGpu::kMixed ? opts.domainSize : 1;
  if (opts.oneGpu == OneGpu::kMixed &&
      (perNode < 2 || perNode > VirtualDomain::kMaxRanks || nRanks % perNode != 0)) {
    fprintf(stderr, "launcher: --one-gpu mixed: %d virtual ranks a node must be in [2, %d] and divide the %d ranks\n",
            perNode, VirtualDomain::kMaxRanks, nRanks);
    return 1;
  }
  if (!oneGpu && nRanks > nGpus) {
    fprintf(stderr, "launcher: %d ranks asked for, %d GPUs visible (NCCL allows one rank per GPU)\n", nRanks, nGpus);
    return kExitNoGpu;
  }

  void* mem = mmap(nullptr, sizeof(SharedBlock), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  SharedBlock* shm = new (mem) SharedBlock();
  shm->idReady.store(0);
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids;
  // Virtual ranks: one child process holds them all (the parent stays the CUDA-free watchdog); mixed: one per node.
  const int nChildren = opts.oneGpu == OneGpu::kVirtual ? 1 : nRanks / perNode;
  for (int r = 0; r < nChildren; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    // A child's output by lines (its buffer is empty: flushed above): a rank killed from outside (a run's time limit)
    // leaves every line it printed.
    if (pid == 0) setvbuf(stdout, nullptr, _IOLBF, 0);
    if (pid == 0 && (opts.oneGpu == OneGpu::kVirtual || opts.oneGpu == OneGpu::kMixed)) {
      const bool mixed = opts.oneGpu == OneGpu::kMixed;
      if (mixed) becomeOneGpuNode(r);
      const int rc = mixed ? runVirtual(perNode, r, nChildren, shm, body) : runVirtual(nRanks, 0, 1, nullptr, body);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    if (pid == 0) {
      RankContext ctx;
      ctx.rank = r;
      ctx.nRanks = nRanks;
      ctx.localRank = r;
      ctx.device = oneGpu ? 0 : r;
      ctx.mode = opts.oneGpu;
      if (opts.oneGpu == OneGpu::kNodes) becomeOneGpuNode(r);
      auto getId = [shm, r](ncclUniqueId* id) {
        if (r == 0) {
          if (ncclGetUniqueId(&shm->id) != ncclSuccess) return false;
          shm->idReady.store(1, std::memory_order_release);
        } else if (!waitForIds(shm, r)) {
          return false;
        }
        *id = shm->id;
        return true;
      };
      int rc = runRank(ctx, initFromId(getId), body);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }

  // Reap; one failed rank would leave the others waiting inside NCCL, so stop them.
  int rc = 0;
  size_t left = pids.size();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opts.timeoutSeconds);
  while (left > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      left--;
      const bool expectedDeath = opts.mayDie >= 0 && opts.mayDie < (int)pids.size() && pid == pids[opts.mayDie] &&
                                 WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      if (expectedDeath) fprintf(stderr, "launcher: rank %d was killed, as the test wanted\n", opts.mayDie);
      const bool ok = expectedDeath || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (!ok && rc == 0) {
        rc = WIFEXITED(status) && WEXITSTATUS(status) == kExitNoGpu ? kExitNoGpu : 1;
        fprintf(stderr, "launcher: a rank failed (pid %d, status 0x%x); stopping the others\n", (int)pid, status);
        for (pid_t p : pids)
          if (p != pid) kill(p, SIGKILL);
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr, "launcher: ranks still running after %.0f s; killing them\n", opts.timeoutSeconds);
      for (pid_t p : pids) kill(p, SIGKILL);
      while (waitpid(-1, &status, 0) > 0) {
      }
      rc = 1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  munmap(mem, sizeof(SharedBlock));
  return rc;
}

}  // namespace harness
}  // namespace ncclext
