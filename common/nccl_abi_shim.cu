// One release family's NcclAbi table (common/nccl_abi.h). CMake compiles this file once per supported family, each
// time against that family's headers, with NCCL_EXT_ABI_NAME naming the table and NCCL_EXT_ABI_MIN / _MAX the
// runtimes it serves. Only this file includes nccl_device.h: it is the one place where the layout of NCCL's
// versioned device structs reaches our code. The libraries link against the oldest supported libnccl, so calls that
// a family added (ncclCommQueryProperties, ncclGetLsaDevicePointer: 2.29) are looked up in the loaded one.
#include <nccl.h>
#include <nccl_device.h>

#include <cstring>
#include <new>

#include "common/checks.h"
#include "common/launch.h"
#include "common/nccl_abi.h"

// NCCL's *_INITIALIZER macros leave the fields after the version to zero-initialisation, by design.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#if !defined(NCCL_EXT_ABI_NAME) || !defined(NCCL_EXT_ABI_MIN) || !defined(NCCL_EXT_ABI_MAX)
#error "cmake/NcclAbi.cmake compiles this file with NCCL_EXT_ABI_NAME, NCCL_EXT_ABI_MIN and NCCL_EXT_ABI_MAX"
#endif
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 7) || NCCL_EXT_ABI_MIN < NCCL_VERSION_CODE
#error "a table serves runtimes of its headers' release or later (2.28.7 at the oldest), never older"
#endif

namespace ncclext {
namespace {

ncclResult_t createDevComm(ncclComm_t comm, int lsaBarrierCount, void** out, int* lsaSize) {
  *out = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  // Asked before the device communicator so that a communicator without symmetric memory gets a reason.
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  const auto query = reinterpret_cast<decltype(&ncclCommQueryProperties)>(ncclSymbol("ncclCommQueryProperties"));
  NCCLEXT_USAGE(query != nullptr, "the loaded libnccl has no ncclCommQueryProperties (older than NCCL 2.29?)");
  NCCLEXT_NCCL(query(comm, &props));
  NCCLEXT_USAGE(props.deviceApiSupport,
                "NCCL reports no Device API support on this communicator (symmetric memory needs CUDA P2P between "
                "all GPUs of an NVLink domain, cuMem, and NCCL_WIN_ENABLE not 0)");
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  ncclDevCommRequirements reqs;  // 2.28 has no initializer: zero means "none of it"
  memset(&reqs, 0, sizeof(reqs));
#endif
  reqs.lsaBarrierCount = lsaBarrierCount;
  reqs.lsaMultimem = false;  // NVLink multicast stays off, always (docs/ARCHITECTURE.md)
  // No GIN resource of any kind: on 2.28 asking for one switches GIN on, which fails on a node without a GIN NIC.
  ncclDevComm* dc = new (std::nothrow) ncclDevComm();
  NCCLEXT_USAGE(dc != nullptr, "out of host memory for a device communicator");
  const ncclResult_t res = ncclDevCommCreate(comm, &reqs, dc);
  if (res != ncclSuccess) {
    delete dc;
    return fail(res, __FILE__, __LINE__,
                "ncclDevCommCreate failed: %s. The communicator needs symmetric-memory support (CUDA P2P between all "
                "local GPUs, cuMem, NCCL_WIN_ENABLE=1)",
                ncclGetLastError(comm));
  }
  *lsaSize = dc->lsaSize;
  *out = dc;
  return ncclSuccess;
}

ncclResult_t destroyDevComm(ncclComm_t comm, void* devComm) {
  ncclDevComm* dc = static_cast<ncclDevComm*>(devComm);
  const ncclResult_t res = dc && comm ? ncclDevCommDestroy(comm, dc) : ncclSuccess;
  delete dc;
  return res;
}

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)
// 2.28 has no host call for a window's LSA addresses: NCCL's own device function gives them.
__global__ void lsaBasesKernel(ncclWindow_t window, int lsaSize, char** bases) {
  for (int p = threadIdx.x; p < lsaSize; p += blockDim.x)
    bases[p] = static_cast<char*>(ncclGetLsaPointer(window, 0, p));
}
#endif

ncclResult_t lsaBases(ncclWindow_t window, int lsaSize, char** bases) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  const auto get = reinterpret_cast<decltype(&ncclGetLsaDevicePointer)>(ncclSymbol("ncclGetLsaDevicePointer"));
  NCCLEXT_USAGE(get != nullptr, "the loaded libnccl has no ncclGetLsaDevicePointer (older than NCCL 2.29?)");
  for (int p = 0; p < lsaSize; p++) {
    void* ptr = nullptr;
    NCCLEXT_NCCL(get(window, 0, p, &ptr));
    bases[p] = static_cast<char*>(ptr);
  }
  return ncclSuccess;
#else
  // A stream of its own, so that nothing else on the device waits for it or it for them.
  struct Scratch {
    cudaStream_t stream = nullptr;
    char** dev = nullptr;
    ~Scratch() {
      if (dev) cudaFreeAsync(dev, stream);
      if (stream) {
        cudaStreamSynchronize(stream);
        cudaStreamDestroy(stream);
      }
    }
  } x;
  NCCLEXT_CUDA(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
  NCCLEXT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&x.dev), sizeof(char*) * lsaSize, x.stream));
  NCCLEXT_CHECK(launchKernel("lsaBasesKernel", lsaBasesKernel, dim3(1), dim3(64), 0, x.stream, window, lsaSize, x.dev));
  NCCLEXT_CUDA(cudaMemcpyAsync(bases, x.dev, sizeof(char*) * lsaSize, cudaMemcpyDeviceToHost, x.stream));
  NCCLEXT_CUDA(cudaStreamSynchronize(x.stream));
  return ncclSuccess;
#endif
}

LsaTeam lsaTeam(ncclComm_t comm) {
  const ncclTeam_t t = ncclTeamLsa(comm);
  LsaTeam out;
  out.nRanks = t.nRanks;
  out.rank = t.rank;
  out.stride = t.stride;
  return out;
}

}  // namespace

extern const NcclAbi NCCL_EXT_ABI_NAME;
const NcclAbi NCCL_EXT_ABI_NAME = {NCCL_VERSION_CODE, NCCL_EXT_ABI_MIN, NCCL_EXT_ABI_MAX, createDevComm,
                                   destroyDevComm,    lsaBases,         lsaTeam};

}  // namespace ncclext
