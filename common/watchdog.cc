#include "common/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ncclext {

namespace {
using Clock = std::chrono::steady_clock;

struct Watch {
  uint64_t id;
  const void* owner;
  Clock::time_point deadline;
  std::function<bool()> done;
  std::function<void()> expire;
};
}  // namespace

struct Watchdog::State {
  std::mutex mu;
  std::condition_variable wake, idle;
  std::vector<Watch> watches;
  uint64_t next = 1;
  const void* running = nullptr;  // the owner whose action runs now (removeOwner waits for it)
  bool started = false;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (watches.empty()) {
        wake.wait(lock);
        continue;
      }
      const Clock::time_point now = Clock::now();
      for (size_t i = 0; i < watches.size();) {
        Watch& w = watches[i];
        if (w.done && w.done()) {
          watches.erase(watches.begin() + (long)i);
          continue;
        }
        if (now > w.deadline) {
          Watch expired = std::move(w);
          watches.erase(watches.begin() + (long)i);
          running = expired.owner;
          lock.unlock();
          if (expired.expire) expired.expire();
          lock.lock();
          running = nullptr;
          idle.notify_all();
          continue;  // the list may have changed while unlocked: i indexes the next watch still
        }
        i++;
      }
      wake.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
};

Watchdog::Watchdog() : s_(*new State()) {}  // the state outlives the object: its thread never stops

Watchdog& Watchdog::instance() {
  static Watchdog* w = new Watchdog();  // never destroyed: its thread may outlive static destruction
  return *w;
}

uint64_t Watchdog::add(const void* owner, double seconds, std::function<bool()> done, std::function<void()> expire) {
  State& s = s_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.started) {
    s.started = true;
    std::thread([&s] { s.loop(); }).detach();
  }
  const uint64_t id = s.next++;
  const auto budget = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  s.watches.push_back({id, owner, Clock::now() + budget, std::move(done), std::move(expire)});
  s.wake.notify_all();
  return id;
}

bool Watchdog::setProbe(uint64_t id, std::function<bool()> done) {
  State& s = s_;
  std::lock_guard<std::mutex> lock(s.mu);
  for (Watch& w : s.watches)
    if (w.id == id) {
      w.done = std::move(done);
      return true;
    }
  return false;
}

void Watchdog::removeOwner(const void* owner) {
  State& s = s_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.idle.wait(lock, [&] { return s.running != owner; });
  for (size_t i = 0; i < s.watches.size();)
    if (s.watches[i].owner == owner)
      s.watches.erase(s.watches.begin() + (long)i);
    else
      i++;
}

size_t Watchdog::size() {
  State& s = s_;
  std::lock_guard<std::mutex> lock(s.mu);
  return s.watches.size();
}

}  // namespace ncclext
