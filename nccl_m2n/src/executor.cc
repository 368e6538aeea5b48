#include "nccl_m2n/src/executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/domain.h"
#include "common/env.h"
#include "common/log.h"
#include "common/symmetric_memory.h"
#include "common/watchdog.h"
#include "nccl_m2n/src/agree.h"
#include "nccl_m2n/src/exec_kernels.h"
#include "nccl_m2n/src/registry.h"
#include "nccl_m2n/src/schedule.h"

namespace ncclm2n {

// The communicator that carries the plans' exchanges: split from a caller's communicator by the first plan made on
// it and shared by every later plan on it while one of them lives (or while ncclM2nCommRetain keeps it), so that
// only that first plan (or ncclM2nReshard call) pays for the split. The watchdog aborts it when an exchange
// outlives its budget (a peer that died or never executes), without touching the caller's communicator; every
// plan on it then fails.
struct ExchangeComm {
  ncclComm_t comm = nullptr;
  int device = 0;
  uint64_t generation = 0;             // the same on every rank (agree.h: decideExchange)
  std::timed_mutex mu;                 // one NCCL group's enqueue against the watchdog's abort
  std::atomic<bool> aborted{false};    // comm is gone: every later call of its plans fails with `why`
  std::atomic<bool> captured{false};   // an execute on it was captured in a CUDA graph
  std::string why;                     // written once, before `aborted` is set
  ~ExchangeComm();
};

}  // namespace ncclm2n

struct ncclM2nPlan {
  ncclComm_t comm = nullptr;  // the caller's
  std::shared_ptr<ncclm2n::ExchangeComm> x;  // the exchanges' (shared with the other plans on `comm`)
  int device = 0;
  double timeoutSeconds = 0;
  int rank = 0, nRanks = 0;
  int nTensors = 0;
  std::vector<std::string> names;
  std::vector<char> needSrc, needDst;  // this rank holds part of tensor t's source / destination
  std::vector<int64_t> srcBytes, dstBytes;  // the bytes of this rank's part of tensor t (its span; 0: none)
  ncclm2n::ExecTables tables;
  std::vector<ncclm2n::MoveSegment> copySegs;
  int64_t copyPlain = 0;  // copySegs: the plain segments first, then the tile segments (a transposing copy's)
  // Device memory (one allocation each, freed by destroyPlan).
  ncclm2n::MoveDesc *copies = nullptr, *sends = nullptr, *recvs = nullptr;
  ncclm2n::MoveSegment *copySegsDev = nullptr, *pack = nullptr, *unpack = nullptr, *remote = nullptr;
  char* staging = nullptr;
  // The call's pointers, one allocation set by one launch per execute: src [nTensors + quant.size()] (with the
  // scratch's), then dst [nTensors]. `uploaded` is what the last upload wrote; an eager execute with the same
  // pointers skips it (executes of a plan are stream-ordered, as its staging requires). Once an execute was
  // captured, never: a replay rewrites the array with the captured pointers behind the host's back.
  const void** src = nullptr;
  void** dst = nullptr;
  std::vector<const void*> uploaded;
  bool everCaptured = false;
  // fp8 quantisation (quantize.h): the quantised tensors, this rank's descriptors, their scratch.
  std::vector<int> fp8Tensors;
  std::vector<ncclm2n::QuantDesc> quant;
  std::vector<int> quantTensor;  // quant[j]'s tensor
  ncclm2n::QuantDesc* quantDev = nullptr;
  int64_t quantRowBlocks = 0, quantTileBlocks = 0;  // the largest descriptor's blocks, by kind
  char* scratch = nullptr;
  // LSA inside the NVLink domain (exec_tables.h, "LSA rounds"); all empty without LSA streams in the domain.
  ncclext::VirtualDomain* virt = nullptr;             // the virtual-rank mode
  std::unique_ptr<ncclext::Domain> domain;            // declared before the window, destroyed after it
  std::unique_ptr<ncclext::SymmetricMemory> window;   // barrier flags, then the slots (at windowSlots)
  std::unique_ptr<ncclext::DeviceStatus> status;      // the barriers' timeouts
  uint64_t* epochs = nullptr;                         // the barrier's epoch (device)
  size_t windowSlots = 0;
  size_t windowTable = 0;  // zero-copy: the published tensors (ncclm2n::Published [nTensors]) in the window
  ncclm2n::DomainBarrier barrier;
  // Virtual ranks: the plan's launch fences (common/virtual_domain.h), skipped once one ran out of time.
  uint64_t fenceKey = 0;
  bool fenceLost = false;
  bool created = false;  // createPlan returned it (a failed creation is freed without the virtual ranks' barriers)
  // Pipelined rounds (exec_tables.h, pipelinedRounds; else all null): the stream that packs and unpacks beside the
  // caller's, which exchanges, and their events (runPipelined).
  cudaStream_t side = nullptr;
  cudaEvent_t packed[2] = {nullptr, nullptr}, exchanged[2] = {nullptr, nullptr}, fork = nullptr, join = nullptr;
  // ncclM2nPlanSetStageHookTesting's: called after each stage an execute enqueues (benchmarks record events there).
  ncclM2nStageHook_t stageHook = nullptr;
  void* stageUser = nullptr;
};

