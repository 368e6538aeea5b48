#include "common/virtual_domain.h"

#include <chrono>
#include <cstring>
#include <string>

#include "common/status.h"

namespace ncclext {

ncclResult_t VirtualDomain::allGather(int rank, const void* mine, size_t bytes, void* all, double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_)
    return fail(ncclRemoteError, __FILE__, __LINE__,
                "virtual domain: an earlier host collective failed (a virtual rank timed out or misbehaved)");
  if (rank < 0 || rank >= n_)
    return fail(ncclInvalidArgument, __FILE__, __LINE__, "virtual domain: rank %d not in [0, %d)", rank, n_);
  if (arrived_ == 0) {
    bytes_ = bytes;
    in_.assign((size_t)n_ * bytes, 0);
    present_.assign(n_, 0);
  }
  if (bytes != bytes_ || present_[rank]) {
    broken_ = true;
    cv_.notify_all();
    return fail(ncclInvalidUsage, __FILE__, __LINE__,
                "virtual domain: rank %d %s (ranks must call the same host collectives in the same order)", rank,
                present_[rank] ? "arrived twice in one collective" : "passed a different size than its peers");
  }
  if (bytes) memcpy(in_.data() + (size_t)rank * bytes, mine, bytes);
  present_[rank] = 1;
  const uint64_t round = generation_;
  if (++arrived_ == n_) {
    // The previous round's result is no longer read: every rank copied it before arriving here.
    out_.swap(in_);
    arrived_ = 0;
    generation_++;
    cv_.notify_all();
  } else {
    const auto budget = std::chrono::duration<double>(timeoutSeconds);
    const bool done = cv_.wait_for(lock, budget, [&] { return generation_ != round || broken_; });
    if (done && generation_ == round)  // woken by a peer that failed this collective
      return fail(ncclRemoteError, __FILE__, __LINE__,
                  "virtual domain: rank %d gave up a host collective: another virtual rank failed in it", rank);
    if (!done) {
      std::string absent;
      for (int r = 0; r < n_; r++)
        if (!present_[r]) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
      broken_ = true;
      cv_.notify_all();
      return fail(ncclRemoteError, __FILE__, __LINE__,
                  "virtual domain: rank %d waited %.1f s in a host collective for virtual rank(s) %s", rank,
                  timeoutSeconds, absent.c_str());
    }
  }
  if (bytes && all) memcpy(all, out_.data(), (size_t)n_ * bytes);
  return ncclSuccess;
}

uint64_t VirtualDomain::newKey(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return rank >= 0 && rank < n_ ? keys_[rank]++ : ~0ull;
}

ncclResult_t VirtualDomain::fence(int rank, uint64_t key, double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (rank < 0 || rank >= n_)
    return fail(ncclInvalidArgument, __FILE__, __LINE__, "virtual domain: rank %d not in [0, %d)", rank, n_);
  std::vector<uint64_t>& made = fences_[key];
  made.resize(n_, 0);
  const uint64_t mine = ++made[rank];
  cv_.notify_all();
  auto all = [&] {  // `made` stays valid: a key is erased only after every rank is past its fences
    for (uint64_t m : made)
      if (m < mine) return false;
    return true;
  };
  if (cv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds), all)) return ncclSuccess;
  std::string absent;
  for (int r = 0; r < n_; r++)
    if (made[r] < mine) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
  return fail(ncclRemoteError, __FILE__, __LINE__,
              "virtual domain: rank %d waited %.1f s at launch fence %llu for virtual rank(s) %s", rank,
              timeoutSeconds, (unsigned long long)mine, absent.c_str());
}

void VirtualDomain::forget(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  fences_.erase(key);
}

}  // namespace ncclext
