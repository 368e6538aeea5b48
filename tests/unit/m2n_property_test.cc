// Property tests of the M2N planner: thousands of random layout pairs executed by the CPU simulator, and
// mutations of correct plans that the simulator must catch.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "tests/unit/m2n_random.h"
#include "tests/unit/m2n_test_util.h"

namespace ncclm2n {
namespace {

using testing::Gen;

TEST(PlannerProperty, RandomLayoutPairsAreDeliveredExactlyOnce) {
  Gen g(20261129);
  int64_t checked = 0;
  const int kCases = 4000;
  for (int c = 0; c < kCases; c++) {
    Problem p = g.problem();
    std::vector<RankPlan> plans;
    PlanStats stats;
    SimulationResult r = testing::planAndSimulate(p, &plans, &stats);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    checked += r.elementsChecked;
    // Local-first rule: nothing is sent from a rank to itself, and stats agree with the lists.
    int64_t sent = 0;
    for (const RankPlan& rp : plans)
      for (const Transfer& t : rp.sends) sent += t.elements();
    int64_t sentBytes = 0;
    for (int64_t b : stats.sendBytes) sentBytes += b;
    const int64_t esize = p.tensors.empty() ? 0 : (int64_t)elementSize(p.tensors[0].src.dtype);
    ASSERT_EQ(sentBytes, sent * esize) << "case " << c;
  }
  EXPECT_GT(checked, 100000);
}

// Whether two mesh positions of the source hold boxes that meet without being equal (no replicas).
bool sourceBoxesOverlap(const TensorPair& tp) {
  const ShardGrid src(tp.src);
  for (int a = 0; a < src.numShards(); a++)
    for (int b = a + 1; b < src.numShards(); b++)
      if (!intersect(src.shardBox(a), src.shardBox(b)).empty()) return true;
  return false;
}

// Whether every element of every destination box lies in some source box, element by element.
bool sourcesHoldEveryDestinationElement(const TensorPair& tp) {
  const ShardGrid src(tp.src), dst(tp.dst);
  for (int pos = 0; pos < tp.dst.mesh.size(); pos++) {
    const Box& b = dst.boxOfPosition(pos);
    if (b.empty()) continue;
    int64_t idx[kMaxTensorDims];
    for (int d = 0; d < b.ndims; d++) idx[d] = b.offset[d];
    for (;;) {
      bool held = false;
      for (int q = 0; q < tp.src.mesh.size() && !held; q++) {
        const Box& s = src.boxOfPosition(q);
        held = true;
        for (int d = 0; d < s.ndims; d++) held = held && idx[d] >= s.offset[d] && idx[d] < s.offset[d] + s.shape[d];
      }
      if (!held) return false;
      int d = b.ndims - 1;
      for (; d >= 0 && ++idx[d] == b.offset[d] + b.shape[d]; d--) idx[d] = b.offset[d];
      if (d < 0) break;
    }
  }
  return true;
}

TEST(PlannerProperty, SourceBoxesWithGapsOrOverlapsAreRejectedOrDeliveredExactlyOnce) {
  // Explicit source boxes with some positions moved to a random sub-box: gaps a destination may or may not need,
  // and boxes that overlap without being replicas. The planner must reject exactly the problems where some
  // destination element has no source (checked element by element), and deliver every other one exactly once.
  Gen g(4242);
  int rejected = 0, accepted = 0, overlapping = 0;
  for (int c = 0; c < 3000; c++) {
    Problem p = g.problem();
    for (TensorPair& tp : p.tensors) {
      Layout& l = tp.src;
      if (!g.chance(0.6)) continue;
      const ShardGrid grid(l);
      std::vector<Box> boxes;
      for (int pos = 0; pos < l.mesh.size(); pos++) {
        Box b = grid.boxOfPosition(pos);
        if (g.chance(0.25)) {
          b = g.subBox(l.globalShape);  // may open a gap
        } else if (g.chance(0.25)) {
          for (int d = 0; d < b.ndims; d++) {  // grown over its neighbours': an overlap, no gap
            const int64_t hi = g.uniform((int)(b.offset[d] + b.shape[d]), (int)l.globalShape[d]);
            b.offset[d] = g.uniform(0, (int)b.offset[d]);
            b.shape[d] = hi - b.offset[d];
          }
        }
        boxes.push_back(b);
      }
      l.boxes = boxes;
      if (!l.strides.empty()) l.strides = g.stridesFor(ShardGrid(l), l.mesh.size(), l.ndims());
    }
    bool expectValid = true;
    for (const TensorPair& tp : p.tensors) expectValid = expectValid && sourcesHoldEveryDestinationElement(tp);
    std::string why;
    ASSERT_EQ(validateProblem(p, &why), expectValid) << "case " << c << ": " << why;
    if (!expectValid) {
      EXPECT_NE(why.find("source boxes do not cover"), std::string::npos) << "case " << c << ": " << why;
      rejected++;
      continue;
    }
    SimulationResult r = testing::planAndSimulate(p);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    accepted++;
    for (const TensorPair& tp : p.tensors)
      if (sourceBoxesOverlap(tp)) {
        overlapping++;
        break;
      }
  }
  printf("source gaps/overlaps: %d problems rejected, %d planned (%d with overlapping source boxes)\n", rejected,
         accepted, overlapping);
  EXPECT_GT(rejected, 300);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(overlapping, 200);
}

// Applies one mutation to the transfer `t` (and its mirror in the receiver's list); false if not applicable.
bool mutate(Transfer* t, int kind) {
  switch (kind) {
    case 0: t->srcOffset += 1; return true;
    case 1: t->dstOffset += 1; return true;
    case 2:
      if (t->ndims == 0) return false;
      t->extent[t->ndims - 1] += 1;
      return true;
    case 3:
      if (t->ndims == 0 || t->extent[0] < 2) return false;
      t->extent[0] -= 1;
      return true;
    case 4:
      if (t->ndims == 0 || t->extent[t->ndims - 1] < 2) return false;
      t->dstStride[t->ndims - 1] += 1;
      return true;
    default: return false;
  }
}

TEST(PlannerProperty, MutatedPlansAreCaught) {
  Gen g(7);
  int tried = 0, caught = 0;
  for (int c = 0; c < 3000 && tried < 1500; c++) {
    Problem p = g.problem();
    std::vector<RankPlan> plans;
    if (!testing::planAndSimulate(p, &plans).ok) FAIL() << "unmutated case " << c << " fails";
    // Pick a random transfer: a send (mutating its receive mirror too) or a local copy.
    std::vector<std::pair<int, int>> sends, copies;
    for (size_t r = 0; r < plans.size(); r++) {
      for (size_t i = 0; i < plans[r].sends.size(); i++) sends.push_back({(int)r, (int)i});
      for (size_t i = 0; i < plans[r].copies.size(); i++) copies.push_back({(int)r, (int)i});
    }
    if (sends.empty() && copies.empty()) continue;
    const int kind = g.uniform(0, 6);
    const bool useSend = !sends.empty() && (copies.empty() || g.chance(0.5));
    auto [r, i] = useSend ? sends[g.uniform(0, (int)sends.size() - 1)] : copies[g.uniform(0, (int)copies.size() - 1)];
    std::vector<Transfer>& list = useSend ? plans[r].sends : plans[r].copies;
    Transfer original = list[i];
    if (kind == 5) {  // drop it
      list.erase(list.begin() + i);
    } else if (kind == 6) {  // duplicate it
      list.push_back(original);
    } else if (!mutate(&list[i], kind)) {
      continue;
    }
    if (useSend) {  // keep the receive list a mirror, so that only execution can catch the change
      std::vector<Transfer>& recvs = plans[original.dst].recvs;
      for (size_t k = 0; k < recvs.size(); k++) {
        const Transfer& x = recvs[k];
        if (x.tensor == original.tensor && x.src == original.src && x.srcOffset == original.srcOffset &&
            x.dstOffset == original.dstOffset) {
          if (kind == 5) recvs.erase(recvs.begin() + k);
          else if (kind == 6) recvs.push_back(original);
          else recvs[k] = list[i];
          break;
        }
      }
    }
    tried++;
    SimulationResult res = simulate(p, plans);
    if (!res.ok) caught++;
    else ADD_FAILURE() << "case " << c << ": mutation " << kind << " of " << (useSend ? "a send" : "a copy")
                       << " was not caught";
  }
  printf("mutations tried %d, caught %d\n", tried, caught);
  EXPECT_GT(tried, 500);
  EXPECT_EQ(caught, tried);
}

// A random batch (with mixed dtypes if asked) and every rank's plan; false when the batch is invalid (skip it).
// dtypes: 0 the generator's, 1 mixed (the same on both sides), 2 conversions in flight (fp32 <-> bf16, or none).
bool drawPlanned(Gen& g, int dtypes, Problem* p, std::vector<RankPlan>* plans) {
  *p = g.problem();
  if (dtypes == 1) g.mixDtypes(p);
  if (dtypes == 2) g.conversionDtypes(p);
  std::string why;
  if (!validateProblem(*p, &why)) return false;
  PlanStats stats;
  planAll(*p, plans, &stats);
  return true;
}

// Every rank's schedule for a plan, with chunks of `chunk` bytes (the cap chunkBytesFor splits into them).
std::vector<RankSchedule> schedulesFor(const Problem& p, const std::vector<RankPlan>& plans, int64_t chunk) {
  ScheduleOptions o;
  o.stagingCapBytes = chunk * 4 * std::max(1, p.nRanks - 1);
  o.maxChunkBytes = chunk;
  std::vector<RankSchedule> out(plans.size());
  for (size_t r = 0; r < plans.size(); r++) {
    std::string why;
    EXPECT_TRUE(buildSchedule(p, plans[r], o, &out[r], &why)) << why;
    EXPECT_EQ(out[r].chunkBytes, chunk);
    EXPECT_LE(out[r].stagingBytes, o.stagingCapBytes);
  }
  return out;
}

TEST(ScheduleProperty, RandomLayoutPairsThroughWireStreamsAreDeliveredExactlyOnce) {
  // Mixed dtypes (1, 2, 4 and 8 bytes) in one batch, chunks from 16 bytes (one element of the widest dtype per
  // vector: most items cross chunk bounds) to 256, every send packed and unpacked by the two sides' own views.
  Gen g(20261201);
  const int64_t chunks[] = {16, 48, 256};
  int64_t checked = 0, streams = 0, crossing = 0;
  for (int c = 0; c < 2000; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, true, &p, &plans)) continue;
    const int64_t chunk = chunks[g.uniform(0, 2)];
    std::vector<RankSchedule> sched = schedulesFor(p, plans, chunk);
    for (const RankSchedule& rs : sched)
      for (const WireStream& w : rs.sends) {
        streams++;
        crossing += w.chunks(rs.chunkBytes) > 1;
        for (const StreamItem& i : w.items) ASSERT_EQ(i.offset % kStreamAlign, 0) << "case " << c;
      }
    SimulationResult r = simulateWire(p, plans, sched);
    ASSERT_TRUE(r.ok) << "case " << c << " (chunk " << chunk << "): " << r.firstError;
    checked += r.elementsChecked;
  }
  printf("wire streams %lld (%lld of several chunks), destination elements checked %lld\n", (long long)streams,
         (long long)crossing, (long long)checked);
  EXPECT_GT(streams, 1000);
  EXPECT_GT(crossing, 500);
}

