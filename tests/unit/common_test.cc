#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/log.h"
#include "common/topology.h"
#include "common/version.h"

namespace ncclext {
namespace {

ncclResult_t rejectNegative(int x) {
  NCCLEXT_ARG(x >= 0, "x = %d < 0", x);
  return ncclSuccess;
}
ncclResult_t propagate(int x) {
  NCCLEXT_CHECK(rejectNegative(x));
  return ncclSuccess;
}
ncclResult_t cudaFailure() {
  NCCLEXT_CUDA(cudaErrorInvalidValue);
  return ncclSuccess;
}

TEST(Status, ArgumentCheckSetsCodeAndText) {
  setLogRank(-1);
  clearLastError();
  EXPECT_EQ(propagate(3), ncclSuccess);
  EXPECT_STREQ(lastError(), "");
  EXPECT_EQ(propagate(-7), ncclInvalidArgument);
  EXPECT_NE(std::string(lastError()).find("x = -7 < 0"), std::string::npos) << lastError();
  EXPECT_EQ(std::string(lastError()).rfind("[test] x = -7", 0), 0u) << lastError();  // no rank known yet
  setLogRank(3);
  EXPECT_EQ(propagate(-7), ncclInvalidArgument);
  EXPECT_EQ(std::string(lastError()).rfind("[test] rank 3: x = -7", 0), 0u) << lastError();
  setLogRank(-1);
}

TEST(Status, CudaErrorBecomesUnhandledCudaError) {
  EXPECT_EQ(cudaFailure(), ncclUnhandledCudaError);
  EXPECT_NE(std::string(lastError()).find("cudaErrorInvalidValue"), std::string::npos) << lastError();
}

TEST(Version, SameReleaseIsCompatible) {
  EXPECT_TRUE(ncclVersionsCompatible(22809, 22809));
  EXPECT_TRUE(ncclVersionsCompatible(22809, 22803));
  EXPECT_FALSE(ncclVersionsCompatible(22809, 22907));
  EXPECT_FALSE(ncclVersionsCompatible(23007, 22809));
  EXPECT_GE(kBuiltNcclVersion, 22800);
}

TEST(Topology, DefaultDomainIsTheLsaTeam) {
  Topology t;
  ASSERT_EQ(makeTopology(5, 8, 1, 4, 0, &t), ncclSuccess);
  EXPECT_EQ(t.domainSize, 4);
  EXPECT_EQ(t.domainRank, 1);
  EXPECT_EQ(t.domainIndex, 1);
  EXPECT_EQ(t.nDomains, 2);
  EXPECT_EQ(t.lsaRankOfDomainRank(3), 3);
}

TEST(Topology, OverrideSplitsTheTeam) {
  Topology t;
  ASSERT_EQ(makeTopology(1, 2, 1, 2, 1, &t), ncclSuccess);  // 2 GPUs as 2 one-GPU "nodes"
  EXPECT_EQ(t.domainSize, 1);
  EXPECT_EQ(t.domainRank, 0);
  EXPECT_EQ(t.domainIndex, 1);
  EXPECT_EQ(t.nDomains, 2);
  EXPECT_EQ(t.lsaRankOfDomainRank(0), 1);
  ASSERT_EQ(makeTopology(6, 8, 6, 8, 4, &t), ncclSuccess);
  EXPECT_EQ(t.domainRank, 2);
  EXPECT_EQ(t.domainIndex, 1);
  EXPECT_EQ(t.lsaRankOfDomainRank(0), 4);
}

TEST(Topology, RejectsWhatDoesNotTile) {
  Topology t;
  EXPECT_EQ(makeTopology(0, 8, 0, 8, 3, &t), ncclInvalidArgument);
  EXPECT_NE(std::string(lastError()).find("does not divide"), std::string::npos);
  EXPECT_EQ(makeTopology(0, 6, 0, 4, 0, &t), ncclInvalidArgument);
  EXPECT_EQ(makeTopology(3, 8, 1, 4, 0, &t), ncclInvalidArgument);  // not a block of consecutive ranks
  EXPECT_EQ(makeTopology(8, 8, 0, 8, 0, &t), ncclInvalidArgument);
  EXPECT_EQ(makeTopology(0, 8, 0, 8, -1, &t), ncclInvalidArgument);
  EXPECT_EQ(makeTopology(0, 8, 0, 8, 0, nullptr), ncclInvalidArgument);
}

TEST(DeviceError, CleanWordIsSuccess) {
  DeviceErrorWord w;
  memset(&w, 0, sizeof(w));
  EXPECT_EQ(describeDeviceError(w, "x"), ncclSuccess);
}

TEST(DeviceError, TimeoutNamesRankPeerAndValues) {
  DeviceErrorWord w;
  memset(&w, 0, sizeof(w));
  w.code = kDeviceTimeout;
  w.rank = 0;
  w.peer = 1;
  w.expected = 5;
  w.seen = 4;
  w.site = kSiteBarrier;
  w.index = 3;
  w.waitedNs = 2000000000ull;
  EXPECT_EQ(describeDeviceError(w, "dispatch"), ncclRemoteError);
  const std::string m = lastError();
  for (const char* part : {"dispatch", "timed out after 2.000 s", "rank 0", "peer 1", "LSA barrier 3",
                           "expected >= 5", "seen 4"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
}

TEST(DeviceError, LibrarySitesAndUnknownCodes) {
  DeviceErrorWord w;
  memset(&w, 0, sizeof(w));
  w.code = 99;
  w.site = kSiteLibraryBase + 2;
  EXPECT_EQ(describeDeviceError(w, "combine"), ncclSystemError);
  EXPECT_NE(std::string(lastError()).find("site 102"), std::string::npos) << lastError();
}

}  // namespace
}  // namespace ncclext
