// nccl_m2n's public functions under hostile arguments. The layout and host-plan functions are pure host code, so
// everything is fuzzed freely: a generator builds a valid layout (mesh, placements or boxes, strides) and then
// breaks it in zero or more ways; a break that makes the arguments invalid by construction is a "poison", and a
// poisoned call must come back as ncclInvalidArgument/ncclInvalidUsage. Valid plans are checked against what the
// header promises and destroyed (the ASan build's leak check sees any plan or error path that leaks).
//
// Bounds that keep a run to seconds: meshes of at most 64 positions (4096 now and then), batches of a few tensors
// (thousands in OversizedBatches), communicators of at most 65536 ranks (2^20 now and then). Sizes the library
// must reject cost nothing to try and are tried at any magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_set>
#include <vector>

#include "nccl_m2n/include/nccl_m2n.h"
#include "nccl_m2n/include/nccl_m2n_testing.h"
#include "nccl_m2n/include/nccl_m2n_testing.h"
#include "tests/fuzz/fuzz.h"

namespace {

using fuzz::Campaign;
using fuzz::Lib;
using fuzz::Rng;

constexpr int kDims = NCCL_M2N_MAX_TENSOR_DIMS;
constexpr int kMeshDims = NCCL_M2N_MAX_MESH_DIMS;
constexpr int64_t kMaxElements = int64_t(1) << 62;  // the library's bound on a global tensor
constexpr int kMaxMeshPositions = 1 << 24;
constexpr int kMaxPlanRanks = 1 << 20;  // api.cc's bound on a plan's communicator

// Defect this fuzzer found, fixed in layout.cc: validateLayout tested offset + shape > global size in int64, which
// wrapped, so a box at offset INT64_MAX (any shape >= 1) passed ncclM2nLayoutValidate and, as a destination box,
// planned to no transfer at all. It now tests shape > global - offset. (The switch stays for bisecting.)
constexpr bool kBoxOverflowRejected = true;

// Huge tensors go up to the layout bound, 2^62 elements; a batch delivering more than 2^62 bytes in all (its int64
// byte counts could overflow) must be refused (api.cc).
constexpr int kHugeLog2 = 62;
constexpr int64_t kMaxPlanBytes = int64_t(1) << 62;

// Defect, kept out of the generator until fixed: ShardGrid::coverage() (layout.cc) lists the holes left by explicit
// source boxes one box each, and k unit slabs per dim of an 8-D tensor leave k^8 of them: 65 boxes (k = 8 and one
// box over the whole tensor, 16^8 elements) take 30 s and 4.2 GB in ncclM2nHostPlanCreate, more exhaust memory and
// std::bad_alloc escapes the C ABI. Explicit layouts keep to few positions in many dims (random boxes stay far
// from the worst case then: 40 ms at most in a run).
int maxBoxPositions(int nd) { return nd <= 2 ? 256 : nd == 3 ? 64 : nd == 4 ? 32 : 16; }

const ncclDataType_t kDtypes[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
                                  ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const int kBadDtypes[] = {ncclNumTypes, ncclNumTypes + 1, 64, 255, -1, INT_MIN, INT_MAX};

// torch.chunk: the extent of chunk `i` of `n` cut into `parts` (in 128 bits: n may be a broken INT64_MAX).
int64_t chunkExtent(int64_t n, int parts, int i) {
  const __int128 c = ((__int128)n + parts - 1) / parts;
  return (int64_t)std::max<__int128>(0, std::min<__int128>(n, c * (i + 1)) - std::min<__int128>(n, c * i));
}

// One layout and every array it points to. The arrays are sized for the most the library may read under any
// break below (8 tensor dims, 8 mesh axes, one box and 8 strides per mesh position), so that an out-of-bounds read
// can only be the library's. Not copyable: the layout points into the object itself.
struct LayoutArgs {
  int nd = 1;  // tensor rank the arrays describe
  ncclDataType_t dtype = ncclBfloat16;
  std::vector<int64_t> shape = std::vector<int64_t>(kDims, 1);
  int md = 1;
  std::vector<int> dims = std::vector<int>(kMeshDims, 1);
  std::vector<int> ranks;
  std::vector<int> placements = std::vector<int>(kMeshDims, NCCL_M2N_REPLICATE);
  std::vector<ncclM2nBox_t> boxes;  // empty: placements
  std::vector<int64_t> strides;     // empty: contiguous; else positions x nd, position-major (capacity x 8)
  bool nullLayout = false, nullShape = false, nullMesh = false, nullDims = false, nullRanks = false,
       nullPlacements = false;
  ncclM2nMesh_t mesh = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t layout = NCCL_M2N_LAYOUT_INITIALIZER;
  const char* poison = nullptr;

  LayoutArgs() = default;
  LayoutArgs(const LayoutArgs&) = delete;
  LayoutArgs& operator=(const LayoutArgs&) = delete;

  int positions() const { return (int)ranks.size(); }
  const ncclM2nLayout_t* get() const { return nullLayout ? nullptr : &layout; }
  void setPoison(const char* why) {
    if (!poison) poison = why;
  }
  // Points the structs at the arrays (after the last resize) and fills the fields the breaks left alone.
  void bind(bool first) {
    if (first) {
      mesh.ndims = md;
      layout.ndims = nd;
      layout.dtype = dtype;
    }
    mesh.dims = nullDims ? nullptr : dims.data();
    mesh.ranks = nullRanks ? nullptr : ranks.data();
    layout.globalShape = nullShape ? nullptr : shape.data();
    layout.mesh = nullMesh ? nullptr : &mesh;
    layout.placements = nullPlacements ? nullptr : placements.data();
    layout.boxes = boxes.empty() ? nullptr : boxes.data();
    layout.localStrides = strides.empty() ? nullptr : strides.data();
  }
  // Extent of dim d of mesh position 0's box (its local tensor), for breaks that need a box of >= 2 elements.
  // Only meaningful while the mesh is unbroken (a broken one is a poison already).
  int64_t box0Extent(int d) const {
    if (!boxes.empty()) return boxes[0].shape[d];
    int64_t n = shape[d];
    for (int a = 0; a < md; a++)
      if (placements[a] == d && dims[a] >= 1) n = chunkExtent(n, dims[a], 0);
    return n;
  }
  // Dim of position 0's box with an extent >= `least` in a box of at least one element; -1 if none.
  int box0Dim(int64_t least) const {
    int found = -1;
    for (int d = 0; d < nd; d++) {
      const int64_t e = box0Extent(d);
      if (e < 1) return -1;
      if (found < 0 && e >= least) found = d;
    }
    return found;
  }
  std::string describe() const;
};

std::string LayoutArgs::describe() const {
  if (nullLayout) return "NULL";
  std::string s;
  char buf[160];
  snprintf(buf, sizeof(buf), "{size %zu magic 0x%x ndims %d dtype %d shape", layout.size, layout.magic, layout.ndims,
           fuzz::dtypeInt(layout.dtype));
  s += buf;
  if (nullShape) s += " NULL";
  for (int d = 0; d < nd && !nullShape; d++) s += " " + std::to_string(shape[d]);
  if (nullMesh) {
    s += " mesh NULL";
  } else {
    snprintf(buf, sizeof(buf), " mesh{size %zu magic 0x%x ndims %d dims", mesh.size, mesh.magic, mesh.ndims);
    s += buf;
    if (nullDims) s += " NULL";
    for (int a = 0; a < md && !nullDims; a++) s += " " + std::to_string(dims[a]);
    s += " ranks";
    if (nullRanks) s += " NULL";
    for (int p = 0; p < std::min(positions(), 16) && !nullRanks; p++) s += " " + std::to_string(ranks[p]);
    if (positions() > 16) s += " ... (" + std::to_string(positions()) + ")";
    s += "}";
  }
  if (boxes.empty()) {
    s += " placements";
    if (nullPlacements) s += " NULL";
    for (int a = 0; a < md && !nullPlacements; a++) s += " " + std::to_string(placements[a]);
  } else {
    s += " boxes";
    for (int p = 0; p < std::min(positions(), 4); p++) {
      s += " [";
      for (int d = 0; d < nd; d++)
        s += std::to_string(boxes[p].offset[d]) + "+" + std::to_string(boxes[p].shape[d]) + (d + 1 < nd ? "," : "");
      s += "]";
    }
    if (positions() > 4) s += " ...";
  }
  if (!strides.empty()) {
    s += " strides";
    for (int i = 0; i < std::min(positions() * nd, 16); i++) s += " " + std::to_string(strides[i]);
    if (positions() * nd > 16) s += " ...";
  }
  s += "}";
  if (poison) s += std::string(" poison: ") + poison;
  return s;
}

// A tensor rank and shape: mostly small, sometimes empty (a 0 dim) or huge (up to 2^kHugeLog2 elements).
void makeShape(Rng& rng, LayoutArgs* l, bool mayBeHuge = true) {
  l->nd = rng.chance(1, 8) ? (int)rng.range(1, kDims) : (int)rng.range(1, 3);
  const bool huge = mayBeHuge && rng.chance(1, 20);
  int64_t total = 1;
  for (int d = 0; d < l->nd; d++) {
    int64_t n = rng.chance(1, 25) ? 0 : rng.range(1, rng.chance(1, 4) ? 1024 : 16);
    if (huge) n = rng.range(1, int64_t(1) << rng.range(8, kHugeLog2));
    const int64_t most = int64_t(1) << kHugeLog2;
    if (n > 0 && total > most / n) n = std::max<int64_t>(1, most / total);
    l->shape[d] = n;
    total = n ? total * n : total;
  }
  l->dtype = rng.pick(kDtypes);
}

void copyShape(const LayoutArgs& from, LayoutArgs* to) {
  to->nd = from.nd;
  to->shape = from.shape;
  to->dtype = from.dtype;
}

// Elements of the global tensor, saturating at INT64_MAX (a break may have made the shape huge).
int64_t elements(const LayoutArgs& l) {
  __int128 e = 1;
  for (int d = 0; d < l.nd; d++) e = std::min<__int128>(e * std::max<int64_t>(l.shape[d], 0), INT64_MAX);
  return (int64_t)e;
}

// `available`: ranks are drawn from [0, available), no rank twice.
void makeMesh(Rng& rng, int available, LayoutArgs* l) {
  const int cap = std::min(available, rng.chance(1, 50) ? 4096 : 64);
  l->md = rng.chance(1, 10) ? (int)rng.range(1, kMeshDims) : (int)rng.range(1, 3);
  int64_t positions = 1;
  for (int a = 0; a < l->md; a++) {
    const int64_t room = cap / positions;
    l->dims[a] = (int)rng.range(1, std::max<int64_t>(1, std::min<int64_t>(room, cap > 64 ? 64 : 8)));
    positions *= l->dims[a];
  }
  l->ranks.resize(positions);
  if (available <= 4 * positions + 64) {
    std::vector<int> all(available);
    for (int r = 0; r < available; r++) all[r] = r;
    for (int64_t p = 0; p < positions; p++) {
      std::swap(all[p], all[p + rng.below(available - p)]);
      l->ranks[p] = all[p];
    }
  } else {
    std::unordered_set<int> used;
    for (int64_t p = 0; p < positions; p++) {
      int r;
      do r = (int)rng.below(available);
      while (!used.insert(r).second);
      l->ranks[p] = r;
    }
  }
}

// Placements, or now and then explicit boxes. A source's boxes must hold every element some destination box needs,
// so `source` boxes mostly cover the tensor: a partition of one dim, the same partition with each chunk reaching one
// further (partly overlapping boxes), or replicas; and sometimes lie anywhere (then a gap is likely and is refused).
void makePlacementsOrBoxes(Rng& rng, bool source, LayoutArgs* l) {
  for (int a = 0; a < l->md; a++) l->placements[a] = rng.chance(1, 3) ? NCCL_M2N_REPLICATE : (int)rng.below(l->nd);
  const int P = l->positions();
  if (P > maxBoxPositions(l->nd) || !rng.chance(1, 4)) return;
  l->boxes.assign(P, ncclM2nBox_t{});
  const int mode = source && rng.chance(3, 4) ? (rng.chance(1, 2) ? 0 : rng.chance(1, 2) ? 3 : 2) : (int)rng.below(4);
  const int cut = (int)rng.below(l->nd);
  for (int p = 0; p < P; p++) {
    ncclM2nBox_t& b = l->boxes[p];
    for (int d = 0; d < l->nd; d++) {
      const int64_t n = l->shape[d];
      if ((mode == 0 || mode == 3) && d == cut) {  // a torch.chunk partition of one dim: covers the tensor once
        const int64_t c = (n + P - 1) / P;
        b.offset[d] = std::min(n, c * p);
        b.shape[d] = chunkExtent(n, P, p);
        if (mode == 3 && b.offset[d] + b.shape[d] < n) b.shape[d]++;  // overlaps the next chunk by one
      } else if (mode == 1) {                                         // anywhere inside the tensor
        b.offset[d] = (int64_t)rng.below((uint64_t)n + 1);
        b.shape[d] = (int64_t)rng.below((uint64_t)(n - b.offset[d]) + 1);
      } else {  // the whole dim (replicas)
        b.offset[d] = 0;
        b.shape[d] = n;
      }
    }
  }
}

// Strides of the whole global tensor in some dim order, with padding: valid (no alias, no overflow) for any box.
void makeStrides(Rng& rng, LayoutArgs* l) {
  if (elements(*l) > (int64_t(1) << 40) || !rng.chance(1, 4)) return;
  const int P = l->positions(), nd = l->nd;
  l->strides.assign((size_t)P * kDims, 0);
  int order[kDims];
  for (int d = 0; d < nd; d++) order[d] = d;
  const bool perPosition = rng.chance(1, 3);
  for (int p = 0; p < P; p++) {
    if (p == 0 || perPosition) {
      for (int d = nd - 1; d > 0; d--) std::swap(order[d], order[rng.below(d + 1)]);
    }
    int64_t s = rng.chance(1, 4) ? rng.range(1, 3) : 1;
    for (int k = nd - 1; k >= 0; k--) {
      const int d = order[k];
      l->strides[(size_t)p * nd + d] = s;
      s *= std::max<int64_t>(l->shape[d], 1) + (rng.chance(1, 4) ? rng.range(0, 3) : 0);
    }
  }
}

// Breaks `l` in zero or more ways. `nRanks` > 0: ranks must be below it. `dst`: destination strides must not alias.
void breakLayout(Rng& rng, int nRanks, bool dst, LayoutArgs* l) {
  const int breaks = rng.chance(1, 2) ? 0 : (int)rng.range(1, 3);
  const int P = l->positions(), nd = l->nd, md = l->md;
  for (int k = 0; k < breaks; k++) {
    switch (rng.below(26)) {
      case 0:
        l->nullLayout = true;
        l->setPoison("layout NULL");
        break;
      case 1: {
        const size_t sizes[] = {0, 8, sizeof(ncclM2nLayout_t) - 8, sizeof(ncclM2nLayout_t) + 8, SIZE_MAX};
        l->layout.size = rng.pick(sizes);
        l->setPoison("layout size");
        break;
      }
      case 2:
        l->layout.magic = rng.chance(1, 2) ? 0 : NCCL_M2N_MAGIC ^ (1u << rng.below(32));
        l->setPoison("layout magic");
        break;
      case 3: {
        const int bad[] = {0, -1, kDims + 1, 100, INT_MIN, INT_MAX};
        l->layout.ndims = rng.pick(bad);
        l->setPoison("tensor rank out of range");
        break;
      }
      case 4:
        l->nullShape = true;
        l->setPoison("globalShape NULL");
        break;
      case 5: {
        const int64_t bad[] = {-1, -2, INT64_MIN, INT64_MIN + 1};
        l->shape[rng.below(nd)] = rng.pick(bad);
        l->setPoison("negative global size");
        break;
      }
      case 6:  // products past 2^62, one dim or two (which overflow int64)
        if (nd >= 2 && rng.chance(1, 2)) {
          l->shape[0] = int64_t(1) << 32;
          l->shape[1] = int64_t(1) << rng.range(31, 62);
        } else {
          l->shape[0] = rng.chance(1, 2) ? INT64_MAX : kMaxElements + 1;
        }
        l->setPoison("global shape beyond 2^62 elements");
        break;
      case 7: {
        fuzz::storeDtype(&l->layout.dtype, rng.pick(kBadDtypes));
        l->setPoison("unknown dtype");
        break;
      }
      case 8:
        l->nullMesh = true;
        l->setPoison("mesh NULL");
        break;
      case 9:
        l->mesh.size = rng.chance(1, 2) ? 0 : sizeof(ncclM2nMesh_t) + 8;
        l->setPoison("mesh size");
        break;
      case 10:
        l->mesh.magic = NCCL_M2N_MAGIC + 1;
        l->setPoison("mesh magic");
        break;
      case 11: {
        const int bad[] = {0, -1, kMeshDims + 1, INT_MIN, INT_MAX};
        l->mesh.ndims = rng.pick(bad);
        l->setPoison("mesh rank out of range");
        break;
      }
      case 12:
        (rng.chance(1, 2) ? l->nullDims : l->nullRanks) = true;
        l->setPoison("mesh dims or ranks NULL");
        break;
      case 13: {  // rejected before the ranks are read, so the ranks array may stay short
        const int bad[] = {0, -1, INT_MIN, kMaxMeshPositions + 1, INT_MAX};
        l->dims[rng.below(md)] = rng.pick(bad);
        l->setPoison("mesh axis size out of range");
        break;
      }
      case 14:
        if (md >= 2) {
          l->dims[0] = l->dims[1] = 4097;  // 4097^2 > 2^24
          l->setPoison("mesh of more than 2^24 positions");
        }
        break;
      case 15:
        if (P >= 2) {
          const int i = (int)rng.below(P);
          int j = (int)rng.below(P - 1);
          j += j >= i;
          l->ranks[j] = l->ranks[i];
          l->setPoison("rank twice in a mesh");
        }
        break;
      case 16:
        l->ranks[rng.below(P)] = rng.chance(1, 2) ? -1 : INT_MIN;
        l->setPoison("negative mesh rank");
        break;
      case 17:
        if (nRanks > 0) {
          l->ranks[rng.below(P)] = rng.chance(1, 2) ? nRanks + (int)rng.below(4) : INT_MAX;
          l->setPoison("mesh rank beyond the communicator");
        }
        break;
      case 18:
        if (l->boxes.empty()) {
          l->nullPlacements = true;
          l->setPoison("placements NULL without boxes");
        }
        break;
      case 19:
        if (l->boxes.empty()) {
          const int bad[] = {-2, -3, nd, kDims, 100, INT_MIN, INT_MAX};
          l->placements[rng.below(md)] = rng.pick(bad);
          l->setPoison("placement shards no dim of the tensor");
        }
        break;
      case 20:
        if (!l->boxes.empty()) {
          ncclM2nBox_t& b = l->boxes[rng.below(P)];
          const int d = (int)rng.below(nd);
          switch (rng.below(3)) {
            case 0:
              b.offset[d] = rng.chance(1, 2) ? -1 : INT64_MIN;
              break;
            case 1:
              b.shape[d] = rng.chance(1, 2) ? -1 : INT64_MIN;
              break;
            default:
              b.offset[d] = l->shape[d];
              b.shape[d] = 1;
              break;
          }
          l->setPoison("box outside the tensor");
        }
        break;
      case 21:
        if (kBoxOverflowRejected && !l->boxes.empty()) {
          // offset + shape overflows int64 and wraps below the global size.
          ncclM2nBox_t& b = l->boxes[rng.below(P)];
          const int d = (int)rng.below(nd);
          b.offset[d] = INT64_MAX - (int64_t)rng.below(2);
          b.shape[d] = rng.range(2, 1 << 20);
          l->setPoison("box offset + shape overflows int64");
        }
        break;
      case 22:
        if (!l->strides.empty()) {
          l->strides[(size_t)rng.below(P) * nd + rng.below(nd)] = rng.chance(1, 2) ? -1 : INT64_MIN;
          l->setPoison("negative stride");
        }
        break;
      case 23:
        if (!l->strides.empty() && l->box0Dim(3) >= 0) {
          l->strides[l->box0Dim(3)] = INT64_MAX / 2 + 1;  // (extent - 1) * stride > INT64_MAX
          l->setPoison("strides whose span overflows int64");
        }
        break;
      case 24:
        if (dst && l->box0Dim(2) >= 0 && elements(*l) <= (int64_t(1) << 40)) {
          if (l->strides.empty()) {
            l->strides.assign((size_t)P * kDims, 0);
            for (int p = 1; p < P; p++) {  // the others row-major over the global tensor: valid for any box
              int64_t s = 1;
              for (int e = nd - 1; e >= 0; e--) {
                l->strides[p * nd + e] = s;
                s *= std::max<int64_t>(l->shape[e], 1);
              }
            }
          }
          for (int e = 0; e < nd; e++) l->strides[e] = 0;  // position 0: every element at one address
          l->setPoison("destination strides alias");
        }
        break;
      default:  // valid: a stride of 0 on the source (a broadcast); only before a poison, which it could undo
        if (!dst && !l->poison && !l->strides.empty()) l->strides[rng.below((uint64_t)P * nd)] = 0;
        break;
    }
  }
}

// One tensor pair of a batch, or one layout alone (dst unused).
struct Pair {
  LayoutArgs src, dst;
  std::string name;
};

void makePair(Rng& rng, int nRanks, Pair* t) {
  makeShape(rng, &t->src);
  copyShape(t->src, &t->dst);
  for (LayoutArgs* l : {&t->src, &t->dst}) {
    makeMesh(rng, nRanks, l);
    makePlacementsOrBoxes(rng, l == &t->src, l);
    makeStrides(rng, l);
  }
  if (rng.chance(1, 30)) {  // shapes or dtypes that differ between the two sides
    if (rng.chance(1, 2)) {
      const int d = (int)rng.below(t->dst.nd);
      t->dst.shape[d] += 1;
      for (ncclM2nBox_t& b : t->dst.boxes) b.offset[d] = b.shape[d] = 0;
      t->dst.setPoison("source and destination shapes differ");
    } else {  // a pair the executor does not convert (fp32 <-> bf16 it does: those stay valid)
      auto converted = [](ncclDataType_t a, ncclDataType_t b) {
        return (a == ncclFloat32 && b == ncclBfloat16) || (a == ncclBfloat16 && b == ncclFloat32);
      };
      while (t->dst.dtype == t->src.dtype || converted(t->src.dtype, t->dst.dtype)) t->dst.dtype = rng.pick(kDtypes);
      t->dst.setPoison("no conversion between the dtypes");
    }
  }
  t->src.bind(true);
  t->dst.bind(true);
  breakLayout(rng, nRanks, false, &t->src);
  breakLayout(rng, nRanks, true, &t->dst);
  t->src.bind(false);
  t->dst.bind(false);
  const int n = (int)rng.below(4);
  t->name = n == 0 ? "w" : n == 1 ? "" : n == 2 ? std::string(200, 'x') : "layers.7.mlp.experts.w1";
}

int drawRanks(Rng& rng) {
  const int64_t u = (int64_t)rng.below(1000);
  if (u < 300) return (int)rng.range(1, 8);
  if (u < 800) return (int)rng.range(9, 300);
  if (u < 950) return (int)rng.range(301, 4096);
  if (u < 999) return (int)rng.range(4097, 65536);
  return kMaxPlanRanks;
}

TEST(M2nFuzz, LayoutValidate) {
  Campaign c("M2nFuzz.LayoutValidate", 150000);
  c.run([&](Rng& rng, int64_t) {
    Pair t;
    // nRanks 0 leaves ranks unbounded; a negative bound is itself invalid.
    int bound = rng.chance(1, 5) ? 0 : drawRanks(rng);
    makeShape(rng, &t.src);
    makeMesh(rng, bound ? std::min(bound, 65536) : 4096, &t.src);
    makePlacementsOrBoxes(rng, rng.chance(1, 2), &t.src);
    makeStrides(rng, &t.src);
    t.src.bind(true);
    breakLayout(rng, bound, false, &t.src);  // destination aliasing is a batch rule: a layout alone may alias
    t.src.bind(false);
    const char* poison = t.src.poison;
    if (rng.chance(1, 50)) {
      bound = rng.chance(1, 2) ? -1 : INT_MIN;
      poison = "nRanks < 0";
    }
    c.describe([&] { return "nRanks " + std::to_string(bound) + " layout " + t.src.describe(); });
    const ncclResult_t r =
        c.call(Lib::kM2n, "ncclM2nLayoutValidate", [&] { return ncclM2nLayoutValidate(t.src.get(), bound); });
    c.expectRejected(r, "ncclM2nLayoutValidate", poison);
    // The local box of a layout: refused exactly when the layout is (ranks unbounded), never written past ndims.
    if (bound == 0) {
      int64_t off[NCCL_M2N_MAX_TENSOR_DIMS + 1], shp[NCCL_M2N_MAX_TENSOR_DIMS + 1];
      off[NCCL_M2N_MAX_TENSOR_DIMS] = shp[NCCL_M2N_MAX_TENSOR_DIMS] = 0x5a5a;
      int holds = -1;
      const int rank = (int)rng.range(0, 70000);
      const ncclResult_t b = c.call(Lib::kM2n, "ncclM2nLayoutLocalBox",
                                    [&] { return ncclM2nLayoutLocalBox(t.src.get(), rank, off, shp, &holds); });
      if ((b == ncclSuccess) != (r == ncclSuccess))
        c.fail("ncclM2nLayoutLocalBox and ncclM2nLayoutValidate disagree on the layout");
      if (b == ncclSuccess && (holds < 0 || holds > 1)) c.fail("ncclM2nLayoutLocalBox: holds not 0 or 1");
      if (off[NCCL_M2N_MAX_TENSOR_DIMS] != 0x5a5a || shp[NCCL_M2N_MAX_TENSOR_DIMS] != 0x5a5a)
        c.fail("ncclM2nLayoutLocalBox wrote past its arrays");
    }
  });
}

struct Batch {
  std::deque<Pair> pairs;
  std::vector<ncclM2nTensorSpec_t> specs;
  std::vector<int> domainOfRank;
  ncclM2nPlanConfig_t cfg = NCCL_M2N_PLAN_CONFIG_INITIALIZER;
  int rank = 0, nTensors = 0;
  bool nullPlan = false, nullConfig = false, nullTensors = false;
  const char* poison = nullptr;
  void setPoison(const char* why) {
    if (!poison) poison = why;
  }
  std::string describe() const {
    std::string s = "rank " + std::to_string(rank) + " nTensors " + std::to_string(nTensors) +
                    (nullPlan ? " plan NULL" : "") + (nullTensors ? " tensors NULL" : "");
    if (nullConfig) {
      s += " config NULL";
    } else {
      char buf[160];
      snprintf(buf, sizeof(buf), " config{size %zu magic 0x%x nRanks %d ranksPerDomain %d domainOfRank %s}", cfg.size,
               cfg.magic, cfg.nRanks, cfg.ranksPerDomain, cfg.domainOfRank ? "[...]" : "NULL");
      s += buf;
    }
    for (size_t t = 0; t < pairs.size() && t < 4; t++)
      s += "\n    tensor " + std::to_string(t) + " src " + pairs[t].src.describe() + "\n    tensor " +
           std::to_string(t) + " dst " + pairs[t].dst.describe();
    if (pairs.size() > 4) s += "\n    ... " + std::to_string(pairs.size()) + " tensors";
    if (poison) s += std::string("\n    poison: ") + poison;
    return s;
  }
};

// A batch of `n` tensors for a communicator of `nRanks`, then broken at the call level too.
void makeBatch(Rng& rng, int nRanks, int n, Batch* b) {
  b->cfg.nRanks = nRanks;
  b->pairs.resize(n);
  b->specs.resize(n);
  for (int t = 0; t < n; t++) {
    Pair& p = b->pairs[t];
    makePair(rng, nRanks, &p);
    b->specs[t].name = rng.chance(1, 10) ? nullptr : p.name.c_str();
    b->specs[t].src = p.src.get();
    b->specs[t].dst = p.dst.get();
  }
  b->nTensors = n;
  b->rank = (int)rng.below(nRanks);
  if (rng.chance(1, 4)) b->cfg.ranksPerDomain = (int)rng.range(0, std::max(1, nRanks));
  if (nRanks <= 65536 && rng.chance(1, 4)) {
    b->domainOfRank.resize(nRanks);
    for (int& d : b->domainOfRank) d = rng.chance(1, 20) ? (int)rng.next() : (int)rng.below(4);
    b->cfg.domainOfRank = b->domainOfRank.data();
  }
  if (rng.chance(1, 2)) return;
  switch (rng.below(12)) {
    case 0:
      b->nullPlan = true;
      b->setPoison("plan NULL");
      break;
    case 1:
      b->nullConfig = true;
      b->setPoison("config NULL");
      break;
    case 2:
      b->cfg.size = rng.chance(1, 2) ? 0 : sizeof(b->cfg) - 8;
      b->setPoison("config size");
      break;
    case 3:
      b->cfg.magic = 0x12345678u;
      b->setPoison("config magic");
      break;
    case 4: {
      const int bad[] = {0, -1, INT_MIN, kMaxPlanRanks + 1, INT_MAX};
      b->cfg.nRanks = rng.pick(bad);
      b->cfg.domainOfRank = nullptr;  // it would have to hold nRanks entries
      b->setPoison("communicator size out of range");
      break;
    }
    case 5: {
      const int bad[] = {-1, nRanks, nRanks + 1, INT_MIN, INT_MAX};
      b->rank = rng.pick(bad);
      b->setPoison("rank outside the communicator");
      break;
    }
    case 6:
      b->cfg.ranksPerDomain = rng.chance(1, 2) ? -1 : INT_MIN;
      b->setPoison("ranksPerDomain < 0");
      break;
    case 7:
      b->nTensors = rng.chance(1, 2) ? -1 : INT_MIN;
      b->setPoison("nTensors < 0");
      break;
    case 8:
      if (n > 0) {
        b->nullTensors = true;
        b->setPoison("tensors NULL");
      }
      break;
    case 9:
      b->nTensors = (int)rng.below((uint64_t)n + 1);
      break;  // a prefix of the batch
    case 10:
      b->cfg.ranksPerDomain = INT_MAX;
      break;
    default:
      b->nTensors = 0;
      b->nullTensors = rng.chance(1, 2);
      break;  // an empty batch: valid
  }
  __int128 bytes = 0;
  for (int t = 0; t < b->nTensors && !b->nullTensors; t++) {
    const LayoutArgs& d = b->pairs[t].dst;
    b->setPoison(b->pairs[t].src.poison);
    b->setPoison(d.poison);
    bytes += (__int128)elements(d) * fuzz::dtypeBytes(d.dtype) * d.positions();
  }
  if (bytes > kMaxPlanBytes) b->setPoison("the batch delivers more than 2^62 bytes");
}

// Checks a plan the library accepted against the header's promises, then destroys it.
void checkPlan(Campaign& c, const Batch& b, ncclM2nHostPlan_t plan) {
  ncclM2nPlanInfo_t info;
  memset(&info, 0xa5, sizeof(info));
  if (c.call(Lib::kM2n, "ncclM2nHostPlanGetInfo", [&] { return ncclM2nHostPlanGetInfo(plan, &info); }) != ncclSuccess) {
    c.fail("ncclM2nHostPlanGetInfo failed on a plan it made");
    return;
  }
  const ncclResult_t r =
      c.call(Lib::kM2n, "ncclM2nHostPlanGetInfo", [&] { return ncclM2nHostPlanGetInfo(plan, nullptr); });
  c.expectRejected(r, "ncclM2nHostPlanGetInfo", "info NULL");
  const int nRanks = b.cfg.nRanks;
  if (info.totalBytes < 0 || info.interDomainBytes < 0 || info.interDomainBytes > info.totalBytes)
    c.fail("plan info: totalBytes " + std::to_string(info.totalBytes) + ", interDomainBytes " +
           std::to_string(info.interDomainBytes));
  if (!(info.maxSourceLoad >= info.meanSourceLoad * (1 - 1e-12) && info.meanSourceLoad >= 0))  // doubles: rounding
    c.fail("plan info: maxSourceLoad " + std::to_string(info.maxSourceLoad) + " < meanSourceLoad " +
           std::to_string(info.meanSourceLoad));
  for (int k = 0; k < 3; k++) {
    const ncclM2nTransfer_t* list = nullptr;
    int64_t n = -1;
    if (c.call(Lib::kM2n, "ncclM2nHostPlanGetTransfers",
               [&] { return ncclM2nHostPlanGetTransfers(plan, (ncclM2nTransferKind_t)k, &list, &n); }) != ncclSuccess) {
      c.fail("ncclM2nHostPlanGetTransfers failed for kind " + std::to_string(k));
      continue;
    }
    if (n != info.counts[k] || (n > 0 && list == nullptr)) {
      c.fail("kind " + std::to_string(k) + ": " + std::to_string(n) + " transfers, info.counts says " +
             std::to_string(info.counts[k]));
      continue;
    }
    __int128 bytes = 0;
    for (int64_t i = 0; i < n; i++) {
      const ncclM2nTransfer_t& t = list[i];
      const bool kindOk = k == ncclM2nSends   ? t.srcRank == b.rank && t.dstRank != b.rank
                          : k == ncclM2nRecvs ? t.dstRank == b.rank && t.srcRank != b.rank
                                              : t.srcRank == b.rank && t.dstRank == b.rank;
      bool ok = kindOk && t.tensor >= 0 && t.tensor < b.nTensors && t.srcRank >= 0 && t.srcRank < nRanks &&
                t.dstRank >= 0 && t.dstRank < nRanks && t.ndims >= 0 && t.ndims <= kDims;
      __int128 e = 1;
      for (int d = 0; ok && d < t.ndims; d++) {
        ok = t.extent[d] >= 1;
        e *= t.extent[d];
      }
      if (!ok) {
        c.fail("kind " + std::to_string(k) + " transfer " + std::to_string(i) + ": tensor " + std::to_string(t.tensor) +
               " " + std::to_string(t.srcRank) + " -> " + std::to_string(t.dstRank) + ", ndims " +
               std::to_string(t.ndims) + " (rank " + std::to_string(b.rank) + ")");
        break;
      }
      bytes += e * fuzz::dtypeBytes(b.pairs[t.tensor].dst.dtype);  // destination-typed, as the wire carries them
    }
    if (bytes != (__int128)info.bytes[k])
      c.fail("kind " + std::to_string(k) + ": transfers hold " + std::to_string((long long)bytes) +
             " bytes, info.bytes says " + std::to_string(info.bytes[k]));
  }
  {
    const int bad[] = {-1, 3, 4, INT_MIN, INT_MAX};
    const ncclM2nTransfer_t* sentinel = reinterpret_cast<const ncclM2nTransfer_t*>(&b);
    const ncclM2nTransfer_t* list = sentinel;
    int64_t n = -7;
    const int kind = bad[b.rank % 5];
    const ncclResult_t r = c.call(Lib::kM2n, "ncclM2nHostPlanGetTransfers", [&] {
      return ncclM2nHostPlanGetTransfers(plan, (ncclM2nTransferKind_t)kind, &list, &n);
    });
    c.expectRejected(r, "ncclM2nHostPlanGetTransfers", "unknown kind");
    if (list != sentinel || n != -7) c.fail("ncclM2nHostPlanGetTransfers wrote its outputs on failure");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nHostPlanGetTransfers",
                            [&] { return ncclM2nHostPlanGetTransfers(plan, ncclM2nSends, nullptr, &n); }),
                     "ncclM2nHostPlanGetTransfers", "transfers NULL");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nHostPlanGetTransfers",
                            [&] { return ncclM2nHostPlanGetTransfers(plan, ncclM2nRecvs, &list, nullptr); }),
                     "ncclM2nHostPlanGetTransfers", "count NULL");
  }
  if (c.call(Lib::kM2n, "ncclM2nHostPlanDestroy", [&] { return ncclM2nHostPlanDestroy(plan); }) != ncclSuccess)
    c.fail("ncclM2nHostPlanDestroy failed");
}