TEST(ScheduleProperty, ReceiversThatDisagreeWithTheirSendersAreCaught) {
  // A receive stream whose items are in another order than the sender's (what sorting by a rank-local key would
  // give), or one item shorter: the wire simulation must fail.
  Gen g(7);
  int tried = 0, caught = 0;
  for (int c = 0; c < 3000 && tried < 300; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, false, &p, &plans)) continue;
    std::vector<RankSchedule> sched = schedulesFor(p, plans, 48);
    for (RankSchedule& rs : sched)
      for (WireStream& w : rs.recvs) {
        if (w.items.size() < 2 || w.items[0].bytes == 0) continue;
        if (tried % 2 == 0) std::swap(w.items[0].transfer, w.items[1].transfer);
        else w.bytes -= 1;
        tried++;
        caught += !simulateWire(p, plans, sched).ok;
        goto next;
      }
  next:;
  }
  printf("schedule mutations tried %d, caught %d\n", tried, caught);
  EXPECT_GT(tried, 50);
  EXPECT_EQ(caught, tried);
}

// Every rank's executor tables with chunks of `chunk` bytes: every stream by ncclSend/ncclRecv, or (lsa) the
// streams inside a domain over its windows, each domain agreeing on its LSA rounds as plan creation makes it.
std::vector<ExecTables> execTablesFor(const Problem& p, const std::vector<RankPlan>& plans, int64_t chunk,
                                      bool direct = true, bool lsa = false, int zeroCopy = kZeroCopyOff) {
  ScheduleOptions o;
  o.stagingCapBytes = chunk * 4 * std::max(1, p.nRanks - 1);
  o.maxChunkBytes = chunk;
  o.lsa = lsa;
  o.zeroCopy = zeroCopy;
  o.direct = direct;  // as the executor
  std::vector<ExecTables> out(plans.size());
  std::vector<RankSchedule> sched(plans.size());
  std::map<int, int64_t> longest;  // by domain: its longest LSA stream (plan creation's agreement)
  for (size_t r = 0; r < plans.size(); r++) {
    std::string why;
    EXPECT_TRUE(buildSchedule(p, plans[r], o, &sched[r], &why)) << why;
    int64_t& m = longest[p.options.domainOf((int)r)];
    m = std::max(m, sched[r].lsaStreamMax);
  }
  for (size_t r = 0; r < plans.size(); r++) {
    std::string why;
    const int64_t m = longest[p.options.domainOf((int)r)];
    if (lsa && m > 0 && m < sched[r].chunkBytes) {  // the window's slots shrink to the domain's longest stream
      ScheduleOptions shrunk = o;
      shrunk.lsaSlotBytes = m;
      EXPECT_TRUE(buildSchedule(p, plans[r], shrunk, &sched[r], &why)) << why;
      EXPECT_EQ(sched[r].lsaBytes, sched[r].lsaSize > 1 ? m * sched[r].lsaSize : 0);
    }
    EXPECT_LE(sched[r].stagingBytes + sched[r].lsaBytes, o.stagingCapBytes);
    EXPECT_TRUE(buildExecTables(p, plans[r], sched[r], &out[r], &why, zeroCopy)) << why;
  }
  if (lsa) {
    std::map<int, int64_t> rounds, streams;  // by domain: the most LSA chunks of its ranks, their LSA streams
    for (size_t r = 0; r < plans.size(); r++) {
      int64_t& m = rounds[p.options.domainOf((int)r)];
      m = std::max(m, out[r].lsaChunks);
      streams[p.options.domainOf((int)r)] += sched[r].lsaStreams;
    }
    for (size_t r = 0; r < plans.size(); r++) {
      setLsaRounds(&out[r], rounds[p.options.domainOf((int)r)]);
      setRemoteBarriers(&out[r], streams[p.options.domainOf((int)r)]);
    }
  }
  return out;
}

