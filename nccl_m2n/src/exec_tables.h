// The M2N executor's tables: one rank's plan and schedule flattened into what the kernels and the NCCL calls of an
// execute read, built once at plan time (pure host C++).
//
// An execute runs the local copies, then rounds k = 0, 1, ...: in round k every stream with a chunk k takes part -
// the sender packs chunk k into its send slot k % 2, the pair moves it (ncclSend from the sender's slot into the
// receiver's slot k % 2; or, with LSA, the receiver reads the sender's slot), and the receiver unpacks it. A rank's
// rounds end with its longest stream; its peers' streams with it end at the same chunk count on both sides. Direct
// transfers (schedule.h) are issued before the rounds, in one NCCL group.
//
// Pipelined rounds (pipelinedRounds). Where every round goes by ncclSend / ncclRecv alone, an execute overlaps them:
// its stream runs the exchanges back to back while a side stream packs round k + 1 and unpacks round k. Two slots
// make that safe: round k + 2 is packed into slot k % 2 only after round k's exchange sent it and round k's unpack
// read the receive slot, and its exchange waits for that pack (executor.cc, runPipelined; the emulator runs the
// packs that early).
//
// LSA rounds. Round k's LSA unpacks read what the domain's senders packed in round k, so a barrier of the domain
// sits between its packs and its unpacks. Every rank of the domain must meet the same barriers: the domain agrees
// on the most LSA chunks of any of its ranks (setLsaRounds), and every rank runs that many rounds at least, with a
// barrier in each, plus one after its last unpack (finalBarrier). Slot k % 2 is packed again in round k + 2 only
// after the barrier of round k + 1, which every rank reaches after its unpacks of round k; the final barrier does
// the same for the next execute's first rounds (and tells the senders that nobody still reads their windows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nccl_m2n/src/move.h"
#include "nccl_m2n/src/plan.h"
#include "nccl_m2n/src/schedule.h"

namespace ncclm2n {

// One ncclSend or ncclRecv of a round.
struct P2pOp {
  int32_t peer = -1;
  int32_t send = 0;         // 1: ncclSend from the staging, 0: ncclRecv into it
  int64_t stageOffset = 0;  // bytes
  int64_t bytes = 0;
};

// A direct transfer's ncclSend (from the source tensor) or ncclRecv (into the destination tensor).
struct DirectOp {
  int32_t peer = -1;
  int32_t send = 0;
  uint32_t desc = 0;      // index into ExecTables::sends (send) or ::recvs (receive)
  int32_t tensor = 0;
  int64_t offset = 0;     // elements from the local tensor's start (the run's first element)
  int64_t bytes = 0;
};

struct ExecRound {
  uint32_t packBegin = 0, packEnd = 0;      // ExecTables::pack[packBegin, packEnd)
  uint32_t unpackBegin = 0, unpackEnd = 0;  // ExecTables::unpack[...]
  uint32_t opBegin = 0, opEnd = 0;          // ExecTables::ops[...]
  int64_t packElements = 0, unpackElements = 0;
  int32_t barrier = 0;                      // 1: the domain's barrier between the packs and the unpacks (LSA)
};

// Zero-copy (schedule.h, ZeroCopy). Before its in-place moves every rank of the domain publishes where its tensors
// are (pull: its sources; push: its destinations) in its window; a barrier of the domain; then one kernel moves every
// in-place segment (MoveSegment::where: the peer's domain rank) between the peer's tensor, reached through what it
// published, and this rank's; the final barrier ends the execute only once nobody reads or writes a peer's tensors
// any more. Every rank of a domain with an LSA stream anywhere meets those two barriers (setRemoteBarriers).
struct ExecTables {
  std::vector<MoveDesc> copies, sends, recvs;  // from the plan's lists, in their order
  std::vector<MoveSegment> pack, unpack;       // indexing sends / recvs
  std::vector<MoveSegment> remote;             // zero-copy: indexing recvs (pull) or sends (push)
  int32_t zeroCopy = 0;                        // ZeroCopy
  int32_t remoteBarrier = 0;                   // 1: publish, the domain's barrier, the in-place moves
  std::vector<P2pOp> ops;
  std::vector<ExecRound> rounds;
  std::vector<DirectOp> direct;                // sends then receives, issued in one group before the rounds
  int64_t copyElements = 0;
  int64_t stagingBytes = 0;
  int64_t chunkBytes = 0;
  int32_t lsaSize = 0, lsaRank = -1;  // as RankSchedule's
  int64_t lsaBytes = 0;               // the window's slots (RankSchedule::lsaBytes)
  int64_t lsaChunks = 0;              // the most chunks of this rank's LSA streams (the domain agrees on the max)
  int32_t finalBarrier = 0;           // 1: a barrier of the domain after the last round
};

MoveDesc moveDescOf(const Problem& problem, const Transfer& t);
// Fewest dims for the same elements in the same row-major order: drops extent-1 dims and merges a dim into the
// one before it where both sides continue it contiguously (a dense box becomes one dim: one run of bytes).
void coalesce(MoveDesc* d);
// The local copies cut into segments of at most maxElements (the copy kernels' unit of work, one CTA each), a copy
// of at least longFrom elements into segments of at most longMaxElements; a transposing box (move.h, tileDimOf)
// into segments of whole tiles, at most that many elements / kTileEdge^2 (at least 1).
std::vector<MoveSegment> copySegments(const std::vector<MoveDesc>& copies, int64_t maxElements,
                                      int64_t longFrom = INT64_MAX, int64_t longMaxElements = 0);
// The executor's: segments of kCopySegmentElements, kLongCopySegmentElements for copies of at least
// kLongCopyElements (move.h).
std::vector<MoveSegment> executorCopySegments(const std::vector<MoveDesc>& copies);

// Flattens `plan` (this rank's lists) and its schedule (built with the same problem and, for zero-copy, the same
// ScheduleOptions::zeroCopy). LSA streams get segments staged in the windows and no P2P operation, their barriers
// set by setLsaRounds; with zero-copy, in-place segments instead (setRemoteBarriers).
bool buildExecTables(const Problem& problem, const RankPlan& plan, const RankSchedule& schedule, ExecTables* out,
                     std::string* error, int zeroCopy = kZeroCopyOff);
// Whether an execute pipelines the rounds (above): at least two, none with a barrier or an LSA segment, no zero-copy.
bool pipelinedRounds(const ExecTables& tables);
// The domain's agreed LSA round count (the max of its ranks' lsaChunks): at least that many rounds, each with a
// barrier, and the final barrier when it is not 0.
void setLsaRounds(ExecTables* tables, int64_t rounds);
// Zero-copy: `domainStreams` is the number of LSA streams of the whole domain (the sum of its ranks'
// RankSchedule::lsaStreams). Any: this rank publishes, meets the barrier before the in-place moves and the final one.
void setRemoteBarriers(ExecTables* tables, int64_t domainStreams);

}  // namespace ncclm2n
