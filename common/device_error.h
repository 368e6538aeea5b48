// The error word a kernel writes instead of trapping. It lives in pinned, mapped host memory so that the host can
// read it while a kernel still runs (a watchdog) and after it ends. Plain C++ so that host code needs no CUDA
// compiler to read it.
//
// Protocol: the first failing thread wins `claimed` by an atomic exchange, fills the fields, fences at system
// scope and then stores `code`. The host trusts the fields only once `code` != 0.
#pragma once

#include <cstdint>

namespace ncclext {

enum DeviceErrorCode : uint32_t {
  kDeviceOk = 0,
  kDeviceTimeout = 1,  // a wait on a peer's flag ran past its budget
  kDeviceAborted = 2,  // the wait gave up because another thread of this rank had already failed
  kDeviceBadInput = 3, // a kernel found invalid input data: `seen` at element `index`, limit `expected`
};

// Where a wait sat. Libraries append their own sites from kSiteLibraryBase on (describeSite() then prints a number).
enum DeviceErrorSite : uint32_t {
  kSiteUnknown = 0,
  kSiteBarrier = 1,  // lsaBarrierSync
  kSiteFlag = 2,     // a plain flag wait
  kSiteLibraryBase = 100,
};

struct DeviceErrorWord {
  uint32_t claimed;
  uint32_t code;      // DeviceErrorCode, written last
  int32_t rank;       // the rank that waited
  int32_t peer;       // the rank it waited for
  uint64_t expected;  // the flag value it needed (at least)
  uint64_t seen;      // the value it last read
  uint32_t site;      // DeviceErrorSite
  uint32_t index;     // barrier index / CTA
  uint64_t waitedNs;  // how long it waited
};

}  // namespace ncclext
