#include "common/version.h"

#include "common/checks.h"

namespace ncclext {

// NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9.
bool ncclVersionsCompatible(int built, int runtime) { return built / 100 == runtime / 100; }

ncclResult_t checkNcclRuntime(int* runtimeVersion) {
  int v = 0;
  NCCLEXT_NCCL(ncclGetVersion(&v));
  if (runtimeVersion) *runtimeVersion = v;
  NCCLEXT_USAGE(ncclVersionsCompatible(kBuiltNcclVersion, v),
                "built against NCCL %d but the loaded libnccl is %d: Device API kernels run only on the NCCL "
                "release they were compiled with; rebuild against the NCCL you run (NCCL_HOME)",
                kBuiltNcclVersion, v);
  if (v != kBuiltNcclVersion) NCCLEXT_INFO("built against NCCL %d, running %d (same release)", kBuiltNcclVersion, v);
  return ncclSuccess;
}

}  // namespace ncclext
