// The group (symmetric buffers, device state; one per communicator and configuration) and the handle (routing
// bound once). Internal: api.cc validates the public structs and calls these.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/device_status.h"
#include "common/domain.h"
#include "common/live_set.h"
#include "common/symmetric_memory.h"
#include "common/virtual_domain.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/include/nccl_ep_testing.h"
#include "nccl_ep/src/ht.h"
#include "nccl_ep/src/ll.h"

// The one-GPU test mode's shared object (ncclEpVirtualDomainCreate).
struct ncclEpVirtualDomain {
  explicit ncclEpVirtualDomain(int n) : domain(n) {}
  ncclext::VirtualDomain domain;
};

namespace ncclep {
// The groups and handles alive: api.cc checks every call's against them (a call on a destroyed one is an error), and
// unit tests register the objects they assemble by hand (LiveSet::Scoped).
ncclext::LiveSet& liveGroups();
ncclext::LiveSet& liveHandles();

// The one-GPU test modes a group is made in (nccl_ep_testing.h; all empty: real ranks).
struct TestingModes {
  ncclEpVirtualDomain* virtualDomain = nullptr;
  int virtualRank = 0;
  ncclComm_t virtualRail = nullptr;  // the mixed mode: relayed exchanges over the rail of my index
};

// A config with the fields an environment variable may fill resolved by common/env.h's one rule (a value the config
// gives wins; NCCL_EP_AUTO takes the variable, else the default): what ncclEpCreateGroup and ncclEpGroupInfoQuery
// both use, so that they agree.
struct ResolvedConfig {
  ncclEpGroupConfig_t config{};  // rail_round_tokens resolved (0 still: layoutGroup's default)
  bool htHierarchical = false;
  bool railOverlap = false;
  double timeoutSeconds = 100;
};
ResolvedConfig resolveConfig(const ncclEpGroupConfig_t& config);

// The group's window layout, sizes and rail view (outbox pointer aside) for `config` on `topo`: pure host
// arithmetic, the same on every rank (ncclEpGroup::create; host tests). htHierarchical: the hierarchical HT;
// relayRail: the mixed test mode's rail (TestingModes::virtualRail).
void layoutGroup(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* view,
                 bool htHierarchical = false, bool relayRail = false);
// The rail's device memory outside the window (ncclEpGroupInfo_t::rail_staging_bytes is their sum; 0 with one
// domain): the outboxes and inboxes, one allocation (the direct exchange: outboxes only; the hierarchical HT:
// inboxes only, its outboxes being in the window), and the hierarchical HT's rail rows of a round (dispatch rows
// with their tails and combine partials, out and in, a round's positions for every domain).
inline size_t railBoxBytes(const RailView& rv) {
  return (rv.hier ? 0 : rv.outboxBytes * rv.boxes) + (rv.direct ? 0 : rv.inboxBytes * rv.boxes);
}
// The hierarchical HT's rail row of exchange `kind`: dispatch, a row with its tail (ht.h, HierRow); combine, a
// partial row.
inline size_t hierRowBytes(const GroupView& v, int kind) {
  return kind == kDispatch ? v.rail.hierRow.bytes() : (size_t)v.rowStride;
}
inline size_t hierRailRowBytes(const GroupView& v) {
  if (!v.rail.hier) return 0;
  const size_t slots = (size_t)(v.nRanks / v.rail.domainSize) * v.rail.roundSlots;
  return 2 * slots * (hierRowBytes(v, kDispatch) + hierRowBytes(v, kCombine));
}
inline size_t railStagingBytes(const GroupView& v) { return railBoxBytes(v.rail) + hierRailRowBytes(v); }
// layoutGroup for `config` whose rail_round_tokens is resolved (not NCCL_EP_AUTO), within its
// rail_staging_bytes_max when it has one: High-Throughput's round shrinks to the most rows a peer whose staging
// (railStagingBytes) fits; ncclInvalidArgument, with the smallest staging, when none does (or, Low-
// Latency and relayed flat exchanges, whose staging is fixed, when it does not fit).
ncclResult_t layoutWithinBudget(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* view,
                                bool htHierarchical = false, bool relayRail = false);
}  // namespace ncclep