TEST(ExecTablesProperty, LsaStreamsThroughTheWindowsAreDeliveredExactlyOnce) {
  // Streams inside a domain packed into the sender's window and unpacked from it by the receiver, with the domain's
  // barriers; across domains by ncclSend/ncclRecv as before. Removing one barrier before an LSA unpack, or giving
  // one rank of a domain fewer rounds, must fail.
  Gen g(20261204);
  int64_t checked = 0, lsaSegments = 0, p2pOps = 0, cases = 0;
  int broken = 0, caught = 0;
  for (int c = 0; c < 1500; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, c % 3 == 2 ? 2 : 1, &p, &plans)) continue;
    std::vector<ExecTables> t = execTablesFor(p, plans, (int64_t)16 << g.uniform(0, 4), c % 4 != 3, true);
    for (const ExecTables& x : t) {
      p2pOps += (int64_t)x.ops.size();
      for (const MoveSegment& s : x.unpack) lsaSegments += s.where != kStageLocal;
    }
    SimulationResult r = emulateExecute(p, t);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    checked += r.elementsChecked;
    cases++;
    for (size_t q = 0; q < t.size() && broken < 200; q++) {
      const ExecTables& x = t[q];
      for (size_t k = 0; k < x.rounds.size(); k++) {
        bool lsaUnpack = false;
        for (uint32_t i = x.rounds[k].unpackBegin; i < x.rounds[k].unpackEnd; i++)
          lsaUnpack = lsaUnpack || x.unpack[i].where != kStageLocal;
        if (!lsaUnpack) continue;
        std::vector<ExecTables> bad = t;
        if (broken % 2 == 0)
          bad[q].rounds[k].barrier = 0;
        else
          setLsaRounds(&bad[q], 0), bad[q].finalBarrier = 0;
        broken++;
        caught += !emulateExecute(p, bad).ok;
        break;
      }
    }
  }
  printf("executed %lld cases: %lld LSA unpack segments, %lld P2P operations, %lld destination elements checked; "
         "barriers broken %d, caught %d\n",
         (long long)cases, (long long)lsaSegments, (long long)p2pOps, (long long)checked, broken, caught);
  EXPECT_GT(lsaSegments, 1000);
  EXPECT_GT(p2pOps, 1000);
  EXPECT_GT(broken, 50);
  EXPECT_EQ(caught, broken);
}