namespace ncclm2n {
namespace {

// The first rank of my NVLink (LSA) team: the same number on every rank of the team.
int domainIdOf(const ncclext::LsaTeam& lsa, int rank) { return rank - lsa.rank * lsa.stride; }

// NCCL's ncclCommDestroy and ncclCommAbort wait until every CUDA graph that captured work on the communicator is
// destroyed. A communicator that was captured is therefore released on a thread of its own: destroying a plan
// (or the watchdog's abort) never waits for the caller's graphs, and the communicator goes once they do.
void releaseComm(ncclComm_t comm, int device, bool abort, bool captured) {
  auto release = [comm, device, abort] {
    cudaSetDevice(device);
    if (abort)
      ncclCommAbort(comm);
    else
      ncclCommDestroy(comm);
  };
  if (captured)
    std::thread(release).detach();
  else
    release();
}

}  // namespace

ExchangeComm::~ExchangeComm() {
  if (comm && !aborted) releaseComm(comm, device, /*abort=*/false, captured);  // an aborted one is released already
}

namespace {

// The exchange communicators split so far, by the caller's communicator: how many splits it has seen (the
// largest count over the ranks numbers the next split, so that every rank gives it the same generation) and the
// latest one, while a plan holds it.
struct SplitRecord {
  uint64_t splits = 0;
  std::weak_ptr<ExchangeComm> latest;
  std::shared_ptr<ExchangeComm> retained;  // ncclM2nCommRetain's: the latest, kept alive between plans
};
std::mutex splitsMu;
std::map<ncclComm_t, SplitRecord>& splitRecords() {
  static auto* records = new std::map<ncclComm_t, SplitRecord>();  // never destroyed: plans may outlive statics
  return *records;
}

// A rank's vote: the latest exchange communicator of `comm` still alive and not aborted (its generation; 0: none)
// and how many it split there.
ExchangeVote voteFor(ncclComm_t comm, std::shared_ptr<ExchangeComm>* reusable) {
  std::lock_guard<std::mutex> lock(splitsMu);
  SplitRecord& rec = splitRecords()[comm];
  *reusable = rec.latest.lock();
  if (*reusable && (*reusable)->aborted) reusable->reset();
  ExchangeVote v;
  v.reuse = *reusable ? (*reusable)->generation : 0;
  v.splits = rec.splits;
  return v;
}

// Every rank's vote known (agree.h: decideExchange): the candidate all ranks hold, else a new split (blocking,
// whatever the caller's communicator is).
ncclResult_t chooseExchange(ncclComm_t comm, int rank, int device, const std::vector<ExchangeVote>& votes,
                            std::shared_ptr<ExchangeComm> reusable, std::shared_ptr<ExchangeComm>* out) {
  const ExchangeDecision decided = decideExchange(votes);
  if (decided.reuse) {
    *out = std::move(reusable);
    return ncclSuccess;
  }
  auto x = std::make_shared<ExchangeComm>();
  x->device = device;
  x->generation = decided.generation;
  ncclConfig_t splitConfig = NCCL_CONFIG_INITIALIZER;
  splitConfig.blocking = 1;
  if (const int k = ncclext::env().m2nNetChannels; k > 0) {
    // NCCL gives a network peer at most the communicator's channel count (ncclTopoComputeP2pChannels), which
    // minCTAs raises. NCCL refuses a minCTAs above an unset maxCTAs, so that is set to NCCL's own default
    // (MAXCHANNELS, 64; k is at most 64: common/env.cc).
    splitConfig.nChannelsPerNetPeer = k;
    splitConfig.minCTAs = k;
    splitConfig.maxCTAs = 64;
  }
  NCCLEXT_NCCL(ncclCommSplit(comm, 0, rank, &x->comm, &splitConfig));
  std::shared_ptr<ExchangeComm> dropped;  // a retained older one goes outside the lock
  {
    std::lock_guard<std::mutex> lock(splitsMu);
    SplitRecord& rec = splitRecords()[comm];
    rec.splits = x->generation;
    rec.latest = x;
    if (rec.retained) {
      dropped = std::move(rec.retained);
      rec.retained = x;
    }
  }
  *out = std::move(x);
  return ncclSuccess;
}

// Copies on plan creation's stream, which creation drains before it returns: the caller's stream (non-blocking,
// or another thread's) does not order after the legacy default stream, so nothing here may use it.
template <typename T>
ncclResult_t upload(const std::vector<T>& host, T** dev, cudaStream_t stream) {
  *dev = nullptr;
  if (host.empty()) return ncclSuccess;
  NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(dev), host.size() * sizeof(T)));
  NCCLEXT_CUDA(cudaMemcpyAsync(*dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return ncclSuccess;
}

struct Round1 {
  int32_t domain = 0;
  int32_t valid = 1;
  int32_t lsaSize = 1;  // NCCL's LSA team (virtual ranks: the domain)
  int32_t lsa = 0;      // the config asks for LSA
  int32_t zeroCopy = 0;  // the config's
  Digest digest;
  ExchangeVote exchange;
};

int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// LSA inside the domain (exec_tables.h, "LSA rounds"): the domain's agreed LSA round count `rounds` and its LSA
// streams (zero-copy's barriers) set in the tables; a domain with LSA traffic gets its window (barrier flags, then
// with zero-copy the published tensors, then the slots), the barrier's epoch and error word. COLLECTIVE over the
// domain.
ncclResult_t setUpLsa(ncclM2nPlan* plan, int64_t rounds, int64_t domainStreams, cudaStream_t stream) {
  ncclext::Domain& d = *plan->domain;
  const ncclext::Topology& topo = d.topo();
  ExecTables& x = plan->tables;
  setLsaRounds(&x, rounds);
  setRemoteBarriers(&x, domainStreams);
  if (rounds == 0 && !x.remoteBarrier) return ncclSuccess;  // no rank of the domain reaches another's memory
  plan->windowTable = (size_t)alignUp((int64_t)topo.domainSize * (int64_t)sizeof(uint64_t), 256);
  const int64_t table = x.remoteBarrier ? (int64_t)plan->nTensors * (int64_t)sizeof(Published) : 0;
  plan->windowSlots = plan->windowTable + (size_t)alignUp(table, 256);
  ncclext::SymmetricMemoryOptions so;
  so.bytes = plan->windowSlots + (size_t)x.lsaBytes;
  NCCLEXT_CHECK(ncclext::SymmetricMemory::create(d, so, stream, &plan->window));
  NCCLEXT_CHECK(ncclext::DeviceStatus::create(&plan->status));
  NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&plan->epochs), sizeof(uint64_t)));
  NCCLEXT_CUDA(cudaMemsetAsync(plan->epochs, 0, sizeof(uint64_t), stream));
  DomainBarrier& b = plan->barrier;
  b.peers = plan->window->peers();
  b.flagsOffset = 0;
  b.epochs = plan->epochs;
  b.lsaRank = topo.domainRank;
  b.lsaSize = topo.domainSize;
  b.worldRankOfLsa0 = plan->rank - topo.domainRank;
  b.rank = plan->rank;
  b.err = plan->status->sink();
  b.timeoutNs = (uint64_t)(plan->timeoutSeconds * 1e9);
  if (plan->virt) plan->fenceKey = plan->virt->newKey(plan->rank);
  return ncclSuccess;
}

