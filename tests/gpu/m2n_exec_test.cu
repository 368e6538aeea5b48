// GPU test of the nccl_m2n executor (ncclM2nPlanCreate / Execute / PlanDestroy) on random batches.
//
// Every rank draws the same batches (tests/unit/m2n_random.h: disjoint, overlapping and co-located meshes, uneven
// shards, several sharded axes, explicit boxes, strided locals; dtypes of 1, 2, 4 and 8 bytes; every third batch
// converts fp32 <-> bf16 in flight, checked against move.h's host conversion) from one seed.
// Source slots hold a value that names (tensor, global element); the slots between a strided tensor's elements hold
// a hole marker; destinations are poisoned. After the execute every destination element must hold its own value
// and every other destination byte its poison. The staging cap is small, so that streams take many chunks. Then:
// a CUDA graph of one execute, replayed with fresh source values; and a batch that one rank names differently,
// which every rank must refuse with a message naming that tensor. Every fifth batch's first tensor also goes through
// the one-shot ncclM2nReshard. Then the device's e4m3 conversion against numeric.h's on every fp32 (e4m3AgreeCase),
// and fp8 e4m3 with block scales (fp8Cases) against numeric.h's quantiser.
//
// --dead-peer: see runDeadPeer (the watchdog that bounds an execute whose peer died; with virtual ranks, the LSA
// barrier that bounds an execute whose peer never comes).
//
// The modes: real ranks and one-GPU nodes move everything between ranks by ncclSend/ncclRecv (each node its own
// domain); virtual ranks (--one-gpu virtual: one domain) move everything over LSA through the plans' windows.
//
// Usage: m2n_exec_test [--nranks N] [--one-gpu off|nodes|virtual] [--cases C] [--seed S] [--json FILE]
//                      [--dead-peer --timeout-s S]
// Exit: 0 pass, 1 fail, 77 no GPU.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/device_status.h"
#include "common/status.h"
#include "nccl_m2n.h"
#include "nccl_m2n_testing.h"
#include "nccl_m2n/src/layout.h"
#include "nccl_m2n/src/move.h"
#include "nccl_m2n/src/quantize.h"
#include "tests/harness/cli.h"
#include "tests/harness/launcher.h"
#include "tests/unit/m2n_elements.h"
#include "tests/unit/m2n_random.h"
#include "tests/unit/m2n_test_util.h"

