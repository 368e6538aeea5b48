// M2N execution schedule (pure host C++): how one rank's plan moves through wire streams, chunks and staging.
//
// Wire streams. For every ordered pair (source rank s, destination rank d != s) with traffic, both ranks put the
// pair's transfers in one canonical order (tensor, source offset, destination offset, shape: every field of the
// Transfer, which both ranks' plans hold alike) and lay their elements end to end, each transfer's box in row-major
// order at its dtype's size, each transfer starting at a multiple of kStreamAlign bytes. The sender's stream to d and
// the receiver's stream from s are then the same bytes, which is what lets a sender pack and a receiver unpack
// independently: neither needs the other's lists.
//
// Chunks. Every stream is cut into chunks of chunkBytes (the last one shorter). chunkBytes is the same on every rank
// (it depends only on the rank count and the options), a multiple of kStreamAlign, so that every chunk starts on an
// element of every dtype. Chunk c of a stream uses staging slot c % 2 of that stream: double buffering, the sender
// filling one slot while the receiver drains the other.
//
// Staging. Rank r's staging holds two slots of chunkBytes for each stream it sends by ncclSend (it packs there) and
// two for each stream it receives by ncclRecv (it lands there), laid out in that order, peers ascending; a stream
// of one chunk has one slot of its own length instead. With LSA
// (ScheduleOptions::lsa), a stream between two ranks of one NVLink domain has no such slots: the sender packs into
// its symmetric window, where the slots of its stream to the peer of domain index i sit at i * 2 * chunkBytes (the
// same layout on every rank, so that the receiver finds them without asking; one slot of the domain's longest
// stream instead when that is shorter than a chunk: ScheduleOptions::lsaSlotBytes), and the receiver unpacks from
// the sender's window over LSA. Everything fits in stagingCapBytes whatever the model size: larger models only make
// more chunks.
//
// Direct transfers (ScheduleOptions::direct). A transfer whose box is one contiguous run on both sides and needs no
// conversion skips the streams: one ncclSend straight from the source tensor and one ncclRecv straight into the
// destination tensor. Both ranks list a pair's direct transfers in the canonical order, and an execute issues them
// in one NCCL group before the rounds, so that NCCL matches each send with its receive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nccl_m2n/src/plan.h"

namespace ncclm2n {

constexpr int64_t kStreamAlign = 16;  // bytes: 16-byte vectors in pack/unpack, and every dtype's element divides it

struct ScheduleOptions {
  int64_t stagingCapBytes = 256ll << 20;  // the rank's staging window may not exceed this
  int64_t maxChunkBytes = 64ll << 20;     // chunks stop growing here. The rounds run one after another (pack,
                                          // exchange, unpack), so fewer, larger chunks cost fewer rounds; a stream
                                          // shorter than a chunk gets slots of its own length
  bool lsa = true;                        // false: every stream goes by ncclSend/ncclRecv (receive slots for all)
  bool direct = false;                    // true: contiguous transfers between domains (or, without lsa, any)
                                          // go straight between the tensors
  int64_t lsaSlotBytes = 0;               // LSA slots: 0, two of a chunk per domain rank; else one of this size
                                          // (below a chunk: every LSA stream of the domain must fit, so plan
                                          // creation agrees on the domain's longest, RankSchedule::lsaStreamMax)
  int zeroCopy = 0;                       // with lsa, ZeroCopy: LSA streams move in place, without slots
};

// Zero-copy inside an NVLink domain (the plan config's zeroCopy, the same on every rank). kZeroCopyPull: the
// receiver of an LSA stream reads its transfers straight from the sender's source tensor (the sources lie in
// memory its peers can load from); kZeroCopyPush: the sender writes them straight into the receiver's destination
// tensor. Such streams have no slots and no chunks: RankSchedule::lsaStreams counts them for the domain's barriers.
enum ZeroCopy { kZeroCopyOff = 0, kZeroCopyPull = 1, kZeroCopyPush = 2 };

// One transfer's place in a stream.
struct StreamItem {
  uint32_t transfer = 0;  // index into the rank's plan list (sends for a send stream, recvs for a receive stream)
  int64_t offset = 0;     // bytes from the stream's start (a multiple of kStreamAlign)
  int64_t bytes = 0;      // elements x element size
};

struct WireStream {
  int peer = -1;             // the destination (send stream) or the source (receive stream)
  bool interDomain = false;  // the peer is in another NVLink domain
  bool lsa = false;          // over LSA through the sender's window (ScheduleOptions::lsa, same domain)
  int lsaPeer = -1;          // lsa: the peer's index in the domain
  int64_t bytes = 0;         // the stream's length (the last item's end)
  int64_t slotOffset = -1;   // slot 0's bytes from the start of its area (slot 1 follows): the rank's staging, or
                             // with lsa the sender's window slots (a receive stream: the sender's, at my index)
  int64_t slotBytes = 0;     // each slot: chunkBytes; a stream of one chunk by ncclSend/ncclRecv has one slot of
                             // its own length (rounded up to kStreamAlign), the same on both sides
  std::vector<StreamItem> items;
  int64_t chunks(int64_t chunkBytes) const { return (bytes + chunkBytes - 1) / chunkBytes; }
};

// A run of one transfer's elements inside one chunk.
struct Segment {
  uint32_t transfer = 0;     // as StreamItem::transfer
  int64_t firstElement = 0;  // row-major index of the run's first element in the transfer's box
  int64_t elements = 0;
  int64_t chunkOffset = 0;  // bytes from the chunk's start
};

struct RankSchedule {
  int rank = -1;
  int64_t chunkBytes = 0;
  int64_t stagingBytes = 0;       // slots of this rank's ncclSend / ncclRecv streams
  int lsaSize = 0, lsaRank = -1;  // lsa: my domain's size and my index in it (0 / -1: no LSA streams possible)
  int64_t lsaBytes = 0;           // lsa: the window's slots, per index of the domain (every rank alike)
  int64_t lsaStreamMax = 0;       // lsa: this rank's longest LSA stream, rounded up to kStreamAlign
  int64_t lsaChunks = 0;          // lsa: the most chunks of this rank's LSA streams (0 with zero-copy)
  int64_t lsaStreams = 0;         // lsa: this rank's LSA streams, both directions
  std::vector<WireStream> sends;  // by peer ascending
  std::vector<WireStream> recvs;  // by peer ascending
  std::vector<uint32_t> directSends, directRecvs;  // plan list indices: by peer ascending, then canonical order
};

// The transfer is one contiguous run on both sides and needs no conversion (see "Direct transfers").
bool directTransfer(const Problem& problem, const Transfer& t);

// The chunk size every rank uses for a communicator of `nRanks` ranks: the cap split into the most slots any rank
// can need (two per peer for sends and two per peer for receives), rounded down to kStreamAlign, at most
// maxChunkBytes. 0 (with `error`) when the cap cannot hold a chunk of kStreamAlign bytes.
int64_t chunkBytesFor(int nRanks, const ScheduleOptions& options, std::string* error);

// Builds the schedule of `plan` (one rank's lists from planRank/planAll for `problem`). False with `error` when the
// options cannot hold it.
bool buildSchedule(const Problem& problem, const RankPlan& plan, const ScheduleOptions& options, RankSchedule* out,
                   std::string* error);

// The runs of chunk `chunk` of `stream`, in stream order. `list` is the plan list the stream's items index (sends or
// recvs) and `problem` gives the element sizes.
std::vector<Segment> chunkSegments(const Problem& problem, const std::vector<Transfer>& list, const WireStream& stream,
                                   int64_t chunkBytes, int64_t chunk);

}  // namespace ncclm2n
