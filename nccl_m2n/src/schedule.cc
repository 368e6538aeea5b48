#include "nccl_m2n/src/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace ncclm2n {
namespace {

int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The canonical order of a pair's transfers: every field, so that both ranks sort their (identical) copies alike.
bool canonicalLess(const Transfer& a, const Transfer& b) {
  auto key = [](const Transfer& t) { return std::make_tuple(t.tensor, t.srcOffset, t.dstOffset, t.ndims); };
  if (key(a) != key(b)) return key(a) < key(b);
  for (int d = 0; d < a.ndims; d++) {
    const auto ka = std::make_tuple(a.extent[d], a.srcStride[d], a.dstStride[d]);
    const auto kb = std::make_tuple(b.extent[d], b.srcStride[d], b.dstStride[d]);
    if (ka != kb) return ka < kb;
  }
  return false;
}

// The wire carries destination-typed elements (a conversion happens where the source is read).
int64_t elementBytes(const Problem& p, const Transfer& t) {
  return (int64_t)elementSize(p.tensors[t.tensor].dst.dtype);
}

// Streams of one direction: list[i] goes to (sends) or comes from (recvs) peerOf(list[i]). With `direct`, the direct
// transfers go to *directOut instead (by peer, then canonical order).
template <typename PeerOf>
std::vector<WireStream> streamsOf(const Problem& p, const std::vector<Transfer>& list, PeerOf peerOf, int me,
                                  const ScheduleOptions& o, std::vector<uint32_t>* directOut) {
  std::map<int, std::vector<uint32_t>> byPeer, directByPeer;
  const int myDomain = p.options.domainOf(me);
  for (size_t i = 0; i < list.size(); i++) {
    const int peer = peerOf(list[i]);
    const bool direct = o.direct && directTransfer(p, list[i]) && !(o.lsa && p.options.domainOf(peer) == myDomain);
    (direct ? directByPeer : byPeer)[peer].push_back((uint32_t)i);
  }
  auto canonical = [&](std::vector<uint32_t>* idx) {
    std::stable_sort(idx->begin(), idx->end(), [&](uint32_t a, uint32_t b) { return canonicalLess(list[a], list[b]); });
  };
  for (auto& [peer, idx] : directByPeer) {
    canonical(&idx);
    directOut->insert(directOut->end(), idx.begin(), idx.end());
  }
  std::vector<WireStream> out;
  for (auto& [peer, idx] : byPeer) {
    canonical(&idx);
    WireStream s;
    s.peer = peer;
    s.interDomain = p.options.domainOf(peer) != myDomain;
    s.lsa = o.lsa && !s.interDomain;
    int64_t at = 0;
    for (uint32_t i : idx) {
      const int64_t bytes = list[i].elements() * elementBytes(p, list[i]);
      at = alignUp(at, kStreamAlign);
      s.items.push_back({i, at, bytes});
      at += bytes;
    }
    s.bytes = at;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

bool directTransfer(const Problem& p, const Transfer& t) {
  const TensorPair& tp = p.tensors[t.tensor];
  if (tp.src.dtype != tp.dst.dtype) return false;
  int64_t run = 1;  // elements of the dims inside d, contiguous on both sides so far
  for (int d = t.ndims - 1; d >= 0; d--) {
    if (t.extent[d] == 1) continue;  // contributes no index
    if (t.srcStride[d] != run || t.dstStride[d] != run) return false;
    run *= t.extent[d];
  }
  return true;
}

int64_t chunkBytesFor(int nRanks, const ScheduleOptions& o, std::string* error) {
  const int64_t slots = 4 * (int64_t)std::max(1, nRanks - 1);
  int64_t c = std::min(o.maxChunkBytes, o.stagingCapBytes / slots) / kStreamAlign * kStreamAlign;
  if (c < kStreamAlign) {
    if (error)
      *error = "staging cap of " + std::to_string(o.stagingCapBytes) + " bytes cannot hold " + std::to_string(slots) +
               " chunks of " + std::to_string(kStreamAlign) + " bytes (" + std::to_string(nRanks) + " ranks)";
    return 0;
  }
  return c;
}

bool buildSchedule(const Problem& p, const RankPlan& plan, const ScheduleOptions& o, RankSchedule* out,
                   std::string* error) {
  RankSchedule s;
  s.rank = plan.rank;
  s.chunkBytes = chunkBytesFor(p.nRanks, o, error);
  if (s.chunkBytes == 0) return false;
  s.sends = streamsOf(
      p, plan.sends, [](const Transfer& t) { return t.dst; }, plan.rank, o, &s.directSends);
  s.recvs = streamsOf(
      p, plan.recvs, [](const Transfer& t) { return t.src; }, plan.rank, o, &s.directRecvs);
  // My domain's ranks in rank order: a rank's index among them addresses its window slots.
  std::vector<int> lsaIndex;
  if (o.lsa) {
    const int mine = p.options.domainOf(plan.rank);
    lsaIndex.assign(p.nRanks, -1);
    for (int r = 0; r < p.nRanks; r++)
      if (p.options.domainOf(r) == mine) lsaIndex[r] = s.lsaSize++;
    s.lsaRank = lsaIndex[plan.rank];
  }
  // LSA slots: a chunk each, two per domain rank; or, when the domain agreed that its longest LSA stream fits in
  // less than a chunk (lsaSlotBytes), one of that size per domain rank.
  for (const auto* list : {&s.sends, &s.recvs})
    for (const WireStream& w : *list)
      if (w.lsa) {
        s.lsaStreams++;
        if (o.zeroCopy != kZeroCopyOff) continue;  // in place: no slots, no chunks
        s.lsaStreamMax = std::max(s.lsaStreamMax, alignUp(w.bytes, kStreamAlign));
        s.lsaChunks = std::max(s.lsaChunks, w.chunks(s.chunkBytes));
      }
  const int64_t lsaSlot = o.lsaSlotBytes > 0 ? std::min(alignUp(o.lsaSlotBytes, kStreamAlign), s.chunkBytes)
                                             : s.chunkBytes;
  const int64_t lsaSlots = lsaSlot < s.chunkBytes ? 1 : 2;
  if (lsaSlot < s.chunkBytes && s.lsaStreamMax > lsaSlot) {
    if (error)
      *error = "an LSA stream of " + std::to_string(s.lsaStreamMax) + " bytes does not fit the agreed slot of " +
               std::to_string(lsaSlot) + " bytes";
    return false;
  }
  if (o.lsa && s.lsaSize > 1 && o.zeroCopy == kZeroCopyOff) s.lsaBytes = lsaSlots * lsaSlot * s.lsaSize;
  int64_t at = 0;
  // A stream by ncclSend / ncclRecv: two slots of a chunk, or one of its own length (both sides see the same length).
  auto place = [&](WireStream& w) {
    const bool one = w.chunks(s.chunkBytes) <= 1;
    w.slotBytes = one ? alignUp(w.bytes, kStreamAlign) : s.chunkBytes;
    w.slotOffset = at;
    at += (one ? 1 : 2) * w.slotBytes;
  };
  for (WireStream& w : s.sends) {
    if (w.lsa) {  // my window's slots for that peer
      w.lsaPeer = lsaIndex[w.peer];
      w.slotOffset = lsaSlots * lsaSlot * w.lsaPeer;
      w.slotBytes = lsaSlot;
      continue;
    }
    place(w);
  }
  for (WireStream& w : s.recvs) {
    if (w.lsa) {  // the sender's window's slots for me
      w.lsaPeer = lsaIndex[w.peer];
      w.slotOffset = lsaSlots * lsaSlot * s.lsaRank;
      w.slotBytes = lsaSlot;
      continue;
    }
    place(w);
  }
  s.stagingBytes = at;
  if (at + s.lsaBytes > o.stagingCapBytes) {  // cannot happen with chunkBytesFor's split; kept as the promise's check
    if (error) *error = "staging of " + std::to_string(at + s.lsaBytes) + " bytes exceeds the cap";
    return false;
  }
  *out = std::move(s);
  return true;
}

std::vector<Segment> chunkSegments(const Problem& p, const std::vector<Transfer>& list, const WireStream& w,
                                   int64_t chunkBytes, int64_t chunk) {
  const int64_t lo = chunk * chunkBytes, hi = std::min(w.bytes, lo + chunkBytes);
  std::vector<Segment> out;
  // The first item ending after lo.
  auto it = std::upper_bound(w.items.begin(), w.items.end(), lo,
                             [](int64_t v, const StreamItem& i) { return v < i.offset + i.bytes; });
  for (; it != w.items.end() && it->offset < hi; ++it) {
    const int64_t eb = elementBytes(p, list[it->transfer]);
    const int64_t b0 = std::max(lo, it->offset), b1 = std::min(hi, it->offset + it->bytes);
    if (b1 <= b0) continue;
    // Chunk bounds and item starts are multiples of kStreamAlign, which every element size divides.
    out.push_back({it->transfer, (b0 - it->offset) / eb, (b1 - b0) / eb, b0 - lo});
  }
  return out;
}

}  // namespace ncclm2n
