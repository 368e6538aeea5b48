// Host reference model of the Low-Latency (LL) dispatch and combine for R ranks (issue "nccl_ep Low-Latency mode"):
// the contract the LL kernels are to follow, bit for bit, so that their GPU tests can compare exactly.
//
// Sizes are fixed at group creation: M = max tokens per rank, L = local experts, K = top-k, H = hidden.
// Dispatch (one message per (token, destination rank); the receiver fans a row out to its local experts):
//   RANK_MAJOR    tokens [R][M][H]: slot (s, j) is the j-th token, in source order, of source s that has an expert
//                 on this rank; rankCount[s] slots are valid. Per slot: srcToken, the K local expert ids (entry k:
//                 topk_idx[t][k] - r * L when that expert is here, else -1) and their weights (0 elsewhere).
//   EXPERT_MAJOR  tokens [L][R * M][H]: zone e holds, for each source s in rank order, the tokens of s naming
//                 local expert e, in source order; block (e, s) starts at the sum of the earlier blocks of zone e.
//                 Per row: srcInfo = s * M + t and the weight of that expert; expertCount[e] rows are valid.
//   FP8           a bf16 row may travel quantised: the sender converts the row to fp32, scales[b] = the block's
//                 fp8BlockScale (128 columns a block, optionally a power of two) and q = e4m3(x / scale)
//                 (common/numeric.h: fp8QuantizeRow); the receiver gets q and the scales.
// Masked ranks (the active mask): a masked rank sends and receives nothing; tokens of active ranks skip experts on
// masked ranks, and combine reports, per token, how many of its top-k experts were masked (missing[t]).
// Combine returns [T][H] in bf16, accumulated in fp32 with fused multiply-adds in a fixed order:
//   RANK_MAJOR            in: one row per slot (the caller's reduced expert outputs); out[t] = sum over ranks r in
//                         rank order of in_r[slot(t, r)].
//   EXPERT_MAJOR, weights at dispatch (the weights travelled): rank r first reduces its local experts,
//                         p = sum over k in column order of w[t][k] * in_r[row(t, e_k)] (fp32, fma), rounded to
//                         bf16 and sent; out[t] = sum over ranks r in rank order of p_r (fp32), rounded to bf16.
//   EXPERT_MAJOR, weights at combine (DeepEP's API: only the owner has them): each (token, expert) row comes back
//                         as it is; out[t] = sum over k in column order of w[t][k] * y_k (fp32, fma) -> bf16.
#pragma once

#include <cstdint>
#include <vector>

namespace ncclep {
namespace llref {

struct Routing {
  int nRanks = 1, numExperts = 1, topk = 1, maxTokens = 1;
  std::vector<int> numTokens;             // per rank, <= maxTokens
  std::vector<std::vector<int>> topkIdx;  // per rank, [numTokens * topk], -1 = none; no expert twice in a row
  std::vector<std::vector<float>> weights;  // per rank, [numTokens * topk]
  std::vector<char> active;               // per rank; empty: every rank active
  int localExperts() const { return numExperts / nRanks; }
  int owner(int expert) const { return expert / localExperts(); }
  bool isActive(int r) const { return active.empty() || active[r]; }
  // Expert e of rank s's token t counts (not -1, and both ends active).
  bool delivered(int s, int e) const { return e >= 0 && isActive(s) && isActive(owner(e)); }
};

struct RankMajorSlot {
  int srcToken = -1;
  std::vector<int> localIds;  // K entries, -1 where the expert is elsewhere
  std::vector<float> weights; // K entries, 0 where the expert is elsewhere
};

struct ExpertRow {
  int src = -1, token = -1, k = -1;
  float weight = 0.0f;
  int srcInfo(int maxTokens) const { return src * maxTokens + token; }
};

struct RankRecv {
  std::vector<int> rankCount;                       // [R]
  std::vector<std::vector<RankMajorSlot>> slots;    // [R][rankCount[s]]
  std::vector<int> expertCount;                     // [L]
  std::vector<std::vector<int>> blockStart;         // [L][R]: where block (e, s) starts in zone e
  std::vector<std::vector<ExpertRow>> zones;        // [L][expertCount[e]]
};

// Every rank's receive side (an inactive rank receives nothing: empty counts).
std::vector<RankRecv> dispatch(const Routing& r);

// missing[s][t]: top-k experts of rank s's token t that were not delivered because a rank was masked.
std::vector<std::vector<int>> missingExperts(const Routing& r);

// Combine outputs as bf16 bits [rank][token * H + h]. Inputs are bf16 bits in each layout's row order:
// rankMajorIn[r][s][j * H + h] for slot (s, j); expertIn[r][e][i * H + h] for zone row i.
std::vector<std::vector<uint16_t>> combineRankMajor(const Routing& r, const std::vector<RankRecv>& recv,
                                                    const std::vector<std::vector<std::vector<uint16_t>>>& in,
                                                    int hidden);
std::vector<std::vector<uint16_t>> combineExpertMajor(const Routing& r, const std::vector<RankRecv>& recv,
                                                      const std::vector<std::vector<std::vector<uint16_t>>>& in,
                                                      int hidden, bool weightsAtDispatch);

}  // namespace llref
}  // namespace ncclep
