// The relayed exchange's protocol (docs/ARCHITECTURE.md, "Relayed exchanges"), checked over every interleaving: an
// explicit-state model of what each rank's kernels wait for and write, step for step as the code does it
//   send half   ll/kernels.cu waitBankFree + sendHeaders/sendRows; ht/copy.cuh waitPeersConsumed: waits until every
//               other rank of my domain released a done flag of call n - banks, then writes my slice (data, then
//               its flag = n) into bank n % banks of every rank of my domain, and my outbox for every other rank;
//   exchange    rail/rail.cc Rail::messages (relay): my outboxes for a domain's ranks to the rank of my index there,
//               its outboxes for my domain's ranks into my inbox (one NCCL group: the ranks of one index meet);
//   relay       rail/relay.cu: waits as the send half does (not for itself: its own receive half of the bank's last
//               call ran before on its stream), then copies each inbox slice into its rank's window at the writer's
//               slice, flag value and all;
//   receive     acquires every source's flag (>= n) in my window, reads the slices, then (finishCall) releases my
//               done flag n into every other window of my domain.
// A rank's kernels run in its stream's order; LL's send-only calls keep two calls open (S X Y of n and n + 1, then the
// two receive halves); with rail_overlap (HT) my domain's rows go on a side stream, forked after the previous receive
// half and joined before this call's, and the main stream's send half writes only outboxes. Checked: every slice a
// receive half reads holds call n's data from its acquire to its done flag (no stale slice, none overwritten under a
// reader), and no reachable state is stuck. Weaker waits (an older call's done flag, the done flag before the reads, a
// receive half taking the previous call's flag, a relay into the other bank, one bank for two open calls) must fail.
// Simplified: one call kind per run (dispatch and combine have flags and banks of their own; on a stream they only add
// order), a slice is one unit with one flag (the code's rows and slices each have theirs, waited for alike), and an
// exchange ends once every rank of its index is in it.
//
// The second model adds what the one GPU of the mixed test mode adds: each process (domain) pushes its ranks' kernels
// into a few hardware queues, a queue's head leaves only once its stream's previous kernel finished, and virtual ranks
// are host threads that launch independently, with a launch fence after each relay (Rail::relayFence) except in a
// graph replay. It finds the back-to-back replays' hang wherever two ranks' kernels share a queue, fences or not, and
// none with a queue per rank: the protocol's bound holds; the hang needs a shared queue (docs/ARCHITECTURE.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace ncclep {
namespace {

enum KernelKind : uint8_t { kSend, kExchange, kRelay, kReceive };

struct RelayModel {
  int domains = 2, domainSize = 2, calls = 3;
  int banks = 2;               // LL: 2 (call n in bank n & 1); HT: 1
  bool sendOnlyPairs = false;  // LL's send-only calls: two open at once
  // rail_overlap (Rail::sideStream): my domain's rows go on a side stream, forked after the previous receive half and
  // joined before this call's; the main stream's send half writes only my outboxes and waits for nothing.
  bool sideStream = false;
  // The waits, as the code has them when 0 (a lag of `banks`); the mutants set them.
  int sendLag = 0, relayLag = 0;
  bool relayWaits = true, doneBeforeReads = false, acceptOlder = false, relayOtherBank = false;
  // Hardware queues per process (0: every kernel may run as soon as its stream allows) and the launch fences.
  int queuesPerProcess = 0;
  bool fences = false;
  bool replays = false;  // a rank pushes a call's kernels at once (one cudaGraphLaunch), else one at a time
};

struct Kernel {
  KernelKind kind;
  uint8_t call;
};

std::vector<Kernel> programOf(const RelayModel& m) {
  std::vector<Kernel> p;
  auto sendSide = [&](int n) {
    for (KernelKind k : {kSend, kExchange, kRelay}) p.push_back({k, (uint8_t)n});
  };
  for (int n = 1; n <= m.calls; n++) {
    if (m.sendOnlyPairs && n + 1 <= m.calls) {
      sendSide(n);
      sendSide(n + 1);
      p.push_back({kReceive, (uint8_t)n});
      p.push_back({kReceive, (uint8_t)(n + 1)});
      n++;
      continue;
    }
    sendSide(n);
    p.push_back({kReceive, (uint8_t)n});
  }
  return p;
}

struct Slice {
  uint8_t data = 0, flag = 0;  // the call whose data it holds, the flag's value
};

struct State {
  std::vector<uint8_t> pc;                  // [rank] the first kernel not finished
  std::vector<uint8_t> reading;             // [rank] the call whose slices its receive half holds acquired (0: none)
  std::vector<uint8_t> running;             // [rank] its kernel pc left the queue (queue model)
  std::vector<uint8_t> launched;            // [rank] kernels pushed (queue model)
  std::vector<std::deque<uint8_t>> queues;  // rank of each queued kernel, in push order
  std::vector<Slice> window;                // [rank][bank][source]
  std::vector<uint8_t> outbox;              // [rank][destination]
  std::vector<uint8_t> inbox;  // [rank][writer]: what writer wrote for this rank's domain, per local rank below
  std::vector<uint8_t> done;   // [rank][peer]: the peer's done flag in this rank's window
  std::vector<uint8_t> side;   // [rank] side-stream send halves done (sideStream)

