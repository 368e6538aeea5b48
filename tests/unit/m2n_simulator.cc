#include "tests/unit/m2n_simulator.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>

#include "tests/unit/m2n_elements.h"

namespace ncclm2n {
namespace {

constexpr uint64_t kHole = 0xdeadbeefdeadbeefull;
constexpr uint64_t kPoison = 0xffffffffffffffffull;

uint64_t encode(uint32_t tensor, int64_t linear) { return (uint64_t)(tensor + 1) << 40 | (uint64_t)linear; }

using testing::forEachElement;
using testing::globalLinear;

struct Buffers {
  std::vector<std::unique_ptr<ShardGrid>> src, dst;
  std::vector<std::vector<std::vector<uint64_t>>> srcData, dstData;  // [tensor][position][slot]
  std::vector<std::vector<std::vector<uint8_t>>> dstWrites;
  std::vector<std::vector<int>> srcPos, dstPos;                      // [tensor][rank] -> position or -1
};

using Key = std::tuple<uint32_t, int32_t, int32_t, int64_t, int64_t, int, std::vector<int64_t>>;
Key keyOf(const Transfer& t) {
  std::vector<int64_t> v;
  for (int d = 0; d < t.ndims; d++) {
    v.push_back(t.extent[d]);
    v.push_back(t.srcStride[d]);
    v.push_back(t.dstStride[d]);
  }
  return Key(t.tensor, t.src, t.dst, t.srcOffset, t.dstOffset, t.ndims, v);
}

}  // namespace

namespace {
SimulationResult run(const Problem& p, const std::vector<RankPlan>& plans, const std::vector<RankSchedule>* wire);
}

SimulationResult simulate(const Problem& p, const std::vector<RankPlan>& plans) { return run(p, plans, nullptr); }

SimulationResult simulateWire(const Problem& p, const std::vector<RankPlan>& plans,
                              const std::vector<RankSchedule>& schedules) {
  return run(p, plans, &schedules);
}

namespace {
SimulationResult run(const Problem& p, const std::vector<RankPlan>& plans, const std::vector<RankSchedule>* wire) {
  SimulationResult res;
  auto error = [&](const std::string& what) {
    if (res.errors++ == 0) res.firstError = what;
    res.ok = false;
  };
  const size_t nt = p.tensors.size();
  Buffers b;
  b.srcData.resize(nt);
  b.dstData.resize(nt);
  b.dstWrites.resize(nt);
  b.srcPos.assign(nt, std::vector<int>(p.nRanks, -1));
  b.dstPos.assign(nt, std::vector<int>(p.nRanks, -1));
  for (size_t t = 0; t < nt; t++) {
    const TensorPair& tp = p.tensors[t];
    b.src.emplace_back(new ShardGrid(tp.src));
    b.dst.emplace_back(new ShardGrid(tp.dst));
    for (int pos = 0; pos < tp.src.mesh.size(); pos++) {
      b.srcPos[t][tp.src.mesh.ranks[pos]] = pos;
      std::vector<uint64_t> buf(b.src[t]->localSpan(pos), kHole);
      forEachElement(*b.src[t], pos, tp.src.ndims(), [&](const int64_t* gi, int64_t off) {
        buf[off] = encode(t, globalLinear(tp.src, gi));
      });
      b.srcData[t].push_back(std::move(buf));
    }
    for (int pos = 0; pos < tp.dst.mesh.size(); pos++) {
      b.dstPos[t][tp.dst.mesh.ranks[pos]] = pos;
      b.dstData[t].emplace_back(b.dst[t]->localSpan(pos), kPoison);
      b.dstWrites[t].emplace_back(b.dst[t]->localSpan(pos), 0);
    }
  }

  // The lists agree: ranks in the right roles, and the receives mirror the sends.
  std::vector<Key> sent, received;
  for (size_t r = 0; r < plans.size(); r++) {
    for (const Transfer& t : plans[r].sends) {
      if (t.src != (int)r || t.dst == (int)r) error("rank " + std::to_string(r) + " lists a send it does not make");
      sent.push_back(keyOf(t));
    }
    for (const Transfer& t : plans[r].recvs) {
      if (t.dst != (int)r || t.src == (int)r) error("rank " + std::to_string(r) + " lists a receive not its own");
      received.push_back(keyOf(t));
    }
    for (const Transfer& t : plans[r].copies)
      if (t.src != (int)r || t.dst != (int)r) error("rank " + std::to_string(r) + " lists a copy that is not local");
  }
  std::sort(sent.begin(), sent.end());
  std::sort(received.begin(), received.end());
  if (sent != received) error("the receive lists do not mirror the send lists");

  auto execute = [&](const Transfer& t) {
    const std::string where = "tensor " + std::to_string(t.tensor) + " " + std::to_string(t.src) + "->" +
                              std::to_string(t.dst);
    if (t.tensor >= nt) return error(where + ": no such tensor");
    if (t.src < 0 || t.src >= p.nRanks || t.dst < 0 || t.dst >= p.nRanks) return error(where + ": rank out of range");
    const int sp = b.srcPos[t.tensor][t.src], dp = b.dstPos[t.tensor][t.dst];
    if (sp < 0) return error(where + ": source rank holds no part of the tensor");
    if (dp < 0) return error(where + ": destination rank holds no part of the tensor");
    const std::vector<uint64_t>& in = b.srcData[t.tensor][sp];
    std::vector<uint64_t>& out = b.dstData[t.tensor][dp];
    std::vector<uint8_t>& writes = b.dstWrites[t.tensor][dp];
    int64_t idx[kMaxTensorDims] = {};
    for (int d = 0; d < t.ndims; d++)
      if (t.extent[d] <= 0) return error(where + ": empty or negative extent");
    for (;;) {
      int64_t so = t.srcOffset, doff = t.dstOffset;
      for (int d = 0; d < t.ndims; d++) {
        so += idx[d] * t.srcStride[d];
        doff += idx[d] * t.dstStride[d];
      }
      if (so < 0 || so >= (int64_t)in.size()) return error(where + ": reads outside the source tensor");
      if (in[so] == kHole) return error(where + ": reads a slot that is no element of the source tensor");
      if (doff < 0 || doff >= (int64_t)out.size()) return error(where + ": writes outside the destination tensor");
      out[doff] = in[so];
      if (writes[doff] < 255) writes[doff]++;
      int d = t.ndims - 1;
      while (d >= 0 && ++idx[d] == t.extent[d]) idx[d--] = 0;
      if (d < 0) return;
    }
  };
  // One element of transfer t: read at the source offset, or write at the destination offset (false: an error).
  auto readSource = [&](const Transfer& t, int64_t so, uint64_t* v) {
    const int sp = t.tensor < nt ? b.srcPos[t.tensor][t.src] : -1;
    if (sp < 0) return error("wire: a send of a tensor its source holds no part of"), false;
    const std::vector<uint64_t>& in = b.srcData[t.tensor][sp];
    if (so < 0 || so >= (int64_t)in.size() || in[so] == kHole)
      return error("wire: a pack reads no source element"), false;
    *v = in[so];
    return true;
  };
  auto writeDestination = [&](const Transfer& t, int64_t doff, uint64_t v) {
    const int dp = t.tensor < nt ? b.dstPos[t.tensor][t.dst] : -1;
    if (dp < 0) return error("wire: a receive of a tensor its destination holds no part of");
    std::vector<uint64_t>& out = b.dstData[t.tensor][dp];
    if (doff < 0 || doff >= (int64_t)out.size()) return error("wire: an unpack writes outside the destination");
    out[doff] = v;
    if (b.dstWrites[t.tensor][dp][doff] < 255) b.dstWrites[t.tensor][dp][doff]++;
  };
  constexpr uint64_t kUnpacked = 0x5a5a5a5a5a5a5a5aull;
  // Sender s packs chunk c of its stream to d; receiver d unpacks it with its own view of the stream from s.
  auto transmit = [&](int s, const WireStream& out, const RankSchedule& rs, const RankSchedule& rd) {
    const int d = out.peer;
    const auto in = std::find_if(rd.recvs.begin(), rd.recvs.end(), [&](const WireStream& w) { return w.peer == s; });
    const std::string pair = std::to_string(s) + "->" + std::to_string(d);
    if (in == rd.recvs.end()) return error("wire " + pair + ": the receiver has no stream from the sender");
    if (in->bytes != out.bytes || rs.chunkBytes != rd.chunkBytes)
      return error("wire " + pair + ": the two sides' streams differ in length or chunking");
    if (in->lsa != out.lsa) return error("wire " + pair + ": one side goes over LSA, the other not");
    // The slots a stream uses: two, or one for a stream of one chunk; each must hold a chunk of the stream.
    auto span = [&](const WireStream& w, int64_t chunk) {
      return (w.chunks(chunk) > 1 ? 2 : 1) * w.slotBytes;
    };
    if (out.slotBytes < std::min(rs.chunkBytes, out.bytes) || in->slotBytes < std::min(rd.chunkBytes, in->bytes))
      return error("wire " + pair + ": a slot shorter than the chunks it holds");
    if (out.lsa) {  // the receiver reads the sender's window where its own schedule says the slots are
      if (out.slotOffset < 0 || out.slotOffset + span(out, rs.chunkBytes) > rs.lsaBytes)
        return error("wire " + pair + ": the send slots lie outside the sender's window");
      if (in->slotOffset != out.slotOffset || rs.lsaBytes != rd.lsaBytes)
        return error("wire " + pair + ": the receiver looks for the slots elsewhere in the sender's window");
    } else {
      if (out.slotOffset < 0 || out.slotOffset + span(out, rs.chunkBytes) > rs.stagingBytes)
        return error("wire " + pair + ": the send slots lie outside the sender's staging");
      if (in->slotOffset < 0 || in->slotOffset + span(*in, rd.chunkBytes) > rd.stagingBytes)
        return error("wire " + pair + ": the receive slots lie outside the receiver's staging");
    }
    std::vector<uint64_t> stage(rs.chunkBytes);
    for (int64_t c = 0; c < out.chunks(rs.chunkBytes); c++) {
      std::fill(stage.begin(), stage.end(), kUnpacked);
      for (const Segment& g : chunkSegments(p, plans[s].sends, out, rs.chunkBytes, c)) {
        const Transfer& t = plans[s].sends[g.transfer];
        const MoveDesc md = moveDescOf(p, t);
        const int64_t eb = md.elemBytes;
        for (int64_t i = 0; i < g.elements; i++) {
          int64_t so, unused;
          moveOffsets(md, g.firstElement + i, &so, &unused);
          if (g.chunkOffset + i * eb >= rs.chunkBytes) return error("wire " + pair + ": a pack past the chunk");
          if (!readSource(t, so, &stage[g.chunkOffset + i * eb])) return;
        }
      }
      for (const Segment& g : chunkSegments(p, plans[d].recvs, *in, rd.chunkBytes, c)) {
        const Transfer& t = plans[d].recvs[g.transfer];
        const MoveDesc md = moveDescOf(p, t);
        const int64_t eb = md.elemBytes;
        for (int64_t i = 0; i < g.elements; i++) {
          int64_t unused, doff;
          moveOffsets(md, g.firstElement + i, &unused, &doff);
          const int64_t at = g.chunkOffset + i * eb;
          if (at >= rd.chunkBytes || stage[at] == kUnpacked)
            return error("wire " + pair + ": an unpack reads a chunk byte that was never packed");
          writeDestination(t, doff, stage[at]);
        }
      }
    }
  };
  for (size_t r = 0; r < plans.size(); r++) {
    const RankPlan& rp = plans[r];
    if (wire) {
      const RankSchedule& rs = (*wire)[r];
      size_t items = 0;
      for (const WireStream& w : rs.sends) {
        items += w.items.size();
        transmit((int)r, w, rs, (*wire)[w.peer]);
      }
      if (items != rp.sends.size()) error("wire: rank " + std::to_string(r) + "'s streams do not hold all its sends");
    } else {
      for (const Transfer& t : rp.sends) execute(t);
    }
    for (const Transfer& t : rp.copies) execute(t);
  }

  for (size_t t = 0; t < nt; t++) {
    const TensorPair& tp = p.tensors[t];
    for (int pos = 0; pos < tp.dst.mesh.size(); pos++) {
      std::vector<uint8_t> isElement(b.dstData[t][pos].size(), 0);
      forEachElement(*b.dst[t], pos, tp.dst.ndims(), [&](const int64_t* gi, int64_t off) {
        isElement[off] = 1;
        res.elementsChecked++;
        const uint64_t want = encode(t, globalLinear(tp.dst, gi));
        const uint64_t got = b.dstData[t][pos][off];
        const int n = b.dstWrites[t][pos][off];
        if (got != want || n != 1)
          error("tensor " + std::to_string(t) + " (" + tp.name + ") rank " + std::to_string(tp.dst.mesh.ranks[pos]) +
                " offset " + std::to_string(off) + ": " + (n == 0 ? "never written" : n > 1 ? "written " +
                std::to_string(n) + " times" : "wrong value"));
      });
      for (size_t off = 0; off < isElement.size(); off++)
        if (!isElement[off] && b.dstWrites[t][pos][off])
          error("tensor " + std::to_string(t) + ": a write landed between the destination's elements");
    }
  }
  return res;
}
}  // namespace

constexpr int64_t kEmulatorCopySegment = 13;

SimulationResult emulateExecute(const Problem& p, const std::vector<ExecTables>& tables) {
  SimulationResult res;
  auto error = [&](const std::string& what) {
    if (res.errors++ == 0) res.firstError = what;
    res.ok = false;
  };
  const size_t nt = p.tensors.size(), nr = tables.size();
  std::vector<std::unique_ptr<ShardGrid>> sg, dg;
  // [rank][tensor] local buffers (bytes), and the destination's write counts per element slot.
  std::vector<std::vector<std::vector<char>>> src(nr, std::vector<std::vector<char>>(nt)),
      dst(nr, std::vector<std::vector<char>>(nt));
  std::vector<std::vector<std::vector<uint8_t>>> writes(nr, std::vector<std::vector<uint8_t>>(nt));
  auto value = [](uint32_t t, int64_t linear) { return testing::elementValue(0, t, linear); };
  for (size_t t = 0; t < nt; t++) {
    const TensorPair& tp = p.tensors[t];
    const int64_t eb = (int64_t)elementSize(tp.src.dtype);
    sg.emplace_back(new ShardGrid(tp.src));
    dg.emplace_back(new ShardGrid(tp.dst));
    for (int pos = 0; pos < tp.src.mesh.size(); pos++) {
      std::vector<char>& b = src[tp.src.mesh.ranks[pos]][t];
      b.assign(sg[t]->localSpan(pos) * eb, (char)0xee);
      forEachElement(*sg[t], pos, tp.src.ndims(), [&](const int64_t* gi, int64_t off) {
        const uint64_t v = value((uint32_t)t, globalLinear(tp.src, gi));
        memcpy(&b[off * eb], &v, eb);
      });
    }
    for (int pos = 0; pos < tp.dst.mesh.size(); pos++) {
      const int r = tp.dst.mesh.ranks[pos];
      dst[r][t].assign(dg[t]->localSpan(pos) * (int64_t)elementSize(tp.dst.dtype), (char)0xff);
      writes[r][t].assign(dg[t]->localSpan(pos), 0);
    }
  }
  std::vector<std::vector<const char*>> srcPtr(nr, std::vector<const char*>(nt, nullptr));
  std::vector<std::vector<char*>> dstPtr(nr, std::vector<char*>(nt, nullptr));
  std::vector<std::vector<char>> stage(nr), win(nr);  // own staging; symmetric window's slots
  for (size_t r = 0; r < nr; r++) {
    for (size_t t = 0; t < nt; t++) {
      if (!src[r][t].empty()) srcPtr[r][t] = src[r][t].data();
      if (!dst[r][t].empty()) dstPtr[r][t] = dst[r][t].data();
    }
    stage[r].assign(tables[r].stagingBytes, (char)0xcd);
    win[r].assign(tables[r].lsaBytes, (char)0xcd);
  }
  // LSA: the world rank of index i of rank r's domain, and the barriers every rank of a domain must meet alike.
  auto domainRank = [&](size_t r, uint32_t i) {
    uint32_t seen = 0;
    for (int q = 0; q < p.nRanks; q++)
      if (p.options.domainOf(q) == p.options.domainOf((int)r) && seen++ == i) return q;
    return -1;
  };
  std::vector<int64_t> barriers(nr, 0);
  for (size_t r = 0; r < nr; r++) {
    for (const ExecRound& R : tables[r].rounds) barriers[r] += R.barrier;
    barriers[r] += tables[r].finalBarrier + tables[r].remoteBarrier;
  }
  for (size_t r = 0; r < nr; r++)
    for (size_t q = 0; q < nr; q++)
      if (p.options.domainOf((int)q) == p.options.domainOf((int)r) && barriers[q] != barriers[r])
        return error("ranks " + std::to_string(r) + " and " + std::to_string(q) +
                     " of one domain meet different numbers of barriers"), res;
  // Bounds of one element move, checked before the shared function touches memory.
  auto inside = [&](size_t r, const MoveDesc& d, int64_t e, bool fromSource, bool toDest) {
    int64_t s, t;
    moveOffsets(d, e, &s, &t);
    if (d.tensor < 0 || (size_t)d.tensor >= nt) return false;
    if (fromSource && (s < 0 || (s + 1) * sourceBytes(d) > (int64_t)src[r][d.tensor].size())) return false;
    if (toDest && (t < 0 || (t + 1) * d.elemBytes > (int64_t)dst[r][d.tensor].size())) return false;
    return true;
  };
  auto countWrite = [&](size_t r, const MoveDesc& d, int64_t e) {
    int64_t s, t;
    moveOffsets(d, e, &s, &t);
    if (writes[r][d.tensor][t] < 255) writes[r][d.tensor][t]++;
  };
  // Every thread's share of a segment, as a kernel's CTA runs them (move.h), one thread after another.
  auto team = [](auto kind, const MoveDesc& d, const MoveSegment& g, const MoveEnds& m) {
    for (int tid = 0; tid < kMoveThreads; tid++) moveSegmentShare<decltype(kind)::value>(d, g, m, tid, kMoveThreads);
  };
  using Copy = std::integral_constant<int, kMoveCopy>;
  using Pack = std::integral_constant<int, kMovePack>;
  using Unpack = std::integral_constant<int, kMoveUnpack>;
  for (size_t r = 0; r < nr; r++) {
    // Segments far smaller than the executor's, so that they also start and end inside rows.
    const std::vector<MoveSegment> segs = copySegments(tables[r].copies, kEmulatorCopySegment);
    MoveEnds m;
    m.src = srcPtr[r].data();
    m.dst = dstPtr[r].data();
    for (const MoveSegment& g : segs) {
      const MoveDesc& d = tables[r].copies[g.desc];
      // The segment's elements: a run of row-major indices, or its tiles' (move.h, tileSpanOf).
      std::vector<int64_t> elems;
      if (g.where == kTileSegment) {
        const int b = tileDimOf(d);
        if (b < 0) return error("rank " + std::to_string(r) + ": a tile segment of a box that does not tile"), res;
        for (int64_t t = g.firstElement; t < g.firstElement + g.elements; t++) {
          const TileSpan sp = tileSpanOf(d, b, t);
          for (int64_t i = 0; i < sp.rows; i++)
            for (int64_t j = 0; j < sp.cols; j++) elems.push_back(sp.e0 + i * sp.rowStep + j);
        }
      } else {
        for (int64_t e = g.firstElement; e < g.firstElement + g.elements; e++) elems.push_back(e);
      }
      for (int64_t e : elems)
        if (!inside(r, d, e, true, true))
          return error("rank " + std::to_string(r) + ": a local copy out of bounds"), res;
      team(Copy(), d, g, m);
      for (int64_t e : elems) countWrite(r, d, e);
    }
  }
  // Direct transfers: the i-th send of s to d meets the i-th receive of d from s, as NCCL matches them in a group.
  for (size_t s = 0; s < nr; s++) {
    std::vector<size_t> next(nr, 0);  // per receiver: its receives from s matched so far
    for (const DirectOp& op : tables[s].direct) {
      if (!op.send) continue;
      const std::string pair = std::to_string(s) + "->" + std::to_string(op.peer) + " (direct)";
      if (op.peer < 0 || (size_t)op.peer >= nr) return error("send " + pair + ": no such receiver"), res;
      const DirectOp* match = nullptr;
      size_t seen = 0;
      for (const DirectOp& o : tables[op.peer].direct)
        if (!o.send && o.peer == (int)s && seen++ == next[op.peer]) {
          match = &o;
          break;
        }
      next[op.peer]++;
      if (!match || match->bytes != op.bytes) return error("send " + pair + ": no receive of the same size"), res;
      const MoveDesc& sd = tables[s].sends[op.desc];
      const MoveDesc& rd = tables[op.peer].recvs[match->desc];
      const std::vector<char>& from = src[s][op.tensor];
      std::vector<char>& to = dst[op.peer][match->tensor];
      if (op.offset < 0 || op.offset * sd.elemBytes + op.bytes > (int64_t)from.size())
        return error("send " + pair + ": outside its source tensor"), res;
      if (match->offset < 0 || match->offset * rd.elemBytes + match->bytes > (int64_t)to.size())
        return error("receive " + pair + ": outside its destination tensor"), res;
      memcpy(&to[match->offset * rd.elemBytes], &from[op.offset * sd.elemBytes], op.bytes);
      for (int64_t e = 0; e < product(rd.extent, rd.ndims); e++) countWrite(op.peer, rd, e);
    }
    for (size_t d = 0; d < nr; d++) {  // every receive from s matched
      size_t want = 0;
      for (const DirectOp& o : tables[d].direct) want += !o.send && o.peer == (int)s;
      if (want != next[d]) return error("rank " + std::to_string(d) + ": a direct receive from " +
                                        std::to_string(s) + " that no send meets"), res;
    }
  }
  // Zero-copy: every in-place segment between this rank's tensor and its peer's (pull: the peer's source into my
  // destination; push: my source into the peer's destination), both ranks past the publishing barrier.
  for (size_t r = 0; r < nr; r++) {
    const ExecTables& x = tables[r];
    const bool pull = x.zeroCopy == kZeroCopyPull;
    for (const MoveSegment& g : x.remote) {
      const MoveDesc& d = pull ? x.recvs[g.desc] : x.sends[g.desc];
      const int peer = domainRank(r, g.where);
      const std::string who = "rank " + std::to_string(r) + ": an in-place " + (pull ? "pull" : "push");
      if (x.zeroCopy == kZeroCopyOff || peer < 0 || (size_t)peer >= nr || peer == (int)r)
        return error(who + " from no peer of its domain"), res;
      if (!x.remoteBarrier || !tables[peer].remoteBarrier || !x.finalBarrier)
        return error(who + " without the publishing and final barriers"), res;
      const size_t sr = pull ? peer : r, dr = pull ? r : peer;  // the ranks whose source / destination it moves
      for (int64_t e = g.firstElement; e < g.firstElement + g.elements; e++) {
        int64_t so, to;
        moveOffsets(d, e, &so, &to);
        if (so < 0 || (so + 1) * sourceBytes(d) > (int64_t)src[sr][d.tensor].size() || to < 0 ||
            (to + 1) * d.elemBytes > (int64_t)dst[dr][d.tensor].size())
          return error(who + " out of bounds"), res;
      }
      MoveEnds m;
      m.src = srcPtr[sr].data();
      m.dst = dstPtr[dr].data();
      team(Copy(), d, g, m);
      for (int64_t e = g.firstElement; e < g.firstElement + g.elements; e++) countWrite(dr, d, e);
    }
  }
  // Rank r's packs of round k (false: the emulation failed, with its error).
  auto packRound = [&](size_t r, size_t k) {
    if (k >= tables[r].rounds.size()) return true;
    const ExecRound& R = tables[r].rounds[k];
    for (uint32_t i = R.packBegin; i < R.packEnd; i++) {
      const MoveSegment& g = tables[r].pack[i];
      const MoveDesc& d = tables[r].sends[g.desc];
      if (g.where != kStageLocal && g.where != (uint32_t)tables[r].lsaRank)
        return error("rank " + std::to_string(r) + ": a pack into another rank's window"), false;
      std::vector<char>& to = g.where == kStageLocal ? stage[r] : win[r];
      if (g.stageOffset < 0 || g.stageOffset + g.elements * d.elemBytes > (int64_t)to.size())
        return error("rank " + std::to_string(r) + ": a pack outside the staging"), false;
      for (int64_t e = 0; e < g.elements; e++)
        if (!inside(r, d, g.firstElement + e, true, false)) return error("a pack reads outside its source"), false;
      MoveEnds m;
      m.src = srcPtr[r].data();
      m.stageOut = to.data();
      team(Pack(), d, g, m);
    }
    return true;
  };
  // Round k's sends and receives of every rank, matched per (sender, receiver) as NCCL matches them: the i-th send
  // of r to d in the round with the i-th receive of d from r.
  auto exchangeRound = [&](size_t k) {
    for (size_t r = 0; r < nr; r++) {
      if (k >= tables[r].rounds.size()) continue;
      const ExecRound& R = tables[r].rounds[k];
      std::vector<int> sent(nr, 0);  // sends of r to each receiver so far in this round
      for (uint32_t i = R.opBegin; i < R.opEnd; i++) {
        const P2pOp& op = tables[r].ops[i];
        if (!op.send) continue;
        const std::string pair = std::to_string(r) + "->" + std::to_string(op.peer) + " round " + std::to_string(k);
        if (op.peer < 0 || (size_t)op.peer >= nr || k >= tables[op.peer].rounds.size())
          return error("send " + pair + ": the receiver has no such round"), false;
        const ExecRound& Q = tables[op.peer].rounds[k];
        const P2pOp* match = nullptr;
        for (uint32_t j = Q.opBegin, seen = 0; j < Q.opEnd && !match; j++) {
          const P2pOp& o = tables[op.peer].ops[j];
          if (!o.send && o.peer == (int)r && (int)seen++ == sent[op.peer]) match = &o;
        }
        sent[op.peer]++;
        if (!match || match->bytes != op.bytes) return error("send " + pair + ": no receive of the same size"), false;
        if (op.stageOffset + op.bytes > (int64_t)stage[r].size() ||
            match->stageOffset + match->bytes > (int64_t)stage[op.peer].size())
          return error("send " + pair + ": outside a staging buffer"), false;
        memcpy(&stage[op.peer][match->stageOffset], &stage[r][op.stageOffset], op.bytes);
      }
    }
    return true;
  };
  auto unpackRound = [&](size_t r, size_t k) {
    if (k >= tables[r].rounds.size()) return true;
    const ExecRound& R = tables[r].rounds[k];
    for (uint32_t i = R.unpackBegin; i < R.unpackEnd; i++) {
      const MoveSegment& g = tables[r].unpack[i];
      const MoveDesc& d = tables[r].recvs[g.desc];
      const int sender = g.where == kStageLocal ? (int)r : domainRank(r, g.where);
      if (sender < 0 || (size_t)sender >= nr)
        return error("rank " + std::to_string(r) + ": an unpack from no rank of its domain"), false;
      if (g.where != kStageLocal && (!R.barrier || k >= tables[sender].rounds.size()))
        return error("rank " + std::to_string(r) + ": an LSA unpack without the round's barrier"), false;
      const std::vector<char>& from = g.where == kStageLocal ? stage[r] : win[sender];
      if (g.stageOffset < 0 || g.stageOffset + g.elements * d.elemBytes > (int64_t)from.size())
        return error("rank " + std::to_string(r) + ": an unpack outside the staging"), false;
      for (int64_t e = 0; e < g.elements; e++)
        if (!inside(r, d, g.firstElement + e, false, true)) return error("an unpack writes outside its tensor"), false;
      MoveEnds m;
      m.dst = dstPtr[r].data();
      m.stageIn = from.data();
      team(Unpack(), d, g, m);
      for (int64_t e = 0; e < g.elements; e++) countWrite(r, d, g.firstElement + e);
    }
    return true;
  };
  // The rounds in lockstep over the ranks. A rank whose execute pipelines them (exec_tables.h, pipelinedRounds) in
  // the latest order its streams allow: its side stream packs rounds 0 and 1 before the first exchange, and after
  // each exchange k it unpacks round k - 1 and packs round k + 1 (so round k's unpack comes after exchange k + 1,
  // and round k + 1's pack before exchange k's receive was unpacked): a slot reused too early fails it.
  std::vector<char> piped(nr);
  size_t rounds = 0;
  for (size_t r = 0; r < nr; r++) {
    piped[r] = pipelinedRounds(tables[r]);
    rounds = std::max(rounds, tables[r].rounds.size());
    if (piped[r] && !(packRound(r, 0) && packRound(r, 1))) return res;
  }
  for (size_t k = 0; k < rounds; k++) {
    for (size_t r = 0; r < nr; r++)
      if (!piped[r] && !packRound(r, k)) return res;
    if (!exchangeRound(k)) return res;
    for (size_t r = 0; r < nr; r++) {
      if (!piped[r]) {
        if (!unpackRound(r, k)) return res;
      } else if (k >= 1 && !(unpackRound(r, k - 1) && packRound(r, k + 1))) {
        return res;
      }
    }
  }
  for (size_t r = 0; r < nr; r++)  // a pipelined rank's last unpack, unless a later round's step made it
    if (piped[r] && tables[r].rounds.size() == rounds && !unpackRound(r, rounds - 1)) return res;
  for (size_t t = 0; t < nt; t++) {
    const TensorPair& tp = p.tensors[t];
    const int64_t eb = (int64_t)elementSize(tp.dst.dtype);
    const int convert = conversionOf(tp.src.dtype, tp.dst.dtype);
    for (int pos = 0; pos < tp.dst.mesh.size(); pos++) {
      const int r = tp.dst.mesh.ranks[pos];
      forEachElement(*dg[t], pos, tp.dst.ndims(), [&](const int64_t* gi, int64_t off) {
        res.elementsChecked++;
        // The source element's bytes, converted as numeric.h converts (its own tests check the rounding).
        const uint64_t v = value((uint32_t)t, globalLinear(tp.dst, gi));
        uint64_t want = 0;
        convertElement(reinterpret_cast<const char*>(&v), reinterpret_cast<char*>(&want), convert, (int)eb);
        if (memcmp(&dst[r][t][off * eb], &want, eb) != 0 || writes[r][t][off] != 1)
          error("tensor " + std::to_string(t) + " rank " + std::to_string(r) + " offset " + std::to_string(off) +
                (writes[r][t][off] == 1 ? ": wrong value" : ": written " + std::to_string(writes[r][t][off]) +
                                                                 " times"));
      });
    }
  }
  return res;
}

}  // namespace ncclm2n
