// The in-process half of the virtual-rank mode (docs/ARCHITECTURE.md, "One GPU, many ranks"): N host threads of one
// process, one per virtual rank, each with its own single-rank NCCL communicator on the same GPU, meet here for the
// host collectives that real ranks run through NCCL (size agreement, window addresses, barriers).
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
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

  // Launch fences. The virtual ranks' streams share the GPU's few hardware work queues, and a queue runs its work in
  // order: a rank's kernel that waits on its own spinning barrier kernel holds up everything queued behind it in the
  // same hardware queue, maybe the barrier kernel of a peer that the spinning one waits for (a deadlock until the
  // device timeout). A rank that enqueued a spinning kernel therefore calls fence() before it enqueues anything that
  // depends on it: every rank's matching kernel is then queued ahead of any work that waits for one.
  //
  // The k-th fence(rank, key) of each rank returns once every rank made its k-th fence on `key` (one key per plan,
  // from newKey, which every rank calls in the same order). Unlike the collectives above, a fence that runs out of
  // time leaves the domain usable: it returns ncclRemoteError, and the kernels' own timeout reports the absent rank.
  uint64_t newKey(int rank);
  ncclResult_t fence(int rank, uint64_t key, double timeoutSeconds);
  void forget(uint64_t key);  // the key's plan is gone (after a barrier that every rank passed with it)

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
  std::vector<uint64_t> keys_ = std::vector<uint64_t>(kMaxRanks, 0);  // newKey's count, by rank
  std::map<uint64_t, std::vector<uint64_t>> fences_;                  // fences made, by key and rank
};

}  // namespace ncclext
