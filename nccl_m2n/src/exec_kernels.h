// Launchers of the M2N executor's kernels (exec_kernels.cu): element moves driven by the tables of exec_tables.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "common/device/peers.h"
#include "common/device_error.h"
#include "nccl_m2n/src/move.h"

namespace ncclm2n {

// arr[0, n) = host[0, n), by kernels whose parameters carry the values (no host buffer outlives the call, so
// consecutive executes and graph replays each see their own pointers).
ncclResult_t launchSetPointers(const void** arr, const void* const* host, int64_t n, cudaStream_t stream);

// Local copies: segments index descs, the first nPlain plain (contiguous or strided), the nTiles after them tile
// segments (kTileSegment); src/dst are device arrays of the call's pointers.
ncclResult_t launchCopies(const MoveDesc* descs, const MoveSegment* segs, int64_t nPlain, int64_t nTiles,
                          const char* const* src, char* const* dst, cudaStream_t stream);
// Where a pack or unpack segment's staging lies (MoveSegment::where): the rank's own staging, or `windowOffset`
// bytes into the symmetric window of a rank of the domain (LSA).
struct StageAreas {
  char* local = nullptr;
  ncclext::dev::Peers peers{};
  size_t windowOffset = 0;
};
ncclResult_t launchPack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const char* const* src,
                        const StageAreas& stage, cudaStream_t stream);
ncclResult_t launchUnpack(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const StageAreas& stage,
                          char* const* dst, cudaStream_t stream);
// One CTA meets the domain's other ranks: common/device/sync.cuh's barrier (index 0) on flags at `flagsOffset` of
// the windows, epochs in this rank's device memory, every wait bounded by timeoutNs (a timeout goes to `err`).
struct DomainBarrier {
  ncclext::dev::Peers peers{};
  size_t flagsOffset = 0;
  uint64_t* epochs = nullptr;
  int lsaRank = 0, lsaSize = 1;
  int worldRankOfLsa0 = 0;  // for the error word's peer
  int rank = 0;             // mine, in the communicator
  ncclext::DeviceErrorSink err{};
  uint64_t timeoutNs = 0;
};
ncclResult_t launchDomainBarrier(const DomainBarrier& barrier, cudaStream_t stream);

// Zero-copy (exec_tables.h): one tensor as a rank publishes it in its window. Real ranks: a = the registration's
// slot (registry.h), b = the offset in it; virtual ranks: a = the address, b = kPublishedAddress. Nothing: both 0
// (a tensor the rank holds no part of on that side, which no peer's table reads).
constexpr uint64_t kPublishedAddress = ~0ull;
struct Published {
  uint64_t a = 0, b = 0;
};
// table[0, n) (this rank's window's table, a device address) = published[0, n), as launchSetPointers sets its array.
ncclResult_t launchPublish(Published* table, const Published* published, int64_t n, cudaStream_t stream);
// The in-place moves, one CTA per segment at a time: segment g's peer (MoveSegment::where, a domain rank) published
// its tensor at `tableOffset` of its window; pull reads it into this rank's destination (descs: the receives), push
// writes this rank's source into it (descs: the sends). `registered`: the registry's device table of window bases
// ([slot][domainSize], real ranks), NULL for virtual ranks. src / dst: this rank's device arrays of the call's
// pointers.
struct RemoteMoves {
  ncclext::dev::Peers peers{};
  size_t tableOffset = 0;
  char* const* registered = nullptr;
  int domainSize = 0;
  int pull = 1;
};
ncclResult_t launchRemote(const MoveDesc* descs, const MoveSegment* segs, int64_t n, const RemoteMoves& rm,
                          const char* const* src, char* const* dst, cudaStream_t stream);
// The kernels, loaded before any of them runs (ncclext::loadKernels: the virtual ranks' barrier spins).
ncclResult_t loadExecKernels();

// fp8 quantisation of this rank's source parts (move.h's functions), before the moves: descs[j] reads
// src[descs[j].srcIndex] (a device array of the call's pointers) and writes into scratch. Blocks of one row go to a
// kernel that gives half a warp a block, taller blocks to one that gives a CTA a block; rowBlocks and tileBlocks:
// the largest descriptor's blocks of each kind (0: none of that kind, no launch).
ncclResult_t launchQuantize(const QuantDesc* descs, int nDescs, int64_t rowBlocks, int64_t tileBlocks,
                            const char* const* src, char* scratch, cudaStream_t stream);

}  // namespace ncclm2n
