// The NCCL this binary was compiled against, and the check that the loaded libnccl matches it. Device API structs
// (ncclDevComm, ncclDevCommRequirements) are tied to the release whose headers compiled the kernels: a 2.28 build
// is rejected by a 2.29+ ncclDevCommCreate, and an older runtime lacks what the headers promise.
#pragma once

#include <nccl.h>

namespace ncclext {

constexpr int kBuiltNcclVersion = NCCL_VERSION_CODE;

// Same major and minor: compatible (a patch difference is logged). Pure function, unit-tested.
bool ncclVersionsCompatible(int built, int runtime);

// ncclGetVersion() against kBuiltNcclVersion; ncclInvalidUsage with a message when they are incompatible.
ncclResult_t checkNcclRuntime(int* runtimeVersion = nullptr);

}  // namespace ncclext
