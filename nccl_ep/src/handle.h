// The handle: a routing bound once to its group (the route kernels' outputs, the counts an EXACT handle waits for),
// which every dispatch and combine on it reads. Internal: api.cc validates the public structs and calls these.
#pragma once

#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ll/ll.h"
#include "nccl_ep/src/views.h"

struct ncclEpGroup;

struct ncclEpHandle {
  ncclEpGroup* group = nullptr;
  ncclEpLayout_t layout = NCCL_EP_LAYOUT_UNSET;
  ncclEpHandleConfig_t config{};
  int topk = 0;
  void* block = nullptr;          // device memory of the HandleView arrays
  int64_t* hostTotals = nullptr;  // pinned, mapped
  ncclep::HandleView view{};
  int64_t maxFlatRows = 0, maxRecvRows = 0;
  // Low-Latency: this handle's send-only call awaiting ncclEpComplete (pendingKind -1: none), and its launch.
  int pendingKind = -1;
  int pendingCtas = 0;
  ncclep::LlDispatchCall pendingDispatch{};
  ncclep::LlCombineCall pendingCombine{};

  static ncclResult_t create(ncclEpGroup* group, ncclEpLayout_t layout, int topk, const ncclEpHandleConfig_t& config,
                             ncclEpHandle** out);
  ~ncclEpHandle();
  // Binds routing (validated shapes): launches the route kernels; EXACT sizing waits for the counts.
  ncclResult_t bind(const ncclEpTensor_t& topkIdx, const ncclEpLayoutInfo_t* info, cudaStream_t stream);
  // Rows this rank receives in this handle's layout (EXACT only).
  int64_t recvRows() const { return layout == NCCL_EP_LAYOUT_EXPERT_MAJOR ? hostTotals[1] : hostTotals[0]; }
};
