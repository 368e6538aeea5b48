// The only file that touches nccl_ep.h's public structs: validate, translate, call, record the last error.
#include "nccl_ep/include/nccl_ep.h"

#include "common/checks.h"
#include "common/version.h"

extern "C" {

ncclResult_t ncclEpGetVersion(int* version) {
  ncclext::clearLastError();
  NCCLEXT_ARG(version != nullptr, "ncclEpGetVersion: version is NULL");
  *version = NCCL_EP_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclEpCheckNcclRuntime(int* builtVersion, int* loadedVersion) {
  ncclext::clearLastError();
  if (builtVersion) *builtVersion = ncclext::kBuiltNcclVersion;
  return ncclext::checkNcclRuntime(loadedVersion);
}

const char* ncclEpGetLastError(void) { return ncclext::lastError(); }

}  // extern "C"