// Plans the batch; a plan that comes back is checked and destroyed, and now and then compared with another rank's
// plan of the same batch (the header: same metadata, same hashes on every rank).
void planBatch(Campaign& c, Rng& rng, const Batch& b) {
  ncclM2nHostPlan_t plan = reinterpret_cast<ncclM2nHostPlan_t>(0x1);
  const ncclResult_t r = c.call(Lib::kM2n, "ncclM2nHostPlanCreate", [&] {
    return ncclM2nHostPlanCreate(b.nullPlan ? nullptr : &plan, b.rank, b.nTensors,
                                 b.nullTensors ? nullptr : b.specs.data(), b.nullConfig ? nullptr : &b.cfg);
  });
  c.expectRejected(r, "ncclM2nHostPlanCreate", b.poison);
  if (b.nullPlan) return;
  if (r != ncclSuccess) {
    if (plan != nullptr) c.fail("ncclM2nHostPlanCreate failed but left *plan non-NULL");
    return;
  }
  if (plan == nullptr) {
    c.fail("ncclM2nHostPlanCreate succeeded with *plan NULL");
    return;
  }
  // Both layouts of every tensor of an accepted batch pass on their own.
  for (int t = 0; t < b.nTensors && t < 2; t++)
    for (const ncclM2nLayout_t* l : {b.specs[t].src, b.specs[t].dst})
      if (c.call(Lib::kM2n, "ncclM2nLayoutValidate", [&] { return ncclM2nLayoutValidate(l, b.cfg.nRanks); }) !=
          ncclSuccess)
        c.fail(std::string("a layout of an accepted batch fails ncclM2nLayoutValidate: ") + ncclM2nGetLastError());
  ncclM2nPlanInfo_t info{};
  ncclM2nHostPlanGetInfo(plan, &info);
  if (rng.chance(1, 8)) {
    ncclM2nHostPlan_t other = nullptr;
    const int rank2 = (int)rng.below((uint64_t)b.cfg.nRanks);
    if (c.call(Lib::kM2n, "ncclM2nHostPlanCreate", [&] {
          return ncclM2nHostPlanCreate(&other, rank2, b.nTensors, b.nullTensors ? nullptr : b.specs.data(), &b.cfg);
        }) != ncclSuccess) {
      c.fail("the batch planned for rank " + std::to_string(b.rank) + " is refused for rank " + std::to_string(rank2));
    } else {
      ncclM2nPlanInfo_t info2{};
      ncclM2nHostPlanGetInfo(other, &info2);
      if (info2.metadataHash != info.metadataHash || info2.planHash != info.planHash ||
          info2.totalBytes != info.totalBytes)
        c.fail("ranks " + std::to_string(b.rank) + " and " + std::to_string(rank2) + " disagree on the global plan");
      ncclM2nHostPlanDestroy(other);
    }
  }
  checkPlan(c, b, plan);
}

