// The Low-Latency calls' launches: whole, or split into a send half and ncclEpComplete's receive half; across NVLink
// domains the rail exchange between the halves; the rank mask (enable_mask) and ncclEpMaskClean.
#include <vector>

#include "common/checks.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "nccl_ep/src/ll/ll.h"

namespace ncclep {

namespace {

// A grid above the default budget (kSharedSms) is launched cooperatively: its CTAs wait on one another (a rank's own
// header and rows), so it must be resident whole, and with most SMs taken a kernel on another stream could keep part
// of a plain launch out until the timeout; a cooperative one starts whole or fails to launch. Virtual ranks never: their
// kernels must run at once, each within its share of the GPU (at most kSharedSms of them at 2 ranks on 132 SMs).
bool llCooperative(const ncclEpGroup* g, int ctas) { return !g->window.domain->isVirtual() && ctas > kSharedSms; }

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
  const bool cooperative = llCooperative(g, ctas);
  c.phases = sendOnly || rail ? kLlSend : kLlSend | kLlReceive;
  NCCLEXT_CHECK(launch(g->view, h->view, c, ctas, cooperative, stream));
  if (rail) {
    NCCLEXT_CHECK(rail->exchange(kind, ownerWeighted(c), stream));
    if (!sendOnly) {
      c.phases = kLlReceive;
      return launch(g->view, h->view, c, ctas, cooperative, stream);
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
  const bool cooperative = llCooperative(g, h->pendingCtas);
  if (kind == kDispatch)
    return launchLlDispatch(g->view, h->view, h->pendingDispatch, h->pendingCtas, cooperative, stream);
  return launchLlCombine(g->view, h->view, h->pendingCombine, h->pendingCtas, cooperative, stream);
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
