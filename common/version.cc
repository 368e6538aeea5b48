#include "common/version.h"

#include "common/checks.h"
#include "common/nccl_abi.h"

namespace ncclext {

ncclResult_t checkNcclRuntime(int* builtVersion, int* runtimeVersion) {
  if (builtVersion) *builtVersion = 0;
  const NcclAbi* abi = nullptr;
  NCCLEXT_CHECK(loadedNcclAbi(&abi, runtimeVersion));
  if (builtVersion) *builtVersion = abi->headerVersion;
  return ncclSuccess;
}

}  // namespace ncclext
