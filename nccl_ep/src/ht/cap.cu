// The receive cap across NVLink domains (RailView::capped): after each round of the direct exchange, every remote
// rank's rows of the round, from my inbox for it into their dense positions in my staging (ht/cap.h), where the
// receive half finds them as it finds my domain's rows.
//
// Contract
//   grid = (the remote ranks, kCapScatterCtas) CTAs of kThreads, on my stream after the round's exchange (so after
//   every NCCL receive of the round and before the next round's, which reuses the inboxes). A warp a row.
//   Dispatch, from source s: its slots j of the round [roundLo, roundLo + roundSlots) below srcCount[s] (the rows of
//   s that fit under my cap), entry j - roundLo of each row region of the inbox: the row to FLAT row
//   recvOffset[s] + j of the dispatch staging, and its metadata (its flag, the call's number, among it) beside.
//   Combine, from expert rank r: my slots j of the round that r received (below my rows to r and under r's cap,
//   dispAt[r] + j < cap): r's row for my token and its flag to combMine[r] + j of my combine staging.
//   The rows past those counts in an inbox are stale or never sent: not read. Plain stores: the receive half, a later
//   kernel on the same stream, reads them.
#include "common/launch.h"
#include "nccl_ep/src/ht/cap.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/ht/ht.h"

namespace ncclep {
namespace {

constexpr int kCapScatterCtas = 16;

__global__ void __launch_bounds__(kThreads)
    capScatterKernel(GroupView g, HandleView h, int kind, int roundLo, int rowBytes) {
  const RailView& rv = g.rail;
  const int b = blockIdx.x, r = b < rv.domainBase ? b : b + rv.domainSize;  // RailView::box's inverse
  const int* d = h.derived;
  const DerivedLayout& dl = h.dl;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int first = blockIdx.y * warps + (threadIdx.x >> 5), stride = gridDim.y * warps;
  const char* box = rv.inbox + (size_t)b * rv.inboxBytes;
  int rows, at;  // the rows of the pair this round holds, from slot roundLo; where they go in my staging
  if (kind == kDispatch) {
    rows = d[dl.srcCount + r];
    at = d[dl.recvOffset + r];
  } else {
    const int mine = h.tileCount[(size_t)g.nChunks * (g.nRanks + g.numExperts) + r];  // my rows to r
    rows = capDelivered(mine, d[dl.dispAt + r], g.recvCap);
    at = d[dl.combMine + r];
  }
  const int n = (int)railRoundRows(rv, roundLo / rv.roundSlots, rows);  // as the round's message counts them
  for (int i = first; i < n; i += stride) {
    const size_t pos = (size_t)(at + roundLo + i);
    if (kind == kDispatch) {
      warpCopy<false>(lane, static_cast<char*>(g.peers.local(g.wl.dispRows + pos * g.rowStride)),
                      box + rv.inOff[kRailDispRows] + (size_t)i * rv.slotBytes(kRailDispRows), rowBytes);
      warpCopy<false>(lane, static_cast<char*>(g.peers.local(g.wl.dispMeta + pos * g.meta.bytes)),
                      box + rv.inOff[kRailDispMeta] + (size_t)i * rv.slotBytes(kRailDispMeta), g.meta.bytes);
    } else {
      warpCopy<false>(lane, static_cast<char*>(g.peers.local(g.wl.combRows + pos * g.rowStride)),
                      box + rv.inOff[kRailCombRows] + (size_t)i * rv.slotBytes(kRailCombRows), rowBytes);
      const char* flag = box + rv.inOff[kRailCombFlags] + (size_t)i * rv.slotBytes(kRailCombFlags);
      if (lane == 0)
        *static_cast<uint64_t*>(g.peers.local(g.wl.combFlags + pos * 8)) = *reinterpret_cast<const uint64_t*>(flag);
    }
  }
}

}  // namespace

ncclResult_t loadCapKernels() { return ncclext::loadKernels("HT receive cap", capScatterKernel); }

ncclResult_t launchCapScatter(const GroupView& g, const HandleView& h, int kind, int roundLo, int rowBytes,
                              cudaStream_t stream) {
  if (g.rail.boxes == 0) return ncclSuccess;
  return ncclext::launchKernel("ht capScatterKernel", capScatterKernel, dim3(g.rail.boxes, kCapScatterCtas),
                               dim3(kThreads), 0, stream, g, h, kind, roundLo, rowBytes);
}

}  // namespace ncclep
