// Where a rank sits: its world rank, its place in NCCL's LSA team (ranks reachable by NVLink load/store), and its
// NVLink domain, which is the LSA team unless NCCL_EXT_LSA_DOMAIN_SIZE (or a config field) splits the team into
// smaller domains of consecutive ranks, so that across-domain paths run on one node.
#pragma once

#include <nccl.h>

namespace ncclext {

struct Topology {
  int rank = 0, nRanks = 1;          // world
  int lsaRank = 0, lsaSize = 1;      // NCCL's LSA team (a block of consecutive world ranks)
  int domainSize = 1;                // ranks per domain (divides lsaSize)
  int domainRank = 0;                // my index inside my domain
  int domainIndex = 0;               // which domain: rank / domainSize
  int nDomains = 1;                  // nRanks / domainSize
  int lsaRankOfDomainRank(int r) const { return lsaRank - domainRank + r; }
};

// `domainOverride` 0 keeps the LSA team; k > 0 must divide lsaSize. Pure function, unit-tested.
ncclResult_t makeTopology(int rank, int nRanks, int lsaRank, int lsaSize, int domainOverride, Topology* out);

}  // namespace ncclext
