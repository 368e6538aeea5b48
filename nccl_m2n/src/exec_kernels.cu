#include "nccl_m2n/src/exec_kernels.h"

#include <algorithm>

#include "common/device/sync.cuh"
#include "common/launch.h"

namespace ncclm2n {
namespace {

constexpr int kThreads = kMoveThreads;
constexpr int kMaxCtas = 1024;

// Host values into device memory, by kernels whose parameters carry them (no host buffer outlives the call, so
// consecutive executes and graph replays each see their own values), in batches of 3,840 bytes: under the classic
// 4 KB parameter limit.
template <typename T>
struct ParamBatch {
  static constexpr int kCount = 3840 / (int)sizeof(T);
  int64_t first;
  int count;
  T p[kCount];
};

template <typename T>
__global__ void paramCopyKernel(T* arr, ParamBatch<T> b) {
  for (int i = threadIdx.x; i < b.count; i += blockDim.x) arr[b.first + i] = b.p[i];
}

template <typename T>
ncclResult_t launchParamCopy(const char* what, T* arr, const T* host, int64_t n, cudaStream_t stream) {
  for (int64_t first = 0; first < n; first += ParamBatch<T>::kCount) {
    ParamBatch<T> b;
    b.first = first;
    b.count = (int)std::min<int64_t>(ParamBatch<T>::kCount, n - first);
    for (int i = 0; i < b.count; i++) b.p[i] = host[first + i];
    NCCLEXT_CHECK(ncclext::launchKernel(what, paramCopyKernel<T>, dim3(1), dim3(128), 0, stream, arr, b));
  }
  return ncclSuccess;
}

// A tile's elements in shared memory, destination-typed; a row one element longer than the tile, so that the
// column reads of the second half fall in different banks.
template <typename T>
using TileRows = T (*)[kTileEdge + 1];
constexpr int kTileBufferWords = kTileEdge * (kTileEdge + 1);  // 8-byte words: room for the widest elements
static_assert(kThreads % kTileEdge == 0, "a CTA is whole groups of kTileEdge threads");

// 16 bytes as T elements.
template <typename T>
union Vec16 {
  int4 v;
  T e[16 / sizeof(T)];
};

// Whole tiles with nothing to convert whose rows and columns start on 16 bytes (the common case: a large row-major
// tensor into a column-major one), n <= G of them at once, tile k in rows [k * kTileEdge, (k + 1) * kTileEdge) of
// the buffer: thread v loads vector v of each tile's rows (row v / (64 / V), V elements a vector), all n loads in
// flight before the first shared-memory store, then stores vector v of each tile's columns, gathered from shared
// memory. G tiles a round keep G loads in flight per thread; one tile a round left the kernel waiting on one load's
// latency between two barriers.
template <typename T, int G>
__device__ void moveWholeTiles(const char* const (&from)[G], T* const (&to)[G], int n, int64_t rowStride,
                               int64_t colStride, TileRows<T> tile) {
  constexpr int V = 16 / sizeof(T), kVecs = kTileEdge * kTileEdge / V, kPerLine = kTileEdge / V;
  for (int v = threadIdx.x; v < kVecs; v += blockDim.x) {
    const int i = v / kPerLine, j = (v % kPerLine) * V;
    Vec16<T> u[G];
#pragma unroll
    for (int k = 0; k < G; k++)
      if (k < n) u[k].v = __ldg(reinterpret_cast<const int4*>(from[k] + (i * rowStride + j) * (int64_t)sizeof(T)));
#pragma unroll
    for (int k = 0; k < G; k++)
      if (k < n)
#pragma unroll
        for (int e = 0; e < V; e++) tile[k * kTileEdge + i][j + e] = u[k].e[e];
  }
  __syncthreads();
  for (int v = threadIdx.x; v < kVecs; v += blockDim.x) {
    const int j = v / kPerLine, i = (v % kPerLine) * V;
#pragma unroll
    for (int k = 0; k < G; k++)
      if (k < n) {
        Vec16<T> u;
#pragma unroll
        for (int e = 0; e < V; e++) u.e[e] = tile[k * kTileEdge + i + e][j];
        *reinterpret_cast<int4*>(to[k] + j * colStride + i) = u.v;
      }
  }
  __syncthreads();  // the buffer is refilled next
}

// A tile segment of a transposing local copy (move.h, tileSpanOf): the CTA reads a tile's rows along the source's
// contiguous (last) dim into shared memory, converting there, and writes its columns along the destination's
// contiguous dim b. The tiles are walked with a TileCursor (offsets stepped along a row of tiles, not recomputed);
// whole aligned tiles collect, G at a time, for moveWholeTiles (the buffer, sized for one tile of 8-byte elements,
// holds 8 / sizeof(T) tiles of T; G is that, at most 4: 1-byte elements would need eight 16-byte registers a
// thread). Any other tile moves alone: thread x of each group of kTileEdge takes column x on the way in and row x on
// the way out, one element at a time, so that both global accesses are still coalesced.
template <typename T>
__device__ void copyTiles(const MoveDesc& d, const MoveSegment& g, const MoveEnds& m, TileRows<T> tile) {
  constexpr int G = sizeof(T) >= 2 ? (int)(sizeof(uint64_t) / sizeof(T)) : 4;  // the registers stay few (below)
  static_assert(G * kTileEdge * (kTileEdge + 1) * sizeof(T) <= kTileBufferWords * sizeof(uint64_t),
                "the buffer holds G tiles of T");
  const int b = tileDimOf(d), last = d.ndims - 1;
  const int x = threadIdx.x % kTileEdge, y0 = threadIdx.x / kTileEdge, ys = blockDim.x / kTileEdge;
  const char* src = m.src[d.tensor];
  T* dst = reinterpret_cast<T*>(m.dst[d.tensor]);
  const int sb = sourceBytes(d);
  const int64_t rowStride = d.srcStride[b], colStride = d.dstStride[last];
  const bool stridesAligned = d.convert == kConvertNone && (rowStride * sb) % 16 == 0 &&
                              (colStride * (int64_t)sizeof(T)) % 16 == 0;
  const char* from[G];
  T* to[G];
  int n = 0;  // whole tiles collected
  TileCursor c;
  tileCursorAt(d, b, g.firstElement, &c);
  for (int64_t t = 0; t < g.elements; t++, tileCursorNext(d, b, &c)) {
    const char* from0 = src + c.src * sb;
    T* to0 = dst + c.dst;
    if (stridesAligned && c.s.rows == kTileEdge && c.s.cols == kTileEdge &&
        (reinterpret_cast<uintptr_t>(from0) | reinterpret_cast<uintptr_t>(to0)) % 16 == 0) {
#pragma unroll
      for (int k = 0; k < G; k++)  // constant indices: the arrays stay in registers
        if (k == n) {
          from[k] = from0;
          to[k] = to0;
        }
      if (++n == G) {
        moveWholeTiles<T, G>(from, to, n, rowStride, colStride, tile);
        n = 0;
      }
      continue;
    }
    if (x < c.s.cols) {
      for (int i = y0; i < c.s.rows; i += ys) {
        const char* p = from0 + (i * rowStride + x) * sb;
        if (d.convert == kConvertNone)
          tile[i][x] = *reinterpret_cast<const T*>(p);
        else
          convertElement(p, reinterpret_cast<char*>(&tile[i][x]), d.convert, (int)sizeof(T));
      }
    }
    __syncthreads();
    if (x < c.s.rows)
      for (int j = y0; j < c.s.cols; j += ys) to0[j * colStride + x] = tile[x][j];
    __syncthreads();  // the tile is refilled next
  }
  if (n > 0) moveWholeTiles<T, G>(from, to, n, rowStride, colStride, tile);
}

__device__ void copyTileSegment(const MoveDesc& d, const MoveSegment& g, const MoveEnds& m, uint64_t* buffer) {
  switch (d.elemBytes) {
    case 1: copyTiles<uint8_t>(d, g, m, reinterpret_cast<TileRows<uint8_t>>(buffer)); break;
    case 2: copyTiles<uint16_t>(d, g, m, reinterpret_cast<TileRows<uint16_t>>(buffer)); break;
    case 4: copyTiles<uint32_t>(d, g, m, reinterpret_cast<TileRows<uint32_t>>(buffer)); break;
    default: copyTiles<uint64_t>(d, g, m, reinterpret_cast<TileRows<uint64_t>>(buffer)); break;
  }
}

// The local copies: one CTA per segment at a time, each thread its share (move.h). Two kernels, each with one
// path's code and registers: copyKernel for the plain (contiguous and strided) segments, which needs its 16-byte
// loads in flight, the more CTAs an SM the better, and tileKernel for the tile segments, through shared memory.
// kPlainMinCtas: the CTAs an SM the plain kernel asks of the compiler (1: no register cap). No cap on the tile
// kernel (__launch_bounds__(kThreads, 2)): with it, when one kernel had both paths, [16384, 8192] bf16 on one H200
// took 165 us contiguous and 392 us transposed, without it 157 and 237 us (bench/experiments/m2n_copy_variants.sh;
// the run is in docs/PERFORMANCE.md as of commit 272b2be).
constexpr int kPlainMinCtas = 1;
__global__ void __launch_bounds__(kThreads, kPlainMinCtas)
    copyKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, MoveEnds m) {
  for (int64_t si = blockIdx.x; si < n; si += gridDim.x) {
    const MoveSegment g = segs[si];
    moveSegmentShare<kMoveCopy>(descs[g.desc], g, m, threadIdx.x, blockDim.x);
  }
}

__global__ void __launch_bounds__(kThreads) tileKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n,
                                                        MoveEnds m) {
  __shared__ uint64_t tileBuffer[kTileBufferWords];
  for (int64_t si = blockIdx.x; si < n; si += gridDim.x) {
    const MoveSegment g = segs[si];
    copyTileSegment(descs[g.desc], g, m, tileBuffer);
  }
}