// The device pointers of an optional ncclEpLayoutInfo_t (all NULL without one): HT handle binding and LL dispatch.
inline ncclep::LayoutInfoOut layoutInfoOut(const ncclEpLayoutInfo_t* info) {
  ncclep::LayoutInfoOut out{};
  if (info) {
    out.expertCounters = static_cast<int*>(info->expert_counters.data);
    out.srcRankCounters = static_cast<int*>(info->src_rank_counters.data);
    out.expertOffsets = static_cast<int*>(info->expert_offsets.data);
    out.recvTotal = static_cast<int*>(info->recv_total_counter.data);
  }
  return out;
}

struct ncclEpGroup {
  ncclComm_t comm = nullptr;
  ncclEpGroupConfig_t config{};
  ncclep::TestingModes testing;  // the one-GPU test modes it was made in (nccl_ep_testing.h)
  std::atomic<int> liveHandles{0};  // its handles not destroyed yet: ncclEpGroupDestroy refuses while there are any
  int smCount = 0;  // SMs this rank may use (virtual ranks: its share of the GPU)
  int numSms = 0;
  // Declared before the window so that it is destroyed after it.
  std::unique_ptr<ncclext::Domain> domain;
  std::unique_ptr<ncclext::SymmetricMemory> mem;
  std::unique_ptr<ncclext::DeviceStatus> status;
  void* state = nullptr;  // device: sequence counters and barrier epoch
  ncclep::GroupView view{};
  double timeoutSeconds = 100;
  // Low-Latency: the handles whose send-only calls of each kind (ncclep::CallKind) await ncclEpComplete, oldest
  // first (at most two: the staging banks).
  std::deque<ncclEpHandle*> pending[2];
  // Across NVLink domains (ht.h, RailView: its outboxes and inboxes are one allocation, at view.rail.outbox): the
  // communicator of their exchanges (NULL with one domain).
  ncclComm_t railComm = nullptr;
  // Between a call's (or HT handle's exchange kernel's) send half and its receive half: every remote rank's slices
  // of `kind` (ncclep::CallKind, or ncclep::kRailHandle; LL: one ncclSend from my outbox for it, one ncclRecv into
  // my inbox, then the inbox copied into my window, launchRailInbox; HT: a send and a receive per region, received
  // straight into my window, RailView::direct), in one NCCL group on `stream`. Relay mode: ht.h. Watched (not when
  // captured): an exchange that does not finish within the group's budget (a peer that died or never calls) has the
  // watchdog abort railComm; every later call of the group then fails with railWhy.
  // `ownerWeighted`: a combine of that mode, whose rows go in their own regions (ht.h, RailRegions).
  // `counts` (HT, an EXACT handle's hostTotals + 2: my rows to each rank, then each source's rows to me, then the
  // hierarchical HT's rail rows per domain, out and in): an eager call then moves only the rows its routing fills, a
  // message per region (hierarchical: per domain; the ranks of a group run a call eagerly or capture it alike);
  // NULL, or a capture: the fixed slices.
  // `hierFwd` (the hierarchical HT's dispatch): the handle's HandleView::hierFwd, which its relay fills.
  // `round` (HT's flat exchange, RailView::direct): the slots [round x roundSlots, + roundSlots) of each region;
  // the hierarchical HT: the rail positions [round x roundSlots, + roundSlots) to and from each other domain.
  ncclResult_t railExchange(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts = nullptr,
                            int* hierFwd = nullptr, int round = 0);
  // railExchange's messages (inside the NCCL group; `counts` NULL in a capture).
  ncclResult_t railMessages(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts, int round);
  // One watched NCCL group of the rail on `stream` (railExchange, railBarrier): `body` posts its sends and receives
  // (told whether the stream is capturing). Fails at once once the rail was aborted; an enqueue holds railMu
  // against the watchdog's abort; not watched in a capture (a replay runs later). `what` names it in errors.
  ncclResult_t inRailGroup(cudaStream_t stream, const char* what,
                           const std::function<ncclResult_t(bool captured)>& body);
  // The rounds an HT call's exchange takes on this rank (the flat one, RailView::direct, and the hierarchical one;
  // else 1): enough for its most rows to or from one peer (hierarchical: rail rows to or from one domain), an EXACT
  // handle's counts (`counts` as railExchange's) in an eager call, else max_tokens_per_rank. Two ranks agree on
  // every message between them whatever their own numbers of rounds: a round carries a pair's rows only where both
  // counts (the same number) reach it (ht.h, railRoundsOf).
  int railRounds(const int64_t* counts, cudaStream_t stream) const;
  // The hierarchical HT's message of a round to each other domain's rank of my index, with fixed slices: a rail row
  // (ncclep::hierRowBytes) per position of the round.
  size_t hierMessageBytes(int kind) const { return (size_t)view.rail.roundSlots * ncclep::hierRowBytes(view, kind); }
  // Virtual ranks in relay mode: the launch fence after a kernel that waits on my domain's ranks (railExchange).
  void relayFence(cudaStream_t stream);
  // The HT exchange overlapped (RailView::overlappable, NCCL_EXT_RAIL_OVERLAP=1, opt-in): a call's NVLink send half
  // runs on sideStream, forked from the caller's stream at the call's start (forkEvent) and joined before its
  // receive half (joinEvent), while the caller's stream runs the rounds and their rail exchanges. The flat
  // exchange's is localOnly (my domain's rows, with the pad rows and the waits; the rounds are all remoteOnly); the
  // hierarchical one's is whole (its rounds then only pack or reduce, exchange, and relay or scatter). NULL
  // otherwise.
  cudaStream_t sideStream = nullptr;
  cudaEvent_t forkEvent = nullptr, joinEvent = nullptr;
  std::timed_mutex railMu;             // one exchange's enqueue against the watchdog's abort
  std::atomic<bool> railAborted{false};
  std::atomic<bool> railCaptured{false};  // an exchange was captured in a CUDA graph (destroy on a thread of its own)
  std::string railWhy;                 // written once, before railAborted
  // Relay mode with virtual ranks (the mixed test mode): the launch fence after each relay kernel (its key, and
  // whether one ran out of time: then skipped). See railExchange.
  void* railAlloc = nullptr;  // the outboxes and inboxes (hierarchical HT: the inboxes; its outboxes are in the window)
  size_t railAllocBytes = 0;  // its bytes
  void* hierAlloc = nullptr;  // the hierarchical HT's rail rows
  size_t railBytes = 0;       // both allocations' bytes (ncclEpGroupInfo_t::rail_staging_bytes)
  uint64_t relayFenceKey = 0;
  bool relayFenced = false, relayFenceLost = false;

