// The memory registered with ncclM2nRegister (nccl_m2n.h, zero-copy): per caller communicator, the NVLink-domain
// communicator it is registered on and a device table of its windows' bases, [slot][domain rank] (NCCL's LSA
// addresses, common/nccl_abi.h). Registration is collective and in the same order on every rank of a domain, so slot i
// names the same registration on each of them: a rank publishes (slot, offset) for a tensor and its peers reach it
// at bases[slot * domainSize + peer] + offset.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

struct ncclM2nRegistration;

namespace ncclm2n {

constexpr int kMaxRegistrations = 64;  // live registrations per communicator

// Where a pointer lies in the registered memory of a communicator.
struct Registered {
  int slot = -1;
  uint64_t offset = 0;
};

// COLLECTIVE over comm's domain (over comm for its first registration). Every rank of the domain must pass the same
// `bytes` (NCCL 2.28 maps each peer's buffer with the local size).
ncclResult_t registerBuffer(ncclComm_t comm, void* buffer, size_t bytes, ncclM2nRegistration** out);
// COLLECTIVE over the domain; the last one on a communicator frees its record.
ncclResult_t deregisterBuffer(ncclM2nRegistration* reg);
// One look at comm's registrations (in domains of `domainSize` ranks; false when it has none): the device table of
// its windows' bases ([slot][domain rank]), and for each of the n buffers [ptrs[i], ptrs[i] + bytes[i]) the
// registration that holds it whole, slot -1 for one that none holds (or a NULL pointer).
bool resolveRegistered(ncclComm_t comm, int domainSize, const void* const* ptrs, const int64_t* bytes, int n,
                       Registered* out, char* const** bases);

}  // namespace ncclm2n