TEST(M2nFuzz, HostPlan) {
  Campaign c("M2nFuzz.HostPlan", 100000);
  c.run([&](Rng& rng, int64_t) {
    Batch b;
    makeBatch(rng, drawRanks(rng), (int)(rng.chance(1, 10) ? rng.range(0, 16) : rng.range(1, 3)), &b);
    c.describe([&] { return b.describe(); });
    planBatch(c, rng, b);
  });
}

// Thousands of tensors in one batch, valid or with one broken tensor somewhere (the error path frees the rest).
TEST(M2nFuzz, OversizedBatches) {
  Campaign c("M2nFuzz.OversizedBatches", 30);
  c.run([&](Rng& rng, int64_t) {
    Batch b;
    const int nRanks = (int)rng.range(1, 64);
    const int n = (int)rng.range(1000, 4000);
    b.cfg.nRanks = nRanks;
    b.pairs.resize(n);
    b.specs.resize(n);
    const int broken = rng.chance(1, 3) ? (int)rng.below(n) : -1;
    for (int t = 0; t < n; t++) {
      Pair& p = b.pairs[t];
      Rng local(rng.next());
      makeShape(local, &p.src, false);  // thousands of huge tensors would pass the 2^62 bytes of a batch
      copyShape(p.src, &p.dst);
      for (LayoutArgs* l : {&p.src, &p.dst}) {
        makeMesh(local, std::min(nRanks, 8), l);
        makePlacementsOrBoxes(local, l == &p.src, l);
        // A gap anywhere refuses the whole batch: the sources of a big valid batch cover their tensors.
        if (l == &p.src && !l->boxes.empty()) {
          for (int q = 0; q < l->positions(); q++)
            for (int d = 0; d < l->nd; d++) l->boxes[q].offset[d] = 0, l->boxes[q].shape[d] = l->shape[d];
        }
        makeStrides(local, l);
        l->bind(true);
      }
      if (t == broken) {
        while (!p.src.poison && !p.dst.poison) breakLayout(local, nRanks, true, &p.dst);
        p.src.bind(false);
        p.dst.bind(false);
        b.setPoison(p.dst.poison ? p.dst.poison : p.src.poison);
      }
      p.name = "t" + std::to_string(t);
      b.specs[t] = {p.name.c_str(), p.src.get(), p.dst.get()};
    }
    b.nTensors = n;
    b.rank = (int)rng.below(nRanks);
    c.describe([&] { return b.describe(); });
    planBatch(c, rng, b);
  });
}

