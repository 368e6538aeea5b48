/*
 * nccl_ep's one-GPU test modes: several ranks of nccl_ep on one GPU, for tests and benchmarks of the protocols on a
 * machine with fewer GPUs than ranks (docs/ARCHITECTURE.md, "One GPU, many ranks"). Not for production: what is
 * here may change in any release. C99-clean; the rest of the API is nccl_ep.h.
 */
#ifndef NCCL_EP_TESTING_H_
#define NCCL_EP_TESTING_H_

#include "nccl_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclEpVirtualDomain* ncclEpVirtualDomain_t;

/* Virtual ranks: `n_ranks` (1..8) ranks of one NVLink domain live in this process as `n_ranks` host threads on the
 * same GPU; each thread passes its own single-rank communicator to ncclEpCreateGroupTesting with the domain and its
 * rank in it. The kernels are the ones real ranks run; peers' windows are reached by address instead of through
 * NCCL's LSA mapping, host collectives meet in the process, and each rank's SM budget is capped at 1/n_ranks of the
 * GPU so that all ranks' kernels are resident at once. It proves protocols, not cross-GPU memory ordering or link
 * speed. Local. */
NCCL_EP_API ncclResult_t ncclEpVirtualDomainCreate(ncclEpVirtualDomain_t* domain, int n_ranks);
/* Local. Only after every group made on the domain has been destroyed. */
NCCL_EP_API ncclResult_t ncclEpVirtualDomainDestroy(ncclEpVirtualDomain_t domain);

typedef struct {
  unsigned int size;  /* sizeof(ncclEpTestingConfig_t) */
  unsigned int magic; /* NCCL_EP_MAGIC */
  ncclEpVirtualDomain_t virtual_domain; /* NULL: real ranks; else this thread is a virtual rank of the domain */
  int virtual_rank;                     /* with virtual_domain: this thread's rank in it */
  ncclComm_t virtual_rail; /* NULL; with virtual_domain, the mixed mode (several virtual domains, one a process):
                              the communicator of the virtual ranks with this virtual_rank in every domain, in
                              domain order. The exchange between domains then goes between ranks of the same index,
                              relayed inside the domain (no enable_mask there) */
} ncclEpTestingConfig_t;
#define NCCL_EP_TESTING_CONFIG_INIT {sizeof(ncclEpTestingConfig_t), NCCL_EP_MAGIC, NULL, 0, NULL}

/* ncclEpCreateGroup in a one-GPU test mode: `testing` NULL (or all fields NULL / 0) makes the same group as
 * ncclEpCreateGroup. COLLECTIVE over `comm`, as ncclEpCreateGroup. */
NCCL_EP_API ncclResult_t ncclEpCreateGroupTesting(ncclEpGroup_t* group, ncclComm_t comm,
                                                  const ncclEpGroupConfig_t* config,
                                                  const ncclEpTestingConfig_t* testing);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_EP_TESTING_H_ */