TEST(ExecTablesProperty, ZeroCopyStreamsMoveInPlaceExactlyOnce) {
  // Zero-copy inside a domain: the receiver pulls from the sender's source (pull) or the sender pushes into the
  // receiver's destination (push), no window slots, no LSA rounds; across domains by ncclSend/ncclRecv as before.
  // Dropping one rank's publishing barrier, or an in-place segment, must fail.
  Gen g(20261205);
  int64_t checked = 0, remote = 0, cases = 0;
  int broken = 0, caught = 0;
  for (int c = 0; c < 1200; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, c % 3 == 2 ? 2 : 1, &p, &plans)) continue;
    const int mode = c % 2 == 0 ? kZeroCopyPull : kZeroCopyPush;
    std::vector<ExecTables> t = execTablesFor(p, plans, (int64_t)16 << g.uniform(0, 4), c % 4 != 3, true, mode);
    for (const ExecTables& x : t) {
      remote += (int64_t)x.remote.size();
      EXPECT_EQ(x.lsaBytes, 0);
      for (const MoveSegment& s : x.unpack) EXPECT_EQ(s.where, kStageLocal);
      for (const MoveSegment& s : x.pack) EXPECT_EQ(s.where, kStageLocal);
    }
    SimulationResult r = emulateExecute(p, t);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    checked += r.elementsChecked;
    cases++;
    for (size_t q = 0; q < t.size() && broken < 200; q++) {
      if (t[q].remote.empty()) continue;
      std::vector<ExecTables> bad = t;
      if (broken % 2 == 0)
        bad[q].remoteBarrier = 0;
      else
        bad[q].remote.pop_back();
      broken++;
      caught += !emulateExecute(p, bad).ok;
      break;
    }
  }
  printf("executed %lld cases: %lld in-place segments, %lld destination elements checked; broken %d, caught %d\n",
         (long long)cases, (long long)remote, (long long)checked, broken, caught);
  EXPECT_GT(remote, 1000);
  EXPECT_GT(broken, 50);
  EXPECT_EQ(caught, broken);
}

