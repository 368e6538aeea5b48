// Launcher for GPU tests and benchmarks: runs a body once per rank, one process per GPU.
//
// - Under mpirun (Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*) or torchrun (RANK/WORLD_SIZE/LOCAL_RANK) the process is already one rank:
//   the communicator's id comes from NCCL_COMM_ID (set it, or let the launcher derive it from MASTER_ADDR and
//   MASTER_PORT+1 under torchrun, or use 127.0.0.1:NCCL_EXT_PORT (default 29517) for a one-node mpirun).
// - Otherwise the launcher forks nRanks children (0 = every visible GPU). The parent never touches CUDA (a context
//   does not survive fork): a probe child counts the GPUs, rank 0's child makes the ncclUniqueId and hands it to
//   the others through a shared mapping.
// NCCL_NVLS_ENABLE is forced to 0 in every case (NVLink multicast is forbidden on our machines).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>

namespace ncclext {
namespace harness {

struct RankContext {
  int rank = 0, nRanks = 1;
  int localRank = 0;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct LaunchOptions {
  int nRanks = 0;                // 0: every visible GPU (fork mode)
  double timeoutSeconds = 600;   // the parent kills all children after this long
};

// Exit code the launcher returns when there is no GPU to run on (the caller reports "skipped").
constexpr int kExitNoGpu = 77;

// Runs `body` on every rank; the communicator is created before and destroyed after it (aborted if the body
// failed). Returns 0 if every rank's body returned 0, kExitNoGpu if there are no (or too few) GPUs, else 1.
int launch(const LaunchOptions& opts, const std::function<int(RankContext&)>& body);

// Number of GPUs, counted in a child process so the caller stays CUDA-free. -1 if the probe failed.
int countGpus();

}  // namespace harness
}  // namespace ncclext
