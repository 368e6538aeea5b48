// The virtual-rank mode's in-process host collectives (common/virtual_domain.h): results in rank order over many
// rounds of changing sizes, and the failures a dead or misbehaving virtual rank must produce (a timeout naming the
// absent ranks, a broken domain afterwards, a size mismatch), never a hang.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"
#include "common/virtual_domain.h"

namespace ncclext {
namespace {

TEST(VirtualDomain, AllGatherInRankOrderOverManyRounds) {
  constexpr int kRanks = 4, kRounds = 2000;
  VirtualDomain d(kRanks);
  std::vector<int> bad(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; r++) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < kRounds; round++) {
        const int n = 1 + round % 5;  // the size changes every round, the same on every rank
        std::vector<uint64_t> mine(n), all(n * kRanks, 0);
        for (int i = 0; i < n; i++) mine[i] = (uint64_t)round << 32 | (uint64_t)r << 8 | (uint64_t)i;
        if (d.allGather(r, mine.data(), n * sizeof(uint64_t), all.data(), 10) != ncclSuccess) {
          bad[r]++;
          return;
        }
        for (int s = 0; s < kRanks; s++)
          for (int i = 0; i < n; i++)
            bad[r] += all[s * n + i] != ((uint64_t)round << 32 | (uint64_t)s << 8 | (uint64_t)i);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(bad[r], 0) << "rank " << r;
}

TEST(VirtualDomain, AnAbsentRankTimesOutNamedAndBreaksTheDomain) {
  VirtualDomain d(4);
  std::vector<ncclResult_t> res(3);
  std::vector<std::string> msg(3);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 3; r++) {  // rank 3 never comes
    threads.emplace_back([&, r] {
      res[r] = d.barrier(r, 0.2);
      msg[r] = lastError();
    });
  }
  for (auto& t : threads) t.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 5.0);
  int named = 0;
  for (int r = 0; r < 3; r++) {
    EXPECT_EQ(res[r], ncclRemoteError) << msg[r];
    named += msg[r].find("virtual rank(s) 3") != std::string::npos;
  }
  EXPECT_GE(named, 1) << "the first rank to give up names the absent one";
  // Broken: every later call fails at once, the absent rank's too.
  EXPECT_EQ(d.barrier(3, 10), ncclRemoteError);
  EXPECT_NE(std::string(lastError()).find("earlier host collective failed"), std::string::npos) << lastError();
}

// The rank that comes first sets the round's size; the other's differs: a usage error for it, and the first is woken
// by the broken domain (ncclRemoteError), not left waiting for its 30 s timeout. Rank 1 sleeps 20 ms to come second,
// but either order must hold.
TEST(VirtualDomain, DifferentSizesAreAUsageError) {
  VirtualDomain d(2);
  ncclResult_t res[2] = {ncclSuccess, ncclSuccess};
  double waited[2] = {0, 0};
  auto rank = [&](int r, auto value) {
    decltype(value) all[2];
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto t0 = std::chrono::steady_clock::now();
    res[r] = d.allGather(r, &value, sizeof(value), all, 30);
    waited[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::thread a(rank, 0, uint32_t{1});
  std::thread b(rank, 1, uint64_t{2});
  a.join();
  b.join();
  const int first = res[0] == ncclRemoteError ? 0 : 1;
  EXPECT_EQ(res[first], ncclRemoteError);
  EXPECT_EQ(res[1 - first], ncclInvalidUsage);
  EXPECT_LT(waited[first], 10.0);
}

TEST(VirtualDomain, RankOutOfRange) {
  VirtualDomain d(2);
  EXPECT_EQ(d.barrier(2, 1), ncclInvalidArgument);
  EXPECT_EQ(d.barrier(-1, 1), ncclInvalidArgument);
}

// Launch fences: the k-th fence of every rank on a key meets the others' k-th (no rank runs ahead by one), keys
// count apart, and one that runs out of time says who was absent without breaking the domain.
TEST(VirtualDomain, LaunchFencesMatchByCountPerKeyAndATimeoutLeavesTheDomainUsable) {
  constexpr int kRanks = 4, kFences = 500;
  VirtualDomain d(kRanks);
  std::vector<uint64_t> keyA(kRanks), keyB(kRanks);
  for (int r = 0; r < kRanks; r++) keyA[r] = d.newKey(r);
  for (int r = 0; r < kRanks; r++) keyB[r] = d.newKey(r);
  EXPECT_EQ(keyA[0], keyA[3]);
  EXPECT_NE(keyA[0], keyB[0]);
  std::vector<int> passed(kRanks, 0);          // fences each rank passed
  std::vector<std::atomic<int>> reached(kRanks);  // the fence each rank is at (or past)
  std::vector<int> ahead(kRanks, 0), bad(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; r++) {
    threads.emplace_back([&, r] {
      for (int k = 1; k <= kFences; k++) {
        reached[r].store(k);
        const uint64_t key = k % 3 == 0 ? keyB[r] : keyA[r];
        if (d.fence(r, key, 10) != ncclSuccess) {
          bad[r]++;
          return;
        }
        // Past my k-th fence on this key: every rank reached the fence that matches it.
        for (int s = 0; s < kRanks; s++)
          if (reached[s].load() < k) ahead[r]++;
        passed[r]++;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(bad[r], 0) << "rank " << r;
    EXPECT_EQ(ahead[r], 0) << "rank " << r;
    EXPECT_EQ(passed[r], kFences) << "rank " << r;
  }
  // Rank 3 never fences on a new key: the others run out of time, naming it, and the domain still works.
  std::vector<uint64_t> keyC(kRanks);
  for (int r = 0; r < kRanks; r++) keyC[r] = d.newKey(r);
  std::vector<ncclResult_t> res(3);
  std::vector<std::string> msg(3);
  threads.clear();
  for (int r = 0; r < 3; r++)
    threads.emplace_back([&, r] {
      res[r] = d.fence(r, keyC[r], 0.2);
      msg[r] = lastError();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; r++) {
    EXPECT_EQ(res[r], ncclRemoteError);
    EXPECT_NE(msg[r].find("virtual rank(s) 3"), std::string::npos) << msg[r];
  }
  d.forget(keyC[0]);
  threads.clear();
  std::vector<ncclResult_t> after(kRanks);
  for (int r = 0; r < kRanks; r++) threads.emplace_back([&, r] { after[r] = d.barrier(r, 10); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(after[r], ncclSuccess) << "rank " << r;
}

}  // namespace
}  // namespace ncclext