// Pack or unpack: as copyKernel, each segment's staging where MoveSegment::where says.
template <int K>
__global__ void stagedMoveKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, MoveEnds m,
                                 StageAreas stage) {
  for (int64_t si = blockIdx.x; si < n; si += gridDim.x) {
    const MoveSegment g = segs[si];
    char* base = g.where == kStageLocal ? stage.local : static_cast<char*>(stage.peers.at(stage.windowOffset, g.where));
    MoveEnds e = m;
    if (K == kMovePack)
      e.stageOut = base;
    else
      e.stageIn = base;
    moveSegmentShare<K>(descs[g.desc], g, e, threadIdx.x, blockDim.x);
  }
}

// Zero-copy moves. The peer's table entry was published before the barrier that precedes this kernel on the stream
// (its release orders the peer's publish and every earlier store of the peer's stream, its tensor's contents
// included, before this rank's acquire); the final barrier after it keeps the peer from touching its tensor before
// every rank is done with it.
__global__ void remoteKernel(const MoveDesc* descs, const MoveSegment* segs, int64_t n, RemoteMoves rm,
                             const char* const* src, char* const* dst) {
  for (int64_t si = blockIdx.x; si < n; si += gridDim.x) {
    const MoveSegment g = segs[si];
    MoveDesc d = descs[g.desc];
    const int peer = (int)g.where;
    const Published* e = static_cast<const Published*>(rm.peers.at(rm.tableOffset, peer)) + d.tensor;
    const uint64_t a = __ldcg(&e->a), b = __ldcg(&e->b);
    char* theirs = b == kPublishedAddress ? reinterpret_cast<char*>(a) : rm.registered[a * rm.domainSize + peer] + b;
    const char* from[1] = {rm.pull ? theirs : src[d.tensor]};
    char* to[1] = {rm.pull ? dst[d.tensor] : theirs};
    d.tensor = 0;  // both ends are the one-element arrays above
    moveSegmentShare<kMoveCopy>(d, g, MoveEnds{from, to, nullptr, nullptr}, threadIdx.x, blockDim.x);
  }
}