// Zero-copy: what this rank publishes for each tensor at an execute (pull: its sources; push: its destinations).
// Virtual ranks publish addresses; real ranks the registration slot and the offset in it (registry.h), checked to
// hold this rank's whole part. Tensors this rank holds no part of publish nothing.
ncclResult_t publishedTensors(const ncclM2nPlan* plan, const void* const* src, void* const* dst,
                              std::vector<Published>* out, char* const** bases) {
  const bool pull = plan->tables.zeroCopy == kZeroCopyPull;
  out->assign(plan->nTensors, Published{});
  *bases = nullptr;
  const int n = plan->nTensors;
  std::vector<const void*> ptrs(n, nullptr);
  for (int t = 0; t < n; t++) {
    const void* p = pull ? (src ? src[t] : nullptr) : (dst ? dst[t] : nullptr);
    if ((pull ? plan->srcBytes[t] : plan->dstBytes[t]) > 0) ptrs[t] = p;  // nothing of it here: nothing published
  }
  if (plan->virt) {
    for (int t = 0; t < n; t++)
      if (ptrs[t]) (*out)[t] = Published{(uint64_t)(uintptr_t)ptrs[t], kPublishedAddress};
    return ncclSuccess;
  }
  // Real ranks: one look at the registry for every tensor; its bases resolve the peers' slots too, so it is needed
  // even where this rank publishes nothing.
  const std::vector<int64_t>& bytes = pull ? plan->srcBytes : plan->dstBytes;
  std::vector<Registered> reg(n);
  NCCLEXT_USAGE(resolveRegistered(plan->comm, plan->domain->topo().domainSize, ptrs.data(), bytes.data(), n,
                                  reg.data(), bases),
                "ncclM2nExecute: the plan moves tensors in place (zeroCopy %s), but no memory is registered with "
                "ncclM2nRegister on this communicator (or its NVLink domains differ from the plan's)",
                pull ? "PULL" : "PUSH");
  for (int t = 0; t < n; t++) {
    if (!ptrs[t]) continue;
    NCCLEXT_ARG(reg[t].slot >= 0,
                "ncclM2nExecute: tensor %d (%s)'s %s (%p, %lld bytes) is not inside memory registered with "
                "ncclM2nRegister on this communicator (the plan moves it in place: zeroCopy %s)",
                t, plan->names[t].c_str(), pull ? "source" : "destination", ptrs[t], (long long)bytes[t],
                pull ? "PULL" : "PUSH");
    (*out)[t] = Published{(uint64_t)reg[t].slot, reg[t].offset};
  }
  return ncclSuccess;
}

// A barrier of the domain. Virtual ranks then meet at a launch fence (common/virtual_domain.h) before this rank
// enqueues anything that waits for it. A fence that runs out of time is not an error of its own: the barrier kernel,
// launched first, times out on the same budget and reports the absent rank as every barrier does.
// The stage hook, if any, after `stage` was enqueued on `stream`.
void stageDone(const ncclM2nPlan* plan, const char* stage, cudaStream_t stream) {
  if (plan->stageHook) plan->stageHook(plan->stageUser, stage, stream);
}

ncclResult_t domainBarrier(ncclM2nPlan* plan, cudaStream_t stream) {
  NCCLEXT_CHECK(launchDomainBarrier(plan->barrier, stream));
  if (plan->virt && !plan->fenceLost)
    plan->fenceLost = plan->virt->fence(plan->rank, plan->fenceKey, plan->timeoutSeconds) != ncclSuccess;
  return ncclSuccess;
}

// Whether `rank` holds a non-empty part of each tensor's source and destination, and the bytes its local tensors
// span (their strides included).
void holdings(const Problem& p, int rank, std::vector<char>* src, std::vector<char>* dst,
              std::vector<int64_t>* srcBytes, std::vector<int64_t>* dstBytes) {
  src->assign(p.tensors.size(), 0);
  dst->assign(p.tensors.size(), 0);
  srcBytes->assign(p.tensors.size(), 0);
  dstBytes->assign(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); t++) {
    const TensorPair& tp = p.tensors[t];
    const ShardGrid sg(tp.src), dg(tp.dst);
    for (int pos = 0; pos < tp.src.mesh.size(); pos++)
      if (tp.src.mesh.ranks[pos] == rank && !sg.boxOfPosition(pos).empty()) {
        (*src)[t] = 1;
        (*srcBytes)[t] = std::max((*srcBytes)[t], sg.localSpan(pos) * (int64_t)elementSize(tp.src.dtype));
      }
    for (int pos = 0; pos < tp.dst.mesh.size(); pos++)
      if (tp.dst.mesh.ranks[pos] == rank && !dg.boxOfPosition(pos).empty()) {
        (*dst)[t] = 1;
        (*dstBytes)[t] = std::max((*dstBytes)[t], dg.localSpan(pos) * (int64_t)elementSize(tp.dst.dtype));
      }
  }
}

// The watchdog's action: the exchanges of `plan` did not finish in time. Aborting the exchange communicator ends
// its NCCL kernels (and a host call blocked inside NCCL); every plan on it then refuses every call.
void abortExchanges(ncclM2nPlan* plan, const char* what) {
  ExchangeComm& x = *plan->x;
  // An enqueue holds the lock for one NCCL group. If it does not let go within a second, it is blocked inside NCCL
  // on this communicator, which is what ncclCommAbort from another thread is for: abort without the lock.
  std::unique_lock<std::timed_mutex> lock(x.mu, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(1));
  if (x.aborted) return;
  char msg[512];
  snprintf(msg, sizeof(msg),
           "%s: the plan's exchanges did not finish within %.1f s (a peer that died or never executes): the "
           "communicator of the plans on this communicator was aborted, destination tensors may hold partial data; "
           "destroy those plans",
           what, plan->timeoutSeconds);
  x.why = msg;
  x.aborted = true;
  releaseComm(x.comm, x.device, /*abort=*/true, x.captured);
}

// Watches the work enqueued on `stream` so far: past the budget, the watchdog aborts the plan's exchanges.
void watchStream(ncclM2nPlan* plan, cudaStream_t stream, const char* what) {
  ncclext::watchStream(plan, plan->timeoutSeconds, stream, [plan, what] { abortExchanges(plan, what); });
}

// Connects the plan's pairs now, at plan creation (ncclext::connectPeers): a dead peer ends plan creation with an
// error within the budget, and an execute never connects (its enqueue never waits for a peer).
ncclResult_t connectPeers(ncclM2nPlan* plan, cudaStream_t stream) {
  std::vector<char> sendTo(plan->nRanks, 0), recvFrom(plan->nRanks, 0);
  for (const DirectOp& op : plan->tables.direct) (op.send ? sendTo : recvFrom)[op.peer] = 1;
  for (const P2pOp& op : plan->tables.ops) (op.send ? sendTo : recvFrom)[op.peer] = 1;
  const char* what = "ncclM2nPlanCreate (connecting to the plan's peers)";
  const ncclResult_t res = ncclext::connectPeers(plan->x->comm, sendTo, recvFrom, plan, plan->timeoutSeconds, stream,
                                                 [plan, what] { abortExchanges(plan, what); }, what);
  if (plan->x->aborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", plan->x->why.c_str());
  return res;
}

}  // namespace

