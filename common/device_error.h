// The error word a kernel writes instead of trapping. It lives in pinned, mapped host memory so that the host can
// read it while a kernel still runs (a watchdog) and after it ends. Plain C++ so that host code needs no CUDA
// compiler to read it.
//
// Protocol: the first failing thread claims the word with a device-scope atomic on a counter in DEVICE memory (GPUs
// attached over PCIe, our H200s among them, have no atomics on host memory: cudaDevAttrHostNativeAtomicSupported is
// 0), then fills the fields with plain stores, fences at system scope and stores `code` last. The host trusts the
// fields only once `code` != 0. The host re-arms the word (after reading it, while no kernel that may write it runs)
// by clearing it and bumping `resets`: a claim succeeds when the device counter equals `resets`.
#pragma once

#include <cstdint>

namespace ncclext {

enum DeviceErrorCode : uint32_t {
  kDeviceOk = 0,
  kDeviceTimeout = 1,  // a wait on a peer's flag ran past its budget
  kDeviceAborted = 2,  // the wait gave up because another thread of this rank had already failed
  kDeviceBadInput = 3, // a kernel found invalid input data: `seen` at element `index`, limit `expected`
  kDevicePeerMasked = 4, // (nccl_ep LL masks) `peer` was masked during a call that had counted on it; recoverable
};

// Where a wait sat. Libraries append their own sites from kSiteLibraryBase on (describeSite() then prints a number).
enum DeviceErrorSite : uint32_t {
  kSiteUnknown = 0,
  kSiteBarrier = 1,  // lsaBarrierSync
  kSiteFlag = 2,     // a plain flag wait
  kSiteHeader = 3,   // a peer's header (counts) of a call; index: the peer
  kSiteRow = 4,      // a peer's row of a call; index: the row
  kSiteLibraryBase = 100,
};

struct DeviceErrorWord {
  uint32_t resets;    // written by the host only
  uint32_t code;      // DeviceErrorCode, written last
  int32_t rank;       // the rank that waited
  int32_t peer;       // the rank it waited for
  uint64_t expected;  // the flag value it needed (at least)
  uint64_t seen;      // the value it last read
  uint32_t site;      // DeviceErrorSite
  uint32_t index;     // barrier index / CTA
  uint64_t waitedNs;  // how long it waited
  uint64_t atNs;      // the GPU's global timer when it was recorded: orders the failures of ranks on one GPU
};

// What kernels get: the word (mapped host memory) and the claim counter (device memory).
struct DeviceErrorSink {
  DeviceErrorWord* word;
  uint32_t* claim;
};

}  // namespace ncclext