// The domain's barrier. Its release orders every store of this rank's earlier kernels on the stream (the packs)
// before the peers' acquires; the unpacks after it read what every peer packed.
__global__ void domainBarrierKernel(DomainBarrier d) {
  ncclext::dev::CoopCta cta;
  const ncclext::dev::LsaBarrier b{d.peers,           d.flagsOffset, d.epochs, d.lsaRank, d.lsaSize,
                                   d.worldRankOfLsa0, {d.err, d.timeoutNs, d.rank}};
  (void)ncclext::dev::lsaBarrierSync(cta, b, 0);
}

// Blocks of blockRows > 1 rows (kFp8BlockElems x kFp8BlockElems and the like). Grid rows are descriptors; each
// row's CTAs take that descriptor's blocks, grid-stride, one CTA of kFp8BlockElems threads a block: thread c the
// block's column c (coalesced across the threads), the magnitudes reduced in shared memory with quantAmaxOf (the
// same maximum in any order), then each column quantised.
__global__ void quantizeTilesKernel(const QuantDesc* descs, const char* const* src, char* scratch) {
  __shared__ float amax[ncclext::kFp8BlockElems];
  __shared__ float scale;
  if (descs[blockIdx.y].blockRows == 1) return;  // quantizeRowsKernel's
  const QuantDesc q = descs[blockIdx.y];
  const char* from = src[q.srcIndex];
  const int c = threadIdx.x;
  for (int64_t b = blockIdx.x; b < q.blocks; b += gridDim.x) {
    const QuantBlock k = quantBlockOf(q, b);
    amax[c] = c < k.n ? quantColumnAmax(q, k, c, from) : 0.0f;
    __syncthreads();
    for (int half = ncclext::kFp8BlockElems / 2; half > 0; half /= 2) {
      if (c < half) amax[c] = quantAmaxOf(amax[c], amax[c + half]);
      __syncthreads();
    }
    if (c == 0) {
      scale = ncclext::fp8BlockScale(amax[0], false);
      memcpy(scratch + q.scalesOffset + b * 4, &scale, 4);
    }
    __syncthreads();
    if (c < k.n) quantColumn(q, k, c, scale, from, scratch);
    __syncthreads();  // amax and scale are reused by the next block
  }
}