  std::string key() const {
    std::string k(pc.begin(), pc.end());
    k.append(side.begin(), side.end());
    k.append(reading.begin(), reading.end());
    k.append(running.begin(), running.end());
    k.append(launched.begin(), launched.end());
    for (const auto& q : queues) {
      k.push_back('|');
      k.append(q.begin(), q.end());
    }
    for (const Slice& s : window) k.append({(char)s.data, (char)s.flag});
    k.append(outbox.begin(), outbox.end());
    k.append(inbox.begin(), inbox.end());
    k.append(done.begin(), done.end());
    return k;
  }
};

class Checker {
 public:
  explicit Checker(const RelayModel& m)
      : m_(m), R_(m.domains * m.domainSize), G_(m.domainSize), prog_(programOf(m)), K_((int)prog_.size()) {}

  // Every interleaving (depth first, states seen once). The first violation, or "" and the states visited and the
  // most calls any rank's send halves were ahead of any rank's receive halves (the bound the banks rely on).
  std::string exhaustive(size_t* states, int* maxLead) {
    *maxLead = 0;
    std::unordered_set<std::string> seen;
    std::vector<State> stack{initial()};
    seen.insert(stack.back().key());
    while (!stack.empty()) {
      State s = std::move(stack.back());
      stack.pop_back();
      *maxLead = std::max(*maxLead, leadOf(s));
      std::vector<State> next;
      std::string why = successors(s, &next);
      if (!why.empty()) return why;
      for (State& n : next)
        if (seen.insert(n.key()).second) stack.push_back(std::move(n));
    }
    *states = seen.size();
    return "";
  }

  // One random interleaving to the end (for shapes too large to enumerate).
  std::string randomWalk(uint64_t seed) {
    std::mt19937_64 rng(seed);
    State s = initial();
    for (;;) {
      std::vector<State> next;
      std::string why = successors(s, &next);
      if (!why.empty() || next.empty()) return why;
      s = std::move(next[rng() % next.size()]);
    }
  }