namespace {

// Plan creation, in the order createPlan runs them. Each returns at its first failure; createPlan's plan then frees
// what was made so far.

// The creation's stream, left to the process when a host collective on it may still run (a failed all-gather).
struct CreationStream {
  cudaStream_t s = nullptr;
  bool leak = false;
  ~CreationStream() {
    if (s && !leak) cudaStreamDestroy(s);
  }
};

// The plan's rank and rank count: comm's, or the virtual domain's for the one-GPU virtual-rank mode.
ncclResult_t placePlan(ncclM2nPlan* plan, ncclComm_t comm, const ExecOptions& o) {
  NCCLEXT_NCCL(ncclCommUserRank(comm, &plan->rank));
  NCCLEXT_NCCL(ncclCommCount(comm, &plan->nRanks));
  if (o.virt) {
    NCCLEXT_ARG(plan->nRanks == 1,
                "ncclM2nPlanCreate: with a virtualDomain, comm must be this thread's single-rank communicator (it has "
                "%d ranks)", plan->nRanks);
    NCCLEXT_ARG(o.virtualRank >= 0 && o.virtualRank < o.virt->size(),
                "ncclM2nPlanCreate: virtualRank %d not in [0, %d)", o.virtualRank, o.virt->size());
    plan->rank = o.virtualRank;
    plan->nRanks = o.virt->size();
  }
  ncclext::setLogRank(plan->rank);
  return ncclSuccess;
}

// The host collectives of plan creation: over comm, or in the process for virtual ranks. A failure leaves the
// stream to the process (the all-gather may still run on it).
struct CreationGather {
  ncclComm_t comm;
  const ExecOptions& o;
  int rank;
  CreationStream& stream;
  ncclResult_t operator()(const void* mine, size_t bytes, void* all) const {
    const ncclResult_t res = o.virt ? o.virt->allGather(rank, mine, bytes, all, o.timeoutSeconds)
                                    : ncclext::ncclAllGatherHost(comm, stream.s, mine, bytes, all, o.timeoutSeconds);
    if (res != ncclSuccess) stream.leak = !o.virt;
    return res;
  }
};

// Rounds 1 and 2: every rank's domain, validity, options and digest of the batch (`all`); when the digests differ,
// the hashes of the first group that differs, for a message naming the first tensor the ranks disagree on. Every
// rank fails alike unless all agree and are valid.
ncclResult_t agreeOnBatch(ncclComm_t comm, const Problem& p, const std::string& localError, const ExecOptions& o,
                          const CreationGather& gather, std::vector<Round1>* all,
                          std::shared_ptr<ExchangeComm>* reusable) {
  const int rank = gather.rank, n = (int)all->size();
  std::vector<uint64_t> hashes(p.tensors.size());
  for (size_t t = 0; t < p.tensors.size(); t++) hashes[t] = tensorHash(p.tensors[t]);
  Round1 mine;
  ncclext::LsaTeam team;
  if (!o.virt) NCCLEXT_CHECK(ncclext::lsaTeamOf(comm, &team));
  mine.domain = o.virt ? 0 : domainIdOf(team, rank);
  mine.lsaSize = o.virt ? n : team.nRanks;
  mine.lsa = o.lsa;
  mine.zeroCopy = o.zeroCopy;
  mine.valid = localError.empty();
  mine.digest = digestOf(hashes);
  mine.exchange = voteFor(comm, reusable);
  NCCLEXT_CHECK(gather(&mine, sizeof(mine), all->data()));
  std::vector<Digest> digests;
  for (const Round1& r : *all) digests.push_back(r.digest);
  const Agreement a = compareDigests(digests);
  if (!a.agree) {
    std::string msg = a.message;
    if (msg.empty()) {  // round 2: the hashes of the first differing group
      int64_t lo, hi;
      digestGroup((int64_t)hashes.size(), a.group, &lo, &hi);
      std::vector<uint64_t> groupAll((size_t)(hi - lo) * n);
      NCCLEXT_CHECK(gather(hashes.data() + lo, (size_t)(hi - lo) * sizeof(uint64_t), groupAll.data()));
      std::vector<std::vector<uint64_t>> per(n);
      for (int r = 0; r < n; r++)
        per[r].assign(groupAll.begin() + (size_t)r * (hi - lo), groupAll.begin() + (size_t)(r + 1) * (hi - lo));
      std::vector<std::string> names;
      for (const TensorPair& tp : p.tensors) names.push_back(tp.name);
      msg = firstDifference(per, lo, names);
    }
    return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                         "ncclM2nPlanCreate: the ranks disagree on the batch: %s", msg.c_str());
  }
  if (!localError.empty())
    return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__, "ncclM2nPlanCreate: %s", localError.c_str());
  const std::vector<Round1>& v = *all;
  for (int r = 0; r < n; r++) {
    if (!v[r].valid)
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                           "ncclM2nPlanCreate: rank %d's batch is invalid (its error says why)", r);
    if (v[r].lsa != v[0].lsa)
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                           "ncclM2nPlanCreate: rank %d sets lsa to %d, rank 0 to %d: the ranks must agree", r, v[r].lsa,
                           v[0].lsa);
    if (v[r].zeroCopy != v[0].zeroCopy)
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                           "ncclM2nPlanCreate: rank %d sets zeroCopy to %d, rank 0 to %d: the ranks must agree", r,
                           v[r].zeroCopy, v[0].zeroCopy);
  }
  return ncclSuccess;
}

