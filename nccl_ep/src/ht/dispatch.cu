// HT dispatch inside one NVLink domain (LSA).
//
// Contract
//   grid = one CTA of 2 x kThreads per SM of the budget (a CTA fills an SM's registers, so the budget is the number
//   of SMs used). With peers, CTA j's first half is sender j (if j < nSenders) and its second half receiver j
//   (nReceivers == grid); alone, there are no receivers and half h of CTA j is sender 2 j + h. Each half is a team
//   with its own named barrier. Each role walks chunks c = j, j + n, ... of kChunkTokens source tokens.
//   Sender: before its first chunk, waits until every peer consumed all of my staging rows of the previous call (the
//   peer's done flag in my window, waitPeersConsumed in copy.cuh). Chunk c: stages the chunk's metadata in shared
//   memory, then one warp per token writes the row once per other rank holding one of its experts, into that rank's
//   staging region [me][slot] over LSA with 16-byte stores, followed by the row's metadata (local expert ids, weights,
//   expert indices, fp8 scales) and, after __syncwarp, a system-scope release of the call's sequence number into the
//   row's flag (cumulativity publishes every lane's stores of the row).
//   Receiver, chunk c: first copies this rank's own tokens of chunk c that have a local expert to their final
//   output positions (FLAT row recvOffset[me] + slot, or one EXPERT_MAJOR row per local expert), so that senders
//   only push over NVLink (with one rank there are no receivers and the senders do it); then for every source s,
//   one warp per staging row of [chunkPrefix[s][c], chunkPrefix[s][c+1]): every lane acquires the row's flag, then
//   the warp copies the row to the output (FLAT: row recvOffset[s] + slot; EXPERT_MAJOR: one row per local expert
//   at zoneStart + srcExpOff[s] + index) and records where it landed for combine. Then every CTA meets in
//   finishCall (copy.cuh): the last to arrive bumps the call counter and release-stores the call's number into my
//   done flag in every peer's window, after which the peers may overwrite my staging.
//   Sequence numbers: seq = the call's number, 1 + the calls of this kind completed (a counter in device memory
//   that only finishCall bumps), so replays of a captured graph stay in step; chunk ownership may differ between
//   calls and ranks. Every wait has the group's time budget; a timed-out CTA records
//   the error word and returns (the host reports ncclRemoteError).
//   Pad rows of EXPERT_MAJOR zones are zero-filled by the senders (local memory).
//   Across NVLink domains (c.phase): the send half runs the senders only, writing another domain's rank's rows and
//   metadata into my outbox for it (peerAt; the flat exchange in rounds: only the slots of the round, c.roundLo /
//   roundSlots, at slot - roundLo, and a later round, c.remoteOnly, nothing else: no LSA rows, pads or waits; when
//   the rounds overlap the NVLink part, every round is remoteOnly and a c.localOnly send half on another stream
//   writes the LSA rows, the pads and the waits); the
//   host's rail exchange puts every remote source's rows and metadata, flags included, into my window (directly, or
//   relayed); the receive half runs the receivers, which find them as they find LSA rows, and ends the call
//   (finishCall). Another domain's rank is never waited on for its done flag.
#include "common/device/sync.cuh"
#include "common/launch.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/ht/cap.h"
#include "nccl_ep/src/ht/copy.cuh"
#include "nccl_ep/src/ht/ht.h"

