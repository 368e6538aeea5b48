// ncclM2nReshard on cached plans (reshard.h): a call finds its plan by key, or creates it (collectively) and evicts
// the oldest past kReshardPlans, then enqueues the execute and records an event; nothing waits on the host but an
// eviction or ncclM2nCommRelease, each for the executes of the plans it frees.
#include "nccl_m2n/src/reshard.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "common/device_status.h"
#include "common/env.h"
#include "nccl_m2n/src/executor.h"

namespace ncclm2n {
namespace {

struct Cached {
  ncclM2nPlan* plan = nullptr;
  cudaEvent_t done = nullptr;  // recorded after each execute of the plan
  int device = 0;
  double budget = 0;  // the plan's timeout
};

std::mutex cacheMu;
// Never destroyed: a process that never releases its communicators leaves its plans to the exit (no destructor
// touching CUDA after its teardown).
std::map<ncclComm_t, RecentPlans<Cached>>& cache() {
  static auto* plans = new std::map<ncclComm_t, RecentPlans<Cached>>();
  return *plans;
}

// Waits (at most twice the plan's budget: the watchdog ends its exchanges within one) for the plan's last execute,
// then destroys it. A wait that runs out leaves the plan to the process (its kernels may still read it).
ncclResult_t release(Cached& c, const char* what) {
  int current = 0;
  NCCLEXT_CUDA(cudaGetDevice(&current));
  if (current != c.device) NCCLEXT_CUDA(cudaSetDevice(c.device));
  cudaStream_t s = nullptr;
  ncclResult_t res = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
                             cudaStreamWaitEvent(s, c.done, 0) == cudaSuccess
                         ? ncclext::waitStream(s, 2 * c.budget, what)
                         : ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: %s", what,
                                         cudaGetErrorString(cudaGetLastError()));
  if (s) cudaStreamDestroy(s);
  if (res == ncclSuccess) {
    cudaEventDestroy(c.done);
    res = destroyPlan(c.plan);
  }
  if (current != c.device) cudaSetDevice(current);
  return res;
}

ncclResult_t releaseAll(std::vector<Cached>&& plans, const char* what) {
  ncclResult_t first = ncclSuccess;
  for (Cached& c : plans) {
    const ncclResult_t res = release(c, what);
    if (first == ncclSuccess) first = res;
  }
  return first;
}

}  // namespace

ncclResult_t reshard(ncclComm_t comm, const ncclM2nTensorSpec_t& spec, const void* src, void* dst,
                     const ncclM2nExecConfig_t* config, cudaStream_t stream,
                     const std::function<ncclResult_t(ncclM2nPlan**)>& create) {
  const std::string key = reshardKey(spec, config);
  Cached c;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(cacheMu);
    auto it = cache().try_emplace(comm, kReshardPlans).first;
    if (Cached* hit = it->second.find(key)) {
      c = *hit;
      found = true;
    }
  }
  if (found) {
    // An earlier execute of this plan outlived its budget: the plan goes (left to the process: its kernels may
    // still run) and the call reports it, as the execute would.
    const ncclResult_t earlier = asyncError(c.plan);
    if (earlier != ncclSuccess) {
      std::lock_guard<std::mutex> lock(cacheMu);
      Cached dropped;
      cache()[comm].take(key, &dropped);
      return earlier;
    }
    // The plan's previous execute (maybe on another stream) before this one: its staging is the plan's.
    NCCLEXT_CUDA(cudaStreamWaitEvent(stream, c.done, 0));
  } else {
    NCCLEXT_CHECK(create(&c.plan));  // collective: every rank missed alike
    NCCLEXT_CUDA(cudaGetDevice(&c.device));
    c.budget = config && config->timeoutSeconds > 0 ? config->timeoutSeconds : ncclext::env().timeoutSeconds;
    if (cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming) != cudaSuccess) {
      destroyPlan(c.plan);
      return ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "ncclM2nReshard: cudaEventCreate: %s",
                           cudaGetErrorString(cudaGetLastError()));
    }
    std::vector<Cached> evicted;
    {
      std::lock_guard<std::mutex> lock(cacheMu);
      evicted = cache()[comm].add(key, c);
    }
    NCCLEXT_CHECK(releaseAll(std::move(evicted), "ncclM2nReshard (freeing the least recently used plan)"));
  }
  const ncclResult_t run = execute(c.plan, &src, &dst, stream);
  // Whatever the execute enqueued before any failure is covered by the event.
  NCCLEXT_CUDA(cudaEventRecord(c.done, stream));
  return run;
}

ncclResult_t releaseReshardPlans(ncclComm_t comm) {
  std::vector<Cached> plans;
  {
    std::lock_guard<std::mutex> lock(cacheMu);
    auto it = cache().find(comm);
    if (it == cache().end()) return ncclSuccess;
    plans = it->second.takeAll();
    cache().erase(it);
  }
  return releaseAll(std::move(plans), "ncclM2nCommRelease (the reshard plans' executes)");
}

}  // namespace ncclm2n
