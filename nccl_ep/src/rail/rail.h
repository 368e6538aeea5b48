// The rail: a group's exchange across NVLink domains (docs/ARCHITECTURE.md, "Low-Latency across NVLink domains" and
// "High-Throughput across NVLink domains"). One object per group with several domains (none with one) owns the
// communicator of its exchanges, its staging outside the window (outboxes, inboxes, the hierarchical HT's rail
// rows), the watchdog's abort, the relay's launch fences (virtual ranks), the overlapped exchange's side stream and
// ncclEpMaskClean's barrier; rail/view.h is what its kernels (rail/relay.cu) and the modes' kernels see of it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/topology.h"
#include "common/virtual_domain.h"
#include "nccl_ep/src/memory.h"
#include "nccl_ep/src/views.h"

namespace ncclep {

class Rail {
 public:
  struct Options {
    // The group's communicator (split once for the rail: the caller's own traffic on it never meets ours) and, in
    // relay mode (RailView::relay), the Domain's rail (the ranks of my index in every domain), split likewise.
    ncclComm_t comm = nullptr;
    ncclComm_t domainRail = nullptr;
    const ncclext::Topology* topo = nullptr;
    bool maskBarrier = false;  // enable_mask: ncclEpMaskClean's barrier across domains (maskBarrier())
    bool overlap = false;      // the overlapped HT exchange (resolved rail_overlap, RailView::overlappable)
    // Virtual ranks in relay mode (the mixed test mode): the domain whose launch fences follow each relay kernel.
    ncclext::VirtualDomain* virt = nullptr;
    const int* hostMask = nullptr;  // LL with enable_mask: the host's mask (LlState::hostMask): whom calls skip
    DeviceMemory* memory = nullptr;
    double timeoutSeconds = 100;
  };
  // COLLECTIVE over the group's communicator: the staging (zeroed), `view`'s rail pointers, the communicator, and
  // every pair of ranks in different domains connected now, while all are here (NCCL connects a pair at its first
  // point-to-point call, which blocks the host until the peer takes part, so that a peer that later skips a call
  // would hang the exchange's host call before the watchdog watches it). `window`: my window's local address (the
  // hierarchical HT's outboxes are in it; the direct exchange receives into it).
  static ncclResult_t create(const Options& options, GroupView* view, char* window, cudaStream_t stream,
                             std::unique_ptr<Rail>* out);
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  // Between a call's (or HT handle's exchange kernel's) send half and its receive half: every remote rank's slices
  // of `kind` (CallKind, or kRailHandle; LL: one ncclSend from my outbox for it, one ncclRecv into my inbox, then the
  // inbox copied into my window, launchRailInbox; HT: a send and a receive per region, received straight into my
  // window, RailView::direct), in one NCCL group on `stream`. Relay mode: then launchRailRelay. Watched (not when
  // captured): an exchange that does not finish within the group's budget (a peer that died or never calls) has the
  // watchdog abort the communicator; every later call of the group then fails with why().
  // `ownerWeighted`: a combine of that mode, whose rows go in their own regions (rail/view.h, RailRegions).
  // `counts` (HT, an EXACT handle's hostTotals + 2: my rows to each rank, then each source's rows to me, then the
  // hierarchical HT's rail rows per domain, out and in): an eager call then moves only the rows its routing fills, a
  // message per region (hierarchical: per domain; the ranks of a group run a call eagerly or capture it alike);
  // NULL, or a capture: the fixed slices.
  // `hierFwd` (the hierarchical HT's dispatch): the handle's HandleView::hierFwd, which its relay fills.
  // `round` (HT's flat exchange, RailView::direct): the slots [round x roundSlots, + roundSlots) of each region;
  // the hierarchical HT: the rail positions [round x roundSlots, + roundSlots) to and from each other domain.
  ncclResult_t exchange(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts = nullptr,
                        int* hierFwd = nullptr, int round = 0);
  // The rounds an HT call's exchange takes on this rank (the flat one, RailView::direct, and the hierarchical one;
  // else 1): enough for its most rows to or from one peer (hierarchical: rail rows to or from one domain), an EXACT
  // handle's counts (`counts` as exchange's) in an eager call, else max_tokens_per_rank. Two ranks agree on every
  // message between them whatever their own numbers of rounds: a round carries a pair's rows only where both counts
  // (the same number) reach it (rail/view.h, railRoundsOf).
  int rounds(const int64_t* counts, cudaStream_t stream) const;
  // Virtual ranks in relay mode: the launch fence after a kernel that waits on my domain's ranks (exchange; the
  // hierarchical combine's reduce). Virtual ranks share the GPU's hardware queues, which start work in order: my
  // next kernel, queued behind one that waits for my domain's ranks, must not sit in a queue ahead of a lagging
  // peer's kernel that the waiting one needs. The fence: every rank enqueued its waiting kernel, so its earlier
  // ones, before anyone enqueues what depends on one (as nccl_m2n's launch fences; an expired one is skipped from
  // then on, the kernels' own timeouts report the absent rank). Not in a capture (replays have no fences).
  void relayFence(cudaStream_t stream);
  // The group's teardown, past its barrier (every rank is past its fences): the fence key is given back.
  void forgetFences();
  // ncclEpMaskClean across domains: its barrier with the ranks of other domains that my host mask marks active (8
  // bytes each way with each, one NCCL group on the stream: it ends once every such rank has posted its own, i.e.
  // reached the same point of its stream), watched like an exchange; and the staging zeroed (the outboxes and
  // inboxes carry flags too, whole slices into the peers' windows: none of a call numbered before the reset may
  // pass for a later one).
  ncclResult_t maskBarrier(cudaStream_t stream);
  ncclResult_t zeroStaging(cudaStream_t stream);

