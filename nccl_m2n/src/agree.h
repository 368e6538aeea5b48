// Do all ranks describe the same batch? Plan creation is collective and every rank must pass the same metadata;
// when they do not, every rank fails with the same message naming the first tensor that differs (pure host C++:
// the exchange itself is the caller's, two small all-gathers at most).
//
// Round 1 all-gathers a fixed-size Digest: the tensor count, a hash of all tensor hashes, and the hashes of
// kDigestGroups contiguous groups of tensors. If they all agree, done. If counts differ, that is the message.
// Else round 2 all-gathers the per-tensor hashes of the first group where some rank differs from rank 0 (at most
// ceil(n / kDigestGroups) hashes each), which names the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ncclm2n {

constexpr int kDigestGroups = 64;

struct Digest {
  int64_t nTensors = 0;
  uint64_t total = 0;
  uint64_t groups[kDigestGroups] = {};
};

// Tensors [*lo, *hi) of group g of a batch of n.
void digestGroup(int64_t n, int g, int64_t* lo, int64_t* hi);

Digest digestOf(const std::vector<uint64_t>& tensorHashes);

struct Agreement {
  bool agree = true;
  int group = -1;       // round 2 needed for this group (agree false, message empty)
  std::string message;  // the verdict when it is already known (counts differ)
};

// From every rank's Digest (indexed by rank).
Agreement compareDigests(const std::vector<Digest>& all);

// Round 2: every rank's hashes of the tensors of `group` (all[r] holds hi - lo hashes). The message names the first
// tensor (index and `names[index]`, this rank's name for it) where some rank differs from rank 0, and that rank.
std::string firstDifference(const std::vector<std::vector<uint64_t>>& all, int64_t lo,
                            const std::vector<std::string>& names);

// Which exchange communicator a plan on a caller's communicator takes (executor.cc's ExchangeComm). Each rank votes
// the generation of the one it could reuse (0: none) and how many it split from that communicator; every rank
// decides the same from all votes: reuse when all name the same non-zero generation, else split a new one numbered
// past every rank's count (so that the ranks' numbers agree again even where their counts drifted).
struct ExchangeVote {
  uint64_t reuse = 0;
  uint64_t splits = 0;
};

struct ExchangeDecision {
  bool reuse = false;
  uint64_t generation = 0;  // the reused one's, or the new split's
};

ExchangeDecision decideExchange(const std::vector<ExchangeVote>& votes);

}  // namespace ncclm2n
