#include "nccl_ep/src/handle.h"

#include <algorithm>
#include <deque>
#include <memory>

#include "common/checks.h"
#include "common/device_status.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/ht/ht.h"

ncclResult_t ncclEpHandle::create(ncclEpGroup* group, ncclEpLayout_t layout, int topk,
                                  const ncclEpHandleConfig_t& config, ncclEpHandle** out) {
  std::unique_ptr<ncclEpHandle> h(new ncclEpHandle());
  h->group = group;
  h->layout = layout;
  h->config = config;
  h->topk = topk;
  const ncclep::GroupView& g = group->view;
  const int R = g.nRanks, E = g.numExperts, L = g.localExperts, NC = g.nChunks, MK = g.meta.maxTopk;
  const int align = std::max(1, config.dispatch_output_per_expert_alignment);
  h->maxFlatRows = g.recvCap > 0 ? g.recvCap : (int64_t)R * g.maxTokens;  // HT's receive cap bounds the FLAT rows
  if (g.lowLatency) {  // fixed layouts: RANK_MAJOR [R][M], EXPERT_MAJOR [L][R x M]
    h->maxRecvRows = layout == NCCL_EP_LAYOUT_RANK_MAJOR ? h->maxFlatRows : h->maxFlatRows * L;
  } else {
    h->maxRecvRows =
        layout == NCCL_EP_LAYOUT_FLAT ? h->maxFlatRows : h->maxFlatRows * std::min(topk, L) + (int64_t)L * (align - 1);
  }
  ncclep::DerivedLayout& dl = h->view.dl;
  int n = 0;
  dl.srcCount = n;
  n += R;
  dl.recvOffset = n;
  n += R;
  dl.expCount = n;
  n += L;
  dl.zoneStart = n;
  n += L + 1;
  dl.srcExpOff = n;
  n += R * L;
  dl.chunkPrefix = n;
  n += R * (NC + 1);
  dl.totals = n;
  n += 2;
  dl.peerChunks = n;
  n += 1;
  dl.dispAt = n;
  n += R;
  dl.combAt = n;
  n += R;
  dl.combMine = n;
  n += R;
  dl.dropped = n;
  n += 1;
  dl.overflow = n;
  n += 1;
  dl.ints = n;
  // One device block: sendSlot, emIdx, tileCount, derived, emPos, flatW, llRecvCount, llToken, and for the
  // hierarchical HT hierPos, hierFwd and hierTok.
  const size_t hierDomains = g.rail.hier ? (size_t)(R / g.rail.domainSize) : 0;
  const size_t sizes[] = {(size_t)g.maxTokens * R * 4,
                          (size_t)g.maxTokens * MK * 4,
                          (size_t)(NC + 1) * (R + E) * 4,
                          (size_t)dl.ints * 4,
                          (size_t)h->maxFlatRows * MK * 4,
                          (size_t)h->maxFlatRows * MK * 4,
                          (size_t)R * 4,
                          (size_t)h->maxFlatRows * 4,
                          (size_t)g.maxTokens * hierDomains * 4,
                          hierDomains * g.maxTokens * (size_t)g.rail.domainSize * 4,
                          hierDomains * ((size_t)g.maxTokens + 1) * 4};
  constexpr int kArrays = sizeof(sizes) / sizeof(sizes[0]);
  size_t offsets[kArrays], total = 0;
  for (int i = 0; i < kArrays; i++) {
    offsets[i] = total;
    total = ncclep::alignUp(total + sizes[i], 256);
  }
  NCCLEXT_CHECK(group->memory.alloc(&h->block, total));
  char* b = static_cast<char*>(h->block);
  ncclep::HandleView& v = h->view;
  v.topk = topk;
  v.layout = layout;
  v.align = align;
  v.sendSlot = reinterpret_cast<int*>(b + offsets[0]);
  v.emIdx = reinterpret_cast<int*>(b + offsets[1]);
  v.tileCount = reinterpret_cast<int*>(b + offsets[2]);
  v.derived = reinterpret_cast<int*>(b + offsets[3]);
  v.emPos = reinterpret_cast<int*>(b + offsets[4]);
  v.flatW = reinterpret_cast<float*>(b + offsets[5]);
  v.llRecvCount = reinterpret_cast<int*>(b + offsets[6]);
  v.llToken = reinterpret_cast<int*>(b + offsets[7]);
  v.hierPos = hierDomains ? reinterpret_cast<int*>(b + offsets[8]) : nullptr;
  v.hierFwd = hierDomains ? reinterpret_cast<int*>(b + offsets[9]) : nullptr;
  v.hierTok = hierDomains ? reinterpret_cast<int*>(b + offsets[10]) : nullptr;
  void* host = nullptr;
  const size_t hostInts = 2 + 2 * (size_t)R + (hierDomains ? 2 * hierDomains + 1 : 0);  // HandleView::hostTotals
  NCCLEXT_CUDA(cudaHostAlloc(&host, hostInts * sizeof(int64_t), cudaHostAllocMapped | cudaHostAllocPortable));
  h->hostTotals = static_cast<int64_t*>(host);
  std::fill(h->hostTotals, h->hostTotals + hostInts, -1);
  if (config.sizing == NCCL_EP_SIZING_EXACT) {
    void* dev = nullptr;
    NCCLEXT_CUDA(cudaHostGetDevicePointer(&dev, host, 0));
    v.hostTotals = static_cast<int64_t*>(dev);
  }
  // Virtual ranks: no peer's route kernels may wait for mine while an allocation above waits for the GPU.
  if (group->window.domain->isVirtual()) NCCLEXT_CHECK(group->window.domain->barrier());
  *out = h.release();
  return ncclSuccess;
}

ncclEpHandle::~ncclEpHandle() {
  if (pendingKind >= 0) {  // its send-only call is abandoned
    std::deque<ncclEpHandle*>& q = group->ll.pending[pendingKind];
    q.erase(std::remove(q.begin(), q.end(), this), q.end());
  }
  group->memory.free(block);
  group->memory.freeHost(hostTotals);
}

ncclResult_t ncclEpHandle::bind(const ncclEpTensor_t& topkIdx, const ncclEpLayoutInfo_t* info, cudaStream_t stream) {
  view.numTokens = (int)topkIdx.sizes[0];
  view.topkIdx = topkIdx.data;
  view.topkIs64 = topkIdx.datatype == ncclInt64 || topkIdx.datatype == ncclUint64;
  const ncclep::LayoutInfoOut out = layoutInfoOut(info);
  if (group->view.lowLatency) {  // the counts travel with every dispatch
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, false, ncclep::kHtWhole, stream));
  } else if (!group->rail) {
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtWhole, stream));
  } else {  // across domains: the exchange kernel's halves around the rail exchange of the count rows
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtSendHalf, stream));
    NCCLEXT_CHECK(group->rail->exchange(ncclep::kRailHandle, false, stream));
    NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtReceiveHalf, stream));
    if (group->view.rail.capped) {  // the counts of the rows that fit, where some rank overflows (ht/route.cu)
      NCCLEXT_CHECK(group->rail->exchange(ncclep::kRailHandle, false, stream));
      NCCLEXT_CHECK(ncclep::launchRoute(group->view, view, out, true, ncclep::kHtRetainedHalf, stream));
    }
  }
  if (config.sizing == NCCL_EP_SIZING_EXACT) {
    // The caller reads the error word through group->asyncError (input errors get their own message there).
    NCCLEXT_CHECK(ncclext::waitStream(stream, group->timeoutSeconds, "handle creation"));
  }
  return ncclSuccess;
}
