// The only file that touches nccl_m2n.h's public structs: validate, translate, call, record the last error.
#include "nccl_m2n/include/nccl_m2n.h"

#include "common/checks.h"
#include "common/version.h"

extern "C" {

ncclResult_t ncclM2nGetVersion(int* version) {
  ncclext::clearLastError();
  NCCLEXT_ARG(version != nullptr, "ncclM2nGetVersion: version is NULL");
  *version = NCCL_M2N_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclM2nCheckNcclRuntime(int* builtVersion, int* loadedVersion) {
  ncclext::clearLastError();
  if (builtVersion) *builtVersion = ncclext::kBuiltNcclVersion;
  return ncclext::checkNcclRuntime(loadedVersion);
}

const char* ncclM2nGetLastError(void) { return ncclext::lastError(); }

}  // extern "C"