// The NVLink domains, once every rank agreed: with LSA and an LSA team of more than one rank somewhere, the domain
// communicator (ncclext::Domain, collective over comm: NCCL_EXT_LSA_DOMAIN_SIZE may split the teams), whose blocks of
// consecutive ranks are the domains; else NCCL's LSA teams, every stream by ncclSend / ncclRecv. Then the exchange
// communicator: none for one rank, for virtual ranks and for one domain over LSA (nothing goes by ncclSend /
// ncclRecv); the same decision on every rank. `*lsa`: streams inside the domain go over its windows.
ncclResult_t setUpDomains(ncclM2nPlan* plan, Problem& p, const ExecOptions& o, const std::vector<Round1>& all,
                          std::shared_ptr<ExchangeComm>&& reusable, bool* lsa) {
  const int n = plan->nRanks;
  p.options.domainOfRank.resize(n);
  for (int r = 0; r < n; r++) p.options.domainOfRank[r] = all[r].domain;
  *lsa = false;
  for (int r = 0; r < n && o.lsa; r++) *lsa = *lsa || all[r].lsaSize > 1;
  if (*lsa) {
    ncclext::DomainOptions dopt;
    dopt.virt = o.virt;
    dopt.virtualRank = o.virtualRank;
    dopt.timeoutSeconds = o.timeoutSeconds;
    NCCLEXT_CHECK(ncclext::Domain::create(plan->comm, dopt, &plan->domain));
    const ncclext::Topology& topo = plan->domain->topo();
    *lsa = topo.domainSize > 1;  // the same on every rank
    for (int r = 0; r < n; r++) p.options.domainOfRank[r] = r / topo.domainSize;
    if (!*lsa) plan->domain.reset();
  }
  if (n == 1 || o.virt || (*lsa && plan->domain->topo().nDomains == 1)) {
    plan->x = std::make_shared<ExchangeComm>();
    return ncclSuccess;
  }
  std::vector<ExchangeVote> votes;
  for (const Round1& r : all) votes.push_back(r.exchange);
  return chooseExchange(plan->comm, plan->rank, plan->device, votes, std::move(reusable), &plan->x);
}

// What LSA needs beyond the schedule, agreed over the domain (setUpLsa).
struct LsaAgreement {
  int64_t rounds = 0;         // the domain's most LSA chunks of a rank
  int64_t domainStreams = 0;  // the domain's LSA streams
};

// This rank's part of the batch (the same batch everywhere, planned with those domains): the schedule and the
// execution tables, the copy segments, what the rank holds and the fp8 descriptors. With LSA, one all-gather over
// the domain of each rank's longest LSA stream and its most LSA chunks (the chunk count does not depend on the
// slots): the window sized by the longest stream when shorter than a chunk, and the rounds; and its LSA streams:
// with zero-copy, whether the domain publishes and meets the in-place moves' barriers.
ncclResult_t planTables(ncclM2nPlan* plan, const Problem& p, const std::vector<Fp8Tensor>& fp8, const ExecOptions& o,
                        bool lsa, LsaAgreement* agreed, int64_t* scratchBytes) {
  const int rank = plan->rank;
  RankPlan rp;
  PlanStats stats;
  planRank(p, rank, &rp, &stats);
  ScheduleOptions so;
  so.stagingCapBytes = o.stagingBytes;
  so.lsa = lsa;      // streams inside the domain over its windows
  so.direct = true;  // contiguous transfers across domains straight between the tensors
  so.zeroCopy = lsa ? o.zeroCopy : kZeroCopyOff;
  RankSchedule sched;
  std::string why;
  NCCLEXT_ARG(buildSchedule(p, rp, so, &sched, &why), "ncclM2nPlanCreate: %s", why.c_str());
  if (plan->domain) {
    const int64_t mineLsa[3] = {sched.lsaStreamMax, sched.lsaChunks, sched.lsaStreams};
    std::vector<int64_t> allLsa(3 * (size_t)plan->domain->topo().domainSize);
    NCCLEXT_CHECK(plan->domain->allGather(mineLsa, sizeof(mineLsa), allLsa.data()));
    int64_t m = 0;
    for (size_t r = 0; r < allLsa.size(); r += 3) {
      m = std::max(m, allLsa[r]);
      agreed->rounds = std::max(agreed->rounds, allLsa[r + 1]);
      agreed->domainStreams += allLsa[r + 2];
    }
    if (m > 0 && m < sched.chunkBytes) {
      so.lsaSlotBytes = m;
      NCCLEXT_ARG(buildSchedule(p, rp, so, &sched, &why), "ncclM2nPlanCreate: %s", why.c_str());
    }
  }
  NCCLEXT_ARG(buildExecTables(p, rp, sched, &plan->tables, &why, so.zeroCopy), "ncclM2nPlanCreate: %s",
              why.c_str());
  plan->copySegs = executorCopySegments(plan->tables.copies);
  plan->copyPlain = std::stable_partition(plan->copySegs.begin(), plan->copySegs.end(),
                                           [](const MoveSegment& g) { return g.where != kTileSegment; }) -
                    plan->copySegs.begin();
  plan->nTensors = (int)p.tensors.size();
  for (const TensorPair& tp : p.tensors) plan->names.push_back(tp.name);
  holdings(p, rank, &plan->needSrc, &plan->needDst, &plan->srcBytes, &plan->dstBytes);
  // A quantised tensor's moves read the scratch; the caller passes the bf16 / fp32 source, and no scales source.
  plan->quant = quantDescs(fp8, rank, scratchBytes);
  for (size_t j = 0; j < plan->quant.size(); j++) {
    QuantDesc& q = plan->quant[j];
    plan->quantTensor.push_back(q.srcIndex);
    q.srcIndex = plan->nTensors + (int32_t)j;  // the caller's pointer, after the tensors' in the device array
    int64_t& most = q.blockRows == 1 ? plan->quantRowBlocks : plan->quantTileBlocks;
    most = std::max(most, q.blocks);
  }
  for (const Fp8Tensor& f : fp8) {
    plan->fp8Tensors.push_back(f.tensor);
    plan->needSrc[f.tensor + 1] = 0;
  }
  return ncclSuccess;
}

