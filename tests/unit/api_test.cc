// The public C entry points that need no GPU.
#include <string>

#include <gtest/gtest.h>

#include "nccl_ep.h"
#include "nccl_m2n.h"

namespace {

TEST(PublicApi, VersionsAndNullArguments) {
  int v = 0;
  ASSERT_EQ(ncclEpGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_EP_VERSION_CODE);
  ASSERT_EQ(ncclM2nGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_M2N_VERSION_CODE);
  EXPECT_EQ(ncclEpGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclEpGetLastError()).find("[nccl_ep]"), std::string::npos) << ncclEpGetLastError();
  EXPECT_EQ(ncclM2nGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclM2nGetLastError()).find("[nccl_m2n]"), std::string::npos) << ncclM2nGetLastError();
}

TEST(PublicApi, NcclRuntimeMatchesTheBuild) {
  int built = 0, loaded = 0;
  EXPECT_EQ(ncclEpCheckNcclRuntime(&built, &loaded), ncclSuccess) << ncclEpGetLastError();
  EXPECT_EQ(built / 100, loaded / 100);  // the loaded family's table
  EXPECT_LE(built, loaded);
  EXPECT_EQ(ncclM2nCheckNcclRuntime(nullptr, nullptr), ncclSuccess) << ncclM2nGetLastError();
}

}  // namespace
