// The in-process half of the virtual-rank mode (docs/ARCHITECTURE.md, "One GPU, many ranks"): N host threads of one
// process, one per virtual rank, each with its own single-rank NCCL communicator on the same GPU, meet here for the
// host collectives that real ranks run through NCCL (size agreement, window addresses, barriers).
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ncclext {

class VirtualDomain {
 public:
  static constexpr int kMaxRanks = 8;
  explicit VirtualDomain(int nRanks) : n_(nRanks) {}
  int size() const { return n_; }

  // COLLECTIVE over the domain (every rank's thread, in the same order): all[r * bytes, (r + 1) * bytes) receives
  // rank r's `mine`. Every rank must pass the same `bytes` (0 makes it a barrier; `all` may then be NULL). After
  // `timeoutSeconds` without every rank: ncclRemoteError naming the absent ranks, and the domain stays broken (every
  // later call fails at once), as a communicator whose peer died would.
  ncclResult_t allGather(int rank, const void* mine, size_t bytes, void* all, double timeoutSeconds);
  ncclResult_t barrier(int rank, double timeoutSeconds) { return allGather(rank, nullptr, 0, nullptr, timeoutSeconds); }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // completed collectives
  int arrived_ = 0;
  size_t bytes_ = 0;
  std::vector<char> in_, out_;  // the round being gathered; the last completed round's result
  std::vector<char> present_;
  bool broken_ = false;
};

}  // namespace ncclext
