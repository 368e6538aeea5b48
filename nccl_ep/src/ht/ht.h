// High-Throughput (HT) mode: the structures host code and kernels share, and the
// launch entry points of its three kernel families (ht/route.cu, dispatch.cu, combine.cu), and its calls' order.
//
// Tokens are cut into chunks of kChunkTokens in source order; a chunk is the unit of work of a team of threads, and
// a call walks only the chunks that hold rows (the handle knows how many). Signalling is per row: a sender warp
// writes a row (and its metadata) into the receiver's staging, then release-stores the call's number into that
// row's flag, so the receiver copies (dispatch) or reduces (combine) each row as soon as it lands. Calls are
// numbered per group and kind in device memory: every CTA reads the number at its start, and the last CTA to finish
// bumps it and tells every peer (a release store of the number into the peer's window) that this rank consumed all
// the peer wrote into its staging in that call; a sender writes nothing into a peer's staging before the peer
// consumed the previous call, so handles with different routings may alternate on one group, and CUDA graph replays
// keep counting.
#pragma once

#include "nccl_ep/src/views.h"

struct ncclEpHandle;

namespace ncclep {

// Which part of a High-Throughput kernel runs. Inside one domain a call (and a handle's exchange) runs whole; across
// domains its send half, the rail exchange, then its receive half (htDispatch, htCombine).
// A handle's exchange with a receive cap across domains has a third part when some rank overflows (ht/route.cu).
enum HtPhase { kHtWhole = 0, kHtSendHalf = 1, kHtReceiveHalf = 2, kHtRetainedHalf = 3 };

struct DispatchCall {
  const char* tokens;
  const float* weights;  // [T][K] or NULL
  const float* scales;   // [T][nScales] or NULL
  char* outTokens;
  float* outWeights;
  int* outIdx;
  float* outScales;
  int rowBytes, nScales;
  int idBase;  // added to every expert id written to outIdx (global ids: my first expert; else 0)
  int nSenders, nReceivers;
  int phase;  // HtPhase
  // HT's flat exchange in rounds (RailView::direct): roundSlots > 0 makes a send half write, towards another
  // domain's ranks, only the rows of slots [roundLo, roundLo + roundSlots), at slot - roundLo of my outbox for the
  // rank; remoteOnly (a round after the first) makes it write nothing else (no rows to my domain, no waits, no pad
  // rows). Zero: every slot, everything (inside one domain; relayed exchanges). The hierarchical HT's kernels
  // (hierPackKernel, hierReduceKernel, hierScatterKernel) take the rail positions [roundLo, roundLo + roundSlots)
  // instead; its send half runs whole, in the first round. localOnly: the reverse of remoteOnly, a send half that
  // writes only my domain's rows, with the pad rows and the waits (the overlapped flat exchange runs it on a stream
  // of the group's beside the rounds, which are then all remoteOnly: Rail::sideStream).
  int roundLo, roundSlots, remoteOnly, localOnly;
  // outputs.tokens is the window's dispatch staging (ncclEpGroupGetDispatchWindow; a receive cap, FLAT): the peers'
  // rows are in place, receivers copy only their metadata (my own rows still go from the input).
  int rowsInPlace;
};

struct CombineCall {
  const char* in;
  char* out;
  int rowBytes;
  int dtype;  // ncclDataType_t
  int nSenders, nReceivers;
  int phase;  // HtPhase
  int roundLo, roundSlots, remoteOnly, localOnly;  // as DispatchCall's (the combine's rows towards their owners)
  int* missing;  // [T] or NULL: per token, its top-k experts on ranks where its row was past the receive cap
  const char* bias;  // [T][H] or NULL: the owner's sum starts from it
  int biasF32;       // bias is fp32 (else the call's dtype)
};

// Each family's kernels loaded now (group creation; see ncclext::loadKernels).
ncclResult_t loadRouteKernels();
ncclResult_t loadDispatchKernels();
ncclResult_t loadCombineKernels();
ncclResult_t loadCapKernels();

// Host entry points (one per kernel family); each enqueues on `stream` and returns an error code.
// `exchange` false (Low-Latency handles): the local kernels only, no exchange between ranks. `phase` (HtPhase): the
// whole handle, or (across domains) the local kernels and the exchange kernel's send half, or its receive half only.
ncclResult_t launchRoute(const GroupView& g, const HandleView& h, const LayoutInfoOut& info, bool exchange, int phase,
                         cudaStream_t stream);
// The hierarchical dispatch (RailView::hier), after the send half: my rail rows for each other domain at the
// positions of the call's round (c.roundLo, c.roundSlots), in token order, into hierOut; the first round
// (c.roundLo 0) first gives my tokens their positions (HandleView::hierPos, hierTok) (ht/dispatch.cu).
ncclResult_t launchHierPack(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream);
// Its combine (ht/combine.cu): after the send half, as a relay, the partial of every row of my domain's
// ranks for each other domain's source of my index (hierCombOut); after the exchange, as a source, each partial
// into the staging of the first rank of its domain the token hit, zero rows into the others' (flags set), so that
// the receive half sums as it does. Each for the positions of the call's round (c.roundLo, c.roundSlots).
ncclResult_t launchHierReduce(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);
ncclResult_t launchHierScatter(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);
// The receive cap across domains (RailView::capped), after round `roundLo / roundSlots`'s exchange of `kind`
// (CallKind): every remote rank's rows of the round (`rowBytes` each) from my inboxes to their positions in my
// staging (ht/cap.cu).
ncclResult_t launchCapScatter(const GroupView& g, const HandleView& h, int kind, int roundLo, int rowBytes,
                              cudaStream_t stream);
ncclResult_t launchDispatch(const GroupView& g, const HandleView& h, const DispatchCall& c, cudaStream_t stream);
ncclResult_t launchCombine(const GroupView& g, const HandleView& h, const CombineCall& c, cudaStream_t stream);

// A call on `h`'s group (its checks passed, api.cc): whole inside one NVLink domain; across domains its send half and
// the rail exchange of its kind, in rounds (rail/rail.h), then its receive half (ht/calls.cc).
ncclResult_t htDispatch(ncclEpHandle* h, const DispatchCall& c, cudaStream_t stream);
ncclResult_t htCombine(ncclEpHandle* h, const CombineCall& c, cudaStream_t stream);

}  // namespace ncclep
