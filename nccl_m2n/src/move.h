// The element moves of the M2N executor, shared by its kernels and by the host emulator that tests the tables they
// read (tests/unit/m2n_simulator: emulateExecute): one strided box per MoveDesc, elements addressed by their
// row-major index; a kernel's CTA runs moveSegmentShare for each of its threads, the emulator for each in turn.
#pragma once

#include <stdint.h>
#include <string.h>

#include "common/numeric.h"

#if defined(__CUDACC__)
#define NCCLM2N_HD __host__ __device__ __forceinline__
#else
#define NCCLM2N_HD inline
#endif

namespace ncclm2n {

constexpr int kMoveMaxDims = 8;
constexpr int kMoveThreads = 512;                 // threads of a move kernel's CTA (and of the emulator's teams)
constexpr int64_t kCopySegmentElements = 1 << 16;  // a local copy is cut into segments of this many elements,
constexpr int64_t kLongCopyElements = 1 << 26;      // one of at least this many elements into segments of
constexpr int64_t kLongCopySegmentElements = 1 << 18;  // this many (docs/PERFORMANCE.md: measured at both sizes)

// A conversion in flight: done where the source is read (local copy, pack), so that the wire and the staging carry
// destination-typed elements.
enum MoveConvert : int32_t { kConvertNone = 0, kConvertF32ToBf16 = 1, kConvertBf16ToF32 = 2 };

// One transfer of the plan, as the executor reads it (a Transfer plus what it needs to address bytes).
struct MoveDesc {
  int32_t tensor = 0;  // index in the batch: the execute call's pointer arrays are indexed by it
  int32_t ndims = 0;
  int32_t elemBytes = 1;  // of the destination (and of the wire)
  int32_t convert = kConvertNone;
  int64_t srcOffset = 0, dstOffset = 0;  // elements
  int64_t extent[kMoveMaxDims] = {};
  int64_t srcStride[kMoveMaxDims] = {};
  int64_t dstStride[kMoveMaxDims] = {};
};

// MoveSegment::where of a segment staged in the rank's own staging (the slots of ncclSend / ncclRecv streams).
// Any other value names the domain rank whose symmetric window holds the slot (LSA streams: a pack writes its own
// window, an unpack reads the sender's).
constexpr uint32_t kStageLocal = 0xffffffffu;

// MoveSegment::where of a local copy's segment of tiles (a transposing box, see tileDimOf): firstElement and
// elements then count tiles, not elements.
constexpr uint32_t kTileSegment = 0xfffffffeu;

// A run of a MoveDesc's elements and where it sits in the staging buffer (pack: written there; unpack: read).
struct MoveSegment {
  uint32_t desc = 0;         // index into the descriptor table of its direction (sends or receives)
  uint32_t where = kStageLocal;
  int64_t firstElement = 0;  // row-major index in the box
  int64_t elements = 0;
  int64_t stageOffset = 0;   // bytes from the start of the staging (or of the window's slots): slot + offset in chunk
};

// Transposing boxes. A local copy whose source is contiguous along the box's last dim and whose destination is
// contiguous along an earlier dim b (a row-major source into a column-major destination, say) is moved in square
// tiles of kTileEdge x kTileEdge elements over dims (b, last): the kernel reads a tile's rows along the source's
// contiguous dim and writes its columns along the destination's, through shared memory, so that both sides are
// coalesced (element by element, one side would be read or written kTileEdge times as wide as it moves).
constexpr int kTileEdge = 64;
constexpr int64_t kTileMinExtent = 16;  // both tiled dims at least this long (else tiles are mostly empty)

// The dim b that tiles d with its last dim, or -1 when d is not a transposing box.
NCCLM2N_HD int tileDimOf(const MoveDesc& d) {
  const int last = d.ndims - 1;
  if (last < 1 || d.srcStride[last] != 1 || d.dstStride[last] == 1 || d.extent[last] < kTileMinExtent) return -1;
  for (int b = last - 1; b >= 0; b--)
    if (d.dstStride[b] == 1) return d.extent[b] >= kTileMinExtent ? b : -1;
  return -1;
}

// Tiles of d over dims (b, last): every index of the other dims times the tiles of the (b, last) plane.
NCCLM2N_HD int64_t tileCountOf(const MoveDesc& d, int b) {
  const int last = d.ndims - 1;
  int64_t n = ((d.extent[b] + kTileEdge - 1) / kTileEdge) * ((d.extent[last] + kTileEdge - 1) / kTileEdge);
  for (int k = 0; k < last; k++)
    if (k != b) n *= d.extent[k];
  return n;
}

// Tile `tile` of d: its corner's row-major element index in the box, its rows (along b) and columns (along the last
// dim), and the row-major index step of one row. Element (i, j) of the tile is element e0 + i * rowStep + j.
struct TileSpan {
  int64_t e0 = 0, rows = 0, cols = 0, rowStep = 0;
};

NCCLM2N_HD TileSpan tileSpanOf(const MoveDesc& d, int b, int64_t tile) {
  const int last = d.ndims - 1;
  const int64_t colTiles = (d.extent[last] + kTileEdge - 1) / kTileEdge;
  const int64_t rowTiles = (d.extent[b] + kTileEdge - 1) / kTileEdge;
  const int64_t ct = tile % colTiles, rt = (tile / colTiles) % rowTiles;
  int64_t outer = tile / colTiles / rowTiles;
  TileSpan s;
  s.cols = d.extent[last] - ct * kTileEdge < kTileEdge ? d.extent[last] - ct * kTileEdge : kTileEdge;
  s.rows = d.extent[b] - rt * kTileEdge < kTileEdge ? d.extent[b] - rt * kTileEdge : kTileEdge;
  int64_t step = 1;  // the row-major index step of dim k, from the last dim inwards
  for (int k = last; k >= 0; k--) {
    int64_t i;
    if (k == last) {
      i = ct * kTileEdge;
    } else if (k == b) {
      i = rt * kTileEdge;
      s.rowStep = step;
    } else {
      i = outer % d.extent[k];
      outer /= d.extent[k];
    }
    s.e0 += i * step;
    step *= d.extent[k];
  }
  return s;
}

NCCLM2N_HD void moveOffsets(const MoveDesc& d, int64_t e, int64_t* src, int64_t* dst) {
  int64_t s = d.srcOffset, t = d.dstOffset;
  for (int k = d.ndims - 1; k >= 0; k--) {
    const int64_t i = e % d.extent[k];
    e /= d.extent[k];
    s += i * d.srcStride[k];
    t += i * d.dstStride[k];
  }
  *src = s;
  *dst = t;
}

// A walk over consecutive tiles of d (a tile segment's): the current tile's span and the source and destination
// offsets of its first element. The next tile of the same row of tiles is one tile's width further on both sides,
// so stepping to it adds that instead of recomputing (tileSpanOf and moveOffsets divide by every dim's extent, which
// for a whole aligned tile is most of the kernel's work); at the end of a row of tiles it recomputes.
struct TileCursor {
  TileSpan s;
  int64_t tile = 0, colTile = 0, colTiles = 0, src = 0, dst = 0;
};

NCCLM2N_HD void tileCursorAt(const MoveDesc& d, int b, int64_t tile, TileCursor* c) {
  const int last = d.ndims - 1;
  c->tile = tile;
  c->colTiles = (d.extent[last] + kTileEdge - 1) / kTileEdge;
  c->colTile = tile % c->colTiles;
  c->s = tileSpanOf(d, b, tile);
  moveOffsets(d, c->s.e0, &c->src, &c->dst);
}

NCCLM2N_HD void tileCursorNext(const MoveDesc& d, int b, TileCursor* c) {
  const int last = d.ndims - 1;
  if (c->colTile + 1 >= c->colTiles) {
    tileCursorAt(d, b, c->tile + 1, c);
    return;
  }
  c->tile++;
  c->colTile++;
  c->s.e0 += kTileEdge;
  c->src += kTileEdge * d.srcStride[last];
  c->dst += kTileEdge * d.dstStride[last];
  const int64_t left = d.extent[last] - c->colTile * kTileEdge;
  c->s.cols = left < kTileEdge ? left : kTileEdge;
}

NCCLM2N_HD void copyElement(const char* from, char* to, int bytes) {
  switch (bytes) {
    case 1: *to = *from; break;
    case 2: *reinterpret_cast<uint16_t*>(to) = *reinterpret_cast<const uint16_t*>(from); break;
    case 4: *reinterpret_cast<uint32_t*>(to) = *reinterpret_cast<const uint32_t*>(from); break;
    case 8: *reinterpret_cast<uint64_t*>(to) = *reinterpret_cast<const uint64_t*>(from); break;
    default: memcpy(to, from, bytes);
  }
}

// Bytes of a source element.
NCCLM2N_HD int sourceBytes(const MoveDesc& d) {
  return d.convert == kConvertF32ToBf16 ? 4 : d.convert == kConvertBf16ToF32 ? 2 : d.elemBytes;
}

// One element from a source-typed `from` to a destination-typed `to`.
NCCLM2N_HD void convertElement(const char* from, char* to, int convert, int bytes) {
  if (convert == kConvertF32ToBf16) {
    float f;
    memcpy(&f, from, 4);
    const uint16_t b = ncclext::floatToBf16(f);
    memcpy(to, &b, 2);
  } else if (convert == kConvertBf16ToF32) {
    uint16_t b;
    memcpy(&b, from, 2);
    const float f = ncclext::bf16ToFloat(b);
    memcpy(to, &f, 4);
  } else {
    copyElement(from, to, bytes);
  }
}

// 16 bytes moved as one (a 128-bit load and store on the GPU).
struct alignas(16) MoveVec16 {
  uint64_t lo, hi;
};

// Thread `lane` of `lanes` copies its share of `bytes` contiguous bytes: 16-byte vectors when both ends share their
// alignment mod 16 (the common case: tensors and staging are 256-byte aligned and runs start at element boundaries),
// 4-byte words when they share it mod 4, else bytes. The threads write disjoint bytes.
NCCLM2N_HD void groupCopy(int64_t lane, int64_t lanes, const char* from, char* to, int64_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(from), b = reinterpret_cast<uintptr_t>(to);
  const int vec = ((a ^ b) & 15) == 0 ? 16 : ((a ^ b) & 3) == 0 ? 4 : 1;
  int64_t head = (int64_t)((vec - (a & (vec - 1))) & (vec - 1));
  if (head > bytes) head = bytes;
  for (int64_t i = lane; i < head; i += lanes) to[i] = from[i];
  const int64_t n = vec > 1 ? (bytes - head) / vec : 0, body = head + n * vec;  // vec 1: all in the tail loop
  if (vec == 16) {  // four loads in flight per thread before their stores (to and from may alias for the compiler)
    const MoveVec16* f = reinterpret_cast<const MoveVec16*>(from + head);
    MoveVec16* t = reinterpret_cast<MoveVec16*>(to + head);
    int64_t i = lane;
    for (; i + 3 * lanes < n; i += 4 * lanes) {
      const MoveVec16 v0 = f[i], v1 = f[i + lanes], v2 = f[i + 2 * lanes], v3 = f[i + 3 * lanes];
      t[i] = v0;
      t[i + lanes] = v1;
      t[i + 2 * lanes] = v2;
      t[i + 3 * lanes] = v3;
    }
    for (; i < n; i += lanes) t[i] = f[i];
  } else if (vec == 4) {
    const uint32_t* f = reinterpret_cast<const uint32_t*>(from + head);
    uint32_t* t = reinterpret_cast<uint32_t*>(to + head);
    for (int64_t i = lane; i < n; i += lanes) t[i] = f[i];
  }
  for (int64_t i = body + lane; i < bytes; i += lanes) to[i] = from[i];
}

// The three moves: a local copy (source box to destination box), a pack (source box to its staging run) and an
// unpack (staging run to destination box).
enum MoveKind { kMoveCopy = 0, kMovePack = 1, kMoveUnpack = 2 };

// The memory of one move: the call's local tensor pointers (indexed by MoveDesc::tensor) and the staging buffer.
struct MoveEnds {
  const char* const* src = nullptr;
  char* const* dst = nullptr;
  const char* stageIn = nullptr;  // unpack
  char* stageOut = nullptr;       // pack
};

// Where element e of segment g moves from and to.
template <int K>
NCCLM2N_HD void moveEnds(const MoveDesc& d, const MoveSegment& g, int64_t e, const MoveEnds& m, const char** from,
                         char** to) {
  int64_t s, t;
  moveOffsets(d, e, &s, &t);
  const int64_t eb = d.elemBytes, stage = g.stageOffset + (e - g.firstElement) * eb;
  *from = K == kMoveUnpack ? m.stageIn + stage : m.src[d.tensor] + s * sourceBytes(d);
  *to = K == kMovePack ? m.stageOut + stage : m.dst[d.tensor] + t * eb;
}

// Thread `tid`'s share (of a team of `nThreads`, a multiple of 32: a CTA) of segment g of box d. When the box's
// innermost dim is contiguous on its strided side(s) (after coalesce(), a dense box is one such dim) and nothing is
// converted, the segment is a list of byte runs, one per row: runs of at least 32 KB take the whole team each,
// shorter ones a warp each (a lane then has four 16-byte loads in flight from 2 KB on: groupCopy's unrolled loop;
// a team of 512 threads on an 8 KB row had one. bench/experiments/m2n_rows_variants.sh measured the two:
// docs/PERFORMANCE.md). Otherwise the threads take single elements (converting them). The threads write
// disjoint bytes, so the host emulator may run the shares one after another.
//
// A local copy's tile segment (kTileSegment): the threads take the tiles' elements one by one. This is the host
// emulator's reference; the copy kernel moves tiles through shared memory instead (exec_kernels.cu).
template <int K>
NCCLM2N_HD void moveSegmentShare(const MoveDesc& d, const MoveSegment& g, const MoveEnds& m, int tid, int nThreads) {
  const int last = d.ndims - 1;
  if (K == kMoveCopy && g.where == kTileSegment) {
    const int b = tileDimOf(d);
    for (int64_t t = g.firstElement; t < g.firstElement + g.elements; t++) {
      const TileSpan s = tileSpanOf(d, b, t);
      for (int64_t k = tid; k < s.rows * s.cols; k += nThreads) {
        const char* from;
        char* to;
        moveEnds<K>(d, g, s.e0 + (k / s.cols) * s.rowStep + k % s.cols, m, &from, &to);
        convertElement(from, to, d.convert, d.elemBytes);
      }
    }
    return;
  }
  const int64_t end = g.firstElement + g.elements;
  const int convert = K == kMoveUnpack ? (int)kConvertNone : d.convert;  // the staging holds converted elements
  const bool runs = last >= 0 && convert == kConvertNone && (K == kMoveUnpack || d.srcStride[last] == 1) &&
                    (K == kMovePack || d.dstStride[last] == 1);
  const char* from;
  char* to;
  if (!runs) {
    for (int64_t e = g.firstElement + tid; e < end; e += nThreads) {
      moveEnds<K>(d, g, e, m, &from, &to);
      convertElement(from, to, convert, d.elemBytes);
    }
    return;
  }
  const int lane = tid & 31, warp = tid >> 5, warps = nThreads >> 5;
  const int64_t ext = d.extent[last], firstRow = g.firstElement / ext, nRuns = (end - 1) / ext - firstRow + 1;
  const bool wide = ext * d.elemBytes >= 32768;
  for (int64_t j = wide ? 0 : warp; j < nRuns; j += wide ? 1 : warps) {
    const int64_t start = j == 0 ? g.firstElement : (firstRow + j) * ext;
    const int64_t rowEnd = (firstRow + j + 1) * ext, stop = rowEnd < end ? rowEnd : end;
    moveEnds<K>(d, g, start, m, &from, &to);
    groupCopy(wide ? tid : lane, wide ? nThreads : 32, from, to, (stop - start) * d.elemBytes);
  }
}

// fp8 e4m3 with one fp32 scale per block of blockRows x kFp8BlockElems (quantize.h): what an execute's first
// kernel does to one local source part before the moves. Rows of the part's box (all dims but the last) are read
// through the caller's strides; a block spans blockRows rows of the dim before the last (1: one row). Values go
// dense [rows][cols] into the plan's scratch, scales dense over the box in blocks.
struct QuantDesc {
  int32_t srcIndex = 0;   // index into the execute's source pointer array: the caller's source tensor
  int32_t srcBytes = 2;   // 2: bf16, 4: fp32
  int32_t ndims = 0;      // of the box (>= 1; >= 2 when blockRows > 1)
  int32_t blockRows = 1;
  int64_t extent[kMoveMaxDims] = {};
  int64_t srcStride[kMoveMaxDims] = {};  // elements
  int64_t valuesOffset = 0, scalesOffset = 0;  // bytes into the scratch
  int64_t blocks = 0;                          // the box's blocks
};

NCCLM2N_HD float quantSource(const char* src, int bytes, int64_t at) {
  if (bytes == 4) {
    float f;
    memcpy(&f, src + at * 4, 4);
    return f;
  }
  uint16_t b;
  memcpy(&b, src + at * 2, 2);
  return ncclext::bf16ToFloat(b);
}

// Where block b of q (row-major over the box in blocks) lies: rows [r0, r1) of one outer index (flattened row
// indices, every dim but the last) and columns [c0, c0 + n).
struct QuantBlock {
  int64_t r0 = 0, r1 = 0, c0 = 0, n = 0;
};

NCCLM2N_HD QuantBlock quantBlockOf(const QuantDesc& q, int64_t b) {
  const int last = q.ndims - 1;
  const int64_t cols = q.extent[last], perRow = (cols + ncclext::kFp8BlockElems - 1) / ncclext::kFp8BlockElems;
  const int64_t inner = last >= 1 ? q.extent[last - 1] : 1;  // rows of one outer index
  const int64_t rowBlocks = (inner + q.blockRows - 1) / q.blockRows;
  const int64_t cb = b % perRow, rb = (b / perRow) % rowBlocks, outer = b / perRow / rowBlocks;
  QuantBlock k;
  k.c0 = cb * ncclext::kFp8BlockElems;
  k.n = cols - k.c0 < ncclext::kFp8BlockElems ? cols - k.c0 : ncclext::kFp8BlockElems;
  k.r0 = outer * inner + rb * q.blockRows;
  k.r1 = outer * inner + (rb * q.blockRows + q.blockRows < inner ? rb * q.blockRows + q.blockRows : inner);
  return k;
}

// The source offset (elements) of flattened row `row` of q's box.
NCCLM2N_HD int64_t quantRowOffset(const QuantDesc& q, int64_t row) {
  int64_t base = 0;
  for (int64_t k = q.ndims - 2, r = row; k >= 0; k--) {
    base += (r % q.extent[k]) * q.srcStride[k];
    r /= q.extent[k];
  }
  return base;
}

// A block's rows differ only in the dim before the last: its rows' offsets step by that dim's stride.
NCCLM2N_HD int64_t quantRowStep(const QuantDesc& q) { return q.ndims >= 2 ? q.srcStride[q.ndims - 2] : 0; }

// Pass 1, one column c (< k.n) of block k: its largest magnitude (a NaN never wins).
NCCLM2N_HD float quantColumnAmax(const QuantDesc& q, const QuantBlock& k, int64_t c, const char* src) {
  const int64_t at = quantRowOffset(q, k.r0) + (k.c0 + c) * q.srcStride[q.ndims - 1], step = quantRowStep(q);
  float amax = 0.0f;
  for (int64_t r = k.r0; r < k.r1; r++) {
    const float x = quantSource(src, q.srcBytes, at + (r - k.r0) * step);
    const float a = x < 0 ? -x : x;
    amax = a > amax ? a : amax;
  }
  return amax;
}

// The larger of two magnitudes as quantColumnAmax keeps them (so that any order of reduction gives the same).
NCCLM2N_HD float quantAmaxOf(float a, float b) { return b > a ? b : a; }

// Pass 2, one column c of block k: its values divided by the block's scale and rounded to e4m3, into the scratch
// (dense [rows][cols]).
NCCLM2N_HD void quantColumn(const QuantDesc& q, const QuantBlock& k, int64_t c, float scale, const char* src,
                            char* scratch) {
  const int64_t cols = q.extent[q.ndims - 1], step = quantRowStep(q);
  const int64_t at = quantRowOffset(q, k.r0) + (k.c0 + c) * q.srcStride[q.ndims - 1];
  uint8_t* values = reinterpret_cast<uint8_t*>(scratch + q.valuesOffset);
  for (int64_t r = k.r0; r < k.r1; r++)
    values[r * cols + k.c0 + c] = ncclext::floatToE4m3(quantSource(src, q.srcBytes, at + (r - k.r0) * step) / scale);
}

// Block b whole, as one thread would run it (the host emulator; the kernel runs the columns on a CTA's threads and
// reduces their magnitudes with quantAmaxOf): its scale from the block's largest magnitude (fp8BlockScale, exact,
// not a power of two), then every value divided by it and rounded to e4m3, as numeric.h's fp8QuantizeRow does for
// rows of whole blocks; blocks at a part's end may be smaller. The scale goes to the scratch's scales, dense.
NCCLM2N_HD void quantizeBlock(const QuantDesc& q, int64_t b, const char* src, char* scratch) {
  const QuantBlock k = quantBlockOf(q, b);
  float amax = 0.0f;
  for (int64_t c = 0; c < k.n; c++) amax = quantAmaxOf(amax, quantColumnAmax(q, k, c, src));
  const float s = ncclext::fp8BlockScale(amax, false);
  for (int64_t c = 0; c < k.n; c++) quantColumn(q, k, c, s, src, scratch);
  memcpy(scratch + q.scalesOffset + b * 4, &s, 4);
}

}  // namespace ncclm2n