namespace {

using namespace ncclm2n;

struct Options {
  int nRanks = 0, cases = 120;
  bool deadPeer = false;
  double timeoutSeconds = 3;  // --dead-peer: the plan's budget
  uint64_t seed = 0;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  std::string json;
  ncclM2nVirtualDomain_t virt = nullptr;  // --one-gpu virtual: the library's in-process domain
};

// A plan's config on this rank.
ncclM2nExecConfig_t configFor(const ncclext::harness::RankContext&, const Options&, double timeoutSeconds) {
  ncclM2nExecConfig_t cfg = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  cfg.timeoutSeconds = timeoutSeconds;
  return cfg;
}

// ncclM2nPlanCreate on this rank (virtual ranks: with the domain and this thread's rank in it).
ncclResult_t createPlan(ncclM2nPlan_t* plan, const ncclext::harness::RankContext& ctx, const Options& o, int nTensors,
                        const ncclM2nTensorSpec_t* specs, const ncclM2nExecConfig_t* cfg) {
  ncclM2nTestingConfig_t testing = NCCL_M2N_TESTING_CONFIG_INITIALIZER;
  testing.virtualDomain = o.virt;
  testing.virtualRank = o.virt ? ctx.rank : 0;
  return ncclM2nPlanCreateTesting(plan, ctx.comm, nTensors, specs, cfg, &testing);
}

using testing::forEachElement;
using testing::globalLinear;

uint64_t valueOf(uint64_t round, size_t t, int64_t linear) { return testing::elementValue(round, t, linear); }

// The public descriptors of one side of a tensor, with the arrays they point into.
struct CLayout {
  std::vector<int> dims, ranks, placements;
  std::vector<int64_t> shape, strides;
  std::vector<ncclM2nBox_t> boxes;
  ncclM2nMesh_t mesh = NCCL_M2N_MESH_INITIALIZER;
  ncclM2nLayout_t layout = NCCL_M2N_LAYOUT_INITIALIZER;
  void from(const Layout& l) {
    dims = l.mesh.dims;
    ranks = l.mesh.ranks;
    placements = l.placements;
    shape = l.globalShape;
    strides = l.strides;
    boxes.clear();
    for (const Box& b : l.boxes) {
      ncclM2nBox_t c = {};
      for (int d = 0; d < b.ndims; d++) {
        c.offset[d] = b.offset[d];
        c.shape[d] = b.shape[d];
      }
      boxes.push_back(c);
    }
    mesh.ndims = (int)dims.size();
    mesh.dims = dims.data();
    mesh.ranks = ranks.data();
    layout.ndims = (int)shape.size();
    layout.globalShape = shape.data();
    layout.dtype = l.dtype;
    layout.mesh = &mesh;
    layout.placements = placements.data();
    layout.boxes = boxes.empty() ? nullptr : boxes.data();
    layout.localStrides = strides.empty() ? nullptr : strides.data();
  }
};

struct Batch {
  Problem p;
  std::vector<std::unique_ptr<CLayout>> src, dst;
  std::vector<ncclM2nTensorSpec_t> specs;
  void build() {
    for (const TensorPair& tp : p.tensors) {
      src.emplace_back(new CLayout());
      src.back()->from(tp.src);
      dst.emplace_back(new CLayout());
      dst.back()->from(tp.dst);
    }
    for (size_t t = 0; t < p.tensors.size(); t++)
      specs.push_back({p.tensors[t].name.c_str(), &src[t]->layout, &dst[t]->layout});
  }
};

// This rank's local tensors of a batch: host images and device copies.
struct Locals {
  std::vector<std::vector<char>> srcHost, dstHost;
  std::vector<void*> srcDev, dstDev;
  cudaStream_t stream = nullptr;
  Locals() = default;
  Locals(cudaStream_t s, size_t nt) : srcHost(nt), dstHost(nt), srcDev(nt, nullptr), dstDev(nt, nullptr), stream(s) {}
  ~Locals() {
    for (void* p : srcDev) if (p) cudaFreeAsync(p, stream);
    for (void* p : dstDev) if (p) cudaFreeAsync(p, stream);
  }
};

int positionOf(const Mesh& m, int rank) {
  for (int i = 0; i < m.size(); i++)
    if (m.ranks[i] == rank) return i;
  return -1;
}

// ncclM2nPlanSetStageHookTesting's record of one execute: the names, in the order given.
void recordStage(void* user, const char* stage, cudaStream_t) {
  static_cast<std::vector<std::string>*>(user)->push_back(stage);
}

// The stages in the header's order: pointers? quantize? copies? direct? (publish barrier remote)?, then the rounds'
// pack, exchange, barrier and unpack (a round's in that order; pipelined rounds pack one round ahead: never more
// unpacks than packs so far, as many in the end), then final barrier?; at least one stage.
bool stagesInOrder(const std::vector<std::string>& v) {
  size_t i = 0;
  auto take = [&](const char* s) { return i < v.size() && v[i] == s ? (i++, true) : false; };
  take("pointers");
  take("quantize");
  take("copies");
  take("direct");
  if (take("publish") && !(take("barrier") && take("remote"))) return false;
  int packs = 0, unpacks = 0;
  for (;;) {
    if (take("pack")) {
      packs++;
    } else if (take("unpack")) {
      if (++unpacks > packs) return false;
    } else if (!take("exchange") && !take("barrier")) {
      break;
    }
  }
  take("final barrier");
  return !v.empty() && i == v.size() && packs == unpacks;
}

bool fillSources(const Problem& p, int rank, uint64_t round, Locals* L) {
  for (size_t t = 0; t < p.tensors.size(); t++) {
    const TensorPair& tp = p.tensors[t];
    const int pos = positionOf(tp.src.mesh, rank);
    if (pos < 0) continue;
    const ShardGrid g(tp.src);
    const int64_t eb = (int64_t)elementSize(tp.src.dtype);
    std::vector<char>& h = L->srcHost[t];
    h.assign(std::max<int64_t>(g.localSpan(pos), 1) * eb, (char)0xee);
    forEachElement(g, pos, tp.src.ndims(), [&](const int64_t* gi, int64_t off) {
      const uint64_t v = valueOf(round, t, globalLinear(tp.src, gi));
      memcpy(&h[off * eb], &v, eb);
    });
    if (!L->srcDev[t] && cudaMallocAsync(&L->srcDev[t], h.size(), L->stream) != cudaSuccess) return false;
    if (cudaMemcpyAsync(L->srcDev[t], h.data(), h.size(), cudaMemcpyHostToDevice, L->stream) != cudaSuccess)
      return false;
  }
  return true;
}

bool poisonDestinations(const Problem& p, int rank, Locals* L) {
  for (size_t t = 0; t < p.tensors.size(); t++) {
    const TensorPair& tp = p.tensors[t];
    const int pos = positionOf(tp.dst.mesh, rank);
    if (pos < 0) continue;
    const ShardGrid g(tp.dst);
    const size_t bytes = std::max<int64_t>(g.localSpan(pos), 1) * elementSize(tp.dst.dtype);
    if (!L->dstDev[t] && cudaMallocAsync(&L->dstDev[t], bytes, L->stream) != cudaSuccess) return false;
    if (cudaMemsetAsync(L->dstDev[t], 0xff, bytes, L->stream) != cudaSuccess) return false;
    L->dstHost[t].assign(bytes, 0);
  }
  return true;
}

// Errors in this rank's destinations (printing the first few).
int64_t checkDestinations(const Problem& p, int rank, uint64_t round, Locals* L, const char* what) {
  int64_t bad = 0;
  for (size_t t = 0; t < p.tensors.size(); t++) {
    const TensorPair& tp = p.tensors[t];
    const int pos = positionOf(tp.dst.mesh, rank);
    if (pos < 0) continue;
    std::vector<char>& h = L->dstHost[t];
    if (cudaMemcpy(h.data(), L->dstDev[t], h.size(), cudaMemcpyDeviceToHost) != cudaSuccess) return bad + 1;
    const ShardGrid g(tp.dst);
    const int64_t eb = (int64_t)elementSize(tp.dst.dtype);
    const int convert = conversionOf(tp.src.dtype, tp.dst.dtype);
    std::vector<char> isElement(h.size() / eb, 0);
    forEachElement(g, pos, tp.dst.ndims(), [&](const int64_t* gi, int64_t off) {
      isElement[off] = 1;
      const uint64_t v = valueOf(round, t, globalLinear(tp.dst, gi));
      uint64_t want = 0;  // the source element converted on the host (move.h, as the kernels convert)
      convertElement(reinterpret_cast<const char*>(&v), reinterpret_cast<char*>(&want), convert, (int)eb);
      if (memcmp(&h[off * eb], &want, eb) != 0 && bad++ < 5)
        fprintf(stderr, "rank %d [%s] tensor %zu (%s) element offset %lld: wrong value\n", rank, what, t,
                tp.name.c_str(), (long long)off);
    });
    for (size_t e = 0; e < isElement.size(); e++)
      for (int64_t k = 0; k < eb && !isElement[e]; k++)
        if ((unsigned char)h[e * eb + k] != 0xff && bad++ < 5)
          fprintf(stderr, "rank %d [%s] tensor %zu: a write between the elements at slot %zu\n", rank, what, t, e);
  }
  return bad;
}

// numeric.h's floatsToE4m3x2 (the hardware conversion the row quantiser uses) against floatToE4m3 (the software
// one the host references use) on every fp32 bit pattern u: u in the low half and its bit reversal in the high
// half, so that each half sees every pattern. Counts the disagreements and keeps the first u that disagreed.
__global__ void e4m3AgreeKernel(unsigned long long* bad, unsigned* first) {
  const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 32); i += step) {
    const unsigned u = (unsigned)i, v = __brev(u);
    const float lo = ncclext::bitsFloat(u), hi = ncclext::bitsFloat(v);
    const uint16_t want = (uint16_t)(ncclext::floatToE4m3(lo) | (uint16_t)ncclext::floatToE4m3(hi) << 8);
    if (ncclext::floatsToE4m3x2(lo, hi) != want) {
      atomicAdd(bad, 1ull);
      atomicMin(first, u);
    }
  }
}

