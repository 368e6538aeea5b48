// The receive cap's position arithmetic (nccl_ep/src/ht/cap.h, the code the handle's exchange kernel runs) against
// the host reference (tests/unit/ep_reference.h, dispatchLayout with a cap), on random routings: every rank derives
// its offsets from the same count matrix, then each row is placed as the kernels place it. Dispatch: a source's row
// for rank r lands at r's FLAT row dispAt + slot; below the cap that is exactly the reference's row of that (source,
// token), no two rows meet, and the rows past it are the reference's dropped ones. The retained counts (a source's
// rows for an expert below the cap's room at r, ht/route.cu) are the reference's per-(source, expert) zone rows.
// Combine: an expert rank writes its row for owner s at combAt + slot of s's staging, where the owner looks for it
// (combMine + slot), every position below M x min(R, K) and none shared; the owner skips exactly the rows r dropped.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "nccl_ep/src/ht/cap.h"
#include "nccl_ep/src/rail/view.h"
#include "tests/unit/ep_reference.h"

namespace ncclep {
namespace {

using ref::Routing;

struct Case {
  Routing r;
  int cap, maxTokens;
  // sendSlot[s][t][d]: position of token t among s's tokens with an expert on d (slotKernel's), -1 if none.
  std::vector<std::vector<std::vector<int>>> slot;
  std::vector<std::vector<int>> counts;  // counts[s][d]: the count matrix of the handle exchange
};

Case makeCase(std::mt19937& rng) {
  Case c;
  c.maxTokens = 1 + rng() % 48;
  c.r = ref::randomRouting(rng, 6, c.maxTokens, 6);
  const Routing& r = c.r;
  c.cap = 1 + rng() % std::max(1, r.nRanks * c.maxTokens);
  const int R = r.nRanks;
  c.slot.assign(R, {});
  c.counts.assign(R, std::vector<int>(R, 0));
  for (int s = 0; s < R; s++) {
    c.slot[s].assign(r.numTokens[s], std::vector<int>(R, -1));
    for (int t = 0; t < r.numTokens[s]; t++) {
      std::vector<char> hit(R, 0);
      for (int k = 0; k < r.topk; k++) {
        const int e = r.topkIdx[s][(size_t)t * r.topk + k];
        if (e >= 0) hit[r.owner(e)] = 1;
      }
      for (int d = 0; d < R; d++)
        if (hit[d]) c.slot[s][t][d] = c.counts[s][d]++;
    }
  }
  return c;
}

TEST(EpCapModel, DensePositionsAreTheReferencesFlatRowsAndNeverMeet) {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 2000; iter++) {
    const Case c = makeCase(rng);
    const Routing& r = c.r;
    const int R = r.nRanks, L = r.localExperts();
    auto rows = [&](int s, int d) { return c.counts[s][d]; };
    const std::vector<ref::RankRecv> want = ref::dispatchLayout(r, 1, c.cap);
    std::vector<std::vector<CapOffsets>> off(R, std::vector<CapOffsets>(R));  // off[me][d], as rank me derives it
    for (int me = 0; me < R; me++)
      for (int d = 0; d < R; d++) off[me][d] = capOffsets(rows, R, me, d);
    for (int d = 0; d < R; d++) {
      // Dispatch: where every source's rows land at d.
      std::map<int, std::pair<int, int>> landed;  // position -> (source, token)
      int dropped = 0;
      std::vector<std::vector<int>> keptOf(R, std::vector<int>(L, 0));  // sender-side retained counts
      for (int s = 0; s < R; s++)
        for (int t = 0; t < r.numTokens[s]; t++) {
          const int sl = c.slot[s][t][d];
          if (sl < 0) continue;
          const int dispAt = off[s][d].dispAt;
          if (capDrops(dispAt, sl, c.cap)) {
            dropped++;
            continue;
          }
          ASSERT_TRUE(landed.emplace(dispAt + sl, std::make_pair(s, t)).second) << "two rows at one position";
          for (int k = 0; k < r.topk; k++) {
            const int e = r.topkIdx[s][(size_t)t * r.topk + k];
            if (e >= 0 && r.owner(e) == d) keptOf[s][e - d * L]++;
          }
        }
      ASSERT_EQ(landed.size(), want[d].flat.size()) << "iter " << iter;
      EXPECT_EQ(dropped, want[d].dropped);
      int own = 0;  // d's FLAT offset for itself: what combine's test of its own row reads as dispAt[d]
      for (int s = 0; s < d; s++) own += c.counts[s][d];
      EXPECT_EQ(off[d][d].dispAt, own);
      for (const auto& [pos, st] : landed) {
        ASSERT_LT(pos, (int)want[d].flat.size());
        EXPECT_EQ(want[d].flat[pos].src, st.first);
        EXPECT_EQ(want[d].flat[pos].token, st.second);
      }
      // The retained counts: the reference's zone rows of each (source, expert).
      for (int l = 0; l < L; l++) {
        std::vector<int> ofSource(R, 0);
        for (int i = want[d].zoneStart[l]; i < want[d].zoneStart[l] + want[d].expertCounts[l]; i++)
          ofSource[want[d].em[i].src]++;
        for (int s = 0; s < R; s++) EXPECT_EQ(keptOf[s][l], ofSource[s]) << "iter " << iter;
      }
    }
    // Combine: expert rank d returns its kept rows of owner s into s's staging.
    const int combSlots = c.maxTokens * std::min(R, r.topk);
    for (int s = 0; s < R; s++) {
      std::set<int> used;
      for (int d = 0; d < R; d++)
        for (int t = 0; t < r.numTokens[s]; t++) {
          const int sl = c.slot[s][t][d];
          if (sl < 0) continue;
          const bool droppedAtD = capDrops(off[s][d].dispAt, sl, c.cap);  // the owner's view
          const bool keptByD = std::any_of(want[d].flat.begin(), want[d].flat.end(),
                                           [&](const ref::FlatRow& f) { return f.src == s && f.token == t; });
          ASSERT_EQ(droppedAtD, !keptByD);
          if (droppedAtD) continue;
          const int written = off[d][s].combAt + sl, read = off[s][d].combMine + sl;  // d's view, then s's
          ASSERT_EQ(written, read);
          ASSERT_LT(written, combSlots);
          ASSERT_TRUE(used.insert(written).second) << "two combine rows at one position";
        }
    }
  }
}

// Across NVLink domains (RailView::capped), every pair in another domain, in rounds of a random size: the sender
// writes its kept rows of a round (capDrops false) at slot - roundLo of its outbox, and sizes its message by the rows
// it keeps (capDelivered from its dispAt); the receiver sizes its receive by its srcCount (capDelivered from its
// recvOffset, the kernel's formula) and scatters entries [0, railRoundRows) of the inbox to recvOffset + roundLo +
// entry. Both ends agree on every message's rows, every entry written is one scattered, and it lands at the dense
// position the sender meant (dispAt + slot). Combine the same way back, to combMine + slot.
TEST(EpCapModel, RoundsAcrossDomainsPlaceEveryKeptRowOnce) {
  std::mt19937 rng(29);
  for (int iter = 0; iter < 2000; iter++) {
    const Case c = makeCase(rng);
    const Routing& r = c.r;
    const int R = r.nRanks, rounds = 1 + rng() % c.maxTokens;
    RailView rv;
    rv.roundSlots = (c.maxTokens + rounds - 1) / rounds;
    const int slots = rv.roundSlots;
    auto rows = [&](int s, int d) { return c.counts[s][d]; };
    for (int s = 0; s < R; s++)
      for (int d = 0; d < R; d++) {
        if (s == d) continue;
        const CapOffsets fromS = capOffsets(rows, R, s, d), atD = capOffsets(rows, R, d, s);
        int recvOffset = 0;  // d's, for source s (the exchange kernel's running sum)
        for (int q = 0; q < s; q++) recvOffset += c.counts[q][d];
        const int sent = capDelivered(c.counts[s][d], fromS.dispAt, c.cap);
        const int srcCount = capDelivered(c.counts[s][d], recvOffset, c.cap);
        ASSERT_EQ(sent, srcCount) << "iter " << iter << ": the pair's messages disagree";
        for (int lo = 0; lo < c.maxTokens; lo += slots) {
          // Dispatch: the entries s writes in this round, then those d scatters.
          std::map<int, int> written;  // entry -> the dense position s meant
          for (int t = 0; t < r.numTokens[s]; t++) {
            const int sl = c.slot[s][t][d];
            if (sl < lo || sl >= lo + slots || capDrops(fromS.dispAt, sl, c.cap)) continue;
            ASSERT_TRUE(written.emplace(sl - lo, fromS.dispAt + sl).second);
          }
          const int n = (int)railRoundRows(rv, lo / slots, srcCount);
          ASSERT_EQ((int)written.size(), n) << "iter " << iter << " round " << lo;
          for (int e = 0; e < n; e++) {
            ASSERT_EQ(written.count(e), 1u) << "entry " << e << " scattered but never written";
            EXPECT_EQ(recvOffset + lo + e, written[e]);
            EXPECT_LT(written[e], c.cap);
          }
          // Combine: d returns its kept rows of owner s (s's slots below srcCount) at slot - lo of its outbox; s
          // counts them from its own rows to d and its dispAt there, and places them at combMine[d] + slot.
          const int back = capDelivered(c.counts[s][d], fromS.dispAt, c.cap);
          const int m = (int)railRoundRows(rv, lo / slots, back);
          for (int e = 0; e < m; e++) EXPECT_EQ(fromS.combMine + lo + e, atD.combAt + lo + e);
          EXPECT_EQ(m, railRoundRows(rv, lo / slots, srcCount));
        }
      }
  }
}

}  // namespace
}  // namespace ncclep