TEST(M2nFuzz, VersionAndErrors) {
  Campaign c("M2nFuzz.VersionAndErrors", 2000);
  c.run([&](Rng& rng, int64_t) {
    int v = -5, built = -5, loaded = -5;
    const bool nullV = rng.chance(1, 2);
    c.describe([&] { return std::string("version ") + (nullV ? "NULL" : "&v"); });
    const ncclResult_t r =
        c.call(Lib::kM2n, "ncclM2nGetVersion", [&] { return ncclM2nGetVersion(nullV ? nullptr : &v); });
    if (nullV) {
      c.expectRejected(r, "ncclM2nGetVersion", "version NULL");
    } else if (r != ncclSuccess || v != NCCL_M2N_VERSION_CODE) {
      c.fail("ncclM2nGetVersion: " + std::to_string(v));
    }
    const bool nb = rng.chance(1, 2), nl = rng.chance(1, 2);
    const ncclResult_t rr = c.call(Lib::kM2n, "ncclM2nCheckNcclRuntime", [&] {
      return ncclM2nCheckNcclRuntime(nb ? nullptr : &built, nl ? nullptr : &loaded);
    });
    if (rr == ncclSuccess && ((!nb && built <= 0) || (!nl && loaded <= 0)))
      c.fail("ncclM2nCheckNcclRuntime succeeded without versions");
    if (ncclM2nGetLastError() == nullptr) c.fail("ncclM2nGetLastError returned NULL");
    // The plan functions on a NULL plan: rejected (Destroy: a no-op).
    ncclM2nPlanInfo_t info, before;
    memset(&info, 0x5a, sizeof(info));
    before = info;
    c.expectRejected(
        c.call(Lib::kM2n, "ncclM2nHostPlanGetInfo", [&] { return ncclM2nHostPlanGetInfo(nullptr, &info); }),
        "ncclM2nHostPlanGetInfo", "plan NULL");
    if (memcmp(&info, &before, sizeof(info)) != 0) c.fail("ncclM2nHostPlanGetInfo wrote its output on failure");
    const ncclM2nTransfer_t* list = nullptr;
    int64_t n = 0;
    c.expectRejected(
        c.call(
            Lib::kM2n, "ncclM2nHostPlanGetTransfers",
            [&] { return ncclM2nHostPlanGetTransfers(nullptr, (ncclM2nTransferKind_t)rng.range(-2, 4), &list, &n); }),
        "ncclM2nHostPlanGetTransfers", "plan NULL");
    if (c.call(Lib::kM2n, "ncclM2nHostPlanDestroy", [&] { return ncclM2nHostPlanDestroy(nullptr); }) != ncclSuccess)
      c.fail("ncclM2nHostPlanDestroy(NULL) failed");
  });
}

