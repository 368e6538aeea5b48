// Launchers of the M2N executor's kernels (exec_kernels.cu): element moves driven by the tables of exec_tables.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "nccl_m2n/src/move.h"

namespace ncclm2n {

// arr[0, n) = host[0, n), by kernels whose parameters carry the values (no host buffer outlives the call, so
// consecutive executes and graph replays each see their own pointers).
ncclResult_t launchSetPointers(const void** arr, const void* const* host, int64_t n, cudaStream_t stream);

// Local copies: segments index descs; src/dst are device arrays of the call's pointers.
ncclResult_t launchCopies(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                          char* const* dst, cudaStream_t stream);
ncclResult_t launchPack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                        char* stage, cudaStream_t stream);
ncclResult_t launchUnpack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* stage,
                          char* const* dst, cudaStream_t stream);

// fp8 quantisation of this rank's source parts (move.h's column functions), one CTA a block, before the moves:
// descs[j] reads src[descs[j].srcIndex] (a device array of the call's pointers) and writes into scratch.
ncclResult_t launchQuantize(const QuantDesc* descs, int nDescs, int64_t maxBlocks, const char* const* src,
                            char* scratch, cudaStream_t stream);

}  // namespace ncclm2n