namespace ncclep {
namespace {

struct Ctx {
  const GroupView& g;
  const HandleView& h;
  const DispatchCall& c;
  const int* d;  // derived
};

// Writes received flat row `flatRow` (FLAT outputs, or the EXPERT_MAJOR fan-out) and the combine maps. Called by
// one whole warp; lane k < K holds entry k of the row's metadata: `expert` the local id (-1: not here), `w` the
// weight, `idx` the (source, expert) index. `srcRow` is the token row (local input or staging).
template <bool kFromPeer>
__device__ void deliver(const Ctx& x, int lane, int s, int slot, int expert, float w, int idx, const char* srcRow,
                        const float* srcScales) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const DispatchCall& c = x.c;
  const int flatRow = x.d[h.dl.recvOffset + s] + slot;
  const int K = h.topk, MK = g.meta.maxTopk;
  if (h.layout == NCCL_EP_LAYOUT_FLAT) {
    if (!(kFromPeer && c.rowsInPlace))  // in place: the sender wrote the row where it belongs
      warpCopy<kFromPeer>(lane, c.outTokens + (size_t)flatRow * c.rowBytes, srcRow, c.rowBytes);
    if (lane < K) {
      if (c.outIdx) c.outIdx[(size_t)flatRow * K + lane] = expert >= 0 ? expert + c.idBase : -1;
      if (c.outWeights) c.outWeights[(size_t)flatRow * K + lane] = expert >= 0 ? w : 0.f;
    }
    if (c.outScales)
      for (int i = lane; i < c.nScales; i += 32)
        c.outScales[(size_t)flatRow * c.nScales + i] = kFromPeer ? __ldcg(srcScales + i) : __ldg(srcScales + i);
    return;
  }
  for (int k = 0; k < K; k++) {
    const int l = __shfl_sync(0xffffffffu, expert, k);
    const float wk = __shfl_sync(0xffffffffu, w, k);
    const int ik = __shfl_sync(0xffffffffu, idx, k);
    int emRow = -1;
    if (l >= 0) {
      emRow = x.d[h.dl.zoneStart + l] + x.d[h.dl.srcExpOff + s * g.localExperts + l] + ik;
      warpCopy<kFromPeer>(lane, c.outTokens + (size_t)emRow * c.rowBytes, srcRow, c.rowBytes);
      if (lane == 0 && c.outWeights) c.outWeights[emRow] = wk;
      if (c.outScales)
        for (int i = lane; i < c.nScales; i += 32)
          c.outScales[(size_t)emRow * c.nScales + i] = kFromPeer ? __ldcg(srcScales + i) : __ldg(srcScales + i);
    }
    if (lane == 0) {
      h.emPos[(size_t)flatRow * MK + k] = emRow;
      h.flatW[(size_t)flatRow * MK + k] = wk;
    }
  }
}

// A chunk's metadata in shared memory: one coalesced load per chunk instead of a chain of dependent global loads
// per token before its copy can start.
struct ChunkStage {
  int slot[kChunkTokens][kMaxRanks];   // my tokens: sendSlot towards every rank
  int expert[kChunkTokens][kMaxTopk];  // my tokens: global expert ids (-1: none)
  int idx[kChunkTokens][kMaxTopk];     // (source, expert) indices
  float w[kChunkTokens][kMaxTopk];     // weights
};

// What one team (half a CTA) keeps in shared memory.
struct TeamShared {
  ChunkStage stage;
};

// All threads of the team: stages my tokens [t0, t0 + n).
__device__ void stageTokens(const Team& team, const Ctx& x, ChunkStage* st, int t0, int n) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int R = g.nRanks, K = h.topk;
  for (int i = team.tid; i < n * R; i += team.size) st->slot[i / R][i % R] = h.sendSlot[(size_t)t0 * R + i];
  for (int i = team.tid; i < n * K; i += team.size) {
    const int j = i / K, k = i % K, t = t0 + j;
    // emIdx -1 marks what routing ignored: no expert, an id out of range, a repeated id (reported at handle time).
    const int idx = h.emIdx[(size_t)t * g.meta.maxTopk + k];
    st->expert[j][k] = idx >= 0 ? loadExpert(h, t, k) : -1;
    st->idx[j][k] = idx;
    st->w[j][k] = x.c.weights ? x.c.weights[(size_t)t * K + k] : 1.f;
  }
  team.sync();
}