  static ncclResult_t create(ncclComm_t comm, const ncclEpGroupConfig_t& config, const ncclep::TestingModes& testing,
                             ncclEpGroup** out);
  ~ncclEpGroup();
  ncclResult_t deviceAlloc(void** ptr, size_t bytes);
  // Virtual ranks: a cudaFree or cudaFreeHost waits for every kernel on the GPU, peers' kernels that wait for this
  // rank's next call included, so handle memory is kept until the group's destruction frees it between two
  // barriers. Real ranks free at once.
  void deviceFree(void* ptr);
  void hostFree(void* ptr);
  // COLLECTIVE: the quiesce point, then the teardown (ncclEpGroupDestroy).
  static ncclResult_t destroy(ncclEpGroup* g);
  // ncclSuccess, or the error a device wait or an input check recorded, as a code and a message.
  // An invalid-input report is cleared once returned (the group stays usable); a timeout stays.
  ncclResult_t asyncError(const char* what);
  // Low-Latency with enable_mask: the mask from the host (nonzero = active), stream-ordered; ncclEpMaskClean.
  ncclResult_t setMask(const int* hostMask, cudaStream_t stream);
  ncclResult_t maskClean(cudaStream_t stream);
  ncclResult_t railBarrier(cudaStream_t stream);  // maskClean's barrier with other domains' active ranks
  void* railBarrierBuf = nullptr;                 // its bytes: 8 out, then 8 in per rank (enable_mask across domains)

 private:
  void freeNow(void* ptr);
  std::vector<void*> retiredDevice_, retiredHost_;
  int maskHost_[ncclep::kMaxRanks] = {};
  uint64_t cleans_ = 0;  // ncclEpMaskClean calls: the epochs of its barriers
};

struct ncclEpHandle {
  ncclEpGroup* group = nullptr;
  ncclEpLayout_t layout = NCCL_EP_LAYOUT_UNSET;
  ncclEpHandleConfig_t config{};
  int topk = 0;
  void* block = nullptr;         // device memory of the HandleView arrays
  int64_t* hostTotals = nullptr; // pinned, mapped
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
  int64_t recvRows() const {
    return layout == NCCL_EP_LAYOUT_EXPERT_MAJOR ? hostTotals[1] : hostTotals[0];
  }
};
