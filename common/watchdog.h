// A process-wide watchdog thread: work that must finish within a budget registers a watch (a "done?" probe and an
// "expire" action); the thread polls the probes every millisecond and runs the action of a watch whose deadline
// passed first. It is what bounds waits that the library cannot time itself: NCCL operations already on a stream
// (M2N's point-to-point exchanges), whose peer may never come. Pure host C++: the probes and actions say what is
// watched (a CUDA event, an NCCL communicator to abort).
#pragma once

#include <cstdint>
#include <functional>

namespace ncclext {

class Watchdog {
 public:
  static Watchdog& instance();

  // Watches `owner`'s work for `seconds` from now. done() is polled (from the watchdog thread) until it returns
  // true; if the deadline passes first, expire() runs once (on the watchdog thread, no lock held) and the watch
  // ends. Returns the watch's id.
  uint64_t add(const void* owner, double seconds, std::function<bool()> done, std::function<void()> expire);
  // Replaces a live watch's probe (e.g. once the work's completion event is recorded). False if it already ended.
  bool setProbe(uint64_t id, std::function<bool()> done);
  // Ends every watch of `owner` without running its action; waits for an action of `owner` that is running.
  void removeOwner(const void* owner);
  // Watches alive (tests).
  size_t size();

 private:
  struct State;
  Watchdog();
  State& s_;
};

}  // namespace ncclext
