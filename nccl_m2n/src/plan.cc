#include "nccl_m2n/src/plan.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ncclm2n {
namespace {

// Word-wise 64-bit hash (a multiply-xorshift mix per word); stable across platforms of one endianness.
struct Hasher {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  void add(uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  void add(const std::string& s) {
    add(s.size());
    for (unsigned char c : s) add(c);
  }
  uint64_t done() const {
    uint64_t x = h;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
  }
};

void hashLayout(Hasher* h, const Layout& l) {
  h->add(l.globalShape.size());
  for (int64_t s : l.globalShape) h->add((uint64_t)s);
  h->add((uint64_t)l.dtype);
  h->add(l.mesh.dims.size());
  for (int d : l.mesh.dims) h->add((uint64_t)d);
  for (int r : l.mesh.ranks) h->add((uint64_t)r);
  h->add(l.boxes.empty() ? l.placements.size() : 0);
  if (l.boxes.empty())
    for (int p : l.placements) h->add((uint64_t)(int64_t)p);
  h->add(l.boxes.size());
  for (const Box& b : l.boxes)
    for (int d = 0; d < b.ndims; d++) {
      h->add((uint64_t)b.offset[d]);
      h->add((uint64_t)b.shape[d]);
    }
  h->add(l.strides.size());
  for (int64_t s : l.strides) h->add((uint64_t)s);
}

// Sufficient condition for distinct elements of `box` to land on distinct offsets: ordered by stride, each dim
// of extent > 1 steps over the whole span of the smaller ones.
bool stridesDoNotAlias(const Box& box, const int64_t* strides) {
  int order[kMaxTensorDims];
  int n = 0;
  for (int d = 0; d < box.ndims; d++)
    if (box.shape[d] > 1) order[n++] = d;
  for (int i = 1; i < n; i++)  // insertion sort by stride: at most kMaxTensorDims entries
    for (int j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; j--) std::swap(order[j], order[j - 1]);
  int64_t span = 1;  // elements covered by the dims so far
  for (int i = 0; i < n; i++) {
    const int d = order[i];
    if (strides[d] < span) return false;
    span = strides[d] * (box.shape[d] - 1) + span;
  }
  return true;
}

// "elements [3, 5) of dim 0" for 1-D boxes, else "the box at offset (1, 1) shape (2, 2)".
std::string describe(const Box& b) {
  if (b.ndims == 1)
    return "elements [" + std::to_string(b.offset[0]) + ", " + std::to_string(b.offset[0] + b.shape[0]) + ") of dim 0";
  std::string offset, shape;
  for (int d = 0; d < b.ndims; d++) {
    offset += (d ? ", " : "") + std::to_string(b.offset[d]);
    shape += (d ? ", " : "") + std::to_string(b.shape[d]);
  }
  return "the box at offset (" + offset + ") shape (" + shape + ")";
}

struct RankState {
  std::vector<int64_t> load;  // bytes each rank was chosen to send so far (the balancing key)
};

}  // namespace

double PlanStats::maxSourceLoad() const {
  int64_t m = 0;
  for (size_t r = 0; r < sendBytes.size(); r++)
    if (isSource[r]) m = std::max(m, sendBytes[r]);
  return (double)m;
}

double PlanStats::meanSourceLoad() const {
  double sum = 0;
  int n = 0;
  for (size_t r = 0; r < sendBytes.size(); r++)
    if (isSource[r]) {
      sum += (double)sendBytes[r];
      n++;
    }
  return n ? sum / n : 0.0;
}

bool validateProblem(const Problem& p, std::string* error) {
  if (p.nRanks < 1) {
    if (error) *error = "communicator size must be >= 1";
    return false;
  }
  if (!p.options.domainOfRank.empty() && (int)p.options.domainOfRank.size() < p.nRanks) {
    if (error) *error = "domain map has " + std::to_string(p.options.domainOfRank.size()) + " entries for " +
                        std::to_string(p.nRanks) + " ranks";
    return false;
  }
  if (p.options.ranksPerDomain < 0) {
    if (error) *error = "ranksPerDomain < 0";
    return false;
  }
  for (size_t t = 0; t < p.tensors.size(); t++) {
    const TensorPair& tp = p.tensors[t];
    std::string why;
    auto bad = [&](const std::string& what) {
      if (error) *error = "tensor " + std::to_string(t) + " (" + tp.name + "): " + what;
      return false;
    };
    if (!validateLayout(tp.src, p.nRanks, &why)) return bad("source layout: " + why);
    if (!validateLayout(tp.dst, p.nRanks, &why)) return bad("destination layout: " + why);
    if (tp.src.globalShape != tp.dst.globalShape) return bad("source and destination global shapes differ");
    if (conversionOf(tp.src.dtype, tp.dst.dtype) < 0)
      return bad("no conversion from NCCL type " + std::to_string((int)tp.src.dtype) + " to " +
                 std::to_string((int)tp.dst.dtype) +
                 " (the executor converts fp32 <-> bf16, and bf16 / fp32 -> fp8 e4m3 with block scales: quantize.h)");
    if (!tp.dst.strides.empty()) {
      ShardGrid g(tp.dst);
      for (int pos = 0; pos < tp.dst.mesh.size(); pos++)
        if (!stridesDoNotAlias(g.boxOfPosition(pos), g.strides(pos)))
          return bad("destination strides of mesh position " + std::to_string(pos) +
                     " map two elements to one address");
    }
    // Placements tile the tensor, explicit source boxes may leave holes: harmless unless a destination box needs
    // part of one, whose elements no transfer would ever write.
    if (tp.src.boxes.empty()) continue;
    const ShardGrid::Coverage cover = ShardGrid(tp.src).coverage();
    if (cover.tooFragmented)
      return bad("its explicit source boxes leave more than " + std::to_string(ShardGrid::kMaxCoveragePieces) +
                 " disjoint uncovered pieces: too fragmented to check that every destination element has a source");
    const std::vector<Box>& holes = cover.holes;
    if (holes.empty()) continue;
    const ShardGrid dst(tp.dst);
    for (int b = 0; b < dst.numShards(); b++)
      for (const Box& hole : holes) {
        const Box missing = intersect(dst.shardBox(b), hole);
        if (missing.empty()) continue;
        const int pos = dst.replicas(b)[0];
        return bad("source boxes do not cover " + describe(missing) + ", which destination mesh position " +
                   std::to_string(pos) + " (rank " + std::to_string(tp.dst.mesh.ranks[pos]) + ") needs");
      }
  }
  return true;
}

uint64_t metadataHash(const Problem& p) {
  Hasher h;
  h.add((uint64_t)p.nRanks);
  h.add((uint64_t)p.options.ranksPerDomain);
  h.add(p.options.domainOfRank.size());
  for (int d : p.options.domainOfRank) h.add((uint64_t)(int64_t)d);
  h.add(p.tensors.size());
  for (const TensorPair& tp : p.tensors) {
    h.add(tp.name);
    hashLayout(&h, tp.src);
    hashLayout(&h, tp.dst);
  }
  return h.done();
}

uint64_t tensorHash(const TensorPair& tp) {
  Hasher h;
  h.add(tp.name);
  hashLayout(&h, tp.src);
  hashLayout(&h, tp.dst);
  return h.done();
}

void normalizeTransfer(Transfer* t) {
  int n = 0;
  for (int d = 0; d < t->ndims; d++) {
    if (t->extent[d] == 1) continue;
    if (n > 0 && t->srcStride[n - 1] == t->extent[d] * t->srcStride[d] &&
        t->dstStride[n - 1] == t->extent[d] * t->dstStride[d]) {
      // Outer dim n-1 steps exactly over dim d on both sides: fold them into one.
      t->extent[n - 1] *= t->extent[d];
      t->srcStride[n - 1] = t->srcStride[d];
      t->dstStride[n - 1] = t->dstStride[d];
      continue;
    }
    t->extent[n] = t->extent[d];
    t->srcStride[n] = t->srcStride[d];
    t->dstStride[n] = t->dstStride[d];
    n++;
  }
  for (int d = n; d < kMaxTensorDims; d++) t->extent[d] = t->srcStride[d] = t->dstStride[d] = 0;
  t->ndims = n;
}

namespace {

// The one planning pass. `wantRank` >= 0: materialise that rank's lists into all[0]; -2: every rank's.
void runPlan(const Problem& p, int wantRank, std::vector<RankPlan>* out, PlanStats* stats,
             const ProgressFn& progress) {
  const int nRanks = p.nRanks;
  PlanStats s;
  s.metadataHash = metadataHash(p);
  for (auto* v : {&s.sendBytes, &s.recvBytes, &s.copyBytes, &s.sendIntraBytes, &s.sendInterBytes, &s.recvIntraBytes,
                  &s.recvInterBytes, &s.sendBoxes, &s.recvBoxes})
    v->assign(nRanks, 0);
  s.isSource.assign(nRanks, 0);
  std::vector<int> domain(nRanks);
  for (int r = 0; r < nRanks; r++) domain[r] = p.options.domainOf(r);
  Hasher planHash;
  std::vector<int> srcPosOfRank(nRanks, -1);
  std::vector<int> candidates, overlaps;
  candidates.reserve(64);
  std::vector<Box> missing, next;
  const bool all = wantRank == -2;

  const size_t nt = p.tensors.size();
  for (size_t ti = 0; ti < nt; ti++) {
    const TensorPair& tp = p.tensors[ti];
    const ShardGrid src(tp.src), dst(tp.dst);
    const int64_t esize = (int64_t)elementSize(tp.dst.dtype);  // bytes as the wire carries them (converted)
    for (int pos = 0; pos < tp.src.mesh.size(); pos++) {
      srcPosOfRank[tp.src.mesh.ranks[pos]] = pos;
      s.isSource[tp.src.mesh.ranks[pos]] = 1;
    }
    // Delivers `piece` of source shard `a` to destination position `dpos`, choosing the replica that sends it.
    auto deliver = [&](int a, const Box& piece, int dpos) {
      const int64_t bytes = piece.elements() * esize;
      const std::vector<int>& sreplicas = src.replicas(a);
      const int dRank = tp.dst.mesh.ranks[dpos];
      // (1) The destination holds this shard itself: a local copy.
      int spos = srcPosOfRank[dRank];
      if (spos < 0 || src.shardOfPosition(spos) != a) {
        // (2) Replicas in the destination's domain, else all; (3) the least loaded, then the lowest rank.
        candidates.clear();
        for (int q : sreplicas)
          if (domain[tp.src.mesh.ranks[q]] == domain[dRank]) candidates.push_back(q);
        const std::vector<int>& pool = candidates.empty() ? sreplicas : candidates;
        spos = pool[0];
        for (int q : pool) {
          const int r = tp.src.mesh.ranks[q], best = tp.src.mesh.ranks[spos];
          if (s.sendBytes[r] < s.sendBytes[best] || (s.sendBytes[r] == s.sendBytes[best] && r < best)) spos = q;
        }
      }
      const int sRank = tp.src.mesh.ranks[spos];
      planHash.add(ti);
      planHash.add((uint64_t)sRank << 32 | (uint32_t)dRank);
      for (int d = 0; d < piece.ndims; d++) planHash.add((uint64_t)piece.offset[d] << 24 ^ (uint64_t)piece.shape[d]);
      s.pieces++;
      s.totalBytes += bytes;
      if (sRank == dRank) {
        s.copyBytes[dRank] += bytes;
        s.localBytes += bytes;
      } else {
        const bool intra = domain[sRank] == domain[dRank];
        s.sendBytes[sRank] += bytes;
        s.recvBytes[dRank] += bytes;
        (intra ? s.sendIntraBytes : s.sendInterBytes)[sRank] += bytes;
        (intra ? s.recvIntraBytes : s.recvInterBytes)[dRank] += bytes;
        (intra ? s.intraDomainBytes : s.interDomainBytes) += bytes;
        s.sendBoxes[sRank]++;
        s.recvBoxes[dRank]++;
      }
      if (!(all || sRank == wantRank || dRank == wantRank)) return;
      Transfer t;
      t.tensor = (uint32_t)ti;
      t.src = sRank;
      t.dst = dRank;
      t.ndims = piece.ndims;
      const Box& sb = src.boxOfPosition(spos);
      const Box& db = dst.boxOfPosition(dpos);
      const int64_t* ss = src.strides(spos);
      const int64_t* ds = dst.strides(dpos);
      for (int d = 0; d < piece.ndims; d++) {
        t.srcOffset += (piece.offset[d] - sb.offset[d]) * ss[d];
        t.dstOffset += (piece.offset[d] - db.offset[d]) * ds[d];
        t.extent[d] = piece.shape[d];
        t.srcStride[d] = ss[d];
        t.dstStride[d] = ds[d];
      }
      normalizeTransfer(&t);
      if (all) {
        RankPlan& sp = (*out)[sRank];
        if (sRank == dRank) {
          sp.copies.push_back(t);
        } else {
          sp.sends.push_back(t);
          (*out)[dRank].recvs.push_back(t);
        }
      } else {
        RankPlan& mine = (*out)[0];
        if (sRank == dRank) mine.copies.push_back(t);
        else if (sRank == wantRank) mine.sends.push_back(t);
        else mine.recvs.push_back(t);
      }
    };
    // Source shards that overlap without being replicas would deliver the elements they share twice: each
    // destination position then takes what its box still misses shard by shard, its own shard first (a local copy).
    const bool srcDisjoint = src.coverage().disjoint;
    for (int b = 0; b < dst.numShards(); b++) {
      const Box& dbox = dst.shardBox(b);
      if (dbox.empty()) continue;
      const std::vector<int>& dpositions = dst.replicas(b);
      if (srcDisjoint) {
        src.forEachOverlap(dbox, [&](int a) {
          const Box piece = intersect(src.shardBox(a), dbox);
          for (int dpos : dpositions) deliver(a, piece, dpos);
        });
        continue;
      }
      overlaps.clear();
      src.forEachOverlap(dbox, [&](int a) { overlaps.push_back(a); });
      for (int dpos : dpositions) {
        const int own = srcPosOfRank[tp.dst.mesh.ranks[dpos]];
        const int ownShard = own >= 0 ? src.shardOfPosition(own) : -1;
        missing.assign(1, dbox);
        auto take = [&](int a) {
          next.clear();
          for (const Box& m : missing) {
            const Box piece = intersect(m, src.shardBox(a));
            if (piece.empty()) {
              next.push_back(m);
              continue;
            }
            deliver(a, piece, dpos);
            subtract(m, piece, &next);
          }
          missing.swap(next);
        };
        if (ownShard >= 0) take(ownShard);
        for (int a : overlaps)
          if (a != ownShard && !missing.empty()) take(a);
      }
    }
    for (int pos = 0; pos < tp.src.mesh.size(); pos++) srcPosOfRank[tp.src.mesh.ranks[pos]] = -1;
    if (progress && ((ti + 1) % 256 == 0 || ti + 1 == nt)) progress(ti + 1, nt);
  }
  s.planHash = planHash.done();
  if (stats) *stats = std::move(s);
}

}  // namespace

void planRank(const Problem& p, int rank, RankPlan* mine, PlanStats* stats, const ProgressFn& progress) {
  std::vector<RankPlan> out(1);
  out[0].rank = rank;
  runPlan(p, mine ? rank : -1, &out, stats, progress);
  if (mine) *mine = std::move(out[0]);
}

void planAll(const Problem& p, std::vector<RankPlan>* all, PlanStats* stats) {
  all->assign(p.nRanks, RankPlan());
  for (int r = 0; r < p.nRanks; r++) (*all)[r].rank = r;
  runPlan(p, -2, all, stats, {});
}

}  // namespace ncclm2n
