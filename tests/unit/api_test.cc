// The public C entry points that need no GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>

#include "nccl_ep.h"
#include "nccl_ep_testing.h"
#include "nccl_m2n.h"
#include "nccl_m2n_testing.h"

// This binary's operator new, which the libraries' allocations reach too: once armed with k, the k-th allocation
// after that throws std::bad_alloc (tests/unit/api_test.cc's allocation sweep).
namespace {
std::atomic<long> gFailAt{0};
}  // namespace

void* operator new(size_t n) {
  if (gFailAt.load(std::memory_order_relaxed) > 0 && gFailAt.fetch_sub(1) == 1) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

// Fails the 1st, 2nd, ... allocation of `call` in turn, until a call makes no more than k allocations: no exception
// may leave the C ABI, and a call whose allocation failed says so (ncclSystemError, "out of host memory").
void sweepAllocationFailures(const char* what, const std::function<int()>& call,
                             const std::function<const char*()>& lastError) {
  for (long k = 1; k <= 10000; k++) {
    gFailAt = k;
    int rc = -1;
    bool escaped = false;
    try {
      rc = call();
    } catch (...) {
      escaped = true;
    }
    const bool failed = gFailAt.load() <= 0;  // the k-th allocation happened (and threw)
    gFailAt = 0;
    ASSERT_FALSE(escaped) << what << ": a C++ exception left the C ABI (allocation " << k << " failed)";
    if (!failed) {
      EXPECT_EQ(rc, ncclSuccess) << what << " with " << k - 1 << " allocations: " << lastError();
      return;
    }
    if (rc != ncclSuccess) {
      EXPECT_EQ(rc, ncclSystemError) << what << ", allocation " << k << ": " << lastError();
      EXPECT_NE(std::string(lastError()).find("out of host memory"), std::string::npos) << lastError();
    }
  }
  FAIL() << what << " still allocates after 10000 allocations";
}

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

TEST(PublicApi, NoExceptionLeavesTheAbiWhenAllocationsFail) {
  sweepAllocationFailures(
      "ncclEpVirtualDomainCreate",
      [] {
        ncclEpVirtualDomain_t d = nullptr;
        const ncclResult_t rc = ncclEpVirtualDomainCreate(&d, 4);
        if (d) ncclEpVirtualDomainDestroy(d);
        return (int)rc;
      },
      ncclEpGetLastError);
  sweepAllocationFailures(
      "ncclEpGroupInfoQuery",
      [] {
        ncclEpGroupConfig_t c = NCCL_EP_GROUP_CONFIG_INIT;
        c.num_experts = 256;
        c.max_tokens_per_rank = 512;
        c.max_token_bytes = 7168 * 2;
        c.max_topk = 8;
        ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
        return (int)ncclEpGroupInfoQuery(&c, 16, 8, &info);
      },
      ncclEpGetLastError);
  sweepAllocationFailures(
      "ncclEpCheckNcclRuntime", [] { return (int)ncclEpCheckNcclRuntime(nullptr, nullptr); }, ncclEpGetLastError);
  sweepAllocationFailures(
      "ncclM2nVirtualDomainCreate",
      [] {
        ncclM2nVirtualDomain_t d = nullptr;
        const ncclResult_t rc = ncclM2nVirtualDomainCreate(&d, 4);
        if (d) ncclM2nVirtualDomainDestroy(d);
        return (int)rc;
      },
      ncclM2nGetLastError);
  sweepAllocationFailures(
      "ncclM2nCheckNcclRuntime", [] { return (int)ncclM2nCheckNcclRuntime(nullptr, nullptr); }, ncclM2nGetLastError);
}

}  // namespace