// Blocks of one row (1 x kFp8BlockElems, the common case): half a warp a block, lane l its columns
// [8 l, 8 l + 8), read with 16-byte loads where the row is contiguous and aligned; the magnitudes reduced with
// shuffles inside the half-warp (quantAmaxOf: the same maximum as the host's loop), the values converted two at a
// time (numeric.h's floatsToE4m3x2: the hardware's conversion, equal to floatToE4m3). Each half-warp takes a
// contiguous run of the descriptor's blocks, so that the row offset (integer divisions) is recomputed only when
// the run enters a new row; every half-warp of a grid row runs the same number of steps, so that both halves of a
// warp meet at every shuffle.
constexpr int kQuantThreads = 256;
constexpr int kQuantLanes = 16;  // a block's lanes
constexpr int kQuantUnits = kQuantThreads / kQuantLanes;
constexpr int kQuantPerLane = ncclext::kFp8BlockElems / kQuantLanes;
constexpr int kQuantUnroll = 2;  // blocks a half-warp loads before it reduces the first
static_assert(kQuantPerLane == 8, "a lane's columns are one 16-byte load of bf16");

// Columns [c, c + 8) of a row that starts at element `at` of `from`, zero past the block's n columns.
__device__ void loadQuantColumns(const char* from, int bytes, int64_t at, int64_t stride, int c, int64_t n,
                                 float x[kQuantPerLane]) {
  const char* p = from + (at + c) * bytes;
  if (stride == 1 && c + kQuantPerLane <= n && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    if (bytes == 2) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      for (int i = 0; i < 4; i++) {
        x[2 * i] = ncclext::bf16ToFloat((uint16_t)(w[i] & 0xffffu));
        x[2 * i + 1] = ncclext::bf16ToFloat((uint16_t)(w[i] >> 16));
      }
    } else {
      const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    }
    return;
  }
  for (int i = 0; i < kQuantPerLane; i++) x[i] = c + i < n ? quantSource(from, bytes, at + (c + i) * stride) : 0.0f;
}

