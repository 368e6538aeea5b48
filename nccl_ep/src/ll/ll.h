// Low-Latency (LL) mode: the call structures and launch entry points of ll/kernels.cu, the group's LL state and the
// calls' launches (ll/calls.cc). The group, handle and window views are views.h's (layout.cc sizes the window for
// LL: a header row per source, combine staging for every (token, expert) pair); the handle's routing comes from the
// HT count / scan / slot kernels without their exchange (launchRoute with exchange off).
//
// One launch per call, nothing on the host. Dispatch: each rank writes, into every rank's window, a header (its
// row count for that rank and its count for each of that rank's local experts) and its rows (per-row flags, as
// HT, but one flag per slice of 512 columns, each slice a warp's work), each released with the call's number; a receiver acquires every source's header, derives the EXPERT_MAJOR
// block starts from the counts, then acquires and lays out each row. Combine sends one row per (token, rank) (or
// per (token, expert)) back into the owner's staging, which sums them in a fixed order (tests/unit/ep_ll_reference.h
// is the contract, bit for bit).
#pragma once

#include <deque>

#include "nccl_ep/src/views.h"

struct ncclEpGroup;
struct ncclEpHandle;

namespace ncclep {

constexpr int kLlMaxTokens = 1024;
constexpr int kLlSliceCols = 512;  // a warp's share of a row: a row of H columns is ceil(H / 512) slices

struct LlDispatchCall {
  const char* tokens;    // [T][H]: bf16, or e4m3 or packed NVFP4 (forwarded with `scales`)
  const float* weights;  // [T][K] or NULL (weights 1)
  const float* scales;   // [T][nScales] 32-bit words, e4m3 and NVFP4 input only
  char* outTokens;       // [N][outRowBytes] of the output dtype
  float* outWeights;     // RANK_MAJOR [N][K], EXPERT_MAJOR [N]; or NULL
  int* outIdx;           // RANK_MAJOR [N][K] expert ids (local + idBase; -1 elsewhere); or NULL
  float* outScales;      // [N][nScales] 32-bit words with an e4m3 or NVFP4 output (NVFP4: four e4m3 scales a word)
  int* outSrcInfo;       // [N] or NULL
  LayoutInfoOut info;    // any may be NULL
  int hidden;            // H
  int inRowBytes;        // H x the input's element size (NVFP4: H / 2)
  int outRowBytes;       // H x the output's element size (NVFP4: H / 2)
  int inColNibbles;      // a column of the input in 4-bit units: 4 (bf16), 2 (e4m3), 1 (NVFP4)
  int outColNibbles;     // the same of the output
  int nScales;           // scale words a row: H >> scaleColsLog2 with an e4m3 or NVFP4 output (forwarded e4m3:
                         // any S), else 0
  int scaleColsLog2;     // columns a scale word covers, log2: 7 (e4m3: one fp32 per 128), 9 (e4m3, UE8M0: four
                         // exponent bytes of 128 each), 6 (NVFP4: four e4m3 of 16); -1: forwarded e4m3 with S words
                         // of the caller's layout, all moved with the row's first slice
  int quantize;          // bf16 in, e4m3 out: the sender quantises
  int quantizeFp4;       // bf16 in, NVFP4 out: the sender quantises under *globalScale
  const float* globalScale;  // [1] on the device, with quantizeFp4
  int roundScale;        // powers of two
  int ue8m0;             // with quantize: each block's scale as its exponent byte, byte b of the row's words
  int idBase;            // added to every expert id written to outIdx (global ids: my first expert; else 0)
  int phases;            // LlPhase bits: kLlSend, kLlReceive or both
  unsigned long long* waitCycles;  // [nRanks] or NULL: the receive half's wait cycles per source, added
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
  unsigned long long* waitCycles;  // [nRanks] or NULL: the receive half's wait cycles per source, added
};

// Loads both kernels (group creation; see ncclext::loadKernels).
ncclResult_t loadLlKernels();
// `cooperative`: a cooperative launch (llCooperative), else a plain one.
ncclResult_t launchLlDispatch(const GroupView& g, const HandleView& h, const LlDispatchCall& c, int ctas,
                              bool cooperative, cudaStream_t stream);
ncclResult_t launchLlCombine(const GroupView& g, const HandleView& h, const LlCombineCall& c, int ctas,
                             bool cooperative, cudaStream_t stream);
// ncclEpMaskClean's barrier (one CTA): meets every rank active in the mask at `epoch` on the window's cleanFlags;
// a rank that does not arrive within the timeout is masked.
ncclResult_t launchLlCleanBarrier(const GroupView& g, uint64_t epoch, cudaStream_t stream);

// A Low-Latency group's host state.
struct LlState {
  // The handles whose send-only calls of each kind (CallKind) await ncclEpComplete, oldest first (at most two: the
  // staging's banks).
  std::deque<ncclEpHandle*> pending[2];
  int hostMask[kMaxRanks] = {};  // with enable_mask: the mask as the host last set it (nonzero: active)
  uint64_t cleans = 0;           // ncclEpMaskClean calls: the epochs of its barriers
};

// A call on `h` (its checks passed, api.cc), whole or (`sendOnly`) its send half, the receive half kept on the
// handle for llComplete and the call marked open in the group's LlState. Across NVLink domains the halves are always
// apart, with the rail exchange between them: the send half, the exchange, and (a whole call) the receive half.
ncclResult_t llDispatch(ncclEpHandle* h, const LlDispatchCall& c, int ctas, bool sendOnly, cudaStream_t stream);
ncclResult_t llCombine(ncclEpHandle* h, const LlCombineCall& c, int ctas, bool sendOnly, cudaStream_t stream);
// ncclEpComplete: the receive half of `h`'s open send-only call, the oldest of its kind (api.cc checks that).
ncclResult_t llComplete(ncclEpHandle* h, cudaStream_t stream);
// enable_mask: the mask from the host (nonzero = active), stream-ordered; ncclEpMaskClean's barriers and reset.
ncclResult_t llSetMask(ncclEpGroup* g, const int* hostMask, cudaStream_t stream);
ncclResult_t llMaskClean(ncclEpGroup* g, cudaStream_t stream);

}  // namespace ncclep