// The plan's device memory: the tables, the staging, the fp8 scratch and the call's pointer array; then the LSA
// window (COLLECTIVE over the domain) and the connections to the plan's peers (COLLECTIVE over its pairs).
ncclResult_t uploadPlan(ncclM2nPlan* plan, const LsaAgreement& agreed, int64_t scratchBytes, cudaStream_t stream) {
  const ExecTables& x = plan->tables;
  NCCLEXT_CHECK(upload(x.copies, &plan->copies, stream));
  NCCLEXT_CHECK(upload(x.sends, &plan->sends, stream));
  NCCLEXT_CHECK(upload(x.recvs, &plan->recvs, stream));
  NCCLEXT_CHECK(upload(plan->copySegs, &plan->copySegsDev, stream));
  NCCLEXT_CHECK(upload(x.pack, &plan->pack, stream));
  NCCLEXT_CHECK(upload(x.unpack, &plan->unpack, stream));
  if (x.stagingBytes > 0) NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&plan->staging), x.stagingBytes));
  NCCLEXT_CHECK(upload(plan->quant, &plan->quantDev, stream));
  if (scratchBytes > 0) NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&plan->scratch), scratchBytes));
  if (plan->nTensors > 0) {
    const size_t nSrc = plan->nTensors + plan->quant.size();
    NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&plan->src), sizeof(void*) * (nSrc + plan->nTensors)));
    plan->dst = const_cast<void**>(plan->src + nSrc);
  }
  NCCLEXT_CHECK(upload(plan->tables.remote, &plan->remote, stream));
  if (plan->domain) NCCLEXT_CHECK(setUpLsa(plan, agreed.rounds, agreed.domainStreams, stream));
  if (pipelinedRounds(plan->tables)) {
    NCCLEXT_CUDA(cudaStreamCreateWithFlags(&plan->side, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&plan->packed[0], &plan->packed[1], &plan->exchanged[0], &plan->exchanged[1], &plan->fork,
                           &plan->join})
      NCCLEXT_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  return connectPeers(plan, stream);
}

}  // namespace

ncclResult_t createPlan(ncclComm_t comm, Problem&& p, std::vector<Fp8Tensor>&& fp8, const std::string& localError,
                        const ExecOptions& o, ncclM2nPlan** out) {
  // Any failure below frees what was allocated so far (destroyPlan frees the device memory, then the plan).
  std::unique_ptr<ncclM2nPlan, void (*)(ncclM2nPlan*)> plan(new ncclM2nPlan(),
                                                         [](ncclM2nPlan* q) { (void)destroyPlan(q); });
  plan->comm = comm;
  plan->virt = o.virt;
  NCCLEXT_CHECK(loadExecKernels());
  NCCLEXT_CHECK(placePlan(plan.get(), comm, o));
  CreationStream stream;
  NCCLEXT_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  const CreationGather gather{comm, o, plan->rank, stream};
  std::vector<Round1> all(plan->nRanks);
  std::shared_ptr<ExchangeComm> reusable;
  NCCLEXT_CHECK(agreeOnBatch(comm, p, localError, o, gather, &all, &reusable));
  plan->timeoutSeconds = o.timeoutSeconds;
  NCCLEXT_CUDA(cudaGetDevice(&plan->device));
  bool lsa = false;
  NCCLEXT_CHECK(setUpDomains(plan.get(), p, o, all, std::move(reusable), &lsa));
  LsaAgreement agreed;
  int64_t scratchBytes = 0;
  NCCLEXT_CHECK(planTables(plan.get(), p, fp8, o, lsa, &agreed, &scratchBytes));
  NCCLEXT_CHECK(uploadPlan(plan.get(), agreed, scratchBytes, stream.s));
  NCCLEXT_CHECK(ncclext::waitStream(stream.s, o.timeoutSeconds, "ncclM2nPlanCreate (uploading the tables)"));
  // Virtual ranks: no rank launches an execute's barrier before every rank is done with the calls above, some of
  // which (cudaHostAlloc, cudaMalloc) may wait for all work on the GPU, a peer's spinning barrier included.
  if (plan->domain && plan->domain->isVirtual()) NCCLEXT_CHECK(plan->domain->barrier());
  plan->created = true;
  *out = plan.release();
  return ncclSuccess;
}

