// The High-Throughput calls' launches: whole inside one NVLink domain; across domains the send half and the rail
// exchange of the call's kind in rounds, the hierarchical HT's pack, reduce and scatter around them, the overlapped
// send half on the rail's side stream, then the receive half.
#include "common/checks.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "nccl_ep/src/ht/ht.h"

namespace ncclep {

namespace {

// The hierarchical HT (relay mode, ht_hierarchical): dispatch packs the round's rail rows per (token, domain) before
// the exchange; combine first reduces, as a relay, its domain's rows at the round's positions for the other domains'
// sources (a kernel that waits for my domain's ranks: the fence follows), and after the exchange scatters the
// round's partials.
ncclResult_t beforeExchange(ncclEpGroup* g, const ncclEpHandle* h, const DispatchCall& c, cudaStream_t stream) {
  return launchHierPack(g->view, h->view, c, stream);
}
ncclResult_t beforeExchange(ncclEpGroup* g, const ncclEpHandle* h, const CombineCall& c, cudaStream_t stream) {
  NCCLEXT_CHECK(launchHierReduce(g->view, h->view, c, stream));
  g->rail->relayFence(stream);
  return ncclSuccess;
}
ncclResult_t afterExchange(ncclEpGroup*, const ncclEpHandle*, const DispatchCall&, cudaStream_t) { return ncclSuccess; }
ncclResult_t afterExchange(ncclEpGroup* g, const ncclEpHandle* h, const CombineCall& c, cudaStream_t stream) {
  return launchHierScatter(g->view, h->view, c, stream);
}

// The overlapped exchange's join (Rail::sideStream): the caller's stream waits for the side stream's send half before
// the receive half, on every path out.
struct Join {
  Rail* rail;
  cudaStream_t stream;
  bool forked = false;
  ~Join() {
    if (forked) NCCLEXT_WARN_ON(rail->join(stream));
  }
};

template <typename Call>
ncclResult_t launchCall(ncclEpHandle* h, CallKind kind, Call c,
                        ncclResult_t (*launch)(const GroupView&, const HandleView&, const Call&, cudaStream_t),
                        cudaStream_t stream) {
  ncclEpGroup* g = h->group;
  Rail* rail = g->rail.get();
  if (!rail) return launch(g->view, h->view, c, stream);
  // EXACT handles know every rank's counts on the host (their binding waited for them): only those rows travel.
  const int64_t* counts = h->config.sizing == NCCL_EP_SIZING_EXACT ? h->hostTotals + 2 : nullptr;
  // The flat exchange moves a call in rounds (RailView::direct): each a send half and its exchange, the first one
  // also writing my domain's rows. The hierarchical HT moves its rail rows in rounds: the send half runs whole in
  // the first, then each round packs (dispatch) or reduces (combine) its positions, exchanges them, and (combine)
  // scatters the partials it got back. Other relayed exchanges: one round. The receive half follows the last round.
  const RailView& rv = g->view.rail;
  const bool hier = rv.hier;
  const int rounds = rail->rounds(counts, stream);
  // Overlapped: the send half's NVLink part on the rail's side stream beside the rounds. The flat exchange's is my
  // domain's rows (the rounds then write only outboxes); the hierarchical one's is its whole send half (it writes
  // only my domain's rows and, for combine, the outboxes my domain's relays reduce, whose flags they wait for), so
  // its rounds only pack or reduce, exchange and relay or scatter.
  Join join{rail, stream};
  const bool overlap = rail->sideStream() != nullptr;  // RailView::overlappable
  if (overlap) {
    NCCLEXT_CHECK(rail->fork(stream));
    Call local = c;
    local.phase = kHtSendHalf;
    local.localOnly = hier ? 0 : 1;
    const ncclResult_t launched = launch(g->view, h->view, local, rail->sideStream());
    NCCLEXT_CHECK(rail->forked());
    join.forked = true;
    NCCLEXT_CHECK(launched);
  }
  for (int k = 0; k < rounds; k++) {
    c.phase = kHtSendHalf;
    c.roundLo = k * rv.roundSlots;
    c.roundSlots = rv.direct || hier ? rv.roundSlots : 0;
    c.remoteOnly = k > 0 || overlap;
    if (!hier) {
      NCCLEXT_CHECK(launch(g->view, h->view, c, stream));
    } else if (k == 0 && !overlap) {
      Call whole = c;
      whole.roundLo = whole.roundSlots = whole.remoteOnly = 0;
      NCCLEXT_CHECK(launch(g->view, h->view, whole, stream));
    }
    if (hier) NCCLEXT_CHECK(beforeExchange(g, h, c, stream));
    NCCLEXT_CHECK(rail->exchange(kind, false, stream, counts, h->view.hierFwd, k));
    if (hier) NCCLEXT_CHECK(afterExchange(g, h, c, stream));
    if (rv.capped) NCCLEXT_CHECK(launchCapScatter(g->view, h->view, kind, c.roundLo, c.rowBytes, stream));
  }
  c.roundLo = c.roundSlots = c.remoteOnly = 0;
  if (join.forked) {
    NCCLEXT_CUDA(rail->join(stream));
    join.forked = false;
  }
  c.phase = kHtReceiveHalf;
  return launch(g->view, h->view, c, stream);
}

}  // namespace

ncclResult_t htDispatch(ncclEpHandle* h, const DispatchCall& c, cudaStream_t stream) {
  return launchCall(h, kDispatch, c, launchDispatch, stream);
}

ncclResult_t htCombine(ncclEpHandle* h, const CombineCall& c, cudaStream_t stream) {
  return launchCall(h, kCombine, c, launchCombine, stream);
}

}  // namespace ncclep