TEST(ExecTablesProperty, RandomLayoutPairsExecutedFromTheTablesAreDeliveredExactlyOnce) {
  // The executor's tables driven as the kernels and NCCL calls will drive them, on real element sizes.
  Gen g(20261202);
  const int64_t chunks[] = {16, 64, 1024};
  int64_t checked = 0, rounds = 0, cases = 0, direct = 0, piped = 0;
  for (int c = 0; c < 1500; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, true, &p, &plans)) continue;
    std::vector<ExecTables> t = execTablesFor(p, plans, chunks[g.uniform(0, 2)], c % 4 != 3);
    for (const ExecTables& x : t) {
      rounds += (int64_t)x.rounds.size(), direct += (int64_t)x.direct.size();
      piped += pipelinedRounds(x);  // the emulator packs them a round ahead (m2n_simulator.h)
    }
    SimulationResult r = emulateExecute(p, t);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    checked += r.elementsChecked;
    cases++;
  }
  printf("executed %lld cases, %lld rounds (%lld ranks' pipelined), %lld direct sends and receives, %lld destination "
         "elements checked\n",
         (long long)cases, (long long)rounds, (long long)piped, (long long)direct, (long long)checked);
  EXPECT_GT(direct, 1000);
  EXPECT_GT(rounds, 2000);
  EXPECT_GT(piped, 300);
  EXPECT_GT(checked, 100000);
}

TEST(ExecTablesProperty, PipelinedRoundsNeedTheirTwoSlots) {
  // The emulator runs a pipelined rank's packs a round ahead (m2n_simulator.h): tables whose every chunk went to
  // slot 0 (a send slot refilled before its exchange, a receive slot before its unpack) must fail it.
  Gen g(20261205);
  int piped = 0, caught = 0;
  for (int c = 0; c < 400 && piped < 60; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, true, &p, &plans)) continue;
    std::vector<ExecTables> t = execTablesFor(p, plans, 16, false);
    bool any = false;
    for (ExecTables& x : t) {
      if (!pipelinedRounds(x)) continue;
      any = true;
      // Round k holds chunk k of its streams, in slot k % 2; a stream with a round 1 has two slots, slot 1 one
      // chunk after slot 0. Fold the odd rounds back onto slot 0.
      for (size_t k = 1; k < x.rounds.size(); k += 2) {
        const ExecRound& r = x.rounds[k];
        for (uint32_t i = r.opBegin; i < r.opEnd; i++) x.ops[i].stageOffset -= x.chunkBytes;
        for (uint32_t i = r.packBegin; i < r.packEnd; i++) x.pack[i].stageOffset -= x.chunkBytes;
        for (uint32_t i = r.unpackBegin; i < r.unpackEnd; i++) x.unpack[i].stageOffset -= x.chunkBytes;
      }
    }
    if (!any) continue;
    piped++;
    caught += !emulateExecute(p, t).ok;
  }
  printf("pipelined plans with their slots folded: %d, caught %d\n", piped, caught);
  EXPECT_GT(piped, 30);
  EXPECT_GT(caught, piped / 2);
}

TEST(ExecTablesProperty, ConversionsInFlightAreDeliveredExactlyOnce) {
  // fp32 -> bf16 and bf16 -> fp32, converted where the source is read (copies and packs), the wire carrying
  // destination-typed elements; a descriptor whose conversion is dropped must fail.
  Gen g(20261203);
  int64_t checked = 0, converted = 0;
  int broken = 0, caught = 0;
  for (int c = 0; c < 800; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, 2, &p, &plans)) continue;
    std::vector<ExecTables> t = execTablesFor(p, plans, 64);
    SimulationResult r = emulateExecute(p, t);
    ASSERT_TRUE(r.ok) << "case " << c << ": " << r.firstError;
    checked += r.elementsChecked;
    for (const TensorPair& tp : p.tensors) converted += tp.src.dtype != tp.dst.dtype;
    for (ExecTables& x : t) {
      MoveDesc* d = nullptr;
      for (auto* list : {&x.copies, &x.sends})
        for (MoveDesc& m : *list)
          if (!d && m.convert != kConvertNone) d = &m;
      if (!d) continue;
      d->convert = kConvertNone;
      broken++;
      caught += !emulateExecute(p, t).ok;
      break;
    }
  }
  printf("conversions: %lld tensors converted, %lld destination elements checked; %d of %d broken caught\n",
         (long long)converted, (long long)checked, caught, broken);
  EXPECT_GT(converted, 500);
  EXPECT_GT(broken, 100);
  EXPECT_EQ(caught, broken);
}

