// The group: one per communicator and configuration. It holds its window (the domain, the symmetric memory, the
// device state and error word), the Low-Latency mode's host state (ll/ll.h, LlState) and, with several NVLink
// domains, its rail (rail/rail.h). Internal: api.cc validates the public structs and calls these.
#pragma once

#include <atomic>
#include <memory>

#include "common/device_status.h"
#include "common/domain.h"
#include "common/live_set.h"
#include "common/symmetric_memory.h"
#include "common/virtual_domain.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/include/nccl_ep_testing.h"
#include "nccl_ep/src/layout.h"
#include "nccl_ep/src/ll/ll.h"
#include "nccl_ep/src/memory.h"
#include "nccl_ep/src/rail/rail.h"
#include "nccl_ep/src/views.h"

// The one-GPU test mode's shared object (ncclEpVirtualDomainCreate).
struct ncclEpVirtualDomain {
  explicit ncclEpVirtualDomain(int n) : domain(n) {}
  ncclext::VirtualDomain domain;
};

namespace ncclep {
// The groups and handles alive: api.cc checks every call's against them (a call on a destroyed one is an error), and
// unit tests register the objects they assemble by hand (LiveSet::Scoped).
ncclext::LiveSet& liveGroups();
ncclext::LiveSet& liveHandles();

// The one-GPU test modes a group is made in (nccl_ep_testing.h; all empty: real ranks).
struct TestingModes {
  ncclEpVirtualDomain* virtualDomain = nullptr;
  int virtualRank = 0;
  ncclComm_t virtualRail = nullptr;  // the mixed mode: relayed exchanges over the rail of my index
};

// The group's device state: u64 calls[2], arrivals[2], sent[2], sendArrivals[2] (the call numbers
// ncclEpMaskClean resets: the first kCountersBytes), barrierEpoch; then the mask, int32 [kMaxRanks].
struct DeviceState {
  static constexpr size_t kCountersBytes = 8 * sizeof(uint64_t);  // then the barrier's epoch and heldDispatch
  static constexpr size_t kMaskOffset = 16 * sizeof(uint64_t);
  static constexpr size_t kBytes = kMaskOffset + kMaxRanks * sizeof(int);
};

// The group's window: the domain (its communicators and topology), the symmetric memory on it, the error word the
// kernels report into and the device state (DeviceState). The domain is declared first, so that it goes last.
struct Window {
  std::unique_ptr<ncclext::Domain> domain;
  std::unique_ptr<ncclext::SymmetricMemory> mem;
  std::unique_ptr<ncclext::DeviceStatus> status;
  void* state = nullptr;
  char* local() const { return static_cast<char*>(mem->localPtr()); }
};
}  // namespace ncclep

// The device pointers of an optional ncclEpLayoutInfo_t (all NULL without one): HT handle binding and LL dispatch.
inline ncclep::LayoutInfoOut layoutInfoOut(const ncclEpLayoutInfo_t* info) {
  ncclep::LayoutInfoOut out{};
  if (info) {
    out.expertCounters = static_cast<int*>(info->expert_counters.data);
    out.srcRankCounters = static_cast<int*>(info->src_rank_counters.data);
    out.expertOffsets = static_cast<int*>(info->expert_offsets.data);
    out.recvTotal = static_cast<int*>(info->recv_total_counter.data);
    // A caller built against the first layout has no recv_dropped_counter (checkLayoutInfo took its size).
    if (info->size >= sizeof(ncclEpLayoutInfo_t)) out.recvDropped = static_cast<int*>(info->recv_dropped_counter.data);
  }
  return out;
}

namespace ncclep {
// The default SM budget (num_sms 0): 64 SMs leave room for a kernel on another stream (group.cc); a whole
// Low-Latency call on more is launched cooperatively (ll/calls.cc, llCooperative).
constexpr int kSharedSms = 64;
}  // namespace ncclep

struct ncclEpGroup {
  ncclComm_t comm = nullptr;
  ncclEpGroupConfig_t config{};
  ncclep::TestingModes testing;     // the one-GPU test modes it was made in (nccl_ep_testing.h)
  std::atomic<int> liveHandles{0};  // its handles not destroyed yet: ncclEpGroupDestroy refuses while there are any
  int smCount = 0;                  // SMs this rank may use (virtual ranks: its share of the GPU)
  int numSms = 0;
  double timeoutSeconds = 100;
  ncclep::DeviceMemory memory;  // declared before what it allocates, so that it goes after it
  ncclep::Window window;
  ncclep::GroupView view{};
  ncclep::LlState ll;
  std::unique_ptr<ncclep::Rail> rail;  // several NVLink domains; NULL with one

  static ncclResult_t create(ncclComm_t comm, const ncclEpGroupConfig_t& config, const ncclep::TestingModes& testing,
                             ncclEpGroup** out);
  ~ncclEpGroup();
  // COLLECTIVE: the quiesce point, then the teardown (ncclEpGroupDestroy).
  static ncclResult_t destroy(ncclEpGroup* g);
  // ncclSuccess, or the error a device wait or an input check recorded, as a code and a message.
  // An invalid-input report is cleared once returned (the group stays usable); a timeout stays.
  ncclResult_t asyncError(const char* what);

 private:
  // create's steps, in order: the domain and SM budget, the window and device state, the rail.
  ncclResult_t createDomain();
  ncclResult_t createWindow(cudaStream_t stream);
  ncclResult_t createRail(bool overlap, cudaStream_t stream);
};
