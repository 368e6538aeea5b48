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

#include "common/log.h"
#include "common/version.h"

namespace ncclext {
namespace harness {
namespace {

struct SharedBlock {
  std::atomic<int> idReady;
  std::atomic<int> gpuCount;
  ncclUniqueId id;
};

int envInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

void forceNvlsOff() {
  const char* v = getenv("NCCL_NVLS_ENABLE");
  if (v && strcmp(v, "0") != 0) fprintf(stderr, "launcher: NCCL_NVLS_ENABLE=%s overridden to 0\n", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

// Creates the communicator, runs the body, tears down. `getId` fills the unique id (called after cudaSetDevice).
int runRank(RankContext ctx, const std::function<bool(ncclUniqueId*)>& getId,
            const std::function<int(RankContext&)>& body) {
  setLogRank(ctx.rank);
  if (cudaSetDevice(ctx.device) != cudaSuccess) {
    fprintf(stderr, "rank %d: cudaSetDevice(%d) failed\n", ctx.rank, ctx.device);
    return 1;
  }
  if (checkNcclRuntime() != ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", ctx.rank, ncclGetLastError(nullptr));
    return 1;
  }
  ncclUniqueId id;
  if (!getId(&id)) return 1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  ncclResult_t res = ncclCommInitRankConfig(&ctx.comm, ctx.nRanks, id, ctx.rank, &cfg);
  if (res != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRankConfig: %s\n", ctx.rank, ncclGetErrorString(res));
    return 1;
  }
  cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking);
  int rc = body(ctx);
  cudaStreamSynchronize(ctx.stream);
  cudaStreamDestroy(ctx.stream);
  if (rc == 0) {
    ncclCommFinalize(ctx.comm);
    ncclCommDestroy(ctx.comm);
  } else {
    ncclCommAbort(ctx.comm);  // a failed body may leave peers waiting: do not wait for them
  }
  return rc;
}

int launchExternal(const std::function<int(RankContext&)>& body) {
  RankContext ctx;
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
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev <= ctx.localRank) {
    fprintf(stderr, "launcher: rank %d needs GPU %d, %d visible\n", ctx.rank, ctx.localRank, nDev);
    return kExitNoGpu;
  }
  // With NCCL_COMM_ID set, every rank derives the same id and rank 0 runs the bootstrap root.
  return runRank(ctx, [](ncclUniqueId* id) { return ncclGetUniqueId(id) == ncclSuccess; }, body);
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

int launch(const LaunchOptions& opts, const std::function<int(RankContext&)>& body) {
  forceNvlsOff();
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || (getenv("WORLD_SIZE") && getenv("RANK")))
    return launchExternal(body);

  const int nGpus = countGpus();
  if (nGpus <= 0) {
    fprintf(stderr, "launcher: no GPU visible: nothing to run\n");
    return kExitNoGpu;
  }
  const int nRanks = opts.nRanks > 0 ? opts.nRanks : nGpus;
  if (nRanks > nGpus) {
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
  for (int r = 0; r < nRanks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      RankContext ctx;
      ctx.rank = r;
      ctx.nRanks = nRanks;
      ctx.localRank = r;
      ctx.device = r;
      auto getId = [shm, r](ncclUniqueId* id) {
        if (r == 0) {
          if (ncclGetUniqueId(&shm->id) != ncclSuccess) return false;
          shm->idReady.store(1, std::memory_order_release);
        } else {
          const auto t0 = std::chrono::steady_clock::now();
          while (!shm->idReady.load(std::memory_order_acquire)) {
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
              fprintf(stderr, "rank %d: no unique id from rank 0\n", r);
              return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        *id = shm->id;
        return true;
      };
      int rc = runRank(ctx, getId, body);
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
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
