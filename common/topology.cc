#include "common/topology.h"

#include "common/checks.h"

namespace ncclext {

ncclResult_t makeTopology(int rank, int nRanks, int lsaRank, int lsaSize, int domainOverride, Topology* out) {
  NCCLEXT_ARG(out != nullptr, "makeTopology: out is NULL");
  NCCLEXT_ARG(nRanks >= 1 && rank >= 0 && rank < nRanks, "rank %d out of [0, %d)", rank, nRanks);
  NCCLEXT_ARG(lsaSize >= 1 && lsaRank >= 0 && lsaRank < lsaSize && nRanks % lsaSize == 0,
              "LSA team size %d (my LSA rank %d) does not tile %d ranks", lsaSize, lsaRank, nRanks);
  NCCLEXT_ARG(rank % lsaSize == lsaRank,
              "LSA rank %d of world rank %d: the LSA team is not a block of consecutive ranks", lsaRank, rank);
  NCCLEXT_ARG(domainOverride >= 0, "LSA domain size %d < 0", domainOverride);
  const int k = domainOverride == 0 ? lsaSize : domainOverride;
  NCCLEXT_ARG(lsaSize % k == 0, "LSA domain size %d does not divide the LSA team size %d", k, lsaSize);
  Topology t;
  t.rank = rank;
  t.nRanks = nRanks;
  t.lsaRank = lsaRank;
  t.lsaSize = lsaSize;
  t.domainSize = k;
  t.domainRank = rank % k;
  t.domainIndex = rank / k;
  t.nDomains = nRanks / k;
  *out = t;
  return ncclSuccess;
}

}  // namespace ncclext