TEST(M2nFuzz, ExecutionPlanArguments) {
  // The executor's entry points with what the CPU can give them: NULL outputs, communicators and plans, and
  // configs of the wrong size or magic. Each must be refused before any communicator is touched.
  Campaign c("M2nFuzz.ExecutionPlanArguments", 2000);
  c.run([&](Rng& rng, int64_t) {
    ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
    const int kind = (int)rng.range(0, 4);
    if (kind == 1) cfg.size = (size_t)rng.range(0, 200);
    if (kind == 2) cfg.magic ^= 1u << rng.range(0, 31);
    if (kind == 3) cfg.timeoutSeconds = -1;
    const bool nullPlan = rng.chance(1, 3);
    ncclM2nPlan_t plan = reinterpret_cast<ncclM2nPlan_t>(0x1);
    // A communicator is never passed (none exists without a GPU): NULL, so the call must refuse it or the config.
    c.describe([&] { return "config kind " + std::to_string(kind) + (nullPlan ? ", plan NULL" : ""); });
    const ncclResult_t r = c.call(Lib::kM2n, "ncclM2nPlanCreate", [&] {
      return ncclM2nPlanCreate(nullPlan ? nullptr : &plan, nullptr, 0, nullptr, &cfg);
    });
    c.expectRejected(r, "ncclM2nPlanCreate", "comm NULL");
    if (!nullPlan && plan != nullptr) c.fail("ncclM2nPlanCreate left *plan set on failure");
    const ncclResult_t e =
        c.call(Lib::kM2n, "ncclM2nExecute", [&] { return ncclM2nExecute(nullptr, nullptr, nullptr, nullptr); });
    c.expectRejected(e, "ncclM2nExecute", "plan NULL");
    if (c.call(Lib::kM2n, "ncclM2nPlanDestroy", [&] { return ncclM2nPlanDestroy(nullptr); }) != ncclSuccess)
      c.fail("ncclM2nPlanDestroy(NULL) failed");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nPlanGetAsyncError", [&] { return ncclM2nPlanGetAsyncError(nullptr); }),
                     "ncclM2nPlanGetAsyncError", "plan NULL");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nPlanSetStageHookTesting",
                            [&] { return ncclM2nPlanSetStageHookTesting(nullptr, nullptr, nullptr); }),
                     "ncclM2nPlanSetStageHookTesting", "plan NULL");
    // The one-shot reshard: a NULL spec, or (with a spec) the NULL communicator or the bad config, refused.
    ncclM2nTensorSpec_t spec = {"t", nullptr, nullptr};
    const bool nullSpec = rng.chance(1, 2);
    const ncclResult_t o = c.call(Lib::kM2n, "ncclM2nReshard", [&] {
      return ncclM2nReshard(nullptr, nullSpec ? nullptr : &spec, nullptr, nullptr, rng.chance(1, 2) ? &cfg : nullptr,
                            nullptr);
    });
    c.expectRejected(o, "ncclM2nReshard", nullSpec ? "spec NULL" : "comm NULL");
    // Keeping the exchange communicator: the NULL communicator refused, with or without the bad config.
    const ncclResult_t k = c.call(Lib::kM2n, "ncclM2nCommRetain", [&] {
      return ncclM2nCommRetain(nullptr, rng.chance(1, 2) ? &cfg : nullptr);
    });
    c.expectRejected(k, "ncclM2nCommRetain", "comm NULL");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nCommRelease", [&] { return ncclM2nCommRelease(nullptr); }),
                     "ncclM2nCommRelease", "comm NULL");
    // Zero-copy registration: a NULL communicator, buffer or handle refused (*reg cleared), a NULL one released.
    ncclM2nRegistration_t reg = reinterpret_cast<ncclM2nRegistration_t>(static_cast<uintptr_t>(0x40));
    const bool nullOut = rng.chance(1, 3);
    void* buf = rng.chance(1, 2) ? nullptr : reinterpret_cast<void*>(static_cast<uintptr_t>(0x10000));
    const ncclResult_t rg = c.call(Lib::kM2n, "ncclM2nRegister", [&] {
      return ncclM2nRegister(nullptr, buf, (size_t)rng.below(1 << 20), nullOut ? nullptr : &reg);
    });
    c.expectRejected(rg, "ncclM2nRegister", nullOut ? "reg NULL" : "comm NULL");
    if (!nullOut && reg != nullptr) c.fail("ncclM2nRegister left *reg set on failure");
    c.expectRejected(c.call(Lib::kM2n, "ncclM2nDeregister", [&] { return ncclM2nDeregister(nullptr); }),
                     "ncclM2nDeregister", "reg NULL");
  });
}

