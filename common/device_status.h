// Host side of the device error word (common/device_error.h) and the host watchdog around kernels.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <vector>

#include "common/device_error.h"

namespace ncclext {

class DeviceStatus {
 public:
  static ncclResult_t create(std::unique_ptr<DeviceStatus>* out);
  ~DeviceStatus();
  DeviceStatus(const DeviceStatus&) = delete;
  DeviceStatus& operator=(const DeviceStatus&) = delete;

  // What kernels write through.
  DeviceErrorSink sink() const { return DeviceErrorSink{device_, claim_}; }

  // ncclSuccess while the word is clean; else ncclRemoteError (a peer did not arrive) or ncclSystemError, with a
  // message naming rank, peer, site, expected and seen values. `what` names the operation for the message.
  ncclResult_t check(const char* what) const;

  // Copies the word into `out` and returns true when an error was recorded (the fields are complete then).
  bool read(DeviceErrorWord* out) const;

  // Clears and re-arms the word. Only while no kernel that may write it is running.
  void reset();

 private:
  DeviceStatus() = default;
  DeviceErrorWord* host_ = nullptr;
  DeviceErrorWord* device_ = nullptr;
  uint32_t* claim_ = nullptr;  // device memory
};

// What host waits allow beyond a device budget: time for a kernel to notice its own timeout, record it and drain.
constexpr double kHostMarginSeconds = 5.0;

// Waits for `stream` on the host without blocking forever: polls the stream (and the error word, when `status` is
// given) and gives up after `timeoutSeconds` plus kHostMarginSeconds (ncclSystemError: a kernel is still running and the
// process cannot tear down cleanly). Returns status->check(what) once the stream is done.
ncclResult_t waitStream(cudaStream_t stream, double timeoutSeconds, const char* what,
                        const DeviceStatus* status = nullptr);

// Watches the work enqueued on `stream` so far (an event recorded now) with common/watchdog.h: if it has not
// finished `seconds` from now, `expire` runs once on the watchdog thread (e.g. aborting the communicator whose peer
// never came). `owner` ends the watch with Watchdog::removeOwner. Without an event to record (an error), nothing is
// watched: the stream's own error reaches the caller. Not for a stream being captured.
void watchStream(const void* owner, double seconds, cudaStream_t stream, std::function<void()> expire);

// NCCL connects a pair at its first point-to-point call on a communicator, and that call blocks the host until the
// peer takes part. Exchanges one byte each way with the peers marked in sendTo / recvFrom (indexed by rank of comm)
// now, while every rank is in the same collective call, under the watchdog: if the host call or its device work has
// not finished `seconds` from now, `expire` runs once on the watchdog thread (it must abort comm: that ends a host call
// blocked inside NCCL). Later calls on comm then never wait on the host for a peer. Returns the first error
// (`what` names the call); after an expiry the caller's own abort text is the better one to report.
ncclResult_t connectPeers(ncclComm_t comm, const std::vector<char>& sendTo, const std::vector<char>& recvFrom,
                          const void* owner, double seconds, cudaStream_t stream, std::function<void()> expire,
                          const char* what);

// Copies `bytes` from device memory to (pageable) host memory once `stream` has drained, within waitStream's budget.
// A device-to-pageable cudaMemcpyAsync returns only when the copy is done: queued behind a collective whose peer is
// gone it would block the thread forever, so the bounded wait comes first and the copy runs on an idle stream.
ncclResult_t copyToHostAfter(cudaStream_t stream, void* dst, const void* src, size_t bytes, double timeoutSeconds,
                             const char* what);

// Turns a filled error word into a result code and a last-error text. Pure host code, unit-tested.
ncclResult_t describeDeviceError(const DeviceErrorWord& w, const char* what);

}  // namespace ncclext