// One warp: my own rows of staged token j (token t) to my output.
__device__ __forceinline__ void deliverOwn(const Ctx& x, const ChunkStage* st, int lane, int j, int t) {
  const GroupView& g = x.g;
  const int slot = st->slot[j][g.rank];
  if (slot < 0) return;
  if (capDrops(x.d[x.h.dl.recvOffset + g.rank], slot, g.recvCap)) return;  // past the receive cap: dropped
  const DispatchCall& c = x.c;
  const bool has = lane < x.h.topk;
  const int e = has ? st->expert[j][lane] : -1;
  deliver<false>(x, lane, g.rank, slot, localExpert(g, e, g.rank), has ? st->w[j][lane] : 0.f,
                 has ? st->idx[j][lane] : -1, c.tokens + (size_t)t * c.rowBytes,
                 c.scales ? c.scales + (size_t)t * c.nScales : nullptr);
}

__device__ void sendChunk(const Team& team, const Ctx& x, TeamShared* sh, int chunk, uint64_t seq) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const DispatchCall& c = x.c;
  const int me = g.rank, R = g.nRanks, K = h.topk;
  const int warp = team.warp(), lane = team.tid & 31, nWarps = team.nWarps();
  ChunkStage* st = &sh->stage;
  // Stage the chunk's metadata (once the team is done with the previous chunk's), then one warp per token.
  team.sync();
  const int t0 = chunk * kChunkTokens, n = max(0, min(h.numTokens, t0 + kChunkTokens) - t0);
  stageTokens(team, x, st, t0, n);
  for (int j = warp; j < n; j += nWarps) {
    const int t = t0 + j;
    const char* row = c.tokens + (size_t)t * c.rowBytes;
    const float* scales = c.scales ? c.scales + (size_t)t * c.nScales : nullptr;
    for (int r = 0; r < R; r++) {
      const int slot = st->slot[j][r];
      if (slot < 0) continue;
      if (g.rail.hier && !g.rail.local(r)) continue;  // the hierarchical HT: hierPackKernel's rail rows carry it
      if (c.remoteOnly && g.rail.local(r)) continue;  // a later round: another domain's rows only
      if (c.localOnly && !g.rail.local(r)) continue;  // my domain's rows only (the rounds write the others)
      if (r == me) {
        if (c.nReceivers == 0) deliverOwn(x, st, lane, j, t);  // alone: nobody else copies my own rows
        continue;
      }
      const int at = roundSlotOf(g.rail, r, slot, c.roundLo, c.roundSlots);
      if (at < 0) continue;  // another round's row
      // With a receive cap the row's position at r is its FLAT row there (another domain's rank: my outbox's entry
      // of the round, which r's scatter places); past the cap it is dropped.
      const int dispAt = g.recvCap ? x.d[h.dl.dispAt + r] : 0;
      if (capDrops(dispAt, slot, g.recvCap)) continue;
      const size_t rowIndex = g.recvCap ? (size_t)(dispAt + slot) : (size_t)me * g.maxTokens + at;
      const bool boxed = g.rail.capped && !g.rail.local(r);
      char* dst = boxed ? capOutboxAt(g, kRailDispRows, r, at)
                        : static_cast<char*>(peerAt(g, g.wl.dispRows + rowIndex * g.rowStride, r));
      char* meta = boxed ? capOutboxAt(g, kRailDispMeta, r, at)
                         : static_cast<char*>(peerAt(g, g.wl.dispMeta + rowIndex * g.meta.bytes, r));
      warpCopy<false>(lane, dst, row, c.rowBytes);
      if (lane < K) {  // the metadata from the stage: expert ids local to r, weights, indices
        reinterpret_cast<int*>(meta + g.meta.expertOff())[lane] = localExpert(g, st->expert[j][lane], r);
        reinterpret_cast<float*>(meta + g.meta.weightOff())[lane] = st->w[j][lane];
        reinterpret_cast<int*>(meta + g.meta.emIdxOff())[lane] = st->idx[j][lane];
      }
      if (scales)
        for (int i = lane; i < c.nScales; i += 32) reinterpret_cast<float*>(meta + g.meta.scaleOff())[i] = scales[i];
      warpPublish(lane, reinterpret_cast<uint64_t*>(meta + g.meta.flagOff()), seq);
    }
  }
}

