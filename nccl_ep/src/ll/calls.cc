// The Low-Latency calls' launches: whole, or split into a send half and ncclEpComplete's receive half; across NVLink
// domains the rail exchange between the halves; the rank mask (enable_mask) and ncclEpMaskClean.
#include <vector>

#include "common/checks.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "nccl_ep/src/ll/ll.h"

namespace ncclep {

namespace {

// A whole call (both halves in one kernel) on a grid above the default budget (kSharedSms) is launched
// cooperatively, as DeepEP's low-latency kernels are: it starts whole once that many SMs are free, rather than in
// part beside another stream's kernel with its resident CTAs spinning on rows that CTAs not yet started would send.
// A half alone has no waits among its own CTAs (a receive half waits only on earlier launches): plain. Virtual ranks
// never: their kernels must all run at once, each within its share of the GPU.
bool llCooperative(const ncclEpGroup* g, int ctas, int phases) {
  return !g->window.domain->isVirtual() && ctas > kSharedSms && phases == (kLlSend | kLlReceive);
}

// Whether a call's combine rows go to the owner by (token, expert): its exchange moves their own regions.
bool ownerWeighted(const LlDispatchCall&) { return false; }
bool ownerWeighted(const LlCombineCall& c) { return c.mode == kLlOwnerWeighted; }

template <typename Call>
ncclResult_t launchCall(ncclEpHandle* h, CallKind kind, Call c, int ctas, bool sendOnly, Call* keep,
                        ncclResult_t (*launch)(const GroupView&, const HandleView&, const Call&, int, bool,
                                               cudaStream_t),
                        cudaStream_t stream) {
  ncclEpGroup* g = h->group;
  Rail* rail = g->rail.get();
  c.phases = sendOnly || rail ? kLlSend : kLlSend | kLlReceive;
  NCCLEXT_CHECK(launch(g->view, h->view, c, ctas, llCooperative(g, ctas, c.phases), stream));
  if (rail) {
    NCCLEXT_CHECK(rail->exchange(kind, ownerWeighted(c), stream));
    if (!sendOnly) {
      c.phases = kLlReceive;
      return launch(g->view, h->view, c, ctas, false, stream);
    }
  }
  if (!sendOnly) return ncclSuccess;
  c.phases = kLlReceive;
  *keep = c;
  h->pendingKind = kind;
  h->pendingCtas = ctas;
  g->ll.pending[kind].push_back(h);
  return ncclSuccess;
}

}  // namespace

ncclResult_t llDispatch(ncclEpHandle* h, const LlDispatchCall& c, int ctas, bool sendOnly, cudaStream_t stream) {
  return launchCall(h, kDispatch, c, ctas, sendOnly, &h->pendingDispatch, launchLlDispatch, stream);
}

ncclResult_t llCombine(ncclEpHandle* h, const LlCombineCall& c, int ctas, bool sendOnly, cudaStream_t stream) {
  return launchCall(h, kCombine, c, ctas, sendOnly, &h->pendingCombine, launchLlCombine, stream);
}

ncclResult_t llComplete(ncclEpHandle* h, cudaStream_t stream) {
  ncclEpGroup* g = h->group;
  const int kind = h->pendingKind;
  h->pendingKind = -1;
  g->ll.pending[kind].pop_front();
  // A receive half: plain (llCooperative).
  if (kind == kDispatch) return launchLlDispatch(g->view, h->view, h->pendingDispatch, h->pendingCtas, false, stream);
  return launchLlCombine(g->view, h->view, h->pendingCombine, h->pendingCtas, false, stream);
}

ncclResult_t llSetMask(ncclEpGroup* g, const int* hostMask, cudaStream_t stream) {
  int* mask = g->ll.hostMask;
  for (int r = 0; r < g->view.nRanks; r++) mask[r] = hostMask[r] != 0;
  // From pageable memory (the group's LlState): the copy has read it before cudaMemcpyAsync returns.
  NCCLEXT_CUDA(cudaMemcpyAsync(static_cast<char*>(g->window.state) + DeviceState::kMaskOffset, mask,
                               g->view.nRanks * sizeof(int), cudaMemcpyHostToDevice, stream));
  return ncclSuccess;
}

ncclResult_t llMaskClean(ncclEpGroup* g, cudaStream_t stream) {
  const uint64_t epoch = ++g->ll.cleans;
  Rail* rail = g->rail.get();
  // Each barrier: my domain's active ranks on the device, then the other domains' over the rail.
  NCCLEXT_CHECK(launchLlCleanBarrier(g->view, 2 * epoch - 1, stream));
  if (rail) NCCLEXT_CHECK(rail->maskBarrier(stream));
  // Every flag of the calls (done flags; each bank's row, header and slice flags) and the call numbers.
  char* base = g->window.local();
  const WindowLayout& w = g->view.wl;
  NCCLEXT_CUDA(cudaMemsetAsync(base + w.dispDone, 0, w.cleanFlags - w.dispDone, stream));
  for (int bank = 0; bank < 2; bank++)
    NCCLEXT_CUDA(cudaMemsetAsync(base + w.combFlags + bank * w.bankBytes, 0, w.dispRows - w.combFlags, stream));
  NCCLEXT_CUDA(cudaMemsetAsync(g->window.state, 0, DeviceState::kCountersBytes, stream));
  if (rail) NCCLEXT_CHECK(rail->zeroStaging(stream));
  NCCLEXT_CHECK(launchLlCleanBarrier(g->view, 2 * epoch, stream));
  return rail ? rail->maskBarrier(stream) : ncclSuccess;
}

}  // namespace ncclep
