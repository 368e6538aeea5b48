#include "nccl_ep/src/rail/rail.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/watchdog.h"
#include "nccl_ep/src/layout.h"

namespace ncclep {

namespace {

// A zero fill of `bytes` at `p` on `stream`, named in the error.
ncclResult_t zero(void* p, size_t bytes, cudaStream_t stream, const char* what) {
  if (bytes > 0 && cudaMemsetAsync(p, 0, bytes, stream) != cudaSuccess)
    return ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: zero-fill failed", what);
  return ncclSuccess;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  return capture != cudaStreamCaptureStatusNone;
}

}  // namespace

ncclResult_t Rail::create(const Options& options, GroupView* view, char* window, cudaStream_t stream,
                          std::unique_ptr<Rail>* out) {
  std::unique_ptr<Rail> rail(new Rail(options, *view, window));
  NCCLEXT_CHECK(rail->allocate(view, stream));
  const RailView& rv = view->rail;
  const ncclext::Topology& topo = *options.topo;
  ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
  cc.blocking = 1;
  const ncclResult_t split = rv.relay ? ncclCommSplit(options.domainRail, 0, topo.domainIndex, &rail->comm_, &cc)
                                      : ncclCommSplit(options.comm, 0, topo.rank, &rail->comm_, &cc);
  if (split != ncclSuccess)
    return ncclext::fail(split, __FILE__, __LINE__, "the rail communicator: ncclCommSplit: %s",
                         ncclGetErrorString(split));
  if (rv.overlappable() && options.overlap) {
    if (cudaStreamCreateWithFlags(&rail->sideStream_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&rail->forkEvent_, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&rail->joinEvent_, cudaEventDisableTiming) != cudaSuccess)
      return ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "the overlapped exchange's stream and events");
  }
  if (rv.relay && options.virt) {  // every virtual rank here, in the same order (VirtualDomain::newKey)
    rail->fenceKey_ = options.virt->newKey(topo.rank - rv.domainBase);
    rail->fenced_ = true;
  }
  NCCLEXT_CHECK(rail->connect(stream));
  *out = std::move(rail);
  return ncclSuccess;
}

// The outboxes, then the inboxes, one allocation; the hierarchical HT: the inboxes only (its outboxes are in the
// window); the direct exchange: the outboxes only (it receives into the window), and with a receive cap the inboxes
// too (RailView::capped). Then the hierarchical HT's rail rows of a round (dispatch: a row and its tail; combine: a
// partial row), out and in, and the mask barrier's bytes.
// All zeroed: slots that no call wrote yet travel too (whole slices), and their flags must read as no call's (relay
// mode copies them into a peer's window while it may be waiting on the slot's flag of a later call).
ncclResult_t Rail::allocate(GroupView* view, cudaStream_t stream) {
  RailView& rv = view->rail;
  const bool inboxes = !rv.direct || rv.capped;
  const size_t boxes = rv.outboxBytes * rv.boxes, inboxBytes = inboxes ? rv.inboxBytes * rv.boxes : 0;
  bytes_ = boxBytes_ = railBoxBytes(rv);
  NCCLEXT_CHECK(o_.memory->alloc(&boxes_, boxBytes_));
  rv.outbox = rv.hier ? window_ + view->wl.outboxes : static_cast<char*>(boxes_);
  rv.inbox = rv.hier ? static_cast<char*>(boxes_) : inboxes ? rv.outbox + boxes : nullptr;
  NCCLEXT_CHECK(zero(rv.outbox, boxes, stream, "the outboxes"));
  if (rv.inbox) NCCLEXT_CHECK(zero(rv.inbox, inboxBytes, stream, "the inboxes"));
  if (rv.hier) {
    const size_t slots = (size_t)o_.topo->nDomains * rv.roundSlots, dispBytes = slots * rv.hierRow.bytes(),
                 combBytes = slots * hierRowBytes(*view, kCombine), rows = hierRailRowBytes(*view);
    NCCLEXT_CHECK(o_.memory->alloc(&hierRows_, rows));
    bytes_ += rows;
    rv.hierOut = static_cast<char*>(hierRows_);
    rv.hierIn = rv.hierOut + dispBytes;
    rv.hierCombOut = rv.hierIn + dispBytes;
    rv.hierCombIn = rv.hierCombOut + combBytes;
    NCCLEXT_CHECK(zero(hierRows_, rows, stream, "the hierarchical rows"));
  }
  if (o_.maskBarrier) {
    const size_t bytes = 8 * ((size_t)view->nRanks + 1);
    NCCLEXT_CHECK(o_.memory->alloc(&barrierBuf_, bytes));
    NCCLEXT_CHECK(zero(barrierBuf_, bytes, stream, "the rail barrier"));
  }
  return ncclSuccess;
}

