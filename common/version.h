// The check that this build serves the libnccl loaded in the process (common/nccl_abi.h): one build carries one
// table per supported NCCL release family and uses the loaded release's.
#pragma once

#include <nccl.h>

namespace ncclext {

// *builtVersion: the headers' release of the table that serves the loaded libnccl (0 when none does);
// *runtimeVersion: the loaded release. ncclInvalidUsage with a message when no table serves it. Either may be NULL.
ncclResult_t checkNcclRuntime(int* builtVersion = nullptr, int* runtimeVersion = nullptr);

}  // namespace ncclext
