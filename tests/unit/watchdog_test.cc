// The watchdog thread (common/watchdog.h): a watch whose probe turns true ends without its action; a watch past its
// deadline runs its action once; removing an owner ends its watches and waits for an action of it that runs.
#include "common/watchdog.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace ncclext {
namespace {

// Polls `cond` for up to 5 s (the watchdog polls every millisecond).
template <typename Cond>
bool eventually(Cond cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST(Watchdog, FinishedWorkEndsItsWatchWithoutTheAction) {
  static int owner;
  std::atomic<bool> finished{false};
  std::atomic<int> expired{0};
  Watchdog::instance().add(&owner, 60.0, [&] { return finished.load(); }, [&] { expired++; });
  finished = true;
  EXPECT_TRUE(eventually([] { return Watchdog::instance().size() == 0; }));
  EXPECT_EQ(expired.load(), 0);
}

TEST(Watchdog, ADeadlineThatPassesRunsTheActionOnce) {
  static int owner;
  std::atomic<int> expired{0};
  const uint64_t id = Watchdog::instance().add(&owner, 0.02, [] { return false; }, [&] { expired++; });
  EXPECT_TRUE(eventually([&] { return expired.load() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(expired.load(), 1);
  EXPECT_FALSE(Watchdog::instance().setProbe(id, [] { return true; }));  // it has ended
}

TEST(Watchdog, AProbeSetLaterIsTheOneAsked) {
  static int owner;
  std::atomic<int> expired{0};
  const uint64_t id = Watchdog::instance().add(&owner, 60.0, [] { return false; }, [&] { expired++; });
  EXPECT_TRUE(Watchdog::instance().setProbe(id, [] { return true; }));
  EXPECT_TRUE(eventually([] { return Watchdog::instance().size() == 0; }));
  EXPECT_EQ(expired.load(), 0);
}

TEST(Watchdog, RemovingAnOwnerEndsItsWatchesAndWaitsForItsAction) {
  static int a, b;
  std::atomic<int> expiredA{0}, expiredB{0};
  std::atomic<bool> inAction{false}, actionDone{false};
  Watchdog::instance().add(&a, 60.0, [] { return false; }, [&] { expiredA++; });
  Watchdog::instance().add(&b, 0.01, [] { return false; }, [&] {
    inAction = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    actionDone = true;
    expiredB++;
  });
  Watchdog::instance().removeOwner(&a);
  EXPECT_EQ(expiredA.load(), 0);
  ASSERT_TRUE(eventually([&] { return inAction.load(); }));
  Watchdog::instance().removeOwner(&b);  // returns only after b's running action
  EXPECT_TRUE(actionDone.load());
  EXPECT_EQ(expiredB.load(), 1);
  EXPECT_TRUE(eventually([] { return Watchdog::instance().size() == 0; }));
}

}  // namespace
}  // namespace ncclext