// Returns false (on every thread of the team) when a wait failed.
__device__ bool receiveChunk(const Team& team, const Ctx& x, TeamShared* sh, int chunk, uint64_t seq) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const int me = g.rank, R = g.nRanks, NC = g.nChunks, K = h.topk;
  const int warp = team.warp(), lane = team.tid & 31, nWarps = team.nWarps();
  ChunkStage* st = &sh->stage;
  team.sync();  // the team is done with the previous chunk's stage
  // My own tokens of chunk c: local copies, no waiting (senders only push rows to peers).
  const int t0 = chunk * kChunkTokens, n = max(0, min(h.numTokens, t0 + kChunkTokens) - t0);
  stageTokens(team, x, st, t0, n);
  for (int j = warp; j < n; j += nWarps) deliverOwn(x, st, lane, j, t0 + j);
  // Every source's rows of chunk c, one warp per row, each as soon as its flag says it landed.
  bool failed = false;  // this thread's outcome (warp-uniform); the team agrees on it below
  for (int k = 1; k < R && !failed; k++) {
    const int s = (me + k) % R;
    const int* prefix = x.d + h.dl.chunkPrefix + s * (NC + 1);
    const int lo = prefix[chunk], hi = prefix[chunk + 1];
    const int base = x.d[h.dl.recvOffset + s];
    for (int slot = lo + warp; slot < hi; slot += nWarps) {
      if (capDrops(base, slot, g.recvCap)) break;  // this and later slots are past the receive cap: dropped
      const size_t rowIndex = g.recvCap ? (size_t)(base + slot) : (size_t)s * g.maxTokens + slot;
      const char* meta =
          static_cast<const char*>(g.peers.local(g.wl.dispMeta + rowIndex * g.meta.bytes));
      if (!warpAcquire(g, reinterpret_cast<const uint64_t*>(meta + g.meta.flagOff()), seq, s, slot)) {
        failed = true;
        break;
      }
      const bool has = lane < K;
      const int expert = has ? __ldcg(reinterpret_cast<const int*>(meta + g.meta.expertOff()) + lane) : -1;
      const float w = has ? __ldcg(reinterpret_cast<const float*>(meta + g.meta.weightOff()) + lane) : 0.f;
      const int idx = has ? __ldcg(reinterpret_cast<const int*>(meta + g.meta.emIdxOff()) + lane) : -1;
      const char* row = static_cast<const char*>(g.peers.local(g.wl.dispRows + rowIndex * g.rowStride));
      deliver<true>(x, lane, s, slot, expert, w, idx, row, reinterpret_cast<const float*>(meta + g.meta.scaleOff()));
    }
  }
  return !team.syncOr(failed);
}

// One role of one team; false when a wait failed.
__device__ bool runTeam(const Team& team, const Ctx& x, TeamShared* sh, bool sender, int j, uint64_t seq) {
  const GroupView& g = x.g;
  const HandleView& h = x.h;
  const DispatchCall& c = x.c;
  const int ownChunks = (h.numTokens + kChunkTokens - 1) / kChunkTokens;
  if (!sender) {
    const int chunks = max(ownChunks, x.d[h.dl.peerChunks]);
    for (int chunk = j; chunk < chunks; chunk += c.nReceivers)
      if (!receiveChunk(team, x, sh, chunk, seq)) return false;
    return true;
  }
  // Zero the EXPERT_MAJOR pad rows (and their weights) of this rank's output (once a call: not in a later round).
  if (h.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR && !c.remoteOnly) {
    const int warp = team.warp(), lane = team.tid & 31, nWarps = team.nWarps();
    for (int l = j; l < g.localExperts; l += c.nSenders) {
      const int lo = x.d[h.dl.zoneStart + l] + x.d[h.dl.expCount + l], hi = x.d[h.dl.zoneStart + l + 1];
      for (int row = lo + warp; row < hi; row += nWarps) {
        warpZero(lane, c.outTokens + (size_t)row * c.rowBytes, c.rowBytes);
        if (lane == 0 && c.outWeights) c.outWeights[row] = 0.f;
        if (c.outScales)
          for (int i = lane; i < c.nScales; i += 32) c.outScales[(size_t)row * c.nScales + i] = 0.f;
      }
    }
  }
  // A later round writes only my outboxes, which the previous round's exchange (before it on my stream) has sent.
  if (g.nRanks > 1 && !c.remoteOnly && !waitPeersConsumed(team, g, g.wl.dispDone, seq)) return false;
  for (int chunk = j; chunk < ownChunks; chunk += c.nSenders) sendChunk(team, x, sh, chunk, seq);
  return true;
}