namespace {

// Round r's ncclSend / ncclRecv (if any) in one NCCL group on `stream`, enqueued under the communicator's lock, which
// the watchdog takes to abort it: no group of ours starts on a freed communicator. Plan creation connected every
// peer, so an enqueue does not wait for one.
ncclResult_t exchangeRound(ncclM2nPlan* plan, ExchangeComm& xc, const ExecRound& r, cudaStream_t stream) {
  if (r.opEnd == r.opBegin) return ncclSuccess;
  std::lock_guard<std::timed_mutex> group(xc.mu);
  if (xc.aborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", xc.why.c_str());
  NCCLEXT_NCCL(ncclGroupStart());
  ncclResult_t res = ncclSuccess;
  for (uint32_t i = r.opBegin; i < r.opEnd && res == ncclSuccess; i++) {
    const P2pOp& op = plan->tables.ops[i];
    char* at = plan->staging + op.stageOffset;
    res = op.send ? ncclSend(at, (size_t)op.bytes, ncclUint8, op.peer, xc.comm, stream)
                  : ncclRecv(at, (size_t)op.bytes, ncclUint8, op.peer, xc.comm, stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (res != ncclSuccess || ended != ncclSuccess)
    return ncclext::fail(res != ncclSuccess ? res : ended, __FILE__, __LINE__,
                         "ncclM2nExecute: NCCL point-to-point: %s", ncclGetLastError(xc.comm));
  stageDone(plan, "exchange", stream);
  return ncclSuccess;
}

// Pipelined rounds (exec_tables.h, pipelinedRounds): `stream` runs the exchanges back to back while the plan's side
// stream packs round k + 1 and unpacks round k. Round k uses slot k % 2 of each stream, so the side stream packs
// round k + 2 only after the exchange of round k sent that slot (event exchanged[k % 2]), and after its own unpack
// of round k, so that the exchange of round k + 2, which waits for that pack (event packed[k % 2]), lands in the
// receive slot only once round k's unpack read it. The side stream forks from `stream` here and joins it before
// this returns, whatever happens (a capture sees both: CUDA graph fork and join).
ncclResult_t runPipelined(ncclM2nPlan* plan, ExchangeComm& xc, const char* const* s, char* const* d,
                          const StageAreas& stage, cudaStream_t stream) {
  const ExecTables& x = plan->tables;
  cudaStream_t side = plan->side;
  NCCLEXT_CUDA(cudaEventRecord(plan->fork, stream));
  NCCLEXT_CUDA(cudaStreamWaitEvent(side, plan->fork, 0));
  struct Join {
    cudaStream_t side, stream;
    cudaEvent_t join;
    ~Join() {
      if (cudaEventRecord(join, side) == cudaSuccess) cudaStreamWaitEvent(stream, join, 0);
    }
  } joined{side, stream, plan->join};
  auto pack = [&](size_t k) -> ncclResult_t {
    const ExecRound& r = x.rounds[k];
    NCCLEXT_CHECK(launchPack(plan->sends, plan->pack + r.packBegin, r.packEnd - r.packBegin, s, stage, side));
    stageDone(plan, "pack", side);
    NCCLEXT_CUDA(cudaEventRecord(plan->packed[k % 2], side));
    return ncclSuccess;
  };
  NCCLEXT_CHECK(pack(0));
  NCCLEXT_CHECK(pack(1));  // pipelined plans have two rounds at least
  for (size_t k = 0; k < x.rounds.size(); k++) {
    const ExecRound& r = x.rounds[k];
    NCCLEXT_CUDA(cudaStreamWaitEvent(stream, plan->packed[k % 2], 0));
    NCCLEXT_CHECK(exchangeRound(plan, xc, r, stream));
    NCCLEXT_CUDA(cudaEventRecord(plan->exchanged[k % 2], stream));
    NCCLEXT_CUDA(cudaStreamWaitEvent(side, plan->exchanged[k % 2], 0));
    NCCLEXT_CHECK(launchUnpack(plan->recvs, plan->unpack + r.unpackBegin, r.unpackEnd - r.unpackBegin, stage, d, side));
    stageDone(plan, "unpack", side);
    if (k + 2 < x.rounds.size()) NCCLEXT_CHECK(pack(k + 2));
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t execute(ncclM2nPlan* plan, const void* const* src, void* const* dst, cudaStream_t stream) {
  for (int t = 0; t < plan->nTensors; t++) {
    NCCLEXT_ARG(!plan->needSrc[t] || (src && src[t]),
                "ncclM2nExecute: rank %d holds part of tensor %d (%s)'s source, but its src pointer is NULL",
                plan->rank, t, plan->names[t].c_str());
    NCCLEXT_ARG(!plan->needDst[t] || (dst && dst[t]),
                "ncclM2nExecute: rank %d holds part of tensor %d (%s)'s destination, but its dst pointer is NULL",
                plan->rank, t, plan->names[t].c_str());
  }
  ExchangeComm& xc = *plan->x;
  if (xc.aborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", xc.why.c_str());
  if (plan->status) NCCLEXT_CHECK(plan->status->check("ncclM2nExecute (an earlier barrier of the domain)"));
  const ExecTables& x = plan->tables;
  // Zero-copy: what this rank publishes (exec_tables.h), checked before anything is enqueued (a refused execute
  // leaves its peers to time out in the barrier they meet it at).
  std::vector<Published> published;
  char* const* registered = nullptr;
  if (x.remoteBarrier) NCCLEXT_CHECK(publishedTensors(plan, src, dst, &published, &registered));
  // The pointers the kernels read, sources then destinations. Quantised tensors: the moves read the scratch (values
  // at tensor t, scales at t + 1); the quantiser reads the caller's sources, whose pointers follow the tensors'.
  const size_t nSrc = plan->nTensors + plan->quant.size();
  std::vector<const void*> pointers(nSrc + plan->nTensors, nullptr);
  if (src) std::copy(src, src + plan->nTensors, pointers.begin());
  if (dst) std::copy(dst, dst + plan->nTensors, pointers.begin() + nSrc);
  for (int t : plan->fp8Tensors) pointers[t] = pointers[t + 1] = nullptr;
  for (size_t j = 0; j < plan->quant.size(); j++) {
    const QuantDesc& q = plan->quant[j];
    const int t = plan->quantTensor[j];
    pointers[q.srcIndex] = src[t];
    pointers[t] = plan->scratch + q.valuesOffset;
    pointers[t + 1] = plan->scratch + q.scalesOffset;
  }
  if (!plan->fp8Tensors.empty()) src = pointers.data();  // the direct sends of quantised tensors read the scratch
  // One launch for them all (none when an eager execute repeats the last ones).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  NCCLEXT_CUDA(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) plan->everCaptured = true;
  if (plan->everCaptured || pointers != plan->uploaded) {
    NCCLEXT_CHECK(launchSetPointers(plan->src, pointers.data(), (int64_t)pointers.size(), stream));
    plan->uploaded = pointers;
    stageDone(plan, "pointers", stream);
  }
  if (!plan->quant.empty()) {
    NCCLEXT_CHECK(launchQuantize(plan->quantDev, (int)plan->quant.size(), plan->quantRowBlocks,
                                 plan->quantTileBlocks, reinterpret_cast<const char* const*>(plan->src), plan->scratch,
                                 stream));
    stageDone(plan, "quantize", stream);
  }
  const char* const* s = reinterpret_cast<const char* const*>(plan->src);
  char* const* d = reinterpret_cast<char* const*>(plan->dst);
  if (!plan->copySegs.empty()) {
    NCCLEXT_CHECK(launchCopies(plan->copies, plan->copySegsDev, plan->copyPlain,
                               (int64_t)plan->copySegs.size() - plan->copyPlain, s, d, stream));
    stageDone(plan, "copies", stream);
  }
  if (x.direct.empty() && x.rounds.empty() && !x.finalBarrier) return ncclSuccess;  // local copies only
  // Whatever happens below, what was enqueued by ncclSend / ncclRecv is watched (a capture is not: its replays run
  // later, unwatched). The LSA barriers bound their own waits.
  const bool p2p = !x.direct.empty() || !x.ops.empty();
  struct Watch {
    ncclM2nPlan* plan;
    cudaStream_t stream;
    bool on;
    ~Watch() {
      if (on) watchStream(plan, stream, "ncclM2nExecute");
    }
  } watch{plan, stream, p2p && capture == cudaStreamCaptureStatusNone};
  if (p2p && capture != cudaStreamCaptureStatusNone) xc.captured = true;
  // Each NCCL group is enqueued under the communicator's lock, which the watchdog takes to abort it: no group of ours
  // starts on a freed communicator. Plan creation connected every peer, so an enqueue does not wait for one.
  if (!x.direct.empty()) {  // straight from and into the tensors (host pointers: the call's own arrays)
    std::lock_guard<std::timed_mutex> group(xc.mu);
    if (xc.aborted) return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", xc.why.c_str());
    NCCLEXT_NCCL(ncclGroupStart());
    ncclResult_t res = ncclSuccess;
    for (size_t i = 0; i < x.direct.size() && res == ncclSuccess; i++) {
      const DirectOp& op = x.direct[i];
      const MoveDesc& md = op.send ? x.sends[op.desc] : x.recvs[op.desc];
      res = op.send ? ncclSend(static_cast<const char*>(src[op.tensor]) + op.offset * md.elemBytes,
                               (size_t)op.bytes, ncclUint8, op.peer, xc.comm, stream)
                    : ncclRecv(static_cast<char*>(dst[op.tensor]) + op.offset * md.elemBytes, (size_t)op.bytes,
                               ncclUint8, op.peer, xc.comm, stream);
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (res != ncclSuccess || ended != ncclSuccess)
      return ncclext::fail(res != ncclSuccess ? res : ended, __FILE__, __LINE__,
                           "ncclM2nExecute: NCCL point-to-point (direct): %s", ncclGetLastError(xc.comm));
    stageDone(plan, "direct", stream);
  }
  if (x.remoteBarrier) {
    const ncclext::dev::Peers peers = plan->window->peers();
    Published* table = reinterpret_cast<Published*>(static_cast<char*>(plan->window->localPtr()) + plan->windowTable);
    NCCLEXT_CHECK(launchPublish(table, published.data(), (int64_t)published.size(), stream));
    stageDone(plan, "publish", stream);
    NCCLEXT_CHECK(domainBarrier(plan, stream));
    stageDone(plan, "barrier", stream);
    RemoteMoves rm;
    rm.peers = peers;
    rm.tableOffset = plan->windowTable;
    rm.registered = registered;
    rm.domainSize = plan->domain->topo().domainSize;
    rm.pull = x.zeroCopy == kZeroCopyPull;
    NCCLEXT_CHECK(launchRemote(rm.pull ? plan->recvs : plan->sends, plan->remote, (int64_t)x.remote.size(), rm, s, d,
                               stream));
    stageDone(plan, "remote", stream);
  }
  StageAreas stage;
  stage.local = plan->staging;
  if (plan->window) stage.peers = plan->window->peers();
  stage.windowOffset = plan->windowSlots;
  if (plan->side) return runPipelined(plan, xc, s, d, stage, stream);
  for (const ExecRound& r : x.rounds) {
    NCCLEXT_CHECK(launchPack(plan->sends, plan->pack + r.packBegin, r.packEnd - r.packBegin, s, stage, stream));
    stageDone(plan, "pack", stream);
    NCCLEXT_CHECK(exchangeRound(plan, xc, r, stream));
    if (r.barrier) {
      NCCLEXT_CHECK(domainBarrier(plan, stream));
      stageDone(plan, "barrier", stream);
    }
    NCCLEXT_CHECK(
        launchUnpack(plan->recvs, plan->unpack + r.unpackBegin, r.unpackEnd - r.unpackBegin, stage, d, stream));
    stageDone(plan, "unpack", stream);
  }
  if (x.finalBarrier) {
    NCCLEXT_CHECK(domainBarrier(plan, stream));
    stageDone(plan, "final barrier", stream);
  }
  return ncclSuccess;
}

void setStageHook(ncclM2nPlan* plan, ncclM2nStageHook_t hook, void* user) {
  plan->stageHook = hook;
  plan->stageUser = user;
}

ncclResult_t asyncError(ncclM2nPlan* plan) {
  if (plan->x && plan->x->aborted)
    return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s", plan->x->why.c_str());
  return plan->status ? plan->status->check("ncclM2nExecute (a barrier of the domain)") : ncclSuccess;
}

ncclResult_t retainExchange(ncclComm_t comm, double timeoutSeconds) {
  int rank = 0, n = 0, device = 0;
  NCCLEXT_NCCL(ncclCommUserRank(comm, &rank));
  NCCLEXT_NCCL(ncclCommCount(comm, &n));
  if (n == 1) return ncclSuccess;  // one rank exchanges nothing
  NCCLEXT_CUDA(cudaGetDevice(&device));
  cudaStream_t stream = nullptr;
  NCCLEXT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::shared_ptr<ExchangeComm> reusable;
  const ExchangeVote mine = voteFor(comm, &reusable);
  std::vector<ExchangeVote> votes(n);
  const ncclResult_t res = ncclext::ncclAllGatherHost(comm, stream, &mine, sizeof(mine), votes.data(), timeoutSeconds);
  if (res != ncclSuccess) return res;  // the all-gather may still run: its stream is left to the process
  cudaStreamDestroy(stream);
  std::shared_ptr<ExchangeComm> x;
  NCCLEXT_CHECK(chooseExchange(comm, rank, device, votes, std::move(reusable), &x));
  std::shared_ptr<ExchangeComm> dropped;
  std::lock_guard<std::mutex> lock(splitsMu);
  dropped = std::move(splitRecords()[comm].retained);
  splitRecords()[comm].retained = std::move(x);
  return ncclSuccess;
}

void releaseExchange(ncclComm_t comm) {
  std::shared_ptr<ExchangeComm> dropped;  // destroyed (with the last plan on it) outside the lock
  std::lock_guard<std::mutex> lock(splitsMu);
  auto it = splitRecords().find(comm);
  if (it != splitRecords().end()) dropped = std::move(it->second.retained);
}

ncclResult_t destroyPlan(ncclM2nPlan* plan) {
  if (!plan) return ncclSuccess;
  // Virtual ranks: every rank is here (its executes done) before any frees, and every rank has freed before any
  // goes on to launch kernels that spin for the others.
  ncclext::VirtualDomain* virt = plan->created ? plan->virt : nullptr;
  const int rank = plan->rank;
  const double timeout = plan->timeoutSeconds;
  ncclResult_t res = virt ? virt->barrier(rank, timeout) : ncclSuccess;
  if (virt && res == ncclSuccess && plan->window) virt->forget(plan->fenceKey);  // every rank is past its fences
  ncclext::Watchdog::instance().removeOwner(plan);  // after it, no action of the watchdog touches the plan
  plan->x.reset();  // the exchange communicator goes with the last plan on it
  for (void* p : {(void*)plan->copies, (void*)plan->sends, (void*)plan->recvs, (void*)plan->copySegsDev,
                  (void*)plan->pack, (void*)plan->unpack, (void*)plan->remote, (void*)plan->staging,
                  (void*)plan->src, (void*)plan->quantDev, (void*)plan->scratch,
                  (void*)plan->epochs})
    if (p) cudaFree(p);
  for (cudaEvent_t e :
       {plan->packed[0], plan->packed[1], plan->exchanged[0], plan->exchanged[1], plan->fork, plan->join})
    if (e) cudaEventDestroy(e);
  if (plan->side) cudaStreamDestroy(plan->side);  // its work runs on (executes joined it to their streams)
  delete plan;  // the window before the domain
  if (virt && res == ncclSuccess) res = virt->barrier(rank, timeout);
  return res;
}

}  // namespace ncclm2n
