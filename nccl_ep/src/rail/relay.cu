// The rail's kernels (rail/rail.h): after an exchange's NCCL group, what it brought into the inbox goes to its place in
// the windows of my domain.
//
// Contract
//   railInboxKernel  Low-Latency across domains, after an exchange's NCCL group: each remote source's slices of the
//                exchange's regions, inbox -> my window (the kind's bank), 8 bytes a thread at a time (HT's flat
//                exchange receives into the window itself: RailView::direct).
//   railRelayKernel  the same in relay mode (HT over a rail of one index, RailView::relay): what each other domain's
//                rank of my index wrote for each rank r of my domain, inbox -> r's window (LSA), at that writer's
//                slices. Dispatch and combine first wait until every rank of my domain consumed the previous call
//                (its done flag, as a sender waits), then move slot by slot, the CTA's stores of a slot before its
//                flag's release (the row flag in the metadata for dispatch, the combine flag region for combine):
//                the receivers acquire the flags as they do LSA senders'. The handle's exchange rows need no flag
//                (their readers meet after this kernel in the domain's barrier).
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/rail/rail.h"

namespace ncclep {
namespace {

// Low-Latency's regions: every slice and offset a multiple of 8 bytes.
__global__ void __launch_bounds__(kThreads) railInboxKernel(GroupView g, int kind, int ownerWeighted) {
  const RailView& rv = g.rail;
  // The bank of the kind's last send half, which ran before on the stream (the receive half reading it comes after).
  const size_t bank = (g.sent[kind] & 1) * g.wl.bankBytes;
  char* window = static_cast<char*>(g.peers.local(bank));
  const RailRegions regions = rv.regionsOf(kind, ownerWeighted != 0);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
  for (int s = 0; s < g.nRanks; s++) {
    if (rv.local(s)) continue;
    for (int i = regions.first; i <= regions.last; i++) {
      const uint64_t* from = reinterpret_cast<const uint64_t*>(rv.inbox + (size_t)rv.box(s) * rv.inboxBytes +
                                                               rv.outOff[i]);
      uint64_t* to = reinterpret_cast<uint64_t*>(window + rv.base[i] + (size_t)s * rv.slice[i]);
      for (size_t k = tid; k < rv.slice[i] / 8; k += nt) to[k] = from[k];
    }
  }
}

// `bytes` (a multiple of 8) from `from` to `to` by the CTA, 8 bytes a thread at a time.
__device__ __forceinline__ void ctaCopy8(void* to, const void* from, size_t bytes) {
  for (size_t k = threadIdx.x; k < bytes / 8; k += blockDim.x)
    static_cast<uint64_t*>(to)[k] = static_cast<const uint64_t*>(from)[k];
}

// Low-Latency's relay: one CTA per (other domain, rank of mine), whole slices in the call's bank: the data (rows,
// metadata, the header's counts), then every flag word (slice flags), then the header's flag, each released after a
// CTA barrier: a receiver acquires the header first, then each row's slice flags, as from an LSA sender.
__device__ void relayLowLatency(const GroupView& g, int kind, bool ownerWeighted) {
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  const uint64_t seq = g.sent[kind];  // this call's send half, which ran before on my stream
  const size_t bank = (seq & 1) * g.wl.bankBytes;
  // Every rank of my domain consumed call seq - 2, the last one of this bank (as a sender waits: waitBankFree):
  // waitPeersConsumed's wait for the call before `seq - 1`.
  const size_t doneOff = kind == kDispatch ? g.wl.dispDone : g.wl.combDone;
  if (!waitPeersConsumed(Team::wholeCta(), g, doneOff, seq - 1)) return;
  const RailRegions regions = rv.regionsOf(kind, ownerWeighted);
  auto isFlags = [](int i) { return i == kRailDispFlags || i == kRailCombFlags || i == kRailOwnerFlags; };
  for (int it = blockIdx.x; it < (nDomains - 1) * G; it += gridDim.x) {
    const int r = it % G, dd = it / G, d = otherDomain(dd, myDomain), writer = d * G + myIndex;
    const char* sub = rv.inbox + (size_t)(d * G + r) * rv.inboxBytes;
    auto to = [&](int i) {
      return static_cast<char*>(g.peers.at(bank + rv.base[i] + (size_t)writer * rv.slice[i], r));
    };
    auto from = [&](int i) { return sub + rv.outOff[i]; };
    for (int i = regions.first; i <= regions.last; i++) {
      if (isFlags(i)) continue;
      const size_t skip = i == kRailHeader ? 8 : 0;  // the header's flag word goes last
      ctaCopy8(to(i) + skip, from(i) + skip, rv.slice[i] - skip);
    }
    __syncthreads();
    for (int i = regions.first; i <= regions.last; i++) {
      if (!isFlags(i)) continue;
      uint64_t* t = reinterpret_cast<uint64_t*>(to(i));
      const uint64_t* f = reinterpret_cast<const uint64_t*>(from(i));
      for (size_t k = threadIdx.x; k < rv.slice[i] / 8; k += blockDim.x) ncclext::dev::storeRelease(t + k, f[k]);
    }
    __syncthreads();
    if (regions.first == kRailHeader && threadIdx.x == 0)
      ncclext::dev::storeRelease(reinterpret_cast<uint64_t*>(to(kRailHeader)),
                                 *reinterpret_cast<const uint64_t*>(from(kRailHeader)));
    __syncthreads();
  }
}

// The hierarchical dispatch's relay (RailView::hier), after the done flags: one CTA per (other domain, rail
// position of round `round`); a row of this call at this position is written into the staging of every rank of my
// domain its tail names, at the source's slot towards that rank, with the metadata the source would have written
// for it (expert ids local to that rank, weights, indices, scales), its flag released last after a CTA barrier.
// The first round also marks every later position unforwarded (a later round, if any, overwrites its own): the
// combine's reduce then reads no forwarding record of an earlier call, whatever rounds this one takes.
__device__ void relayHierarchical(const GroupView& g, int* hierFwd, int round) {
  const RailView& rv = g.rail;
  const HierRow& hr = rv.hierRow;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  const uint64_t seq = callNumber(g, kDispatch);
  const int M = g.maxTokens, C = rv.roundSlots, lo = round * C;
  const int span = round == 0 ? M : min(C, M - lo);  // positions [lo, lo + span) of each other domain
  for (int64_t it = blockIdx.x; it < (int64_t)(nDomains - 1) * span; it += gridDim.x) {
    const int q = lo + (int)(it % span), dd = (int)(it / span), d = otherDomain(dd, myDomain);
    const int writer = d * G + myIndex;
    int* fwd = hierFwd + ((size_t)d * M + q) * G;
    if (q - lo >= C) {  // the first round: a position of a later round
      for (int rl = threadIdx.x; rl < G; rl += blockDim.x) fwd[rl] = -1;
      continue;
    }
    const char* in = rv.hierIn + ((size_t)d * C + (q - lo)) * hr.bytes();
    const bool current = *reinterpret_cast<const uint64_t*>(in + hr.seqOff()) == seq &&
                         *reinterpret_cast<const int*>(in + hr.posOff()) == q;
    // The handle's forwarding record for its combine: each rank's slot for this position (-1 for a stale row).
    for (int rl = threadIdx.x; rl < G; rl += blockDim.x)
      fwd[rl] = current ? reinterpret_cast<const int*>(in + hr.slotOff())[rl] : -1;
    if (!current) continue;  // not a row of this call at this position
    const int K = reinterpret_cast<const int*>(in + hr.countsOff())[0];
    const int nScales = reinterpret_cast<const int*>(in + hr.countsOff())[1];
    for (int rl = 0; rl < G; rl++) {
      const int slot = reinterpret_cast<const int*>(in + hr.slotOff())[rl];
      if (slot < 0) continue;
      const int r = rv.domainBase + rl;
      const size_t rowIndex = (size_t)writer * M + slot;
      ctaCopy8(g.peers.at(g.wl.dispRows + rowIndex * g.rowStride, rl), in, hr.rowStride);
      char* meta = static_cast<char*>(g.peers.at(g.wl.dispMeta + rowIndex * g.meta.bytes, rl));
      for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const int e = reinterpret_cast<const int*>(in + hr.expertOff())[k];
        reinterpret_cast<int*>(meta + g.meta.expertOff())[k] = localExpert(g, e, r);
        reinterpret_cast<float*>(meta + g.meta.weightOff())[k] = reinterpret_cast<const float*>(in + hr.weightOff())[k];
        reinterpret_cast<int*>(meta + g.meta.emIdxOff())[k] = reinterpret_cast<const int*>(in + hr.idxOff())[k];
      }
      for (int i = threadIdx.x; i < nScales; i += blockDim.x)
        reinterpret_cast<float*>(meta + g.meta.scaleOff())[i] = reinterpret_cast<const float*>(in + hr.scaleOff())[i];
      __syncthreads();
      if (threadIdx.x == 0) ncclext::dev::storeRelease(reinterpret_cast<uint64_t*>(meta + g.meta.flagOff()), seq);
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads) railRelayKernel(GroupView g, int kind, int ownerWeighted, int* hierFwd,
                                                            int round) {
  if (g.lowLatency) {
    relayLowLatency(g, kind, ownerWeighted != 0);
    return;
  }
  const RailView& rv = g.rail;
  const int G = rv.domainSize, myDomain = g.rank / G, myIndex = g.rank - rv.domainBase, nDomains = g.nRanks / G;
  if (kind != kRailHandle) {
    const size_t doneOff = kind == kDispatch ? g.wl.dispDone : g.wl.combDone;
    if (!waitPeersConsumed(Team::wholeCta(), g, doneOff, callNumber(g, static_cast<CallKind>(kind)))) return;
  }
  if (kind == kDispatch && rv.hier) {
    relayHierarchical(g, hierFwd, round);
    return;
  }
  // Items: (other domain, rank of mine, slot); the handle's exchange row is one slot of its whole slice.
  const int slots = kind == kRailHandle ? 1 : g.maxTokens;
  const int64_t items = (int64_t)(nDomains - 1) * G * slots;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int j = (int)(it % slots), r = (int)(it / slots % G), dd = (int)(it / slots / G);
    const int d = otherDomain(dd, myDomain);
    const int writer = d * G + myIndex;  // the rank of domain d whose slices these are
    const char* sub = rv.inbox + (size_t)(d * G + r) * rv.inboxBytes;
    auto dst = [&](int region, size_t slotBytes) {
      return static_cast<char*>(
          g.peers.at(rv.base[region] + (size_t)writer * rv.slice[region] + (size_t)j * slotBytes, r));
    };
    auto src = [&](int region, size_t slotBytes) { return sub + rv.outOff[region] + (size_t)j * slotBytes; };
    if (kind == kRailHandle) {  // int32 rows: 4 bytes a thread
      const size_t bytes = rv.slice[kRailHeader];
      const uint32_t* from = reinterpret_cast<const uint32_t*>(src(kRailHeader, 0));
      uint32_t* to = reinterpret_cast<uint32_t*>(dst(kRailHeader, 0));
      for (size_t k = threadIdx.x; k < bytes / 4; k += blockDim.x) to[k] = from[k];
      continue;
    }
    const size_t row = (size_t)g.rowStride;
    uint64_t* flagTo;
    const uint64_t* flagFrom;
    if (kind == kDispatch) {  // the row, then the metadata after its flag (the flag's 8 bytes lead the metadata)
      const size_t meta = g.meta.bytes;
      ctaCopy8(dst(kRailDispRows, row), src(kRailDispRows, row), row);
      ctaCopy8(dst(kRailDispMeta, meta) + 8, src(kRailDispMeta, meta) + 8, meta - 8);
      flagTo = reinterpret_cast<uint64_t*>(dst(kRailDispMeta, meta));
      flagFrom = reinterpret_cast<const uint64_t*>(src(kRailDispMeta, meta));
    } else {  // combine: the row, then its flag
      ctaCopy8(dst(kRailCombRows, row), src(kRailCombRows, row), row);
      flagTo = reinterpret_cast<uint64_t*>(dst(kRailCombFlags, 8));
      flagFrom = reinterpret_cast<const uint64_t*>(src(kRailCombFlags, 8));
    }
    // Every thread's stores of the slot before the flag: the barrier, then thread 0's system-scope release
    // (cumulative over what the barrier ordered before it).
    __syncthreads();
    if (threadIdx.x == 0) ncclext::dev::storeRelease(flagTo, *flagFrom);
    __syncthreads();  // the next slot's stores after this release (not needed for order; keeps the CTA in step)
  }
}

}  // namespace

ncclResult_t loadRailKernels() { return ncclext::loadKernels("rail", railInboxKernel, railRelayKernel); }

ncclResult_t launchRailRelay(const GroupView& g, int kind, bool ownerWeighted, int* hierFwd, int round,
                             cudaStream_t stream) {
  return ncclext::launchKernel("railRelayKernel", railRelayKernel, dim3(64), dim3(kThreads), 0, stream, g, kind,
                               ownerWeighted ? 1 : 0, hierFwd, round);
}

ncclResult_t launchRailInbox(const GroupView& g, int kind, bool ownerWeighted, cudaStream_t stream) {
  return ncclext::launchKernel("railInboxKernel", railInboxKernel, dim3(64), dim3(kThreads), 0, stream, g, kind,
                               ownerWeighted ? 1 : 0);
}

}  // namespace ncclep