// Returns 1 when the two conversions disagree anywhere or the kernel fails (rank 0 runs it; the others return 0).
int64_t e4m3AgreeCase(ncclext::harness::RankContext& ctx) {
  if (ctx.rank != 0) return 0;
  struct Result {
    unsigned long long bad;
    unsigned first;
  };
  Result* r = nullptr;
  bool ok = cudaMallocManaged(&r, sizeof(Result)) == cudaSuccess;
  if (ok) {
    r->bad = 0;
    r->first = ~0u;
    e4m3AgreeKernel<<<1024, 256, 0, ctx.stream>>>(&r->bad, &r->first);
    ok = cudaGetLastError() == cudaSuccess && ncclext::waitStream(ctx.stream, 60, "e4m3 agreement") == ncclSuccess;
  }
  if (!ok) {
    fprintf(stderr, "rank 0: e4m3 agreement kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    if (r) cudaFree(r);
    return 1;
  }
  printf("rank 0: e4m3 conversion, hardware (floatsToE4m3x2) against software (floatToE4m3) on all 2^32 fp32 "
         "patterns in both halves: %llu disagree\n", r->bad);
  if (r->bad) fprintf(stderr, "rank 0: e4m3 conversions disagree, first at fp32 bits 0x%08x\n", r->first);
  const int64_t bad = r->bad ? 1 : 0;
  cudaFree(r);
  return bad;
}

// fp8 e4m3 with block scales (quantize.h) through the public API: layout pairs over this communicator's ranks
// (sharded rows, columns on the 128-column grid, replicas, a column-major source), bf16 and fp32 sources of
// normal values with outliers. Every destination value and scale must equal the global tensor quantised row by
// row with numeric.h's fp8QuantizeRow (whole blocks; a short last block padded with zeros); destinations poisoned
// first. Returns this rank's wrong elements (or 1 for a call that failed).
int64_t fp8Cases(ncclext::harness::RankContext& ctx, const Options& o, uint64_t seed) {
  const int n = ctx.nRanks;
  std::vector<int> all(n), reversed(n);
  for (int r = 0; r < n; r++) all[r] = r, reversed[r] = n - 1 - r;
  int64_t bad = 0, cases = 0;
  struct Case {
    std::vector<int64_t> shape;
    int blockRows, variants;
  };
  // [4100, 520]: more blocks than the row quantiser has half-warps (16,384), so that each runs several blocks and
  // crosses rows, and a short last block of 8 columns.
  const std::vector<Case> kCases = {{{5, 300}, 1, 4},     {{3, 128 * n}, 1, 4},   {{2, 3, 640}, 1, 4},
                                    {{4100, 520}, 1, 4},  {{256, 256}, 128, 2},   {{2, 200, 384}, 128, 2}};
  for (const Case& kase : kCases)
    for (ncclDataType_t dt : {ncclBfloat16, ncclFloat32})
      for (int variant = 0; variant < kase.variants; variant++) {
        const std::vector<int64_t>& shape = kase.shape;
        const int blockRows = kase.blockRows;
        const int last = (int)shape.size() - 1;
        auto lay = [&](const std::vector<int>& ranks, int placement, ncclDataType_t t) {
          return testing::layout(shape, {(int)ranks.size()}, ranks, {placement}, t);
        };
        // Sources: rows over every rank, or one replica on the last rank; destinations: columns (128 each when the
        // shape allows it) over the ranks reversed, rows, or a replica everywhere. 128 x 128 blocks: a replica on
        // the last rank, to a replica everywhere or to rows over the ranks reversed where 128 each fit.
        Layout src = variant % 2 == 0 ? lay(all, 0, dt) : lay({n - 1}, kReplicate, dt);
        Layout dst = variant < 2 ? lay(reversed, shape[last] == 128 * n ? last : 0, ncclFloat8e4m3)
                                 : lay(all, kReplicate, ncclFloat8e4m3);
        if (blockRows > 1) {
          src = lay({n - 1}, kReplicate, dt);
          dst = variant == 0 || shape[last - 1] % (128 * n) != 0 ? lay(all, kReplicate, ncclFloat8e4m3)
                                                                   : lay(reversed, last - 1, ncclFloat8e4m3);
        }
        if (variant == 3 && shape.size() == 2) {  // column-major source parts
          src = lay(all, 0, dt);
          const ShardGrid sg(src);
          for (int pos = 0; pos < n; pos++)
            src.strides.insert(src.strides.end(), {1, std::max<int64_t>(1, sg.boxOfPosition(pos).shape[0])});
        }
        // The global tensor and its reference quantisation.
        const int64_t cols = shape[last], total = product(shape.data(), (int)shape.size());
        std::vector<float> g(total);
        uint64_t x = seed * 7919 + (uint64_t)cases;
        for (int64_t i = 0; i < total; i++) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          float v = ((float)((x >> 40) % 20001) - 10000.0f) / 1000.0f * (i % 257 == 0 ? 100.0f : 1.0f);
          g[i] = dt == ncclBfloat16 ? ncclext::bf16ToFloat(ncclext::floatToBf16(v)) : v;
        }
        std::vector<uint8_t> wantQ;
        std::vector<float> wantS;
        testing::fp8Reference(g, shape, blockRows, &wantQ, &wantS);
        // The public batch: the tensor, then its scales entry (no layouts).
        CLayout cs, cd;
        cs.from(src);
        cd.from(dst);
        const ncclM2nTensorSpec_t specs[2] = {{"q", &cs.layout, &cd.layout}, {"q.scales", nullptr, nullptr}};
        ncclM2nExecConfig_t cfg = configFor(ctx, o, 60);
        cfg.stagingBytes = 4096 * 4 * (size_t)std::max(1, n - 1);
        cfg.fp8BlockRows = blockRows;
        ncclM2nPlan_t plan = nullptr;
        if (createPlan(&plan, ctx, o, 2, specs, &cfg) != ncclSuccess) {
          fprintf(stderr, "rank %d fp8 case %lld: ncclM2nPlanCreate: %s\n", ctx.rank, (long long)cases,
                  ncclM2nGetLastError());
          return bad + 1;
        }
        // This rank's source part (its strides), its destination values and scales, poisoned.
        const Layout scalesDst = scalesLayout(dst, blockRows);
        void* dev[3] = {nullptr, nullptr, nullptr};
        size_t bytes[3] = {0, 0, 0};
        std::vector<char> host[3];
        const int sp = positionOf(src.mesh, ctx.rank), dp = positionOf(dst.mesh, ctx.rank);
        const ShardGrid sg(src), dg(dst), sdg(scalesDst);
        const int64_t eb = (int64_t)elementSize(dt);
        if (sp >= 0) {
          host[0].assign(std::max<int64_t>(sg.localSpan(sp), 1) * eb, 0);
          testing::forEachElement(sg, sp, src.ndims(), [&](const int64_t* gi, int64_t off) {
            testing::storeFloat(g[globalLinear(src, gi)], (int)eb, &host[0][off * eb]);
          });
        }
        if (dp >= 0) {
          host[1].assign(std::max<int64_t>(dg.localSpan(dp), 1), 0);
          host[2].assign(std::max<int64_t>(sdg.localSpan(dp), 1) * 4, 0);
        }
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++) {
          bytes[k] = host[k].size();
          if (bytes[k] == 0) continue;
          // Stream-ordered: the execute on ctx.stream must see them, and (virtual ranks) an allocation that waits
          // for the GPU would wait for the other ranks' barriers, which wait for this rank.
          ok = cudaMallocAsync(&dev[k], bytes[k], ctx.stream) == cudaSuccess &&
               (k == 0 ? cudaMemcpyAsync(dev[k], host[0].data(), bytes[k], cudaMemcpyHostToDevice, ctx.stream)
                       : cudaMemsetAsync(dev[k], 0xff, bytes[k], ctx.stream)) == cudaSuccess;
        }
        const void* srcPtrs[2] = {dev[0], nullptr};
        void* dstPtrs[2] = {dev[1], dev[2]};
        ok = ok && ncclM2nExecute(plan, srcPtrs, dstPtrs, ctx.stream) == ncclSuccess &&
             ncclext::waitStream(ctx.stream, 60, "m2n fp8 execute") == ncclSuccess;
        if (!ok) {
          fprintf(stderr, "rank %d fp8 case %lld: %s / %s\n", ctx.rank, (long long)cases, ncclM2nGetLastError(),
                  cudaGetErrorString(cudaGetLastError()));
          bad++;
        }
        for (int k = 1; k < 3 && ok; k++)
          if (bytes[k]) ok = cudaMemcpy(host[k].data(), dev[k], bytes[k], cudaMemcpyDeviceToHost) == cudaSuccess;
        if (ok && dp >= 0) {
          int64_t wrong = 0;
          testing::forEachElement(dg, dp, dst.ndims(), [&](const int64_t* gi, int64_t off) {
            wrong += (uint8_t)host[1][off] != wantQ[globalLinear(dst, gi)];
          });
          testing::forEachElement(sdg, dp, scalesDst.ndims(), [&](const int64_t* gi, int64_t off) {
            wrong += memcmp(&host[2][off * 4], &wantS[globalLinear(scalesDst, gi)], 4) != 0;
          });
          if (wrong)
            fprintf(stderr, "rank %d fp8 case %lld (%zu-D, %lld columns, %d x 128, %s, variant %d): %lld wrong\n",
                    ctx.rank, (long long)cases, shape.size(), (long long)cols, blockRows,
                    dt == ncclBfloat16 ? "bf16" : "fp32", variant, (long long)wrong);
          bad += wrong;
        }
        cudaStreamSynchronize(ctx.stream);
        ncclM2nPlanDestroy(plan);
        for (void* p : dev)  // stream-ordered: a free that waits for the GPU would wait for other virtual ranks
          if (p) cudaFreeAsync(p, ctx.stream);
        cases++;
      }
  printf("rank %d: fp8 e4m3 with block scales: %lld layout pairs, %lld wrong elements\n", ctx.rank, (long long)cases,
         (long long)bad);
  return bad;
}

