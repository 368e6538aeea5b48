#include "nccl_m2n/src/exec_tables.h"

#include <algorithm>
#include <tuple>

namespace ncclm2n {

MoveDesc moveDescOf(const Problem& p, const Transfer& t) {
  MoveDesc d;
  d.tensor = (int32_t)t.tensor;
  d.ndims = t.ndims;
  const TensorPair& tp = p.tensors[t.tensor];
  d.elemBytes = (int32_t)elementSize(tp.dst.dtype);
  d.convert = conversionOf(tp.src.dtype, tp.dst.dtype);  // checked at plan time: >= 0
  d.srcOffset = t.srcOffset;
  d.dstOffset = t.dstOffset;
  for (int k = 0; k < t.ndims; k++) {
    d.extent[k] = t.extent[k];
    d.srcStride[k] = t.srcStride[k];
    d.dstStride[k] = t.dstStride[k];
  }
  coalesce(&d);
  return d;
}

void coalesce(MoveDesc* d) {
  for (int k = 0; k < d->ndims; k++)
    if (d->extent[k] == 0) return;  // an empty box stays as it is
  MoveDesc out = *d;
  int n = 0;
  for (int k = 0; k < d->ndims; k++) {
    if (d->extent[k] == 1) continue;  // contributes no index
    if (n > 0 && out.srcStride[n - 1] == d->extent[k] * d->srcStride[k] &&
        out.dstStride[n - 1] == d->extent[k] * d->dstStride[k]) {
      out.extent[n - 1] *= d->extent[k];  // dim k continues dim n-1 on both sides: one dim
      out.srcStride[n - 1] = d->srcStride[k];
      out.dstStride[n - 1] = d->dstStride[k];
      continue;
    }
    out.extent[n] = d->extent[k];
    out.srcStride[n] = d->srcStride[k];
    out.dstStride[n] = d->dstStride[k];
    n++;
  }
  if (n == 0) {  // a single element
    out.extent[0] = 1;
    out.srcStride[0] = out.dstStride[0] = 1;
    n = 1;
  }
  for (int k = n; k < kMoveMaxDims; k++) out.extent[k] = out.srcStride[k] = out.dstStride[k] = 0;
  out.ndims = n;
  *d = out;
}

std::vector<MoveSegment> copySegments(const std::vector<MoveDesc>& copies, int64_t maxElements, int64_t longFrom,
                                      int64_t longMaxElements) {
  std::vector<MoveSegment> out;
  for (size_t i = 0; i < copies.size(); i++) {
    const int b = tileDimOf(copies[i]);
    const int64_t elements = product(copies[i].extent, copies[i].ndims);
    const int64_t most = elements >= longFrom && longMaxElements > 0 ? longMaxElements : maxElements;
    // Tiled: segments of whole tiles, about as many elements each.
    const int64_t n = b >= 0 ? tileCountOf(copies[i], b) : elements;
    const int64_t per = b >= 0 ? std::max<int64_t>(1, most / (kTileEdge * kTileEdge)) : most;
    for (int64_t first = 0; first < n; first += per)
      out.push_back({(uint32_t)i, b >= 0 ? kTileSegment : kStageLocal, first, std::min(per, n - first), 0});
  }
  return out;
}

std::vector<MoveSegment> executorCopySegments(const std::vector<MoveDesc>& copies) {
  return copySegments(copies, kCopySegmentElements, kLongCopyElements, kLongCopySegmentElements);
}

bool buildExecTables(const Problem& p, const RankPlan& plan, const RankSchedule& s, ExecTables* out,
                     std::string* error, int zeroCopy) {
  ExecTables x;
  x.chunkBytes = s.chunkBytes;
  x.stagingBytes = s.stagingBytes;
  for (const Transfer& t : plan.copies) {
    x.copies.push_back(moveDescOf(p, t));
    x.copyElements += t.elements();
  }
  for (const Transfer& t : plan.sends) x.sends.push_back(moveDescOf(p, t));
  for (const Transfer& t : plan.recvs) x.recvs.push_back(moveDescOf(p, t));
  for (const auto& [list, idx, send] : {std::make_tuple(&plan.sends, &s.directSends, 1),
                                        std::make_tuple(&plan.recvs, &s.directRecvs, 0)})
    for (uint32_t i : *idx) {
      const Transfer& t = (*list)[i];
      const MoveDesc& d = send ? x.sends[i] : x.recvs[i];
      x.direct.push_back({send ? t.dst : t.src, send, i, (int32_t)t.tensor, send ? t.srcOffset : t.dstOffset,
                          t.elements() * d.elemBytes});
    }
  x.lsaSize = s.lsaSize;
  x.lsaRank = s.lsaRank;
  x.lsaBytes = s.lsaBytes;
  x.lsaChunks = s.lsaChunks;
  x.zeroCopy = s.lsaSize > 1 ? zeroCopy : kZeroCopyOff;
  const bool inPlace = x.zeroCopy != kZeroCopyOff;
  int64_t rounds = 0;
  for (const auto* list : {&s.sends, &s.recvs})
    for (const WireStream& w : *list) {
      if (inPlace && w.lsa) continue;  // moved in place (below)
      if (w.slotOffset < 0) {
        if (error) *error = "stream with rank " + std::to_string(w.peer) + " has no staging slots";
        return false;
      }
      rounds = std::max(rounds, w.chunks(s.chunkBytes));
    }
  // Chunk k of every stream of one direction: its segments (into `segs`) and its P2P operation (none over LSA).
  auto addChunks = [&](const std::vector<WireStream>& streams, const std::vector<Transfer>& list, bool send,
                       int64_t k, std::vector<MoveSegment>* segs, int64_t* elements) {
    for (const WireStream& w : streams) {
      if ((inPlace && w.lsa) || k >= w.chunks(s.chunkBytes)) continue;
      const int64_t slot = w.slotOffset + (k % 2) * w.slotBytes;
      const uint32_t where = !w.lsa ? kStageLocal : (uint32_t)(send ? s.lsaRank : w.lsaPeer);
      const std::vector<MoveDesc>& descs = send ? x.sends : x.recvs;
      for (const Segment& g : chunkSegments(p, list, w, s.chunkBytes, k)) {
        // Pieces of at most kCopySegmentElements, one CTA each (a chunk of one transfer would be one CTA).
        const int64_t eb = descs[g.transfer].elemBytes;
        for (int64_t at = 0; at < g.elements; at += kCopySegmentElements) {
          const int64_t n = std::min(kCopySegmentElements, g.elements - at);
          segs->push_back({g.transfer, where, g.firstElement + at, n, slot + g.chunkOffset + at * eb});
        }
        *elements += g.elements;
      }
      if (!w.lsa) x.ops.push_back({w.peer, send ? 1 : 0, slot, std::min(s.chunkBytes, w.bytes - k * s.chunkBytes)});
    }
  };
  // Round k: chunk k of every stream, in slot k % 2 (pipelinedRounds says when an execute overlaps the rounds).
  for (int64_t k = 0; k < rounds; k++) {
    ExecRound r;
    r.opBegin = (uint32_t)x.ops.size();
    r.packBegin = (uint32_t)x.pack.size();
    addChunks(s.sends, plan.sends, true, k, &x.pack, &r.packElements);
    r.packEnd = (uint32_t)x.pack.size();
    r.unpackBegin = (uint32_t)x.unpack.size();
    addChunks(s.recvs, plan.recvs, false, k, &x.unpack, &r.unpackElements);
    r.unpackEnd = (uint32_t)x.unpack.size();
    r.opEnd = (uint32_t)x.ops.size();
    x.rounds.push_back(r);
  }
  // Zero-copy: the receiver's LSA streams (pull) or the sender's (push), whole transfers in pieces of
  // kCopySegmentElements, each from or to the peer's tensor.
  if (inPlace) {
    const bool pull = x.zeroCopy == kZeroCopyPull;
    for (const WireStream& w : pull ? s.recvs : s.sends) {
      if (!w.lsa) continue;
      for (const StreamItem& it : w.items) {
        const int64_t n = (pull ? plan.recvs : plan.sends)[it.transfer].elements();
        for (int64_t at = 0; at < n; at += kCopySegmentElements)
          x.remote.push_back({it.transfer, (uint32_t)w.lsaPeer, at, std::min(kCopySegmentElements, n - at), 0});
      }
    }
  }
  if (x.pack.size() > UINT32_MAX || x.unpack.size() > UINT32_MAX || x.ops.size() > UINT32_MAX) {
    if (error) *error = "the plan has more than 2^32 segments on one rank";
    return false;
  }
  *out = std::move(x);
  return true;
}

bool pipelinedRounds(const ExecTables& x) {
  if (x.rounds.size() < 2 || x.finalBarrier || x.remoteBarrier) return false;
  for (const ExecRound& r : x.rounds)
    if (r.barrier) return false;
  for (const auto* segs : {&x.pack, &x.unpack})
    for (const MoveSegment& g : *segs)
      if (g.where != kStageLocal) return false;
  return true;
}

void setLsaRounds(ExecTables* x, int64_t rounds) {
  while ((int64_t)x->rounds.size() < rounds) {  // rounds with nothing of mine but the domain's barrier
    ExecRound r;
    r.packBegin = r.packEnd = (uint32_t)x->pack.size();
    r.unpackBegin = r.unpackEnd = (uint32_t)x->unpack.size();
    r.opBegin = r.opEnd = (uint32_t)x->ops.size();
    x->rounds.push_back(r);
  }
  for (int64_t k = 0; k < (int64_t)x->rounds.size(); k++) x->rounds[k].barrier = k < rounds;
  x->finalBarrier = rounds > 0;
}

void setRemoteBarriers(ExecTables* x, int64_t domainStreams) {
  x->remoteBarrier = x->zeroCopy != kZeroCopyOff && domainStreams > 0;
  if (x->remoteBarrier) x->finalBarrier = 1;
}

}  // namespace ncclm2n