// Draws planned batches (dtypes as drawPlanned) until `want` of them took a mutation: mutate(tables, k) breaks one
// rank's tables with the k-th mutation tried (returning false when that rank has nothing to break), and the
// emulator must then fail. Prints and checks that every mutation was caught.
template <typename Mutate>
void expectMutationsCaught(const char* what, uint64_t seed, int dtypes, int draws, int want, Mutate mutate) {
  Gen g(seed);
  int tried = 0, caught = 0;
  for (int c = 0; c < draws && tried < want; c++) {
    Problem p;
    std::vector<RankPlan> plans;
    if (!drawPlanned(g, dtypes, &p, &plans)) continue;
    std::vector<ExecTables> t = execTablesFor(p, plans, 64);
    for (ExecTables& x : t) {
      if (!mutate(&x, tried)) continue;
      tried++;
      caught += !emulateExecute(p, t).ok;
      break;
    }
  }
  printf("%s mutations tried %d, caught %d\n", what, tried, caught);
  EXPECT_GT(tried, 100);
  EXPECT_EQ(caught, tried);
}

TEST(ExecTablesProperty, BrokenDirectTransfersAreCaught) {
  // A direct receive moved by one element, shrunk, or dropped; two of a pair's sends swapped: each must fail.
  expectMutationsCaught("direct", 13, 1, 6000, 300, [](ExecTables* x, int k) {
    std::vector<size_t> recvs, sends;
    for (size_t i = 0; i < x->direct.size(); i++) (x->direct[i].send ? sends : recvs).push_back(i);
    if (recvs.empty()) return false;
    DirectOp& r = x->direct[recvs[0]];
    if (k % 4 == 0) r.offset += 1;
    if (k % 4 == 1) r.bytes -= 1;
    if (k % 4 == 2) x->direct.erase(x->direct.begin() + recvs[0]);
    if (k % 4 == 3) {  // two sends to one peer of different sizes, swapped
      for (size_t i = 0; i < sends.size(); i++)
        for (size_t j = i + 1; j < sends.size(); j++)
          if (x->direct[sends[i]].peer == x->direct[sends[j]].peer &&
              x->direct[sends[i]].bytes != x->direct[sends[j]].bytes) {
            std::swap(x->direct[sends[i]], x->direct[sends[j]]);
            return true;
          }
      return false;
    }
    return true;
  });
}

TEST(ExecTablesProperty, BrokenTablesAreCaught) {
  // A pack segment moved in the staging, a receive of another size, an unpack dropped: each must fail.
  expectMutationsCaught("table", 11, 0, 4000, 300, [](ExecTables* x, int k) {
    if (x->pack.empty() || x->unpack.empty()) return false;
    if (k % 3 == 0) x->pack[0].stageOffset += 16;
    if (k % 3 == 1)
      for (P2pOp& op : x->ops)
        if (!op.send) {
          op.bytes -= 1;
          break;
        }
    if (k % 3 == 2) x->unpack[0].elements = 0;
    return true;
  });
}

TEST(Schedule, ChunkSizeIsTheSameOnEveryRankAndFitsTheCap) {
  ScheduleOptions o;  // 256 MiB, chunks up to 64 MiB
  std::string why;
  EXPECT_EQ(chunkBytesFor(2, o, &why), 64ll << 20);
  EXPECT_EQ(chunkBytesFor(1, o, &why), 64ll << 20);
  EXPECT_EQ(chunkBytesFor(8, o, &why), (256ll << 20) / 28 / kStreamAlign * kStreamAlign);
  const int64_t c = chunkBytesFor(1024, o, &why);  // 4 slots per peer, 1023 peers
  EXPECT_EQ(c % kStreamAlign, 0);
  EXPECT_LE(c * 4 * 1023, o.stagingCapBytes);
  EXPECT_GT((c + kStreamAlign) * 4 * 1023, o.stagingCapBytes);
  o.stagingCapBytes = 1000;
  EXPECT_EQ(chunkBytesFor(64, o, &why), 0);
  EXPECT_NE(why.find("staging cap of 1000 bytes cannot hold 252 chunks"), std::string::npos) << why;
}

MoveDesc box(std::vector<int64_t> extent, std::vector<int64_t> src, std::vector<int64_t> dst) {
  MoveDesc d;
  d.ndims = (int)extent.size();
  d.elemBytes = 2;
  for (int k = 0; k < d.ndims; k++) {
    d.extent[k] = extent[k];
    d.srcStride[k] = src[k];
    d.dstStride[k] = dst[k];
  }
  return d;
}
std::vector<int64_t> dims(const MoveDesc& d, const int64_t* a) { return std::vector<int64_t>(a, a + d.ndims); }