__global__ void __launch_bounds__(kQuantThreads) quantizeRowsKernel(const QuantDesc* descs, const char* const* src,
                                                                     char* scratch) {
  const QuantDesc& q = descs[blockIdx.y];  // read in place: a copy would live in local memory (indexed by dim)
  if (q.blockRows != 1) return;            // quantizeTilesKernel's
  const char* from = src[q.srcIndex];
  const int last = q.ndims - 1, lane = threadIdx.x % kQuantLanes, c = lane * kQuantPerLane, bytes = q.srcBytes;
  const int64_t cols = q.extent[last], stride = q.srcStride[last], blocks = q.blocks;
  const int64_t perRow = (cols + ncclext::kFp8BlockElems - 1) / ncclext::kFp8BlockElems;
  const int64_t units = (int64_t)gridDim.x * kQuantUnits, steps = (blocks + units - 1) / units;
  const int64_t first = ((int64_t)blockIdx.x * kQuantUnits + threadIdx.x / kQuantLanes) * steps;
  uint8_t* values = reinterpret_cast<uint8_t*>(scratch + q.valuesOffset);
  float* scales = reinterpret_cast<float*>(scratch + q.scalesOffset);
  int64_t row = first / perRow, cb = first % perRow, base = quantRowOffset(q, row);
  // kQuantUnroll blocks a round, all their loads issued before the first reduction (two loads in flight per lane).
  for (int64_t i = 0; i < steps; i += kQuantUnroll) {
    float x[kQuantUnroll][kQuantPerLane];
    int64_t at[kQuantUnroll], n[kQuantUnroll];
#pragma unroll
    for (int u = 0; u < kQuantUnroll; u++) {
      const int64_t c0 = cb * ncclext::kFp8BlockElems;
      const int64_t left = cols - c0 < ncclext::kFp8BlockElems ? cols - c0 : ncclext::kFp8BlockElems;
      n[u] = i + u < steps && first + i + u < blocks ? left : 0;
      at[u] = row * cols + c0;
      loadQuantColumns(from, bytes, base + c0 * stride, stride, c, n[u], x[u]);
      if (++cb == perRow) {
        cb = 0;
        base = quantRowOffset(q, ++row);
      }
    }
#pragma unroll
    for (int u = 0; u < kQuantUnroll; u++) {
      float amax = 0.0f;
      for (int j = 0; j < kQuantPerLane; j++) amax = quantAmaxOf(amax, x[u][j] < 0 ? -x[u][j] : x[u][j]);
      for (int off = kQuantLanes / 2; off > 0; off /= 2) amax = quantAmaxOf(amax, __shfl_xor_sync(~0u, amax, off));
      const float s = ncclext::fp8BlockScale(amax, false);
      if (n[u] == 0) continue;
      uint32_t w[2] = {0, 0};
      for (int j = 0; j < kQuantPerLane; j += 2)
        w[j / 4] |= (uint32_t)ncclext::floatsToE4m3x2(x[u][j] / s, x[u][j + 1] / s) << (8 * (j % 4));
      uint8_t* to = values + at[u] + c;
      if (c + kQuantPerLane <= n[u] && (reinterpret_cast<uintptr_t>(to) & 7) == 0) {
        *reinterpret_cast<uint2*>(to) = make_uint2(w[0], w[1]);
      } else {
        for (int j = 0; j < kQuantPerLane && c + j < n[u]; j++) to[j] = (uint8_t)(w[j / 4] >> (8 * (j % 4)));
      }
      if (lane == 0) scales[first + i + u] = s;
    }
  }
}

unsigned gridFor(int64_t segments) { return (unsigned)std::max<int64_t>(1, std::min<int64_t>(segments, kMaxCtas)); }

}  // namespace

