// Which objects of one kind handed out through a C ABI are alive, so that a call on a destroyed (or never created)
// object is an error with a message, not a use-after-free. Process-wide; an address freed and handed out again by a
// later create reads as that new object (a stale pointer that happens to match is a caller's bug we cannot see).
//
// Registering a created object cannot fail: a Reservation (made before the create: it may throw std::bad_alloc)
// keeps room for one entry, its commit() (after the create) uses that room without allocating, and one never
// committed gives the room back. So an object whose creation was collective is never left created but unregistered.
#pragma once

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

namespace ncclext {

class LiveSet {
 public:
  class Reservation {
   public:
    explicit Reservation(LiveSet& set) : set_(set) { set_.reserve(); }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() {
      if (!committed_) set_.cancel();
    }
    void commit(const void* p) noexcept {
      set_.commit(p);
      committed_ = true;
    }

   private:
    LiveSet& set_;
    bool committed_ = false;
  };

  // `p` alive for this object's lifetime: for objects assembled without their create call (unit tests).
  class Scoped {
   public:
    Scoped(LiveSet& set, const void* p) : set_(set), p_(p) { Reservation(set).commit(p); }
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    ~Scoped() { set_.remove(p_); }

   private:
    LiveSet& set_;
    const void* p_;
  };

  // False when `p` was not alive (then nothing changes).
  bool remove(const void* p) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(live_.begin(), live_.end(), p);
    if (it == live_.end()) return false;
    *it = live_.back();
    live_.pop_back();
    return true;
  }
  bool contains(const void* p) const noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(live_.begin(), live_.end(), p) != live_.end();
  }

 private:
  void reserve() {
    std::lock_guard<std::mutex> lock(mu_);
    live_.reserve(live_.size() + reserved_ + 1);
    reserved_++;
  }
  void commit(const void* p) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_--;
    live_.push_back(p);  // within the reserved capacity: no allocation, no throw
  }
  void cancel() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_--;
  }

  mutable std::mutex mu_;
  std::vector<const void*> live_;  // a few groups and handles a process: a scan beats hashing
  size_t reserved_ = 0;
};

}  // namespace ncclext