// One execute of a plan of b's one tensor on fresh sources (round `round`) and poisoned destinations, then every
// destination element checked: this rank's wrong elements, or 1 for a call that failed. With `registered`, the
// source is first copied into that buffer (`registeredBytes`) and executed from there.
int64_t executeOnce(ncclext::harness::RankContext& ctx, ncclM2nPlan_t plan, const Batch& b, uint64_t round,
                    const char* what, void* registered = nullptr, size_t registeredBytes = 0) {
  Locals L(ctx.stream, 1);
  bool ok = fillSources(b.p, ctx.rank, round, &L) && poisonDestinations(b.p, ctx.rank, &L);
  const void* src[1] = {L.srcDev[0]};
  if (ok && registered) {
    const size_t srcBytes = L.srcHost[0].size();
    ok = srcBytes <= registeredBytes &&
         cudaMemcpyAsync(registered, L.srcDev[0], srcBytes, cudaMemcpyDeviceToDevice, ctx.stream) == cudaSuccess;
    src[0] = registered;
  }
  ok = ok && ncclM2nExecute(plan, src, L.dstDev.data(), ctx.stream) == ncclSuccess &&
       ncclext::waitStream(ctx.stream, 60, what) == ncclSuccess;
  int64_t bad = 0;
  if (!ok) {
    fprintf(stderr, "rank %d [%s] execute: %s\n", ctx.rank, what, ncclM2nGetLastError());
    bad = 1;
  } else {
    bad = checkDestinations(b.p, ctx.rank, round, &L, what);
  }
  cudaStreamSynchronize(ctx.stream);
  return bad;
}