// The one-GPU test mode (nccl_m2n_testing.h): virtual domains of any size, and plan creation with a testing config
// of any size, magic and virtual rank, with or without a domain. The communicator is NULL, so every call is refused.
TEST(M2nFuzz, TestingMode) {
  Campaign c("M2nFuzz.TestingMode", 5000);
  c.run([&](Rng& rng, int64_t) {
    const int bad[] = {0, -1, 9, 64, INT_MIN, INT_MAX};
    const int n = rng.chance(1, 3) ? rng.pick(bad) : (int)rng.range(1, 8);
    const bool nullOut = rng.chance(1, 20);
    ncclM2nVirtualDomain_t d = nullptr;
    c.describe([&] {
      return std::string("ncclM2nVirtualDomainCreate(") + (nullOut ? "NULL" : "&d") + ", " + std::to_string(n) + ")";
    });
    const ncclResult_t r = c.call(Lib::kM2n, "ncclM2nVirtualDomainCreate",
                                  [&] { return ncclM2nVirtualDomainCreate(nullOut ? nullptr : &d, n); });
    c.expectRejected(r, "ncclM2nVirtualDomainCreate", nullOut ? "domain NULL" : n < 1 || n > 8 ? "nRanks not in 1..8"
                                                                                              : nullptr);
    if (r != ncclSuccess && d != nullptr) c.fail("ncclM2nVirtualDomainCreate failed but wrote a domain");
    if (r == ncclSuccess && d == nullptr) c.fail("ncclM2nVirtualDomainCreate succeeded without a domain");
    ncclM2nTestingConfig_t t = NCCL_M2N_TESTING_CONFIG_INITIALIZER;
    const int kind = (int)rng.range(0, 3);
    if (kind == 1) t.size = (size_t)rng.range(0, 200);
    if (kind == 2) t.magic ^= 1u << rng.range(0, 31);
    t.virtualDomain = rng.chance(3, 4) ? d : nullptr;
    t.virtualRank = rng.chance(1, 2) ? (int)rng.range(0, 7) : rng.pick(bad);
    const bool nullTesting = rng.chance(1, 10), nullPlan = rng.chance(1, 10);
    ncclM2nPlan_t plan = reinterpret_cast<ncclM2nPlan_t>(0x1);
    c.describe([&] {
      return "ncclM2nPlanCreateTesting(" + std::string(nullPlan ? "NULL" : "&plan") + ", NULL, 0, NULL, NULL, " +
             (nullTesting ? std::string("NULL") : "{size " + std::to_string(t.size) + " magic " +
                                                     std::to_string(t.magic) + " domain " +
                                                     (t.virtualDomain ? "set" : "NULL") + " virtualRank " +
                                                     std::to_string(t.virtualRank) + "}") +
             ")";
    });
    const ncclResult_t rp = c.call(Lib::kM2n, "ncclM2nPlanCreateTesting", [&] {
      return ncclM2nPlanCreateTesting(nullPlan ? nullptr : &plan, nullptr, 0, nullptr, nullptr,
                                      nullTesting ? nullptr : &t);
    });
    c.expectRejected(rp, "ncclM2nPlanCreateTesting", "comm NULL");
    if (!nullPlan && plan != nullptr) c.fail("ncclM2nPlanCreateTesting left *plan set on failure");
    const ncclResult_t rd =
        c.call(Lib::kM2n, "ncclM2nVirtualDomainDestroy", [&] { return ncclM2nVirtualDomainDestroy(d); });
    if (rd != ncclSuccess) c.fail("ncclM2nVirtualDomainDestroy returned " + std::string(ncclGetErrorString(rd)));
  });
}

}  // namespace
