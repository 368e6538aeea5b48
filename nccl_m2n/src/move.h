// The element moves of the M2N executor, shared by its kernels and by the host emulator that tests the tables they
// read (tests/unit/m2n_exec_emulator): one strided box per MoveDesc, elements addressed by their row-major index.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define NCCLM2N_HD __host__ __device__ __forceinline__
#else
#define NCCLM2N_HD inline
#endif

namespace ncclm2n {

constexpr int kMoveMaxDims = 8;

// One transfer of the plan, as the executor reads it (a Transfer plus what it needs to address bytes).
struct MoveDesc {
  int32_t tensor = 0;  // index in the batch: the execute call's pointer arrays are indexed by it
  int32_t ndims = 0;
  int32_t elemBytes = 1;
  int32_t pad = 0;
  int64_t srcOffset = 0, dstOffset = 0;  // elements
  int64_t extent[kMoveMaxDims] = {};
  int64_t srcStride[kMoveMaxDims] = {};
  int64_t dstStride[kMoveMaxDims] = {};
};

// A run of a MoveDesc's elements and where it sits in the staging buffer (pack: written there; unpack: read).
struct MoveSegment {
  uint32_t desc = 0;         // index into the descriptor table of its direction (sends or receives)
  uint32_t pad = 0;
  int64_t firstElement = 0;  // row-major index in the box
  int64_t elements = 0;
  int64_t stageOffset = 0;   // bytes from the staging buffer's start (slot + offset in the chunk)
};

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

NCCLM2N_HD void copyElement(const char* from, char* to, int bytes) {
  switch (bytes) {
    case 1: *to = *from; break;
    case 2: *reinterpret_cast<uint16_t*>(to) = *reinterpret_cast<const uint16_t*>(from); break;
    case 4: *reinterpret_cast<uint32_t*>(to) = *reinterpret_cast<const uint32_t*>(from); break;
    case 8: *reinterpret_cast<uint64_t*>(to) = *reinterpret_cast<const uint64_t*>(from); break;
    default: memcpy(to, from, bytes);
  }
}

// Element i of segment g: pack copies it from the source tensor into the staging buffer, unpack from the staging
// buffer into the destination tensor. `tensors` holds the call's local pointers, indexed by MoveDesc::tensor.
NCCLM2N_HD void packElement(const MoveDesc* descs, const MoveSegment& g, int64_t i, const char* const* tensors,
                            char* stage) {
  const MoveDesc& d = descs[g.desc];
  int64_t s, t;
  moveOffsets(d, g.firstElement + i, &s, &t);
  copyElement(tensors[d.tensor] + s * d.elemBytes, stage + g.stageOffset + i * d.elemBytes, d.elemBytes);
}

NCCLM2N_HD void unpackElement(const MoveDesc* descs, const MoveSegment& g, int64_t i, const char* stage,
                              char* const* tensors) {
  const MoveDesc& d = descs[g.desc];
  int64_t s, t;
  moveOffsets(d, g.firstElement + i, &s, &t);
  copyElement(stage + g.stageOffset + i * d.elemBytes, tensors[d.tensor] + t * d.elemBytes, d.elemBytes);
}

// Element e of local copy d: source tensor straight into destination tensor.
NCCLM2N_HD void copyLocalElement(const MoveDesc& d, int64_t e, const char* const* src, char* const* dst) {
  int64_t s, t;
  moveOffsets(d, e, &s, &t);
  copyElement(src[d.tensor] + s * d.elemBytes, dst[d.tensor] + t * d.elemBytes, d.elemBytes);
}

}  // namespace ncclm2n
