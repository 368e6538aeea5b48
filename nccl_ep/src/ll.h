// Low-Latency (LL) mode inside one NVLink (LSA) domain: the call structures and launch entry points of
// kernels/ll_lsa.cu. The group, handle and window are ht.h's (group.cc sizes the window for LL: a header row per
// source, combine staging for every (token, expert) pair); the handle's routing comes from the HT count / scan /
// slot kernels without their exchange (launchRoute with exchange off).
//
// One launch per call, nothing on the host. Dispatch: each rank writes, into every rank's window, a header (its
// row count for that rank and its count for each of that rank's local experts) and its rows (per-row flags, as
// HT, but one flag per slice of 512 columns, each slice a warp's work), each released with the call's number; a receiver acquires every source's header, derives the EXPERT_MAJOR
// block starts from the counts, then acquires and lays out each row. Combine sends one row per (token, rank) (or
// per (token, expert)) back into the owner's staging, which sums them in a fixed order (tests/unit/ep_ll_reference.h
// is the contract, bit for bit).
#pragma once

#include "nccl_ep/src/ht.h"

namespace ncclep {

constexpr int kLlMaxTokens = 1024;
constexpr int kLlSliceCols = 512;  // a warp's share of a row: a row of H columns is ceil(H / 512) slices

struct LlDispatchCall {
  const char* tokens;    // [T][H]: bf16, or e4m3 (forwarded with `scales`)
  const float* weights;  // [T][K] or NULL (weights 1)
  const float* scales;   // [T][nScales], e4m3 input only
  char* outTokens;       // [N][H] of the output dtype
  float* outWeights;     // RANK_MAJOR [N][K], EXPERT_MAJOR [N]; or NULL
  int* outIdx;           // RANK_MAJOR [N][K] local expert ids; or NULL
  float* outScales;      // [N][nScales] with an e4m3 output
  int* outSrcInfo;       // [N] or NULL
  LayoutInfoOut info;    // any may be NULL
  int hidden;            // H
  int inRowBytes;        // H x the input's element size
  int outRowBytes;       // H x the output's element size
  int nScales;           // H / 128 with an e4m3 output, else 0
  int quantize;          // bf16 in, e4m3 out: the sender quantises
  int roundScale;        // powers of two
  int phases;            // LlPhase bits: kLlSend, kLlReceive or both
};

enum LlCombineMode { kLlRankRows = 0, kLlExpertWeighted = 1, kLlOwnerWeighted = 2 };

// The halves of a call: a send-only call launches kLlSend, ncclEpComplete kLlReceive (the call number is bumped at
// the end of the receive half), a plain call both in one launch.
enum LlPhase { kLlSend = 1, kLlReceive = 2 };

struct LlCombineCall {
  const char* in;        // [N][H] bf16 in the dispatch layout
  const float* weights;  // kLlOwnerWeighted: the owner's [T][K]
  char* out;             // [T][H] bf16
  int* missing;          // [T] int32 or NULL (enable_mask): top-k experts on ranks masked at the receive half's start
  int rowBytes;          // H x 2
  int mode;              // LlCombineMode
  int phases;            // LlPhase bits
};

// Loads both kernels (group creation; see ncclext::loadKernels).
ncclResult_t loadLlKernels();
ncclResult_t launchLlDispatch(const GroupView& g, const HandleView& h, const LlDispatchCall& c, int ctas,
                              cudaStream_t stream);
ncclResult_t launchLlCombine(const GroupView& g, const HandleView& h, const LlCombineCall& c, int ctas,
                             cudaStream_t stream);
// ncclEpMaskClean's barrier (one CTA): meets every rank active in the mask at `epoch` on the window's cleanFlags;
// a rank that does not arrive within the timeout is masked.
ncclResult_t launchLlCleanBarrier(const GroupView& g, uint64_t epoch, cudaStream_t stream);

}  // namespace ncclep