TEST(ExecTables, CoalesceMergesWhatBothSidesContinue) {
  MoveDesc dense = box({4, 6, 8}, {48, 8, 1}, {48, 8, 1});
  coalesce(&dense);
  EXPECT_EQ(dims(dense, dense.extent), std::vector<int64_t>({192}));
  EXPECT_EQ(dims(dense, dense.srcStride), std::vector<int64_t>({1}));
  MoveDesc rows = box({8, 1, 4}, {8, 99, 1}, {4, 7, 1});  // a column block of a row-major matrix; a unit dim
  coalesce(&rows);
  EXPECT_EQ(dims(rows, rows.extent), std::vector<int64_t>({8, 4}));
  EXPECT_EQ(dims(rows, rows.srcStride), std::vector<int64_t>({8, 1}));
  EXPECT_EQ(dims(rows, rows.dstStride), std::vector<int64_t>({4, 1}));
  MoveDesc transposed = box({3, 5}, {5, 1}, {1, 3});  // nothing continues on the destination side
  coalesce(&transposed);
  EXPECT_EQ(transposed.ndims, 2);
  MoveDesc one = box({1, 1}, {9, 9}, {3, 3});
  coalesce(&one);
  EXPECT_EQ(one.ndims, 1);
  EXPECT_EQ(one.extent[0], 1);
  // The same elements in the same order: every element's offsets agree before and after.
  MoveDesc before = box({2, 3, 4, 5}, {60, 20, 5, 1}, {120, 40, 10, 1});
  MoveDesc after = before;
  coalesce(&after);
  EXPECT_LT(after.ndims, before.ndims);
  for (int64_t e = 0; e < 120; e++) {
    int64_t s0, t0, s1, t1;
    moveOffsets(before, e, &s0, &t0);
    moveOffsets(after, e, &s1, &t1);
    ASSERT_EQ(s0, s1) << e;
    ASSERT_EQ(t0, t1) << e;
  }
}

// Transposing copies move in tiles (move.h): every element of the box once, from and to the places the row-major
// element path gives, whatever the tiles' fit (partial tiles at both edges, dims outside the tile plane on either
// side of it, conversions).
TEST(ExecTables, TransposingCopiesAreTiledAndMoveEveryElementOnce) {
  struct Case {
    MoveDesc d;
    int tileDim;  // expected
  };
  std::vector<Case> cases = {
      {box({70, 100}, {100, 1}, {1, 70}), 0},                               // row-major -> column-major
      {box({3, 40, 50}, {2000, 50, 1}, {2000, 1, 40}), 1},                  // batched
      {box({2, 20, 3, 17}, {1020, 51, 17, 1}, {1020, 1, 340, 20}), 1},      // a dim between the tiled ones
      {box({64, 128}, {128, 1}, {1, 64}), 0},                               // whole tiles only
      {box({70, 10}, {10, 1}, {1, 70}), -1},                                // too narrow to tile
      {box({70, 100}, {100, 1}, {100, 1}), -1},                             // not transposing
  };
  MoveDesc converted = box({33, 65}, {65, 1}, {1, 33});
  converted.convert = kConvertF32ToBf16;
  cases.push_back({converted, 0});
  for (size_t c = 0; c < cases.size(); c++) {
    const MoveDesc& d = cases[c].d;
    ASSERT_EQ(tileDimOf(d), cases[c].tileDim) << "case " << c;
    const int64_t n = product(d.extent, d.ndims);
    const int sb = sourceBytes(d), eb = d.elemBytes;
    int64_t srcSpan = 0, dstSpan = 0;
    for (int64_t e = 0; e < n; e++) {
      int64_t s, t;
      moveOffsets(d, e, &s, &t);
      srcSpan = std::max(srcSpan, s + 1);
      dstSpan = std::max(dstSpan, t + 1);
    }
    std::vector<char> src(srcSpan * sb), dst(dstSpan * eb, (char)0xff), want(dst);
    for (size_t i = 0; i < src.size(); i++) src[i] = (char)(i * 7 + 3);
    if (d.convert == kConvertF32ToBf16)  // finite floats
      for (size_t i = 0; i < src.size(); i += 4) {
        const float f = (float)i * 0.25f - 100.0f;
        memcpy(&src[i], &f, 4);
      }
    for (int64_t e = 0; e < n; e++) {
      int64_t s, t;
      moveOffsets(d, e, &s, &t);
      convertElement(&src[s * sb], &want[t * eb], d.convert, eb);
    }
    const std::vector<MoveDesc> copies = {d};
    const std::vector<MoveSegment> segs = copySegments(copies, 3 * kTileEdge * kTileEdge);
    const char* srcs[1] = {src.data()};
    char* dsts[1] = {dst.data()};
    const MoveEnds m{srcs, dsts, nullptr, nullptr};
    std::vector<int> seen(n, 0);
    for (const MoveSegment& g : segs) {
      ASSERT_EQ(g.where == kTileSegment, cases[c].tileDim >= 0) << "case " << c;
      if (g.where == kTileSegment) {
        EXPECT_LE(g.elements, 3) << "case " << c;
        for (int64_t t = g.firstElement; t < g.firstElement + g.elements; t++) {
          const TileSpan sp = tileSpanOf(d, tileDimOf(d), t);
          ASSERT_TRUE(sp.rows > 0 && sp.rows <= kTileEdge && sp.cols > 0 && sp.cols <= kTileEdge) << "case " << c;
          for (int64_t i = 0; i < sp.rows; i++)
            for (int64_t j = 0; j < sp.cols; j++) {
              const int64_t e = sp.e0 + i * sp.rowStep + j;
              ASSERT_TRUE(e >= 0 && e < n) << "case " << c << " tile " << t;  // before the move touches memory
              seen[e]++;
            }
        }
      } else {
        for (int64_t e = g.firstElement; e < g.firstElement + g.elements; e++) seen[e]++;
      }
      for (int tid = 0; tid < kMoveThreads; tid++) moveSegmentShare<kMoveCopy>(d, g, m, tid, kMoveThreads);
    }
    for (int64_t e = 0; e < n; e++) ASSERT_EQ(seen[e], 1) << "case " << c << " element " << e;
    EXPECT_EQ(dst, want) << "case " << c;
  }
}

