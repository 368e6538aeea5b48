// The part of NCCL's Device API whose binary form changes between releases, behind one table of functions.
//
// NCCL's host calls (nccl.h: communicators, ncclSend/Recv, ncclMemAlloc, window registration) keep their binary
// form from release to release, and our kernels include no NCCL header (common/device/peers.h). What does change is
// the device communicator: ncclDevCommRequirements and ncclDevComm are laid out per release. 2.28 has no version
// in them, and every later release refuses them. From 2.29.2 on they carry size, magic and version; a runtime
// accepts a struct of its own release or of the older releases it keeps a copy of the layout of, and refuses a newer
// one (NCCL's src/dev_runtime.cc, getNcclVersionCompat). So the few functions that touch those structs are
// compiled once per supported release family (common/nccl_abi_shim.cu, with that family's oldest headers, which
// every patch release of the family accepts), and the table of the family of the libnccl loaded in the process is
// chosen at first use by ncclGetVersion(). A release no table serves is refused with a message that names it and
// the supported ones.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace ncclext {

// A communicator's team of ranks that reach each other by load/store (NCCL's ncclTeam_t of ncclTeamLsa): my rank
// in it, its size, and the stride between its members' ranks in the communicator.
struct LsaTeam {
  int nRanks = 0, rank = 0, stride = 0;
};

struct NcclAbi {
  int headerVersion;  // NCCL_VERSION_CODE of the headers it was compiled against
  int minRuntime;     // the runtimes it serves: [minRuntime, maxRuntime], maxRuntime the family's last patch
  int maxRuntime;
  // COLLECTIVE over comm: a device communicator with `lsaBarrierCount` LSA barriers and no GIN, multicast or other
  // resource; *lsaSize is its LSA team's size. *devComm is this table's own object, for destroyDevComm.
  ncclResult_t (*createDevComm)(ncclComm_t comm, int lsaBarrierCount, void** devComm, int* lsaSize);
  // LOCAL. Frees devComm's object in any case; a NULL comm (aborted: NCCL released its part) frees only that.
  ncclResult_t (*destroyDevComm)(ncclComm_t comm, void* devComm);
  // LOCAL, may block (a copy from the device): bases[p] = the device address of LSA rank p's copy of `window`'s
  // first byte (what ncclGetLsaPointer(window, 0, p) gives in a kernel), for p < lsaSize. `bases` is host memory.
  ncclResult_t (*lsaBases)(ncclWindow_t window, int lsaSize, char** bases);
  // LOCAL: comm's LSA team.
  LsaTeam (*lsaTeam)(ncclComm_t comm);
};

// The table that serves `runtimeVersion` among `abis` (NULL-terminated), or NULL. Pure: unit-tested.
const NcclAbi* selectNcclAbi(int runtimeVersion, const NcclAbi* const* abis);
// The tables this build has (NULL-terminated, oldest first; nccl_abi_list.cc, written by CMake).
const NcclAbi* const* builtNcclAbis();
// The families `abis` serve, for messages: "2.28.x from 2.28.9, 2.29.x from 2.29.2".
std::string ncclAbiReleases(const NcclAbi* const* abis);
// The table of the libnccl loaded in this process (ncclGetVersion), chosen once; ncclInvalidUsage with a message
// naming the loaded release and the supported ones when none serves it. *runtimeVersion: the loaded release.
ncclResult_t loadedNcclAbi(const NcclAbi** out, int* runtimeVersion = nullptr);
// A function of the libnccl loaded in this process, by name (NULL when it has none): the tables of newer families
// reach their release's host calls this way, since the libraries link against the oldest supported libnccl.
void* ncclSymbol(const char* name);
// LOCAL: comm's LSA team, through the loaded NCCL's table.
ncclResult_t lsaTeamOf(ncclComm_t comm, LsaTeam* out);

}  // namespace ncclext
