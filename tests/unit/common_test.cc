#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/log.h"
#include "common/topology.h"
#include "common/nccl_abi.h"
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

// Tables as cmake/NcclAbi.cmake makes them: each serves its headers' release to its family's last patch.
NcclAbi table(int headers) {
  return NcclAbi{headers, headers, headers / 100 * 100 + 99, nullptr, nullptr, nullptr, nullptr};
}

TEST(NcclAbi, TheLoadedReleaseGetsItsFamilysTable) {
  const NcclAbi t228 = table(22807), t229 = table(22902), t230 = table(23003), t232 = table(23203);
  const NcclAbi* const abis[] = {&t228, &t229, &t230, &t232, nullptr};
  EXPECT_EQ(selectNcclAbi(22807, abis), &t228);
  EXPECT_EQ(selectNcclAbi(22809, abis), &t228);  // torch 2.11
  EXPECT_EQ(selectNcclAbi(22902, abis), &t229);
  EXPECT_EQ(selectNcclAbi(22907, abis), &t229);  // torch 2.12, 2.13
  EXPECT_EQ(selectNcclAbi(23007, abis), &t230);  // torch 2.14, 2.15
  EXPECT_EQ(selectNcclAbi(23206, abis), &t232);
  EXPECT_EQ(selectNcclAbi(22803, abis), nullptr);  // older than its family's table (NCCL refuses newer structs)
  EXPECT_EQ(selectNcclAbi(23002, abis), nullptr);
  EXPECT_EQ(selectNcclAbi(23102, abis), nullptr);  // a family not built
  EXPECT_EQ(selectNcclAbi(22707, abis), nullptr);
  EXPECT_EQ(selectNcclAbi(23301, abis), nullptr);  // newer than every table: refused, not guessed
  EXPECT_EQ(ncclAbiReleases(abis), "2.28.x from 2.28.7, 2.29.x from 2.29.2, 2.30.x from 2.30.3, 2.32.x from 2.32.3");
}

TEST(NcclAbi, EveryBuiltTableServesItsOwnFamilyFromItsHeadersOn) {
  const NcclAbi* const* abis = builtNcclAbis();
  ASSERT_NE(abis[0], nullptr);
  int previous = 0;
  for (const NcclAbi* const* a = abis; *a; a++) {
    const NcclAbi& t = **a;
    EXPECT_GE(t.headerVersion, 22807);
    EXPECT_GT(t.headerVersion / 100, previous / 100) << "one table per family, oldest first";
    EXPECT_EQ(t.minRuntime, t.headerVersion);
    EXPECT_EQ(t.maxRuntime, t.headerVersion / 100 * 100 + 99);
    EXPECT_EQ(selectNcclAbi(t.headerVersion, abis), &t);
    EXPECT_EQ(selectNcclAbi(t.maxRuntime, abis), &t);
    EXPECT_NE(selectNcclAbi(t.headerVersion - 1, abis), &t);
    EXPECT_TRUE(t.createDevComm && t.destroyDevComm && t.lsaBases && t.lsaTeam);
    previous = t.headerVersion;
  }
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
