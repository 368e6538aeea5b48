#include "common/nccl_abi.h"

#include <dlfcn.h>

#include <mutex>

#include "common/checks.h"

namespace ncclext {

namespace {

std::string releaseName(int code) {  // NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace

const NcclAbi* selectNcclAbi(int runtimeVersion, const NcclAbi* const* abis) {
  for (; abis && *abis; abis++)
    if (runtimeVersion >= (*abis)->minRuntime && runtimeVersion <= (*abis)->maxRuntime) return *abis;
  return nullptr;
}

std::string ncclAbiReleases(const NcclAbi* const* abis) {
  std::string s;
  for (; abis && *abis; abis++) {
    const NcclAbi& a = **abis;
    s += (s.empty() ? "" : ", ") + std::to_string(a.minRuntime / 10000) + "." +
         std::to_string(a.minRuntime / 100 % 100) + ".x from " + releaseName(a.minRuntime);
  }
  return s.empty() ? "none" : s;
}

ncclResult_t loadedNcclAbi(const NcclAbi** out, int* runtimeVersion) {
  static std::once_flag once;
  static int loaded = 0;
  static ncclResult_t versionResult = ncclSuccess;
  std::call_once(once, [] { versionResult = ncclGetVersion(&loaded); });
  if (runtimeVersion) *runtimeVersion = loaded;
  NCCLEXT_USAGE(versionResult == ncclSuccess, "ncclGetVersion failed (%d)", (int)versionResult);
  const NcclAbi* abi = selectNcclAbi(loaded, builtNcclAbis());
  NCCLEXT_USAGE(abi != nullptr,
                "the libnccl loaded in this process is NCCL %s, which this build does not support: it supports NCCL "
                "%s. Load a supported release first (torch loads its own when imported; else NCCL_HOME or "
                "LD_LIBRARY_PATH), or rebuild with that release among NCCL_EXT_NCCL_RELEASES",
                releaseName(loaded).c_str(), ncclAbiReleases(builtNcclAbis()).c_str());
  *out = abi;
  return ncclSuccess;
}

void* ncclSymbol(const char* name) {
  // The libnccl that our own calls resolve to: the file that holds ncclGetVersion.
  static void* const lib = [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) || !info.dli_fname) return (void*)nullptr;
    return dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  }();
  return lib ? dlsym(lib, name) : nullptr;
}

ncclResult_t lsaTeamOf(ncclComm_t comm, LsaTeam* out) {
  const NcclAbi* abi = nullptr;
  NCCLEXT_CHECK(loadedNcclAbi(&abi));
  *out = abi->lsaTeam(comm);
  return ncclSuccess;
}

}  // namespace ncclext