ncclResult_t Rail::connect(cudaStream_t stream) {
  const RailView& rv = view_.rail;
  const ncclext::Topology& topo = *o_.topo;
  // Relay: the rail's ranks are the domains (mine excluded).
  std::vector<char> remote(rv.relay ? topo.nDomains : topo.nRanks, 0);
  for (int r = 0; r < (int)remote.size(); r++) remote[r] = rv.relay ? r != topo.domainIndex : !rv.local(r);
  const ncclResult_t res = ncclext::connectPeers(
      comm_, remote, remote, this, o_.timeoutSeconds, stream, [this] { abort(); }, "ncclEpCreateGroup (the rail)");
  if (aborted_)
    return ncclext::fail(ncclRemoteError, __FILE__, __LINE__,
                         "ncclEpCreateGroup: connecting to the ranks of the other NVLink domains did not finish within "
                         "%.1f s (a peer that died or never called ncclEpCreateGroup)",
                         o_.timeoutSeconds);
  return res;
}

Rail::~Rail() {
  ncclext::Watchdog::instance().removeOwner(this);  // after it, no action of the watchdog touches the rail
  if (comm_ && !aborted_) {
    // NCCL's destruction waits for the graphs that captured work on the communicator: on a thread of its own then.
    ncclComm_t c = comm_;
    if (captured_)
      std::thread([c] { ncclCommDestroy(c); }).detach();
    else
      NCCLEXT_WARN_ON(ncclCommDestroy(c));
  }
  if (sideStream_) NCCLEXT_WARN_ON(cudaStreamDestroy(sideStream_));
  if (forkEvent_) NCCLEXT_WARN_ON(cudaEventDestroy(forkEvent_));
  if (joinEvent_) NCCLEXT_WARN_ON(cudaEventDestroy(joinEvent_));
  o_.memory->freeNow(boxes_);
  o_.memory->freeNow(hierRows_);
  o_.memory->freeNow(barrierBuf_);
}

// As nccl_m2n's abortExchanges: an enqueue that does not let the lock go within a second is blocked inside NCCL,
// which ncclCommAbort from another thread ends.
void Rail::abort() {
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(1));
  if (aborted_) return;
  char msg[400];
  snprintf(msg, sizeof(msg),
           "across NVLink domains: a rail exchange timed out (not finished within %.1f s: a peer of another domain "
           "that died or never calls): the group's rail communicator was aborted; destroy the group",
           o_.timeoutSeconds);
  why_ = msg;
  aborted_ = true;
  ncclComm_t c = comm_;
  if (captured_) {
    std::thread([c] { ncclCommAbort(c); }).detach();
  } else {
    ncclCommAbort(c);
  }
}

int Rail::rounds(const int64_t* counts, cudaStream_t stream) const {
  return railRoundsOf(view_.rail, view_.nRanks, view_.maxTokens, capturing(stream) ? nullptr : counts);
}

size_t Rail::hierMessageBytes(int kind) const { return (size_t)view_.rail.roundSlots * hierRowBytes(view_, kind); }

ncclResult_t Rail::inGroup(cudaStream_t stream, const char* what,
                           const std::function<ncclResult_t(bool captured)>& body) {
  if (aborted_) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", why_.c_str());
  const bool captured = capturing(stream);
  if (captured) captured_ = true;
  std::lock_guard<std::timed_mutex> lock(mu_);
  if (aborted_) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", why_.c_str());
  NCCLEXT_NCCL(ncclGroupStart());
  const ncclResult_t res = body(captured);
  const ncclResult_t ended = ncclGroupEnd();
  if (res != ncclSuccess || ended != ncclSuccess)
    return ncclext::fail(res != ncclSuccess ? res : ended, __FILE__, __LINE__,
                         "%s across NVLink domains: NCCL point-to-point: %s", what, ncclGetLastError(comm_));
  if (!captured) {  // a replay runs later, unwatched
    ncclext::watchStream(this, o_.timeoutSeconds, stream, [this] { abort(); });
  }
  return ncclSuccess;
}

ncclResult_t Rail::exchange(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts, int* hierFwd,
                            int round) {
  const RailView& rv = view_.rail;
  const bool hierCall = rv.hier && kind != kRailHandle;
  const char* what = kind == kDispatch ? "dispatch" : kind == kCombine ? "combine" : "handle";
  // A captured call moves the fixed slices: its replays must not depend on this call's counts.
  NCCLEXT_CHECK(inGroup(stream, what, [&](bool captured) {
    return messages(kind, ownerWeighted, stream, captured ? nullptr : counts, round);
  }));
  if (!rv.relay) return rv.direct ? ncclSuccess : launchRailInbox(view_, kind, ownerWeighted, stream);
  if (hierCall && kind == kCombine) return ncclSuccess;  // the source's scatter follows (ht/calls.cc)
  NCCLEXT_CHECK(launchRailRelay(view_, kind, ownerWeighted, hierFwd, round, stream));
  relayFence(stream);
  return ncclSuccess;
}

