// How a kernel reaches the symmetric windows of its NVLink domain: a device table of every domain rank's window
// base, the same for real ranks (NCCL's LSA mapping of the window: each entry is what ncclGetLsaPointer(window, 0,
// peer) gives, read once when the window is registered, common/nccl_abi.h) and for the virtual ranks of the
// one-GPU mode (every virtual rank's ncclMemAlloc address). The kernels include no NCCL header: nothing in them
// depends on the layout of NCCL's device structs, so one build runs on every NCCL release the library supports.
// NCCL maps a window at another address than the one ncclMemAlloc returned; a table holds addresses of one kind
// only, and these functions are the only way kernels address windows.
#pragma once

#include <cstddef>

namespace ncclext {
namespace dev {

struct Peers {
  char* const* bases = nullptr;  // [domain size], device: every domain rank's window base
  char* mine = nullptr;          // bases[self]
  int self = 0;                  // my rank in the domain

#ifdef __CUDACC__
  // `offset` bytes into domain rank `peer`'s window (myself included). The table is read-only while kernels run.
  __device__ __forceinline__ void* at(size_t offset, int peer) const {
    return reinterpret_cast<char*>(__ldg(reinterpret_cast<const unsigned long long*>(bases) + peer)) + offset;
  }
  __device__ __forceinline__ void* local(size_t offset) const { return mine + offset; }
#endif
};

}  // namespace dev
}  // namespace ncclext