// Segment sizes: a copy of at least longFrom elements gets the long segments, a smaller one the short ones, plain
// and tiled alike; the segments cover each copy once, in order.
TEST(ExecTables, LongCopiesGetLongSegments) {
  const MoveDesc small = box({64, 1024}, {1024, 1}, {1024, 1});          // 65,536 elements: plain
  const MoveDesc large = box({256, 1024}, {1024, 1}, {1024, 1});         // 262,144
  const MoveDesc tiled = box({256, 1024}, {1024, 1}, {1, 256});          // transposing, 64 tiles
  MoveDesc flat[3] = {small, large, tiled};
  for (MoveDesc& d : flat) coalesce(&d);
  const std::vector<MoveDesc> copies(flat, flat + 3);
  const int64_t tile = kTileEdge * kTileEdge;
  const std::vector<MoveSegment> segs = copySegments(copies, 4 * tile, 200000, 16 * tile);
  std::vector<int64_t> count(3, 0), most(3, 0), next(3, 0);
  for (const MoveSegment& g : segs) {
    ASSERT_EQ(g.firstElement, next[g.desc]) << g.desc;
    next[g.desc] += g.elements;
    count[g.desc]++;
    most[g.desc] = std::max(most[g.desc], g.elements);
  }
  EXPECT_EQ(count, std::vector<int64_t>({4, 4, 4}));  // 65,536 / 16,384; 262,144 / 65,536; 64 tiles / 16
  EXPECT_EQ(most, std::vector<int64_t>({4 * tile, 16 * tile, 16}));
  EXPECT_EQ(next, std::vector<int64_t>({65536, 262144, 64}));
  // Without longFrom every copy gets the short ones.
  EXPECT_EQ(copySegments(copies, 4 * tile).size(), 4u + 16u + 16u);
}

// The copy kernel walks a tile segment with a TileCursor (offsets stepped along a row of tiles): at every tile it
// must agree with tileSpanOf + moveOffsets, the emulator's reference, from any first tile (a segment starts
// anywhere), over partial tiles at both edges and dims on either side of the tile plane.
TEST(ExecTables, TileCursorStepsToWhatTileSpanOfGives) {
  const std::vector<MoveDesc> descs = {
      box({70, 100}, {100, 1}, {1, 70}),
      box({3, 40, 50}, {2000, 50, 1}, {2000, 1, 40}),
      box({2, 20, 3, 17}, {1020, 51, 17, 1}, {1020, 1, 340, 20}),
      box({64, 128}, {128, 1}, {1, 64}),
      box({130, 200}, {1000, 1}, {1, 300}),  // strided on both sides (a box inside larger tensors)
      box({5, 129, 64}, {9000, 64, 1}, {9000, 1, 129}),
  };
  for (size_t c = 0; c < descs.size(); c++) {
    MoveDesc d = descs[c];
    d.srcOffset = 11;
    d.dstOffset = 7;
    const int b = tileDimOf(d);
    ASSERT_GE(b, 0) << "case " << c;
    const int64_t tiles = tileCountOf(d, b);
    for (int64_t first : {int64_t(0), int64_t(1), tiles / 3, tiles - 1}) {
      TileCursor cur;
      tileCursorAt(d, b, first, &cur);
      for (int64_t t = first; t < tiles; t++, tileCursorNext(d, b, &cur)) {
        const TileSpan want = tileSpanOf(d, b, t);
        int64_t s, u;
        moveOffsets(d, want.e0, &s, &u);
        ASSERT_EQ(cur.tile, t) << "case " << c;
        ASSERT_EQ(cur.s.e0, want.e0) << "case " << c << " tile " << t;
        ASSERT_EQ(cur.s.rows, want.rows) << "case " << c << " tile " << t;
        ASSERT_EQ(cur.s.cols, want.cols) << "case " << c << " tile " << t;
        ASSERT_EQ(cur.s.rowStep, want.rowStep) << "case " << c << " tile " << t;
        ASSERT_EQ(cur.src, s) << "case " << c << " tile " << t;
        ASSERT_EQ(cur.dst, u) << "case " << c << " tile " << t;
      }
    }
  }
}

}  // namespace
}  // namespace ncclm2n