ncclResult_t launchSetPointers(const void** arr, const void* const* host, int64_t n, cudaStream_t stream) {
  return launchParamCopy("m2n setPointers", arr, host, n, stream);
}

ncclResult_t launchQuantize(const QuantDesc* descs, int nDescs, int64_t rowBlocks, int64_t tileBlocks,
                            const char* const* src, char* scratch, cudaStream_t stream) {
  const int64_t rowCtas = std::min<int64_t>((rowBlocks + kQuantUnits - 1) / kQuantUnits, kMaxCtas);
  const int64_t tileCtas = std::min<int64_t>(tileBlocks, kMaxCtas);
  for (int first = 0; first < nDescs; first += 65535) {  // a grid's rows
    const unsigned rows = (unsigned)std::min(65535, nDescs - first);
    if (rowCtas > 0)
      NCCLEXT_CHECK(ncclext::launchKernel("m2n quantize rows", quantizeRowsKernel, dim3((unsigned)rowCtas, rows),
                                          dim3(kQuantThreads), 0, stream, descs + first, src, scratch));
    if (tileCtas > 0)
      NCCLEXT_CHECK(ncclext::launchKernel("m2n quantize tiles", quantizeTilesKernel, dim3((unsigned)tileCtas, rows),
                                          dim3(ncclext::kFp8BlockElems), 0, stream, descs + first, src, scratch));
  }
  return ncclSuccess;
}

ncclResult_t launchCopies(const MoveDesc* descs, const MoveSegment* segs, int64_t nPlain, int64_t nTiles,
                          const char* const* src, char* const* dst, cudaStream_t stream) {
  const MoveEnds m{src, dst, nullptr, nullptr};
  if (nPlain > 0)
    NCCLEXT_CHECK(ncclext::launchKernel("m2n copy", copyKernel, dim3(gridFor(nPlain)), dim3(kThreads), 0, stream,
                                        descs, segs, nPlain, m));
  if (nTiles > 0)
    NCCLEXT_CHECK(ncclext::launchKernel("m2n tiled copy", tileKernel, dim3(gridFor(nTiles)), dim3(kThreads), 0,
                                        stream, descs, segs + nPlain, nTiles, m));
  return ncclSuccess;
}

ncclResult_t launchPack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                        const StageAreas& stage, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n pack", stagedMoveKernel<kMovePack>, dim3(gridFor(n)), dim3(kThreads), 0, stream,
                               descs, segs, n, MoveEnds{src, nullptr, nullptr, nullptr}, stage);
}

ncclResult_t launchUnpack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const StageAreas& stage,
                          char* const* dst, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n unpack", stagedMoveKernel<kMoveUnpack>, dim3(gridFor(n)), dim3(kThreads), 0,
                               stream, descs, segs, n, MoveEnds{nullptr, dst, nullptr, nullptr}, stage);
}

ncclResult_t launchPublish(Published* table, const Published* published, int64_t n, cudaStream_t stream) {
  return launchParamCopy("m2n publish", table, published, n, stream);
}

ncclResult_t launchRemote(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const RemoteMoves& rm,
                          const char* const* src, char* const* dst, cudaStream_t stream) {
  if (n == 0) return ncclSuccess;
  return ncclext::launchKernel("m2n in-place moves", remoteKernel, dim3(gridFor(n)), dim3(kThreads), 0, stream, descs,
                               segs, n, rm, src, dst);
}

ncclResult_t launchDomainBarrier(const DomainBarrier& barrier, cudaStream_t stream) {
  return ncclext::launchKernel("m2n domain barrier", domainBarrierKernel, dim3(1), dim3(32), 0, stream, barrier);
}

ncclResult_t loadExecKernels() {
  return ncclext::loadKernels("nccl_m2n", paramCopyKernel<const void*>, copyKernel, tileKernel,
                              stagedMoveKernel<kMovePack>,
                              stagedMoveKernel<kMoveUnpack>, domainBarrierKernel, quantizeRowsKernel,
                              quantizeTilesKernel,
                              paramCopyKernel<Published>, remoteKernel);
}

}  // namespace ncclm2n