 private:
  // The most calls a rank wrote (send half or relay) into a window of its domain past the last call that window's
  // rank received: at most `banks`, or a write lands in the bank of a call not yet read.
  int leadOf(const State& s) const {
    int lead = 0;
    for (int q = 0; q < R_; q++) {
      int written = 0;
      for (int k = 0; k < s.pc[q]; k++)  // with the side stream the main send half writes only outboxes
        if ((prog_[k].kind == kSend && !m_.sideStream) || prog_[k].kind == kRelay)
          written = std::max(written, (int)prog_[k].call);
      written = std::max(written, (int)s.side[q]);
      for (int p = domainOf(q) * G_; p < (domainOf(q) + 1) * G_; p++) {
        int received = 0;
        for (int k = 0; k < s.pc[p]; k++)
          if (prog_[k].kind == kReceive) received = prog_[k].call;
        lead = std::max(lead, written - received);
      }
    }
    return lead;
  }
  int domainOf(int r) const { return r / G_; }
  int indexOf(int r) const { return r % G_; }
  int bankOf(int n) const { return n % m_.banks; }
  Slice& win(State& s, int r, int bank, int src) const { return s.window[((size_t)r * m_.banks + bank) * R_ + src]; }
  uint8_t& done(State& s, int r, int peer) const { return s.done[(size_t)r * R_ + peer]; }
  int queueOf(int r) const { return domainOf(r) * m_.queuesPerProcess + indexOf(r) % m_.queuesPerProcess; }
  bool queued() const { return m_.queuesPerProcess > 0; }

  State initial() const {
    State s;
    s.pc.assign(R_, 0);
    s.reading.assign(R_, 0);
    s.running.assign(R_, 0);
    s.launched.assign(R_, 0);
    s.queues.assign(queued() ? m_.domains * m_.queuesPerProcess : 0, {});
    s.window.assign((size_t)R_ * m_.banks * R_, Slice{});
    s.outbox.assign((size_t)R_ * R_, 0);
    s.inbox.assign((size_t)R_ * R_, 0);
    s.done.assign((size_t)R_ * R_, 0);
    s.side.assign(R_, 0);
    return s;
  }

  // Every rank of r's domain but r released a done flag of call `atLeast` or later into r's window.
  bool peersConsumed(State& s, int r, int atLeast) const {
    for (int q = domainOf(r) * G_; q < (domainOf(r) + 1) * G_; q++)
      if (q != r && done(s, r, q) < atLeast) return false;
    return true;
  }

  // r's receive half of call n holds call n's data in every source's slice, else the violation.
  std::string checkReads(State& s, int r, int n, const char* when) const {
    for (int src = 0; src < R_; src++) {
      const uint8_t d = win(s, r, bankOf(n), src).data;
      if (d != n)
        return "rank " + std::to_string(r) + "'s receive half of call " + std::to_string(n) + " " + when + " source " +
               std::to_string(src) + "'s slice holding call " + std::to_string(d);
    }
    return "";
  }

  void releaseDone(State& s, int r, int n) const {
    for (int q = domainOf(r) * G_; q < (domainOf(r) + 1) * G_; q++)
      if (q != r) done(s, q, r) = (uint8_t)n;
  }