// One CTA of 2 x kThreads per SM of the budget: with peers, its first half sends and its second half receives
// (sender j and receiver j are CTA j); alone, both halves send (sender 2 j + half). Each half synchronises on its
// own named barrier; the whole CTA meets once, at the end.
__global__ void __launch_bounds__(2 * kThreads, 1) dispatchKernel(GroupView g, HandleView h, DispatchCall c) {
  Ctx x{g, h, c, h.derived};
  __shared__ TeamShared shared[2];
  releaseHeld(g);
  const uint64_t seq = callNumber(g, kDispatch);
  const int half = threadIdx.x >= kThreads;
  const Team team = Team::halfCta(half);
  TeamShared* sh = &shared[half];
  const bool sender = c.nReceivers == 0 || half == 0;
  const int j = c.nReceivers == 0 ? 2 * blockIdx.x + half : blockIdx.x;
  const bool runs = sender ? c.phase != kHtReceiveHalf : c.phase != kHtSendHalf;
  bool ok = true;
  if (runs && j < (sender ? c.nSenders : c.nReceivers)) ok = runTeam(team, x, sh, sender, j, seq);
  if (c.phase == kHtSendHalf) return;  // a failed wait is in the error word; the receive half ends the call
  finishCall(g, kDispatch, g.wl.dispDone, seq, !ok, nullptr, c.rowsInPlace);
}

// The hierarchical dispatch's rail positions (RailView::hier), before the first round's pack: one CTA per other
// domain D. Its tokens are taken in blocks of the CTA's threads in token order: a token that hits a rank of D (its
// sendSlot there) gets the next rail position q (a block-wide exclusive scan), recorded both ways in the handle:
// hierPos[t][D] = q (-1: none; for the combine's reduce and scatter) and hierTok[D][q] = t (for every round's
// pack), then hierTok[D][maxTokens] = the positions given.
__global__ void __launch_bounds__(kThreads) hierScanKernel(GroupView g, HandleView h) {
  const int G = g.rail.domainSize, d = blockIdx.x, R = g.nRanks, D = R / G;
  if (d == g.rank / G) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nWarps = blockDim.x >> 5;
  int* tok = h.hierTok + (size_t)d * (g.maxTokens + 1);
  __shared__ int warpHits[kThreads / 32];
  int base = 0;  // rail positions given so far (every thread keeps the same count)
  for (int t0 = 0; t0 < h.numTokens; t0 += blockDim.x) {
    const int t = t0 + (int)threadIdx.x;
    bool hit = false;
    if (t < h.numTokens)
      for (int rl = 0; rl < G; rl++) hit = hit || h.sendSlot[(size_t)t * R + d * G + rl] >= 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warpHits[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < nWarps; w++) {
      before += w < warp ? warpHits[w] : 0;
      total += warpHits[w];
    }
    const int q = base + before + __popc(ballot & ((1u << lane) - 1));
    if (hit) tok[q] = t;
    if (t < h.numTokens) h.hierPos[(size_t)t * D + d] = hit ? q : -1;
    base += total;
    __syncthreads();  // `warpHits` is rewritten by the next block
  }
  if (threadIdx.x == 0) tok[g.maxTokens] = base;
}

