#include "nccl_ep/src/group.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/checks.h"
#include "common/env.h"
#include "common/topology.h"
#include "nccl_ep/src/ht/ht.h"
#include "nccl_ep/src/ll/ll.h"

namespace {

// A stream of the group's creation, destroyed on every path out.
struct CreationStream {
  cudaStream_t stream = nullptr;
  ~CreationStream() {
    if (stream) NCCLEXT_WARN_ON(cudaStreamDestroy(stream));
  }
};

}  // namespace

ncclResult_t ncclEpGroup::create(ncclComm_t comm, const ncclEpGroupConfig_t& config,
                                 const ncclep::TestingModes& testing, ncclEpGroup** out) {
  std::unique_ptr<ncclEpGroup> g(new ncclEpGroup());
  g->comm = comm;
  g->config = config;
  g->testing = testing;
  const ncclep::ResolvedConfig resolved = ncclep::resolveConfig(config);
  g->timeoutSeconds = resolved.timeoutSeconds;
  NCCLEXT_CHECK(g->createDomain());
  const ncclext::Topology& topo = g->window.domain->topo();

  // The kernels this group launches, loaded before any of them runs (ncclext::loadKernels says why).
  NCCLEXT_CHECK(ncclep::loadRouteKernels());
  NCCLEXT_CHECK(ncclep::loadRailKernels());
  if (config.algorithm == NCCL_EP_ALGO_LOW_LATENCY) {
    NCCLEXT_CHECK(ncclep::loadLlKernels());
  } else {
    NCCLEXT_CHECK(ncclep::loadDispatchKernels());
    NCCLEXT_CHECK(ncclep::loadCombineKernels());
    NCCLEXT_CHECK(ncclep::loadCapKernels());
  }

  NCCLEXT_CHECK(ncclep::layoutWithinBudget(resolved.config, topo, &g->view, resolved.htHierarchical,
                                           testing.virtualRail != nullptr));
  {
    CreationStream cs;
    NCCLEXT_CUDA(cudaStreamCreateWithFlags(&cs.stream, cudaStreamNonBlocking));
    NCCLEXT_CHECK(g->createWindow(cs.stream));
    if (g->view.rail.outboxBytes) NCCLEXT_CHECK(g->createRail(resolved.railOverlap, cs.stream));
  }
  // Virtual ranks: nobody launches a kernel of this group before every rank is done with the calls above (some of
  // them wait for all work on the GPU).
  if (g->window.domain->isVirtual()) NCCLEXT_CHECK(g->window.domain->barrier());
  NCCLEXT_INFO("group: %d ranks, %d experts, %d tokens x %d bytes, top-%d, %d SMs, window %zu bytes, %s", topo.nRanks,
               config.num_experts, config.max_tokens_per_rank, config.max_token_bytes, config.max_topk, g->numSms,
               g->view.wl.total, ncclext::describeEnv(ncclext::env()).c_str());
  *out = g.release();
  return ncclSuccess;
}