  // The kernel at r's pc runs one step if it can: the successor state, or nothing. `why` gets a violation.
  bool step(const State& from, int r, State* to, std::string* why) const {
    const Kernel k = prog_[from.pc[r]];
    const int n = k.call, d = domainOf(r), i = indexOf(r);
    State s = from;
    auto finish = [&](int rank) {
      s.pc[rank]++;
      s.running[rank] = 0;
    };
    switch (k.kind) {
      case kSend:
        if (!m_.sideStream && !peersConsumed(s, r, n - (m_.sendLag ? m_.sendLag : m_.banks))) return false;
        for (int q = 0; q < R_; q++) {
          if (domainOf(q) != d)
            s.outbox[(size_t)r * R_ + q] = (uint8_t)n;
          else if (!m_.sideStream)
            win(s, q, bankOf(n), r) = Slice{(uint8_t)n, (uint8_t)n};
        }
        finish(r);
        break;
      case kExchange: {
        // One NCCL group among the ranks of index i: it ends when every one of them is in it. The lowest
        // domain's rank makes the step, so that each group is one transition.
        for (int dd = 0; dd < m_.domains; dd++) {
          const int p = dd * G_ + i;
          if (from.pc[p] >= K_ || prog_[from.pc[p]].kind != kExchange || prog_[from.pc[p]].call != n) return false;
          if (queued() && !from.running[p]) return false;
        }
        if (d != 0) return false;
        for (int dp = 0; dp < m_.domains; dp++)
          for (int dw = 0; dw < m_.domains; dw++) {
            if (dw == dp) continue;
            const int p = dp * G_ + i, w = dw * G_ + i;
            for (int j = 0; j < G_; j++)
              s.inbox[(size_t)p * R_ + dw * G_ + j] = from.outbox[(size_t)w * R_ + dp * G_ + j];
          }
        for (int dd = 0; dd < m_.domains; dd++) finish(dd * G_ + i);
        break;
      }
      case kRelay:
        if (m_.relayWaits && !peersConsumed(s, r, n - (m_.relayLag ? m_.relayLag : m_.banks))) return false;
        for (int dw = 0; dw < m_.domains; dw++) {
          if (dw == d) continue;
          for (int j = 0; j < G_; j++) {
            const uint8_t t = s.inbox[(size_t)r * R_ + dw * G_ + j];
            win(s, d * G_ + j, bankOf(n + (m_.relayOtherBank ? 1 : 0)), dw * G_ + i) = Slice{t, t};
          }
        }
        finish(r);
        break;
      case kReceive:
        if (!s.reading[r]) {
          if (m_.sideStream && s.side[r] < n)
            return false;  // the join: the side stream's send half of this call came first
          for (int src = 0; src < R_; src++)
            if (win(s, r, bankOf(n), src).flag < n - (m_.acceptOlder ? 1 : 0)) return false;
          *why = checkReads(s, r, n, "acquired");
          s.reading[r] = (uint8_t)n;
          if (m_.doneBeforeReads) releaseDone(s, r, n);
        } else {
          *why = checkReads(s, r, n, "found, before its done flag,");
          s.reading[r] = 0;
          releaseDone(s, r, n);
          finish(r);
        }
        break;
    }
    *to = std::move(s);
    return true;
  }

  // Rank r may push its next kernel: the launch fence after a relay holds it until every rank of its domain pushed
  // that relay.
  bool mayLaunch(const State& s, int r) const {
    const int k = s.launched[r];
    if (k >= K_) return false;
    if (!m_.fences || k == 0 || prog_[k - 1].kind != kRelay) return true;
    for (int q = domainOf(r) * G_; q < (domainOf(r) + 1) * G_; q++)
      if (s.launched[q] < k) return false;
    return true;
  }

  // r's side-stream send half of its next call, if the fork (its previous receive half done) and its wait allow.
  bool sideStep(const State& from, int r, State* to) const {
    const int n = from.side[r] + 1;
    if (!m_.sideStream || n > m_.calls) return false;
    int received = 0;
    for (int k = 0; k < from.pc[r]; k++) received += prog_[k].kind == kReceive;
    State s = from;
    if (received < n - 1 || !peersConsumed(s, r, n - (m_.sendLag ? m_.sendLag : m_.banks))) return false;
    for (int q = domainOf(r) * G_; q < (domainOf(r) + 1) * G_; q++)
      win(s, q, bankOf(n), r) = Slice{(uint8_t)n, (uint8_t)n};
    s.side[r]++;
    *to = std::move(s);
    return true;
  }