// The hierarchical dispatch's pack, after the send half (and, in the first round, hierScanKernel on the same
// stream): a warp per (other domain D, rail position q of the round [c.roundLo, c.roundLo + c.roundSlots)) that
// hierTok gives a token, writing the token's row and its tail into hierOut[D][q - c.roundLo], the call's number
// last (the exchange that sends it follows on the stream).
__global__ void __launch_bounds__(kThreads) hierPackKernel(GroupView g, HandleView h, DispatchCall c) {
  const RailView& rv = g.rail;
  const HierRow& hr = rv.hierRow;
  const int G = rv.domainSize, R = g.nRanks, D = R / G, K = h.topk, MK = g.meta.maxTopk, M = g.maxTokens;
  const uint64_t seq = callNumber(g, kDispatch);
  const int lane = threadIdx.x & 31, nWarps = (int)(gridDim.x * blockDim.x) >> 5;
  const int span = min(c.roundSlots, M - c.roundLo);
  for (int64_t it = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; it < (int64_t)(D - 1) * span; it += nWarps) {
    const int d = otherDomain((int)(it / span), g.rank / G), q = c.roundLo + (int)(it % span);
    const int* tok = h.hierTok + (size_t)d * (M + 1);
    if (q >= tok[M]) continue;  // past the rows this call sends to d
    const int tt = tok[q];
    char* out = rv.hierOut + ((size_t)d * rv.roundSlots + (q - c.roundLo)) * hr.bytes();
    warpCopy<false>(lane, out, c.tokens + (size_t)tt * c.rowBytes, c.rowBytes);
    for (int rl = lane; rl < G; rl += 32)
      reinterpret_cast<int*>(out + hr.slotOff())[rl] = h.sendSlot[(size_t)tt * R + d * G + rl];
    if (lane < K) {  // as stageTokens: emIdx -1 marks a column routing ignored
      const int idx = h.emIdx[(size_t)tt * MK + lane];
      reinterpret_cast<int*>(out + hr.expertOff())[lane] = idx >= 0 ? loadExpert(h, tt, lane) : -1;
      reinterpret_cast<float*>(out + hr.weightOff())[lane] = c.weights ? c.weights[(size_t)tt * K + lane] : 1.f;
      reinterpret_cast<int*>(out + hr.idxOff())[lane] = idx;
    }
    for (int k = lane; k < c.nScales && c.scales; k += 32)
      reinterpret_cast<float*>(out + hr.scaleOff())[k] = c.scales[(size_t)tt * c.nScales + k];
    if (lane == 0) {
      reinterpret_cast<int*>(out + hr.countsOff())[0] = K;
      reinterpret_cast<int*>(out + hr.countsOff())[1] = c.scales ? c.nScales : 0;
      *reinterpret_cast<int*>(out + hr.posOff()) = q;
    }
    __syncwarp();
    if (lane == 0) *reinterpret_cast<uint64_t*>(out + hr.seqOff()) = seq;
  }
}

}  // namespace

ncclResult_t loadDispatchKernels() {
  return ncclext::loadKernels("HT dispatch", dispatchKernel, hierScanKernel, hierPackKernel);
}

ncclResult_t launchDispatch(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream) {
  const int ctas = c.nReceivers > 0 ? max(c.nSenders, c.nReceivers) : (c.nSenders + 1) / 2;
  return ncclext::launchKernel("ht dispatchKernel", dispatchKernel, dim3(ctas), dim3(2 * kThreads), 0, stream, g, h, c);
}

ncclResult_t launchHierPack(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream) {
  if (c.roundLo == 0)
    NCCLEXT_CHECK(ncclext::launchKernel("ht hierScanKernel", hierScanKernel, dim3(g.nRanks / g.rail.domainSize),
                                        dim3(kThreads), 0, stream, g, h));
  return ncclext::launchKernel("ht hierPackKernel", hierPackKernel, dim3(64), dim3(kThreads), 0, stream, g, h, c);
}

}  // namespace ncclep
