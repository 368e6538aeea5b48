// How a kernel reaches the symmetric windows of its NVLink domain: one type and one pair of device functions for
// real ranks (NCCL's LSA mapping of the window) and for the virtual ranks of the one-GPU mode (every virtual rank's
// window by its ncclMemAlloc address, from a device table). NCCL maps a window at another address than the one
// ncclMemAlloc returned; a kernel must address a window through one of the two consistently, and these functions
// are the only way kernels address windows.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

namespace ncclext {
namespace dev {

struct Peers {
  ncclWindow_t window;        // real ranks: the window (a device pointer)
  char* const* virtualBases;  // virtual ranks: every rank's window base by domain rank; NULL for real ranks
  int self;                   // my rank in the domain

#ifdef __CUDACC__
  // `offset` bytes into domain rank `peer`'s window (myself included).
  __device__ __forceinline__ void* at(size_t offset, int peer) const {
    return virtualBases ? virtualBases[peer] + offset : ncclGetLsaPointer(window, offset, peer);
  }
  __device__ __forceinline__ void* local(size_t offset) const {
    return virtualBases ? virtualBases[self] + offset : ncclGetLocalPointer(window, offset);
  }
#endif
};

}  // namespace dev
}  // namespace ncclext