  std::string successors(const State& s, std::vector<State>* next) const {
    bool unfinished = false;
    for (int r = 0; r < R_; r++) {
      State t;
      if (sideStep(s, r, &t)) next->push_back(std::move(t));
    }
    for (int r = 0; r < R_; r++) {
      if (s.pc[r] >= K_) continue;
      unfinished = true;
      if (queued() && !s.running[r]) continue;
      State t;
      std::string why;
      if (step(s, r, &t, &why)) {
        if (!why.empty()) return why;
        next->push_back(std::move(t));
      }
    }
    if (queued()) {
      for (int r = 0; r < R_; r++)
        if (mayLaunch(s, r)) {
          State t = s;
          do {
            t.queues[queueOf(r)].push_back((uint8_t)r);
            t.launched[r]++;
          } while (m_.replays && t.launched[r] < K_ && prog_[t.launched[r] - 1].kind != kReceive);
          next->push_back(std::move(t));
        }
      // A queue's head leaves once its stream's previous kernel finished (it is then the rank's kernel at pc).
      for (size_t q = 0; q < s.queues.size(); q++) {
        if (s.queues[q].empty()) continue;
        const int r = s.queues[q].front();
        if (s.running[r] || s.launched[r] <= s.pc[r]) continue;
        // The head is r's oldest kernel still queued: kernel pc (pushed in order, not yet running).
        State t = s;
        t.queues[q].pop_front();
        t.running[r] = 1;
        next->push_back(std::move(t));
      }
    }
    if (unfinished && next->empty()) {
      std::string at;
      for (int r = 0; r < R_; r++) {
        if (s.pc[r] >= K_) continue;
        const Kernel k = prog_[s.pc[r]];
        at += " rank " + std::to_string(r) + " at " + "SXYR"[k.kind] + std::to_string(k.call) +
              (queued() && !s.running[r] ? " (queued)" : "");
      }
      return "stuck:" + at;
    }
    return "";
  }