// Inside exchange's NCCL group (`counts` NULL in a capture). NCCLEXT_CHECK hands NCCL's code to inGroup, which
// names it.
ncclResult_t Rail::messages(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts, int round) {
  const GroupView& view = view_;
  const RailView& rv = view.rail;
  const RailRegions regions = rv.regionsOf(kind, ownerWeighted);
  const int R = view.nRanks;
  if (rv.hier && kind != kRailHandle) {
    // The hierarchical HT: to each other domain D's rank of my index (rail rank D), dispatch: my rail rows for D;
    // combine: my partials for its sources (as their relay); from it the same for my domain, one message each way,
    // the round's positions [round x roundSlots, + roundSlots) from the start of the round's rows. An EXACT
    // handle's eager call moves the rows its routing fills (positions 0.. in token order: my tokens that hit D out,
    // and back as partials; its tokens that hit my domain in, and back), no message where there are none;
    // otherwise the fixed messages. Rows past the ones sent are stale (an earlier call's number, or another
    // position: the relay skips them), and a source reads only the partials of its own positions.
    const int G = rv.domainSize, myDomain = view.rank / G, D = R / G;
    const bool dispatch = kind == kDispatch, sized = counts != nullptr;
    const size_t bytes = hierMessageBytes(kind), row = hierRowBytes(view, kind);
    const int64_t* rail = counts ? counts + 2 * (size_t)R : nullptr;  // hostTotals: views.h, HandleView
    char* out = dispatch ? rv.hierOut : rv.hierCombOut;
    char* in = dispatch ? rv.hierIn : rv.hierCombIn;
    for (int d = 0; d < D; d++) {
      if (d == myDomain) continue;
      const int64_t mine = sized ? rail[d] : view.maxTokens, its = sized ? rail[D + d] : view.maxTokens;
      const size_t toD = (size_t)railRoundRows(rv, round, dispatch ? mine : its) * row;
      const size_t fromD = (size_t)railRoundRows(rv, round, dispatch ? its : mine) * row;
      if (toD > 0) NCCLEXT_CHECK(ncclSend(out + (size_t)d * bytes, toD, ncclUint8, d, comm_, stream));
      if (fromD > 0) NCCLEXT_CHECK(ncclRecv(in + (size_t)d * bytes, fromD, ncclUint8, d, comm_, stream));
    }
  } else if (rv.relay) {
    // To the rank of my index in each other domain D (rail rank D): what I wrote for each of its ranks, one message
    // per rank in rank order; from it, what it wrote for each rank of mine, into inbox[D * G + r] (matched in the
    // same order). Whole fixed spans: a relay does not know another pair's counts.
    const int G = rv.domainSize, myDomain = view.rank / G;
    const size_t from = rv.outOff[regions.first], bytes = rv.spanOf(regions);
    for (int d = 0; d < R / G; d++) {
      if (d == myDomain) continue;
      for (int r = 0; r < G; r++) {
        const size_t box = (size_t)(d * G + r);
        NCCLEXT_CHECK(ncclSend(rv.outbox + box * rv.outboxBytes + from, bytes, ncclUint8, d, comm_, stream));
        NCCLEXT_CHECK(ncclRecv(rv.inbox + box * rv.inboxBytes + from, bytes, ncclUint8, d, comm_, stream));
      }
    }
  } else if (rv.direct) {
    // High-Throughput: a message per region and direction, from my outbox for remote rank r (box(r)) straight into
    // r's slice of my window: a rank of another domain writes there only through this exchange, which my stream
    // runs after my receive half of the previous call read it, and before this call's receive half reads it. Round
    // k moves the slots [k x roundSlots, + roundSlots), which its send half wrote from the outbox's start: an EXACT
    // handle's eager call the rows its routing fills (slots are dense from 0; what my peer sends me is what I
    // count from it), no message where there are none; otherwise whole slices (stale slots of earlier calls travel
    // too and are never read: a receiver reads only this call's rows). The handle's count row goes whole. With a
    // receive cap (RailView::capped) a round lands in my inbox for r instead (RailView::inOff), and
    // launchCapScatter places its rows (ht/calls.cc); the counts are then the rows delivered (under the cap).
    const bool sized = counts != nullptr, dispatch = kind == kDispatch;
    const int64_t lo = (int64_t)round * rv.roundSlots;
    for (int r = 0; r < R; r++) {
      if (rv.local(r)) continue;
      const int64_t out = railRoundRows(rv, round, !sized ? view.maxTokens : dispatch ? counts[r] : counts[R + r]);
      const int64_t in = railRoundRows(rv, round, !sized ? view.maxTokens : dispatch ? counts[R + r] : counts[r]);
      for (int i = regions.first; i <= regions.last; i++) {
        const bool whole = kind == kRailHandle;
        const size_t sendBytes = whole ? rv.slice[i] : (size_t)out * rv.slotBytes(i);
        const size_t recvBytes = whole ? rv.slice[i] : (size_t)in * rv.slotBytes(i);
        char* from = rv.outbox + (size_t)rv.box(r) * rv.outboxBytes + rv.outOff[i];
        char* into = whole       ? window_ + rv.base[i] + (size_t)r * rv.slice[i]
                     : rv.capped ? rv.inbox + (size_t)rv.box(r) * rv.inboxBytes + rv.inOff[i]
                                 : window_ + rv.roundInto(i, r, lo);
        if (sendBytes > 0) NCCLEXT_CHECK(ncclSend(from, sendBytes, ncclUint8, r, comm_, stream));
        if (recvBytes > 0) NCCLEXT_CHECK(ncclRecv(into, recvBytes, ncclUint8, r, comm_, stream));
      }
    }
  } else {
    // Low-Latency: one message each way per remote rank (a message has a fixed cost of its own, milliseconds over
    // sockets: docs/PERFORMANCE.md): the call's regions lie end to end in the outbox, and land in my inbox. With
    // enable_mask, none to or from a rank my host mask marks inactive, and none at all when it marks me (the
    // kernels send such ranks nothing and read nothing of theirs; every rank applies the same mask update).
    const size_t from = rv.outOff[regions.first], bytes = rv.spanOf(regions);
    const bool masks = view.mask != nullptr;
    for (int r = 0; r < R; r++) {
      if (rv.local(r) || (masks && (!o_.hostMask[r] || !o_.hostMask[view.rank]))) continue;
      const size_t box = (size_t)rv.box(r);
      NCCLEXT_CHECK(ncclSend(rv.outbox + box * rv.outboxBytes + from, bytes, ncclUint8, r, comm_, stream));
      NCCLEXT_CHECK(ncclRecv(rv.inbox + box * rv.inboxBytes + from, bytes, ncclUint8, r, comm_, stream));
    }
  }
  return ncclSuccess;
}

