/*
 * nccl_m2n's one-GPU test mode: several ranks of nccl_m2n on one GPU, for tests and benchmarks of the executor's
 * protocols on a machine with fewer GPUs than ranks (docs/ARCHITECTURE.md, "One GPU, many ranks"). Not for
 * production: what is here may change in any release. C99-clean; the rest of the API is nccl_m2n.h.
 */
#ifndef NCCL_M2N_TESTING_H_
#define NCCL_M2N_TESTING_H_

#include "nccl_m2n.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Virtual ranks: `nRanks` (1..8) host threads of one process, each with its own single-rank communicator on the
 * same GPU, joined into one NVLink domain whose windows they reach by address. Create the domain once (before the
 * threads) and destroy it after every plan on it. Every stream then goes over LSA, and plan destruction is
 * collective over the domain (a barrier before and after freeing). Local. */
typedef struct ncclM2nVirtualDomain* ncclM2nVirtualDomain_t;
NCCL_M2N_API ncclResult_t ncclM2nVirtualDomainCreate(ncclM2nVirtualDomain_t* domain, int nRanks);
NCCL_M2N_API ncclResult_t ncclM2nVirtualDomainDestroy(ncclM2nVirtualDomain_t domain);

typedef struct {
  size_t size;                          /* sizeof(ncclM2nTestingConfig_t) */
  unsigned int magic;                   /* NCCL_M2N_MAGIC */
  ncclM2nVirtualDomain_t virtualDomain; /* NULL: real ranks; else this thread is a virtual rank of the domain */
  int virtualRank;                      /* with virtualDomain: this thread's rank in it */
} ncclM2nTestingConfig_t;
#define NCCL_M2N_TESTING_CONFIG_INITIALIZER {sizeof(ncclM2nTestingConfig_t), NCCL_M2N_MAGIC, NULL, 0}

/* ncclM2nPlanCreate in the one-GPU test mode (comm: this thread's single-rank communicator); `testing` NULL (or its
 * fields NULL / 0) makes the same plan as ncclM2nPlanCreate. COLLECTIVE over the domain's ranks, as
 * ncclM2nPlanCreate over comm's. */
NCCL_M2N_API ncclResult_t ncclM2nPlanCreateTesting(ncclM2nPlan_t* plan, ncclComm_t comm, int nTensors,
                                                   const ncclM2nTensorSpec_t* tensors,
                                                   const ncclM2nExecConfig_t* config,
                                                   const ncclM2nTestingConfig_t* testing);

/* Where an execute's time goes, for benchmarks: `hook` (NULL: none) is called by every later ncclM2nExecute of
 * `plan`, on the calling thread, right after the execute enqueued each of its stages on `stream`, with the stage's
 * name: "pointers", "quantize", "copies", "direct", "publish", "barrier", "remote", then per round "pack",
 * "exchange", "barrier", "unpack", and last "final barrier" (only the stages the plan has, in that order; pipelined
 * rounds, docs/ARCHITECTURE.md, pack one round ahead on the plan's side stream, which `stream` then names). A hook
 * that records a CUDA event on `stream` timestamps the stage's end on the GPU. Local; not thread-safe against a
 * concurrent execute of the same plan. */
typedef void (*ncclM2nStageHook_t)(void* user, const char* stage, cudaStream_t stream);
NCCL_M2N_API ncclResult_t ncclM2nPlanSetStageHookTesting(ncclM2nPlan_t plan, ncclM2nStageHook_t hook, void* user);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_M2N_TESTING_H_ */