  RelayModel m_;
  int R_, G_;
  std::vector<Kernel> prog_;
  int K_;
};

std::string check(const RelayModel& m, size_t* states = nullptr, int* maxLead = nullptr) {
  size_t n = 0;
  int lead = 0;
  std::string why = Checker(m).exhaustive(&n, &lead);
  if (states) *states = n;
  if (maxLead) *maxLead = lead;
  return why;
}

RelayModel lowLatency(int calls) {
  RelayModel m;
  m.calls = calls;
  return m;
}

RelayModel highThroughput(int calls) {
  RelayModel m;
  m.calls = calls;
  m.banks = 1;
  return m;
}

// One domain (the LSA protocol the relays join) and two domains of two over the relays: Low-Latency's whole calls and
// send-only pairs, High-Throughput's one bank; every interleaving of 4 calls. A writer gets as far ahead of a reader
// of its domain as the banks allow, never further (the bound is reached: the banks are all used).
TEST(RelayProtocol, EveryInterleavingReadsEachCallsDataAndFinishes) {
  struct Shape {
    int domains, banks;
    bool pairs;
  };
  for (const Shape& sh : {Shape{1, 1, false}, Shape{1, 2, false}, Shape{1, 2, true}, Shape{2, 1, false},
                          Shape{2, 2, false}, Shape{2, 2, true}}) {
    RelayModel m = sh.banks == 2 ? lowLatency(4) : highThroughput(4);
    m.domains = sh.domains;
    m.sendOnlyPairs = sh.pairs;
    size_t states = 0;
    int lead = -1;
    EXPECT_EQ(check(m, &states, &lead), "") << sh.domains << " domains, " << sh.banks << " banks, pairs " << sh.pairs;
    EXPECT_GT(states, 100u);  // the search really branched
    EXPECT_EQ(lead, sh.banks) << sh.domains << " domains, " << sh.banks << " banks, pairs " << sh.pairs;
  }
}

TEST(RelayProtocol, RandomInterleavingsOfLongerRunsAndMoreDomains) {
  for (int banks : {1, 2})
    for (int domains : {2, 3}) {
      RelayModel m = banks == 2 ? lowLatency(12) : highThroughput(12);
      m.domains = domains;
      m.sendOnlyPairs = banks == 2 && domains == 3;
      for (uint64_t seed = 1; seed <= 300; seed++)
        ASSERT_EQ(Checker(m).randomWalk(seed), "") << "banks " << banks << ", domains " << domains << ", seed " << seed;
    }
}

// Each weaker wait lets some interleaving read a slice of the wrong call, or stick: the checks can fail.
TEST(RelayProtocol, WeakerWaitsAreCaught) {
  auto wrongCall = [](const RelayModel& m) { return check(m).find("holding call") != std::string::npos; };
  auto stuck = [](const RelayModel& m) { return check(m).rfind("stuck:", 0) == 0; };
  RelayModel m = highThroughput(4);
  m.domains = 1;
  m.sendLag = 2;  // High-Throughput's one bank with the done flag of the call before last
  EXPECT_TRUE(wrongCall(m));
  m.domains = 2;
  m.relayLag = 2;
  EXPECT_TRUE(wrongCall(m));
  m = lowLatency(4);
  m.sendOnlyPairs = true;
  m.sendLag = 3;
  EXPECT_TRUE(wrongCall(m));
  m = lowLatency(4);
  m.sendOnlyPairs = true;
  m.doneBeforeReads = true;  // finishCall's done flag before the reads
  EXPECT_TRUE(wrongCall(m));
  m = lowLatency(4);
  m.acceptOlder = true;  // a receive half that takes the previous call's flag
  EXPECT_TRUE(wrongCall(m));
  m = lowLatency(4);
  m.relayOtherBank = true;
  EXPECT_TRUE(stuck(m));
  m = lowLatency(4);
  m.banks = 1;  // two open send-only calls in one bank: the second waits for a receive half queued behind it
  m.sendOnlyPairs = true;
  EXPECT_TRUE(stuck(m));
}

// Whole calls bound the skew by themselves: no rank writes call n + 2 before every rank of its domain received call n,
// since a receive half needs every domain peer's send half (and, across domains, relay) of the same call, which that
// peer's stream runs after its previous receive half. So Low-Latency's done flags matter only for send-only pairs, and
// the relay's wait is implied by its own send half's on the same stream (not where the send half runs on rail_overlap's
// side stream): kept, they cost one poll.
TEST(RelayProtocol, WholeCallsNeedNoDoneFlagsWithTwoBanks) {
  RelayModel m = lowLatency(4);
  m.sendLag = 100;
  m.relayWaits = false;
  int lead = -1;
  EXPECT_EQ(check(m, nullptr, &lead), "");
  EXPECT_EQ(lead, 2);
  m.sendOnlyPairs = true;
  EXPECT_NE(check(m), "");
}

// rail_overlap (High-Throughput's): the main stream's send half waits for nothing (it writes only outboxes), so the
// relay's own wait is what keeps it off the bank a peer still reads: without it some interleaving fails, with it none.
TEST(RelayProtocol, OnTheOverlapsSideStreamTheRelaysWaitIsNeeded) {
  RelayModel m = highThroughput(4);
  m.sideStream = true;
  size_t states = 0;
  int lead = -1;
  EXPECT_EQ(check(m, &states, &lead), "");
  EXPECT_GT(states, 1000u);
  EXPECT_EQ(lead, 1);
  m.relayWaits = false;
  EXPECT_NE(check(m).find("holding call"), std::string::npos);
}

// Back-to-back graph replays on one GPU (a replay has no launch fences): where two ranks' kernels share a process's
// hardware queue, a rank's receive half spins while its next call's send half blocks the queue ahead of the peer's
// send half it waits for. With a queue per rank nothing sticks. The fences of uncaptured calls do not save a shared
// queue either (a rank may launch a whole call before its peer launches its previous receive half).
TEST(RelayProtocol, BackToBackReplaysStickOnlyWhereRanksShareAHardwareQueue) {
  for (int banks : {1, 2}) {
    RelayModel m = banks == 2 ? lowLatency(2) : highThroughput(2);
    m.replays = true;
    m.queuesPerProcess = 2;
    size_t states = 0;
    EXPECT_EQ(check(m, &states), "") << banks << " banks";
    EXPECT_GT(states, 1000u);
    m.queuesPerProcess = 1;
    EXPECT_EQ(check(m).rfind("stuck:", 0), 0u) << banks << " banks";
  }
  RelayModel m = lowLatency(2);
  m.queuesPerProcess = 1;
  m.fences = true;
  EXPECT_EQ(check(m).rfind("stuck:", 0), 0u);
}

}  // namespace
}  // namespace ncclep
