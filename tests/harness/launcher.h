// Launcher for GPU tests and benchmarks: runs a body once per rank, one process per GPU.
//
// - Under mpirun (Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*) or torchrun (RANK/WORLD_SIZE/LOCAL_RANK) the process is already one rank:
//   the communicator's id comes from NCCL_COMM_ID (set it, or let the launcher derive it from MASTER_ADDR and
//   MASTER_PORT+1 under torchrun, or use 127.0.0.1:NCCL_EXT_PORT (default 29517) for a one-node mpirun).
// - Otherwise the launcher forks nRanks children (0 = every visible GPU). The parent never touches CUDA (a context
//   does not survive fork): a probe child counts the GPUs, rank 0's child makes the ncclUniqueId and hands it to
//   the others through a shared mapping.
// - One GPU, many ranks (docs/ARCHITECTURE.md, "One GPU, many ranks"), chosen with --one-gpu MODE:
//   nodes    every rank (forked, or started by mpirun/torchrun) claims its own host (NCCL_HOSTID=ncclext-node-<rank>,
//            NCCL_SOCKET_IFNAME=lo) and runs on GPU 0: real NCCL over loopback sockets, each rank an NVLink domain
//            of one, so every across-domain path (split communicators, the rail, ncclSend/ncclRecv) runs for real.
//   virtual  one forked process runs nRanks threads on GPU 0, each with its own single-rank communicator; the
//            libraries join them into one NVLink domain (ncclEpVirtualDomainCreate; ncclext::Domain with
//            DomainOptions::virt = RankContext::virt), so that LSA protocols run with 2..8 ranks.
//   mixed    both at once: nRanks / domainSize forked processes, each a one-GPU node (as `nodes`) running
//            domainSize threads as virtual ranks (as `virtual`): world rank = node * domainSize + thread. Besides its
//            single-rank communicator each thread gets RankContext::rail, a communicator of the threads with its
//            index on every node (ncclext::Domain with DomainOptions::rail), so that a domain of several ranks and
//            the rail between domains run at once, on one GPU. There is no world communicator: two ranks of one
//            NCCL communicator cannot share a GPU inside one host, so only protocols whose traffic between domains
//            goes between ranks of the same index (hierarchical ones) can run here.
// NCCL_NVLS_ENABLE is forced to 0 in every case (NVLink multicast is forbidden on our machines).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <functional>

#include "common/virtual_domain.h"

namespace ncclext {
namespace harness {

enum class OneGpu { kOff, kNodes, kVirtual, kMixed };
// "off", "nodes", "virtual", and "mixed" where the program runs in that mode (`mixedToo`: its bodies take their
// virtual rank from RankContext::localRank and their rail from RankContext::rail); false for anything else.
bool parseOneGpu(const char* s, OneGpu* out, bool mixedToo = false);
const char* oneGpuName(OneGpu m);

struct RankContext {
  int rank = 0, nRanks = 1;
  int localRank = 0;
  int device = 0;
  ncclComm_t comm = nullptr;      // the world; virtual ranks (and mixed): this rank's single-rank communicator
  ncclComm_t rail = nullptr;      // mixed: the ranks with my thread index on every node, in node order
  cudaStream_t stream = nullptr;
  OneGpu mode = OneGpu::kOff;
  VirtualDomain* virt = nullptr;  // virtual ranks: the in-process domain (host collectives of the harness's copy)
  bool peerDied = false;          // set by a body that saw a peer die: the communicator is aborted, not finalised
};

struct LaunchOptions {
  int nRanks = 0;                // 0: every visible GPU (fork mode)
  double timeoutSeconds = 600;   // the parent kills all children after this long
  OneGpu oneGpu = OneGpu::kOff;
  int domainSize = 2;            // mixed: virtual ranks per node (2..VirtualDomain::kMaxRanks, dividing nRanks)
  int mayDie = -1;               // fork mode: this rank may end by SIGKILL (the dead-peer test); the others go on
};

// Host collectives for test bodies, in every mode (NCCL on ctx.comm, or the in-process domain), bounded by
// `timeoutSeconds`: the sum of every rank's `mine`, and a barrier.
ncclResult_t sumOverRanks(RankContext& ctx, uint64_t mine, uint64_t* total, double timeoutSeconds);
ncclResult_t barrier(RankContext& ctx, double timeoutSeconds);

// Exit code the launcher returns when there is no GPU to run on (the caller reports "skipped").
constexpr int kExitNoGpu = 77;

// Runs `body` on every rank; the communicator is created before and destroyed after it (aborted if the body
// failed). Returns 0 if every rank's body returned 0, kExitNoGpu if there are no (or too few) GPUs, else 1. In the
// virtual mode, `body` runs on nRanks threads of one process at once.
int launch(const LaunchOptions& opts, const std::function<int(RankContext&)>& body);

// Number of GPUs, counted in a child process so the caller stays CUDA-free. -1 if the probe failed.
int countGpus();

}  // namespace harness
}  // namespace ncclext