void Rail::relayFence(cudaStream_t stream) {
  if (!fenced_ || fenceLost_ || capturing(stream)) return;
  fenceLost_ = o_.virt->fence(view_.rank - view_.rail.domainBase, fenceKey_, o_.timeoutSeconds) != ncclSuccess;
}

void Rail::forgetFences() {
  if (fenced_) o_.virt->forget(fenceKey_);
}

ncclResult_t Rail::maskBarrier(cudaStream_t stream) {
  return inGroup(stream, "ncclEpMaskClean", [&](bool) {
    char* buf = static_cast<char*>(barrierBuf_);
    const int* mask = o_.hostMask;
    if (!mask[view_.rank]) return ncclSuccess;
    for (int r = 0; r < view_.nRanks; r++) {
      if (view_.rail.local(r) || !mask[r]) continue;
      NCCLEXT_CHECK(ncclSend(buf, 8, ncclUint8, r, comm_, stream));
      NCCLEXT_CHECK(ncclRecv(buf + 8 * (size_t)(r + 1), 8, ncclUint8, r, comm_, stream));
    }
    return ncclSuccess;
  });
}

ncclResult_t Rail::zeroStaging(cudaStream_t stream) {
  if (boxes_) NCCLEXT_CUDA(cudaMemsetAsync(boxes_, 0, boxBytes_, stream));
  return ncclSuccess;
}

ncclResult_t Rail::fork(cudaStream_t stream) {
  NCCLEXT_CUDA(cudaEventRecord(forkEvent_, stream));
  NCCLEXT_CUDA(cudaStreamWaitEvent(sideStream_, forkEvent_, 0));
  return ncclSuccess;
}

ncclResult_t Rail::forked() {
  NCCLEXT_CUDA(cudaEventRecord(joinEvent_, sideStream_));
  return ncclSuccess;
}

cudaError_t Rail::join(cudaStream_t stream) { return cudaStreamWaitEvent(stream, joinEvent_, 0); }

}  // namespace ncclep