// Transposing layouts big enough for the copy kernel's tiles (move.h, tileDimOf): a [3, H, W] tensor in rows
// over every rank into a replica on every rank stored with dim 1 innermost (dims 1 and 2 transposed, dim 0
// outside them), for every element size and conversion. This rank's own rows are a tiled local copy; the others'
// arrive packed and are unpacked element by element. [3, 150, 77]: no stride a multiple of 16 bytes, every tile
// element by element; [3, 256, 136]: whole aligned tiles (exec_kernels.cu, TileRound: 64 rows a rank at up to 4
// ranks) beside an 8-column edge. Returns this rank's wrong elements (1 for a failed call).
int64_t transposeCases(ncclext::harness::RankContext& ctx, const Options& o) {
  const int n = ctx.nRanks;
  std::vector<int> all(n);
  for (int r = 0; r < n; r++) all[r] = r;
  const std::pair<ncclDataType_t, ncclDataType_t> kTypes[] = {
      {ncclInt8, ncclInt8},       {ncclBfloat16, ncclBfloat16}, {ncclFloat32, ncclFloat32},
      {ncclInt64, ncclInt64},     {ncclFloat32, ncclBfloat16},  {ncclBfloat16, ncclFloat32}};
  int64_t bad = 0;
  const std::vector<int64_t> kShapes[] = {{3, 150, 77}, {3, 256, 136}};
  for (int t = 0; t < (int)(std::size(kShapes) * std::size(kTypes)); t++) {
    const std::vector<int64_t>& shape = kShapes[t / std::size(kTypes)];
    const auto& [from, to] = kTypes[t % std::size(kTypes)];
    const int64_t H = shape[1], W = shape[2];
    Batch b;
    b.p.nRanks = n;
    TensorPair tp;
    tp.name = "transposed";
    tp.src = testing::layout(shape, {n}, all, {1}, from);
    tp.dst = testing::layout(shape, {n}, all, {kReplicate}, to);
    for (int pos = 0; pos < n; pos++) tp.dst.strides.insert(tp.dst.strides.end(), {H * W, 1, H});
    b.p.tensors.push_back(tp);
    std::string why;
    if (!validateProblem(b.p, &why)) {
      fprintf(stderr, "rank %d: transposing case invalid: %s\n", ctx.rank, why.c_str());
      return bad + 1;
    }
    b.build();
    ncclM2nExecConfig_t cfg = configFor(ctx, o, 60);
    ncclM2nPlan_t plan = nullptr;
    if (createPlan(&plan, ctx, o, 1, b.specs.data(), &cfg) != ncclSuccess) {
      fprintf(stderr, "rank %d transposing case: ncclM2nPlanCreate: %s\n", ctx.rank, ncclM2nGetLastError());
      return bad + 1;
    }
    bad += executeOnce(ctx, plan, b, 7, "transposing");
    ncclM2nPlanDestroy(plan);
  }
  printf("rank %d: transposing layouts (tiled local copies), 2 shapes x %zu element types: %lld wrong elements\n",
         ctx.rank, sizeof(kTypes) / sizeof(kTypes[0]), (long long)bad);
  return bad;
}

