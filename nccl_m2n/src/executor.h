// The M2N executor (ncclM2nPlanCreate / Execute / PlanDestroy): plan creation's agreement and planning, the
// device tables, and an execute's sequence of kernels and NCCL point-to-point calls. api.cc validates the public
// arguments and builds the Problem; everything here is behind that.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/virtual_domain.h"
#include "nccl_m2n/include/nccl_m2n.h"
#include "nccl_m2n/include/nccl_m2n_testing.h"
#include "nccl_m2n/src/exec_tables.h"
#include "nccl_m2n/src/plan.h"
#include "nccl_m2n/src/quantize.h"

struct ncclM2nPlan;

// The one-GPU test mode's shared object (ncclM2nVirtualDomainCreate).
struct ncclM2nVirtualDomain {
  explicit ncclM2nVirtualDomain(int n) : domain(n) {}
  ncclext::VirtualDomain domain;
};

namespace ncclm2n {

struct ExecOptions {
  int64_t stagingBytes = 256ll << 20;
  double timeoutSeconds = 100;
  bool lsa = false;                    // streams inside an NVLink domain over LSA (false: ncclSend / ncclRecv)
  ncclext::VirtualDomain* virt = nullptr;  // the one-GPU virtual-rank mode: comm is this thread's single-rank one
  int virtualRank = 0;
  int zeroCopy = 0;                        // ZeroCopy (schedule.h), with lsa
};

// COLLECTIVE over comm. `problem` holds the batch (nRanks set, options empty: the domains come from NCCL's LSA
// teams); `localError` is non-empty when this rank's batch failed validation (the ranks still meet, so that all of
// them fail together).
// `fp8`: the batch's tensors quantised to e4m3 (quantize.h; `problem` is rewritten already).
ncclResult_t createPlan(ncclComm_t comm, Problem&& problem, std::vector<Fp8Tensor>&& fp8,
                        const std::string& localError, const ExecOptions& options, ncclM2nPlan** out);
ncclResult_t execute(ncclM2nPlan* plan, const void* const* src, void* const* dst, cudaStream_t stream);
// Local, except with virtual ranks (a barrier of the domain before and after freeing: a free waits for every
// kernel on the GPU, and a peer's barrier kernel waits for this rank). ncclRemoteError when that barrier fails.
ncclResult_t destroyPlan(ncclM2nPlan* plan);
// ncclM2nPlanSetStageHookTesting.
void setStageHook(ncclM2nPlan* plan, ncclM2nStageHook_t hook, void* user);
// ncclSuccess, or ncclRemoteError (with the text) once the watchdog aborted the plan's exchanges.
ncclResult_t asyncError(ncclM2nPlan* plan);
// ncclM2nCommRetain (COLLECTIVE over comm) / ncclM2nCommRelease (local).
ncclResult_t retainExchange(ncclComm_t comm, double timeoutSeconds);
void releaseExchange(ncclComm_t comm);

// ncclM2nReshard (reshard.cc): the cached plan of `spec` and `config` (which passed api.cc's checks), or a new one
// from `create` (collective), executed on `stream` without a host wait.
ncclResult_t reshard(ncclComm_t comm, const ncclM2nTensorSpec_t& spec, const void* src, void* dst,
                     const ncclM2nExecConfig_t* config, cudaStream_t stream,
                     const std::function<ncclResult_t(ncclM2nPlan**)>& create);
// ncclM2nCommRelease: frees comm's reshard plans once their executes finished (at most twice each plan's budget).
ncclResult_t releaseReshardPlans(ncclComm_t comm);

}  // namespace ncclm2n
