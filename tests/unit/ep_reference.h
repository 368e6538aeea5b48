// Host reference model of High-Throughput dispatch and combine for R ranks: what each rank receives, in which
// order, with which counts, and what combine returns. The ordering contract it encodes (and the kernels follow):
//   FLAT          rows grouped by source rank in rank order; inside a source, its tokens in order; one row per
//                 (token, destination rank) whatever the number of its experts there.
//   EXPERT_MAJOR  zones by local expert; zone e starts at the sum of the earlier zones' counts, each rounded up to
//                 the alignment; inside a zone rows are ordered by (source rank, token); pad rows are zero.
//   combine FLAT  out[t] = sum over the ranks r that received t of in_r[row(t, r)].
//   combine EM    out[t] = sum over ranks r of sum over t's experts e on r of w[t][k(e)] * in_r[row(t, e)].
//   receive cap   (max_recv_rows_per_rank) a rank keeps its first `cap` FLAT rows; the rows past them are not
//                 delivered in either layout (zones and counts hold the kept rows only), and combine leaves them out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ncclep {
namespace ref {

struct Routing {
  int nRanks = 1, numExperts = 1, topk = 1;
  std::vector<int> numTokens;            // per rank
  std::vector<std::vector<int>> topkIdx; // per rank, [numTokens * topk], -1 = none
  int localExperts() const { return numExperts / nRanks; }
  int owner(int expert) const { return expert / localExperts(); }
};

struct FlatRow {
  int src, token;
};

struct EmRow {
  int src = -1, token = -1, k = -1;  // src -1: a pad row
};

struct RankRecv {
  std::vector<FlatRow> flat;
  std::vector<int> srcCounts;     // rows from each source
  std::vector<int> expertCounts;  // per local expert, unpadded
  std::vector<int> zoneStart;     // per local expert
  std::vector<EmRow> em;          // EXPERT_MAJOR rows, pads included
  int dropped = 0;                // rows past the receive cap
};

// A random routing: 1 to 8 ranks of 1 to maxLocal experts each, top-1 to min(8, E) distinct experts a token, each
// column -1 with chance 1 / noneOneIn, 0 to maxTokens tokens a rank.
Routing randomRouting(std::mt19937& rng, int maxLocal, int maxTokens, int noneOneIn);

// Receive layouts of every rank. `align` >= 1; `cap` > 0: the receive cap.
std::vector<RankRecv> dispatchLayout(const Routing& r, int align, int cap = 0);

// Combine, in double. flatIn[rank][row][h] -> out[rank][token][h].
std::vector<std::vector<std::vector<double>>> combineFlat(const Routing& r, const std::vector<RankRecv>& recv,
                                                          const std::vector<std::vector<std::vector<double>>>& flatIn,
                                                          int hidden);
// emIn[rank][emRow][h]; weights[rank][token * topk + k].
std::vector<std::vector<std::vector<double>>> combineExpertMajor(
    const Routing& r, const std::vector<RankRecv>& recv, const std::vector<std::vector<std::vector<double>>>& emIn,
    const std::vector<std::vector<float>>& weights, int hidden);

}  // namespace ref
}  // namespace ncclep