// The domain and rail communicators (collective over `comm`), then the checks of several domains, which every rank
// reaches with the same topology, and this rank's SM budget.
ncclResult_t ncclEpGroup::createDomain() {
  ncclext::DomainOptions dopt;
  dopt.domainSize = config.lsa_domain_size;
  dopt.virt = testing.virtualDomain ? &testing.virtualDomain->domain : nullptr;
  dopt.virtualRank = testing.virtualRank;
  dopt.rail = testing.virtualRail;
  dopt.timeoutSeconds = timeoutSeconds;
  NCCLEXT_CHECK(ncclext::Domain::create(comm, dopt, &window.domain));
  memory = ncclep::DeviceMemory(config.alloc, window.domain->isVirtual());
  const ncclext::Topology& topo = window.domain->topo();
  NCCLEXT_USAGE(topo.nDomains == 1 || !config.enable_mask || !testing.virtualRail,
                "enable_mask in the mixed test mode (virtual_rail) across %d NVLink domains: not supported (a relay "
                "sends what every rank of its domain wrote, masked or not)",
                topo.nDomains);
  const int nRanks = topo.nRanks;
  ncclext::setLogRank(topo.rank);
  NCCLEXT_ARG(nRanks <= ncclep::kMaxRanks, "%d ranks: at most %d", nRanks, ncclep::kMaxRanks);
  NCCLEXT_ARG(config.num_experts % nRanks == 0, "num_experts %d is not a multiple of the %d ranks", config.num_experts,
              nRanks);
  int dev = 0;
  NCCLEXT_CUDA(cudaGetDevice(&dev));
  NCCLEXT_CUDA(cudaDeviceGetAttribute(&smCount, cudaDevAttrMultiProcessorCount, dev));
  // Virtual ranks share the GPU: each gets its share of the SMs, so that every rank's kernels are resident at once
  // (a rank's CTAs spin on flags that the others' CTAs write).
  if (window.domain->isVirtual()) smCount = std::max(1, smCount / nRanks);
  // Auto: kSharedSms (64), not every SM, in both modes. A kernel's CTAs wait on the peers' CTAs, so a call on every
  // SM beside a kernel on another stream that itself waits on the peers (an NCCL collective) can wait in a circle
  // until the timeout: the LL grid, started in part (or, cooperative, not at all), waits on a peer whose SMs the
  // other kernel holds, or the other way round. 64 leaves room. Low-Latency calls at 7168 columns are 20-33% faster
  // with every SM (docs/PERFORMANCE.md), for a caller that runs nothing of that kind beside them: num_sms says so
  // (a whole LL call on more than kSharedSms is launched cooperatively: ll/calls.cc).
  numSms = config.num_sms > 0 ? std::min(config.num_sms, smCount) : std::min(ncclep::kSharedSms, smCount);
  return ncclSuccess;
}

// Symmetric memory on the domain (collective), the error word, and the device state, zeroed (with enable_mask,
// every rank active), on `stream`, drained.
ncclResult_t ncclEpGroup::createWindow(cudaStream_t stream) {
  ncclext::SymmetricMemoryOptions so;
  so.bytes = view.wl.total;
  NCCLEXT_CHECK(ncclext::SymmetricMemory::create(*window.domain, so, stream, &window.mem));
  view.peers = window.mem->peers();
  NCCLEXT_CHECK(ncclext::DeviceStatus::create(&window.status));
  view.err = window.status->sink();
  view.timeoutNs = (uint64_t)(timeoutSeconds * 1e9);
  NCCLEXT_CHECK(memory.alloc(&window.state, ncclep::DeviceState::kBytes));
  if (cudaMemsetAsync(window.state, 0, ncclep::DeviceState::kBytes, stream) != cudaSuccess)
    return ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "group state: zero-fill failed");
  uint64_t* st = static_cast<uint64_t*>(window.state);
  view.calls = st;
  view.arrivals = reinterpret_cast<unsigned long long*>(st + 2);
  view.sent = st + 4;
  view.sendArrivals = reinterpret_cast<unsigned long long*>(st + 6);
  view.barrierEpoch = st + 8;  // index 0 only
  view.heldDispatch = st + 9;
  if (config.enable_mask) {
    NCCLEXT_CHECK(ncclep::llSetMask(this, std::vector<int>(view.nRanks, 1).data(), stream));
    view.mask = reinterpret_cast<int*>(static_cast<char*>(window.state) + ncclep::DeviceState::kMaskOffset);
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess)
    return ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "group state: mask fill failed");
  return ncclSuccess;
}

// The rail (several domains): over every rank of comm, or in relay mode the domain's rail, the ranks of my index in
// every domain.
ncclResult_t ncclEpGroup::createRail(bool overlap, cudaStream_t stream) {
  ncclep::Rail::Options o;
  o.comm = comm;
  o.domainRail = window.domain->railComm();
  o.topo = &window.domain->topo();
  o.maskBarrier = config.enable_mask != 0;
  o.overlap = overlap;
  o.virt = window.domain->isVirtual() && testing.virtualDomain ? &testing.virtualDomain->domain : nullptr;
  o.hostMask = ll.hostMask;
  o.memory = &memory;
  o.timeoutSeconds = timeoutSeconds;
  return ncclep::Rail::create(o, &view, window.local(), stream, &rail);
}