// Real ranks: ncclM2nRegister / ncclM2nDeregister of an ncclMemAlloc buffer on the test's communicator, and a
// zero-copy plan executed on tensors inside it (one-GPU modes have no NVLink peer, so its pieces move as without
// zero-copy: what this checks is the registration's collectives and the plan's acceptance). Returns 0 on success.
int64_t registrationCase(ncclext::harness::RankContext& ctx, const Options& o) {
  const int n = ctx.nRanks;
  std::vector<int> all(n);
  for (int r = 0; r < n; r++) all[r] = r;
  const size_t bytes = 1 << 20;
  void* buf = nullptr;
  if (ncclMemAlloc(&buf, bytes) != ncclSuccess) return 1;
  ncclM2nRegistration_t reg = nullptr;
  int64_t bad = 0;
  if (ncclM2nRegister(ctx.comm, buf, bytes, &reg) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclM2nRegister: %s\n", ctx.rank, ncclM2nGetLastError());
    ncclMemFree(buf);
    return 1;
  }
  Batch b;
  b.p.nRanks = n;
  TensorPair tp;
  tp.name = "registered";
  tp.src = testing::layout({64, 96}, {n}, all, {0}, ncclFloat32);
  tp.dst = testing::layout({64, 96}, {n}, all, {1}, ncclFloat32);
  b.p.tensors.push_back(tp);
  b.build();
  ncclM2nExecConfig_t cfg = configFor(ctx, o, 60);
  cfg.lsa = 1;
  cfg.zeroCopy = NCCL_M2N_ZERO_COPY_PULL;
  ncclM2nPlan_t plan = nullptr;
  if (createPlan(&plan, ctx, o, 1, b.specs.data(), &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: zero-copy plan: %s\n", ctx.rank, ncclM2nGetLastError());
    bad++;
  } else {
    bad += executeOnce(ctx, plan, b, 5, "zero-copy (registered source)", buf, bytes);
    ncclM2nPlanDestroy(plan);
  }
  if (ncclM2nDeregister(reg) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclM2nDeregister: %s\n", ctx.rank, ncclM2nGetLastError());
    bad++;
  }
  ncclMemFree(buf);
  printf("rank %d: ncclM2nRegister, a zero-copy plan on registered memory, ncclM2nDeregister: %s\n", ctx.rank,
         bad ? "FAILED" : "ok");
  return bad;
}

int body(ncclext::harness::RankContext& ctx, const Options& o) {
  int64_t errors = 0, cases = 0, pairs = 0, elements = 0, oneShots = 0;
  bool graphDone = false, graphOk = true;
  cudaGraph_t heldGraph = nullptr;
  cudaGraphExec_t heldExec = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  // Plan creation's host time, in the first half of the cases (each plan splits its exchange communicator: the
  // previous plan is gone) and in the second (ncclM2nCommRetain keeps one); reported, never asserted.
  double createSeconds[2] = {0, 0};
  int64_t creates[2] = {0, 0};
  const int retainAt = o.cases / 2;
  for (int c = 0; c < o.cases; c++) {
    if (c == retainAt && ncclM2nCommRetain(ctx.comm, nullptr) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclM2nCommRetain: %s\n", ctx.rank, ncclM2nGetLastError());
      return 1;
    }
    testing::Gen g(o.seed * 1000003 + (uint64_t)c);
    Batch b;
    b.p = g.problem(ctx.nRanks);
    if (c % 3 == 2)
      g.conversionDtypes(&b.p);  // fp32 <-> bf16 in flight
    else
      g.mixDtypes(&b.p);
    std::string why;
    if (!validateProblem(b.p, &why)) continue;  // every rank skips the same cases
    b.build();
    ncclM2nExecConfig_t cfg = configFor(ctx, o, 60);
    // Virtual ranks: a third of the batches move the domain's streams in place, pulling, and a third pushing.
    if (o.virt)
      cfg.zeroCopy = c % 3 == 0 ? NCCL_M2N_ZERO_COPY_OFF : c % 3 == 1 ? NCCL_M2N_ZERO_COPY_PULL : NCCL_M2N_ZERO_COPY_PUSH;
    const int64_t chunk = (int64_t)16 << g.uniform(0, 8);  // 16 B .. 4 KiB chunks
    cfg.stagingBytes = (size_t)(chunk * 4 * std::max(1, ctx.nRanks - 1));
    ncclM2nPlan_t plan = nullptr;
    const auto created = std::chrono::steady_clock::now();
    if (createPlan(&plan, ctx, o, (int)b.specs.size(), b.specs.data(), &cfg) != ncclSuccess) {
      fprintf(stderr, "rank %d case %d: ncclM2nPlanCreate: %s\n", ctx.rank, c, ncclM2nGetLastError());
      return 1;
    }
    createSeconds[c >= retainAt] += std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
    creates[c >= retainAt]++;
    Locals L(ctx.stream, b.p.tensors.size());
    if (!fillSources(b.p, ctx.rank, 1, &L) || !poisonDestinations(b.p, ctx.rank, &L)) return 1;
    // Every fourth batch names its stages (the benchmarks' hook); the first execute uploads its pointers.
    std::vector<std::string> stages;
    if (c % 4 == 1 && ncclM2nPlanSetStageHookTesting(plan, recordStage, &stages) != ncclSuccess) return 1;
    if (ncclM2nExecute(plan, const_cast<const void* const*>(L.srcDev.data()), L.dstDev.data(), ctx.stream) !=
        ncclSuccess) {
      fprintf(stderr, "rank %d case %d: ncclM2nExecute: %s\n", ctx.rank, c, ncclM2nGetLastError());
      return 1;
    }
    if (c % 4 == 1) {
      std::string seen;
      for (const std::string& st : stages) seen += (seen.empty() ? "" : ", ") + st;
      if (!stagesInOrder(stages) || stages[0] != "pointers" ||
          ncclM2nPlanSetStageHookTesting(plan, nullptr, nullptr) != ncclSuccess) {
        fprintf(stderr, "rank %d case %d: stage hook: out of order or missing: %s\n", ctx.rank, c, seen.c_str());
        errors++;
      }
    }
    if (ncclext::waitStream(ctx.stream, 60, "m2n execute") != ncclSuccess) {
      fprintf(stderr, "rank %d case %d: %s\n", ctx.rank, c, ncclext::lastError());
      return 1;
    }
    errors += checkDestinations(b.p, ctx.rank, 1, &L, "execute");
    // Every fifth batch: its first tensor again, alone, through the one-shot ncclM2nReshard (real ranks: it takes
    // no testing config), twice: the second call finds its plan cached. Asynchronous: the stream is waited for.
    if (c % 5 == 4 && !b.p.tensors.empty() && !o.virt) {
      Problem one = b.p;
      one.tensors.resize(1);
      for (int again = 0; again < 2; again++) {
        if (!poisonDestinations(one, ctx.rank, &L)) return 1;
        if (ncclM2nReshard(ctx.comm, &b.specs[0], L.srcDev[0], L.dstDev[0], &cfg, ctx.stream) != ncclSuccess ||
            ncclext::waitStream(ctx.stream, 60, "one-shot reshard") != ncclSuccess) {
          fprintf(stderr, "rank %d case %d: ncclM2nReshard: %s / %s\n", ctx.rank, c, ncclM2nGetLastError(),
                  ncclext::lastError());
          return 1;
        }
        errors += checkDestinations(one, ctx.rank, 1, &L, again ? "one-shot reshard, cached plan" : "one-shot reshard");
        oneShots++;
      }
    }
    for (const TensorPair& tp : b.p.tensors) {
      const ShardGrid dg(tp.dst);
      for (int pos = 0; pos < tp.dst.mesh.size(); pos++) elements += dg.boxOfPosition(pos).elements();
    }
    pairs += (int64_t)b.p.tensors.size();
    cases++;
    // Once: the same execute captured in a graph and replayed with fresh source values.
    if (!graphDone && !b.p.tensors.empty()) {
      graphDone = true;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      bool ok = cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
      ok = ok && ncclM2nExecute(plan, const_cast<const void* const*>(L.srcDev.data()), L.dstDev.data(),
                                ctx.stream) == ncclSuccess;
      ok = cudaStreamEndCapture(ctx.stream, &graph) == cudaSuccess && ok;
      ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
      for (uint64_t round = 2; ok && round < 4; round++) {
        ok = fillSources(b.p, ctx.rank, round, &L) && poisonDestinations(b.p, ctx.rank, &L) &&
             cudaGraphLaunch(exec, ctx.stream) == cudaSuccess &&
             ncclext::waitStream(ctx.stream, 60, "m2n graph replay") == ncclSuccess;
        if (ok) errors += checkDestinations(b.p, ctx.rank, round, &L, "graph replay");
      }
      heldExec = exec;  // destroyed after the plan (below)
      heldGraph = graph;
      if (!ok) {
        fprintf(stderr, "rank %d: graph capture/replay failed: %s / %s\n", ctx.rank, ncclM2nGetLastError(),
                cudaGetErrorString(cudaGetLastError()));
        graphOk = false;
      }
    }
    cudaStreamSynchronize(ctx.stream);
    if (ncclM2nPlanDestroy(plan) != ncclSuccess) {
      fprintf(stderr, "rank %d case %d: ncclM2nPlanDestroy: %s\n", ctx.rank, c, ncclM2nGetLastError());
      return 1;
    }
    // The graph outlives its plan, as Python's garbage collection may order it: destroying the plan must not wait
    // for the graph (NCCL's communicator destruction does; a hang here ends the run at its timeout).
    if (heldExec) cudaGraphExecDestroy(heldExec);
    if (heldGraph) cudaGraphDestroy(heldGraph);
    heldExec = nullptr;
    heldGraph = nullptr;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  errors += transposeCases(ctx, o);
  if (!o.virt) errors += registrationCase(ctx, o);
  errors += e4m3AgreeCase(ctx);
  errors += fp8Cases(ctx, o, o.seed);

  // Metadata that differs on one rank: every rank refuses the batch, naming the tensor.
  bool mismatchOk = true;
  if (ctx.nRanks > 1) {
    testing::Gen g(o.seed + 99);
    Batch b;
    std::string why;
    do {
      b = Batch();
      b.p = g.problem(ctx.nRanks);
    } while (b.p.tensors.size() < 2 || !validateProblem(b.p, &why));
    const size_t bad = b.p.tensors.size() - 1;
    if (ctx.rank == ctx.nRanks - 1) b.p.tensors[bad].name += "_other";
    b.build();
    ncclM2nPlan_t plan = nullptr;
    ncclM2nExecConfig_t cfg = configFor(ctx, o, 60);
    const ncclResult_t r = createPlan(&plan, ctx, o, (int)b.specs.size(), b.specs.data(), &cfg);
    const std::string msg = ncclM2nGetLastError();
    mismatchOk = r == ncclInvalidArgument && plan == nullptr &&
                 msg.find("tensor " + std::to_string(bad)) != std::string::npos &&
                 msg.find("rank " + std::to_string(ctx.nRanks - 1)) != std::string::npos;
    printf("rank %d: a batch named differently on rank %d -> %s: \"%s\"\n", ctx.rank, ctx.nRanks - 1,
           ncclGetErrorString(r), msg.c_str());
    if (plan) ncclM2nPlanDestroy(plan);
  }
  // Before the harness destroys the communicator: frees the reshards' cached plans too.
  if (ncclM2nCommRelease(ctx.comm) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclM2nCommRelease: %s\n", ctx.rank, ncclM2nGetLastError());
    errors++;
  }
  const double createMs[2] = {creates[0] ? 1e3 * createSeconds[0] / creates[0] : 0,
                              creates[1] ? 1e3 * createSeconds[1] / creates[1] : 0};
  printf("rank %d: plan creation %.1f ms a plan (%lld plans), %.1f ms with the exchange communicator retained "
         "(%lld)\n",
         ctx.rank, createMs[0], (long long)creates[0], createMs[1], (long long)creates[1]);
  uint64_t total = 0;
  const uint64_t mine = (uint64_t)errors + (graphOk ? 0 : 1) + (mismatchOk ? 0 : 1);
  if (ncclext::harness::sumOverRanks(ctx, mine, &total, 60) != ncclSuccess) total = mine + 1;
  const bool pass = total == 0 && cases > 0;
  printf("rank %d: %lld batches executed (%lld layout pairs, %lld destination elements in all), %lld one-shot "
         "reshards, graph replays %s, mismatch %s, errors %lld (all ranks %llu), %.1f s -> %s (seed %llu)\n",
         ctx.rank, (long long)cases, (long long)pairs, (long long)elements, (long long)oneShots,
         graphOk ? "ok" : "FAILED",
         mismatchOk ? "ok" : "FAILED",
         (long long)errors, (unsigned long long)total, seconds, pass ? "PASS" : "FAIL", (unsigned long long)o.seed);
  if (ctx.rank == 0) {
    char line[512];
    snprintf(line, sizeof(line),
             "{\"test\": \"m2n_exec\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"cases\": %lld, "
             "\"layout_pairs\": %lld, \"elements\": %lld, \"seconds\": %.3f, \"seed\": %llu, "
             "\"plan_create_ms\": %.2f, \"plan_create_retained_ms\": %.2f}",
             ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), pass ? "true" : "false", (long long)cases,
             (long long)pairs, (long long)elements, seconds, (unsigned long long)o.seed, createMs[0], createMs[1]);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return pass ? 0 : 1;
}

// --dead-peer: the last rank, the only source of a tensor every rank receives a part of, dies (SIGKILL) right after
// plan creation. Each survivor's execute must end within the budget: the watchdog aborts the plan's communicator,
// ncclM2nPlanGetAsyncError says so, the stream drains and the plan is destroyed; the caller's communicator stays.
// Virtual ranks (threads: nothing to kill) have the last rank never execute: the survivors' LSA barrier times out,
// ncclM2nPlanGetAsyncError says so, and a later execute is refused.
int runDeadPeer(ncclext::harness::RankContext& ctx, const Options& o) {
  const bool virt = ctx.mode == ncclext::harness::OneGpu::kVirtual;
  const int victim = ctx.nRanks - 1;
  Batch b;
  TensorPair tp;
  tp.name = "w";
  tp.src.globalShape = tp.dst.globalShape = {256, 64};
  tp.src.dtype = tp.dst.dtype = ncclFloat32;
  tp.src.mesh.dims = {1};
  tp.src.mesh.ranks = {victim};
  tp.src.placements = {kReplicate};
  tp.dst.mesh.dims = {ctx.nRanks};
  for (int r = 0; r < ctx.nRanks; r++) tp.dst.mesh.ranks.push_back(r);
  tp.dst.placements = {0};
  b.p.nRanks = ctx.nRanks;
  b.p.tensors.push_back(tp);
  b.build();
  ncclM2nExecConfig_t cfg = configFor(ctx, o, o.timeoutSeconds);
  ncclM2nPlan_t plan = nullptr;
  if (createPlan(&plan, ctx, o, 1, b.specs.data(), &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclM2nPlanCreate: %s\n", ctx.rank, ncclM2nGetLastError());
    return 1;
  }
  Locals L(ctx.stream, 1);
  if (!fillSources(b.p, ctx.rank, 1, &L) || !poisonDestinations(b.p, ctx.rank, &L)) return 1;
  if (ctx.rank == victim && virt) {  // silent: waits for the survivors' checks, then destroys with them
    fprintf(stderr, "rank %d: never executing the plan\n", ctx.rank);
    const bool met = ncclext::harness::barrier(ctx, 60) == ncclSuccess;
    return ncclM2nPlanDestroy(plan) == ncclSuccess && met ? 0 : 1;
  }
  if (ctx.rank == victim) {
    fprintf(stderr, "rank %d: dying now, after plan creation\n", ctx.rank);
    fflush(stderr);
    kill(getpid(), SIGKILL);
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const ncclResult_t enq =
      ncclM2nExecute(plan, const_cast<const void* const*>(L.srcDev.data()), L.dstDev.data(), ctx.stream);
  ncclResult_t seen = enq;
  const double bound = o.timeoutSeconds + ncclext::kHostMarginSeconds + 2;
  while (seen == ncclSuccess && std::chrono::duration<double>(Clock::now() - t0).count() < bound) {
    seen = ncclM2nPlanGetAsyncError(plan);
    if (seen == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double noticed = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string msg = ncclM2nGetLastError();
  const ncclResult_t drained = ncclext::waitStream(ctx.stream, o.timeoutSeconds, "m2n dead-peer teardown");
  const ncclResult_t again = ncclM2nExecute(plan, const_cast<const void* const*>(L.srcDev.data()), L.dstDev.data(),
                                            ctx.stream);  // refused at once: the plan is broken
  bool met = true;
  if (virt) met = ncclext::harness::barrier(ctx, 60) == ncclSuccess;  // the silent rank destroys with us
  if (drained == ncclSuccess) met = ncclM2nPlanDestroy(plan) == ncclSuccess && met;
  ctx.peerDied = !virt;
  const bool ok = enq == ncclSuccess && seen == ncclRemoteError && noticed <= bound && drained == ncclSuccess &&
                  again == ncclRemoteError && met &&
                  msg.find(virt ? "timed out" : "aborted") != std::string::npos;
  printf("rank %d: dead peer (%s, %d ranks): %s after %.2f s (budget %.1f s, bound %.1f s): \"%s\"; stream %s; "
         "a later execute -> %s -> %s\n",
         ctx.rank, ncclext::harness::oneGpuName(ctx.mode), ctx.nRanks, ncclGetErrorString(seen), noticed,
         o.timeoutSeconds, bound, msg.c_str(), drained == ncclSuccess ? "drained" : "NOT drained",
         ncclGetErrorString(again), ok ? "PASS" : "FAIL");
  if (ctx.rank == 0) {
    char line[256];
    snprintf(line, sizeof(line),
             "{\"test\": \"m2n_dead_peer\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, "
             "\"noticed_s\": %.3f, \"budget_s\": %.3f}",
             ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), ok ? "true" : "false", noticed, o.timeoutSeconds);
    ncclext::harness::writeJsonLine(o.json, line);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.seed = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", &o.nRanks);
  cli.oneGpu(&o.oneGpu);
  cli.option("cases", &o.cases);
  cli.option("seed", &o.seed);
  cli.flag("dead-peer", &o.deadPeer);
  cli.option("timeout-s", &o.timeoutSeconds);
  cli.option("json", &o.json);
  if (!cli.parse(argc, argv)) return 2;
  const bool virt = o.oneGpu == ncclext::harness::OneGpu::kVirtual;
  if (!cli.require(o.cases >= 1 && (!o.deadPeer || o.nRanks >= 2) && (!virt || o.nRanks >= 1) && o.timeoutSeconds > 0,
                   "needs --cases >= 1, --timeout-s > 0, --nranks >= 2 with --dead-peer and >= 1 with --one-gpu "
                   "virtual"))
    return 2;
  // Virtual ranks: the library's in-process domain, made before the launcher forks the process that runs them.
  if (virt && ncclM2nVirtualDomainCreate(&o.virt, o.nRanks) != ncclSuccess) {
    fprintf(stderr, "ncclM2nVirtualDomainCreate: %s\n", ncclM2nGetLastError());
    return 1;
  }
  printf("m2n_exec_test: seed %llu\n", (unsigned long long)o.seed);
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = o.nRanks;
  lo.oneGpu = o.oneGpu;
  if (o.deadPeer) lo.mayDie = o.nRanks - 1;
  const int rc = ncclext::harness::launch(
      lo, [&](ncclext::harness::RankContext& ctx) { return o.deadPeer ? runDeadPeer(ctx, o) : body(ctx, o); });
  if (o.virt) ncclM2nVirtualDomainDestroy(o.virt);
  return rc;
}
