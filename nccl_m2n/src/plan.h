// M2N transfer planner (pure host C++, no CUDA).
//
// For a batch of (source layout, destination layout) pairs, decides for every destination element which source
// rank delivers it, and emits per-rank lists of strided boxes: sends, receives and rank-local copies.
//
// Rules
// - Every destination position gets each element it holds exactly once, from exactly one source replica. Where
//   explicit source boxes overlap without being replicas, it takes each element from the first shard holding it,
//   its own shard first.
// - Replica choice, per (destination rank, overlapping source shard): the destination rank itself when it holds
//   that shard (a local copy, never a send); else a replica in the destination's NVLink domain if any; among
//   those, the one with the fewest bytes assigned so far (ties: lower rank). Bytes accumulate over the batch.
// - Deterministic: the decisions depend only on the metadata and the options, so every rank computes the same
//   global plan; metadataHash() and PlanStats::planHash let an executor check that ranks agree.
// - Cost: one pass over the overlaps (found per dim by binary search for placement layouts; explicit boxes are
//   compared pairwise). Only the calling rank's transfers are materialised unless all ranks are asked for.
// - Boxes are in elements of each side's local tensor: offsets, extents and strides, outermost dim first, with
//   extent-1 dims dropped and adjacent dims merged wherever both sides are contiguous across them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nccl_m2n/src/layout.h"

namespace ncclm2n {

struct TensorPair {
  std::string name;
  Layout src, dst;
};

struct PlanOptions {
  int ranksPerDomain = 0;           // NVLink domain of rank r = r / ranksPerDomain; 0: one domain for all
  std::vector<int> domainOfRank;    // explicit map (wins over ranksPerDomain); indexed by communicator rank
  int domainOf(int rank) const {
    if (!domainOfRank.empty()) return rank < (int)domainOfRank.size() ? domainOfRank[rank] : -1;
    return ranksPerDomain > 0 ? rank / ranksPerDomain : 0;
  }
};

struct Problem {
  std::vector<TensorPair> tensors;
  PlanOptions options;
  int nRanks = 0;  // communicator size: every mesh rank must be below it
};

struct Transfer {
  uint32_t tensor = 0;
  int32_t src = 0, dst = 0;           // communicator ranks
  int64_t srcOffset = 0, dstOffset = 0;
  int ndims = 0;                       // after merging; 0 = a single element
  int64_t extent[kMaxTensorDims] = {};
  int64_t srcStride[kMaxTensorDims] = {};
  int64_t dstStride[kMaxTensorDims] = {};
  int64_t elements() const { return product(extent, ndims); }
  // Elements per contiguous run on both sides (the innermost merged dim when both strides are 1, else 1).
  int64_t contiguousRun() const { return ndims > 0 && srcStride[ndims - 1] == 1 && dstStride[ndims - 1] == 1 ? extent[ndims - 1] : 1; }
};

struct RankPlan {
  int rank = -1;
  std::vector<Transfer> sends;   // this rank is the source, another rank the destination
  std::vector<Transfer> recvs;   // this rank is the destination
  std::vector<Transfer> copies;  // source and destination are this rank
};

struct PlanStats {
  uint64_t metadataHash = 0;
  uint64_t planHash = 0;        // over every decision, in plan order
  int64_t pieces = 0;           // transfers of all ranks (local copies included)
  int64_t totalBytes = 0;       // bytes arriving at destinations, local copies included
  int64_t localBytes = 0;       // moved by rank-local copies
  int64_t intraDomainBytes = 0; // sent between different ranks of one NVLink domain
  int64_t interDomainBytes = 0; // sent across domains (the network)
  std::vector<int64_t> sendBytes, recvBytes, copyBytes;  // per communicator rank (non-local only for send/recv)
  std::vector<int64_t> sendIntraBytes, sendInterBytes, recvIntraBytes, recvInterBytes;
  std::vector<int64_t> sendBoxes, recvBoxes;
  std::vector<char> isSource;   // rank appears in some source mesh
  // Source load balance: max over source ranks of sendBytes, and the mean over source ranks.
  double maxSourceLoad() const;
  double meanSourceLoad() const;
};

// Checks every tensor pair (layouts, same global shape and dtype, destination strides that do not alias, a source
// box holding every element of every destination box) and the options. On failure: false, with the tensor's index
// and name in `error` (for a gap: the first part of a destination box that no source holds).
bool validateProblem(const Problem& problem, std::string* error);

// 64-bit hash of everything the plan depends on.
uint64_t metadataHash(const Problem& problem);
// 64-bit hash of one tensor pair (name and both layouts): what ranks compare to name the tensor they disagree on.
uint64_t tensorHash(const TensorPair& tensor);

using ProgressFn = std::function<void(size_t tensorsDone, size_t tensorsTotal)>;

// Plans the batch. Fills `stats` for all ranks; materialises the transfers of `rank` into `mine` (may be NULL).
// The problem must have passed validateProblem.
void planRank(const Problem& problem, int rank, RankPlan* mine, PlanStats* stats, const ProgressFn& progress = {});

// Same, materialising every rank's lists (all->size() == nRanks). For tests, the simulator and small problems.
void planAll(const Problem& problem, std::vector<RankPlan>* all, PlanStats* stats);

// Drops extent-1 dims and merges adjacent dims that are contiguous on both sides. Exposed for tests.
void normalizeTransfer(Transfer* t);

}  // namespace ncclm2n