ncclEpGroup::~ncclEpGroup() {
  rail.reset();  // its communicator and staging first, as the window's users
  memory.freeNow(window.state);
  memory.freeRetired();
}

ncclResult_t ncclEpGroup::destroy(ncclEpGroup* g) {
  ncclext::Domain& domain = *g->window.domain;
  // (1) No peer reads or writes my window after this.
  ncclResult_t res = domain.barrier();
  ncclext::VirtualDomain* virt = g->testing.virtualDomain ? &g->testing.virtualDomain->domain : nullptr;
  const int rank = g->view.rank - g->view.rail.domainBase;  // in the virtual domain (mixed: not the world rank)
  const double timeout = g->timeoutSeconds;
  if (res == ncclSuccess && g->rail) g->rail->forgetFences();  // every rank is past its fences
  // (2) Free. A failed barrier means a peer is gone: the domain communicator is aborted first (no teardown call may
  // wait for the dead peer), and the window is then freed without its collective deregistration.
  if (res != ncclSuccess && domain.abort() && g->window.mem) g->window.mem->abandon();
  delete g;
  // (3) Virtual ranks: no rank goes on to launch kernels while another still frees (a free waits for all of them).
  if (virt && res == ncclSuccess) res = virt->barrier(rank, timeout);
  return res;
}

ncclResult_t ncclEpGroup::asyncError(const char* what) {
  if (rail && rail->aborted())
    return ncclext::fail(ncclRemoteError, __FILE__, __LINE__, "%s: %s", what, rail->why().c_str());
  ncclext::DeviceErrorWord w;
  if (!window.status || !window.status->read(&w)) return ncclSuccess;
  if (w.code == ncclext::kDevicePeerMasked) {  // reported once: the group goes on without the peer
    window.status->reset();
    return ncclext::describeDeviceError(w, what);
  }
  if (w.code == ncclext::kDeviceBadInput && w.site == ncclep::kSiteRecvCap) {
    window.status->reset();
    return ncclext::fail(
        ncclInvalidArgument, __FILE__, __LINE__,
        "%s: a handle routes %llu rows to rank %d, above max_recv_rows_per_rank %llu: the last %u (the "
        "last sources' last tokens) were not delivered, and combine leaves them out (recv_overflow "
        "DROP makes that the rule instead of an error)",
        what, (unsigned long long)w.seen, w.rank, (unsigned long long)w.expected, w.index);
  }
  if (w.code == ncclext::kDeviceBadInput && (w.site == ncclep::kSiteTopkIdx || w.site == ncclep::kSiteTopkRepeat)) {
    window.status->reset();
    if (w.site == ncclep::kSiteTopkRepeat)
      return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                           "%s: topk_idx[%u][%d] = %lld repeats topk_idx[%u][%llu]: a token names each expert at most "
                           "once (the repeat was ignored)",
                           what, w.index, w.peer, (long long)(int64_t)w.seen, w.index, (unsigned long long)w.expected);
    return ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__,
                         "%s: topk_idx[%u][%d] = %lld is not an expert id in [-1, %llu) (it was ignored)", what,
                         w.index, w.peer, (long long)(int64_t)w.seen, (unsigned long long)w.expected);
  }
  if (w.code == ncclext::kDeviceAborted && w.site == ncclep::kSiteRelayPartial)  // kept: the group is failed
    return ncclext::fail(ncclRemoteError, __FILE__, __LINE__,
                         "%s: across NVLink domains: rank %d's relay, rank %d, sent the combine partial at position %u "
                         "of an earlier call (its number %llu, this call's %llu): the relay's reduce failed (a rank of "
                         "its domain that died or never calls); this call's outputs are incomplete, destroy the group",
                         what, w.rank, w.peer, w.index, (unsigned long long)w.seen, (unsigned long long)w.expected);
  return window.status->check(what);
}