  // The HT exchange overlapped (RailView::overlappable, rail_overlap): a call's NVLink send half runs on the side
  // stream, forked from the caller's stream at the call's start and joined before its receive half, while the
  // caller's stream runs the rounds and their rail exchanges (ht/calls.cc). NULL otherwise.
  cudaStream_t sideStream() const { return sideStream_; }
  ncclResult_t fork(cudaStream_t stream);  // the side stream waits for `stream`'s work so far
  ncclResult_t forked();                   // after the side stream's launch: the join point
  cudaError_t join(cudaStream_t stream);   // `stream` waits for the join point

  bool aborted() const { return aborted_; }
  const std::string& why() const { return why_; }  // written once, before aborted()
  size_t stagingBytes() const { return bytes_; }   // ncclEpGroupInfo_t::rail_staging_bytes

 private:
  Rail(const Options& options, const GroupView& view, char* window) : o_(options), view_(view), window_(window) {}
  ncclResult_t allocate(GroupView* view, cudaStream_t stream);
  ncclResult_t connect(cudaStream_t stream);
  // One watched NCCL group of the rail on `stream` (exchange, maskBarrier): `body` posts its sends and receives
  // (told whether the stream is capturing). Fails at once once the rail was aborted; an enqueue holds mu_ against
  // the watchdog's abort; not watched in a capture (a replay runs later). `what` names it in errors.
  ncclResult_t inGroup(cudaStream_t stream, const char* what, const std::function<ncclResult_t(bool captured)>& body);
  ncclResult_t messages(int kind, bool ownerWeighted, cudaStream_t stream, const int64_t* counts, int round);
  // The hierarchical HT's message of a round to each other domain's rank of my index, with fixed slices: a rail row
  // (hierRowBytes) per position of the round.
  size_t hierMessageBytes(int kind) const;
  // The watchdog's action on an exchange past its budget: abort the communicator (its NCCL kernels end, and a host
  // call blocked in NCCL on it returns), then every later call fails.
  void abort();

  Options o_;
  const GroupView& view_;  // the group's (it outlives its rail)
  char* window_;           // my window's local address
  ncclComm_t comm_ = nullptr;
  void* boxes_ = nullptr;     // the outboxes and inboxes (hierarchical HT: the inboxes; its outboxes are in the window)
  size_t boxBytes_ = 0;       // their bytes
  void* hierRows_ = nullptr;  // the hierarchical HT's rail rows
  void* barrierBuf_ = nullptr;  // maskBarrier's bytes: 8 out, then 8 in per rank
  size_t bytes_ = 0;            // both staging allocations' bytes
  cudaStream_t sideStream_ = nullptr;
  cudaEvent_t forkEvent_ = nullptr, joinEvent_ = nullptr;
  std::timed_mutex mu_;  // one exchange's enqueue against the watchdog's abort
  std::atomic<bool> aborted_{false};
  std::atomic<bool> captured_{false};  // an exchange was captured in a CUDA graph (destroy on a thread of its own)
  std::string why_;
  uint64_t fenceKey_ = 0;
  bool fenced_ = false, fenceLost_ = false;
};

// Loads the rail's kernels (group creation; see ncclext::loadKernels).
ncclResult_t loadRailKernels();
// Low-Latency across domains, after an exchange's NCCL group: copies every remote source's slices of exchange `kind`
// (kDispatch, kCombine) from the inbox into its slices of my window, in the bank of the kind's last send half.
ncclResult_t launchRailInbox(const GroupView& g, int kind, bool ownerWeighted, cudaStream_t stream);
// Relay mode (RailView::relay): instead, what each other domain's rank of my index wrote for each rank r of my
// domain, from the inbox into r's window at that writer's slices (LSA), flags last (rail/relay.cu). The
// hierarchical dispatch: the rail rows of round `round` (positions from round x roundSlots), each into the staging
// of the ranks of my domain it names; the first round also marks every position past it unforwarded (hierFwd).
ncclResult_t launchRailRelay(const GroupView& g, int kind, bool ownerWeighted, int* hierFwd, int round,
                             cudaStream_t stream);

}  // namespace ncclep
