#include "common/device_status.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "common/checks.h"
#include "common/watchdog.h"

namespace ncclext {
namespace {

const char* siteName(uint32_t site) {
  switch (site) {
    case kSiteBarrier: return "LSA barrier";
    case kSiteFlag: return "flag wait";
    case kSiteHeader: return "header of source";
    case kSiteRow: return "row";
    default: return nullptr;
  }
}

}  // namespace

ncclResult_t describeDeviceError(const DeviceErrorWord& w, const char* what) {
  if (w.code == kDeviceOk) return ncclSuccess;
  char site[64];
  if (const char* name = siteName(w.site)) {
    snprintf(site, sizeof(site), "%s %u", name, w.index);
  } else {
    snprintf(site, sizeof(site), "site %u index %u", w.site, w.index);
  }
  if (w.code == kDeviceTimeout || w.code == kDeviceAborted) {
    // Which rank failed first, when several share one GPU (virtual ranks, one-GPU nodes): NCCL_EXT_LOG=debug.
    NCCLEXT_DEBUG("%s: rank %d's wait for peer %d (%s, expected >= %llu) gave up at GPU clock %llu ns", what, w.rank,
                  w.peer, site, (unsigned long long)w.expected, (unsigned long long)w.atNs);
    return fail(ncclRemoteError, __FILE__, __LINE__,
                "%s: %s after %.3f s: rank %d waited for peer %d at %s (flag expected >= %llu, seen %llu)", what,
                w.code == kDeviceTimeout ? "timed out" : "aborted", w.waitedNs * 1e-9, w.rank, w.peer, site,
                (unsigned long long)w.expected, (unsigned long long)w.seen);
  }
  if (w.code == kDeviceBadInput) {
    return fail(ncclInvalidArgument, __FILE__, __LINE__, "%s: invalid input at %s, element %u: value %lld (limit %llu)",
                what, site, w.index, (long long)(int64_t)w.seen, (unsigned long long)w.expected);
  }
  if (w.code == kDevicePeerMasked) {
    return fail(ncclRemoteError, __FILE__, __LINE__,
                "%s: rank %d masked peer %d during a call that had counted on it (call %llu of its kind): that call's "
                "outputs are incomplete; the peer stays masked (query the mask, clean it to bring the peer back)",
                what, w.rank, w.peer, (unsigned long long)w.expected);
  }
  return fail(ncclSystemError, __FILE__, __LINE__, "%s: device error code %u at %s", what, w.code, site);
}

ncclResult_t DeviceStatus::create(std::unique_ptr<DeviceStatus>* out) {
  std::unique_ptr<DeviceStatus> s(new DeviceStatus());
  void* h = nullptr;
  NCCLEXT_CUDA(cudaHostAlloc(&h, sizeof(DeviceErrorWord), cudaHostAllocMapped | cudaHostAllocPortable));
  s->host_ = static_cast<DeviceErrorWord*>(h);
  memset(s->host_, 0, sizeof(DeviceErrorWord));
  void* d = nullptr;
  NCCLEXT_CUDA(cudaHostGetDevicePointer(&d, h, 0));
  s->device_ = static_cast<DeviceErrorWord*>(d);
  NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&s->claim_), sizeof(uint32_t)));
  // Synchronous copy from pageable memory: done before the first kernel that could claim the word is launched.
  const uint32_t zero = 0;
  NCCLEXT_CUDA(cudaMemcpy(s->claim_, &zero, sizeof(zero), cudaMemcpyHostToDevice));
  NCCLEXT_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  *out = std::move(s);
  return ncclSuccess;
}

DeviceStatus::~DeviceStatus() {
  if (claim_) NCCLEXT_WARN_ON(cudaFree(claim_));
  if (host_) NCCLEXT_WARN_ON(cudaFreeHost(host_));
}

bool DeviceStatus::read(DeviceErrorWord* out) const {
  // The device stores `code` last after a system-scope fence; read it first.
  const uint32_t code = __atomic_load_n(&host_->code, __ATOMIC_ACQUIRE);
  if (code == kDeviceOk) return false;
  memcpy(out, host_, sizeof(*out));
  out->code = code;
  return true;
}

ncclResult_t DeviceStatus::check(const char* what) const {
  DeviceErrorWord w;
  return read(&w) ? describeDeviceError(w, what) : ncclSuccess;
}

void DeviceStatus::reset() {
  const uint32_t resets = host_->resets + 1;
  memset(host_, 0, sizeof(DeviceErrorWord));
  __atomic_store_n(&host_->resets, resets, __ATOMIC_RELEASE);
}

ncclResult_t waitStream(cudaStream_t stream, double timeoutSeconds, const char* what, const DeviceStatus* status) {
  const auto start = std::chrono::steady_clock::now();
  // Device waits give up after their own budget; the host allows that budget plus a margin for the kernel to
  // notice, write the word and drain.
  const auto limit = std::chrono::duration<double>(timeoutSeconds + kHostMarginSeconds);
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: stream failed: %s", what, cudaGetErrorString(e));
    }
    if (std::chrono::steady_clock::now() - start > limit) {
      if (status) NCCLEXT_CHECK(status->check(what));
      return fail(ncclSystemError, __FILE__, __LINE__,
                  "%s: kernels still running after %.1f s with no device error recorded; the process cannot tear "
                  "down cleanly",
                  what, limit.count());
    }
    // Poll tightly for the first millisecond (a short kernel is then seen within a few microseconds), then back
    // off so that a long wait does not burn a core.
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(1))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return status ? status->check(what) : ncclSuccess;
}

ncclResult_t copyToHostAfter(cudaStream_t stream, void* dst, const void* src, size_t bytes, double timeoutSeconds,
                             const char* what) {
  NCCLEXT_CHECK(waitStream(stream, timeoutSeconds, what));
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: copy to the host failed: %s", what,
                cudaGetErrorString(cudaGetLastError()));
  return ncclSuccess;
}

void watchStream(const void* owner, double seconds, cudaStream_t stream, std::function<void()> expire) {
  int device = 0;
  cudaEvent_t ev = nullptr;
  if (cudaGetDevice(&device) != cudaSuccess || cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(ev, stream) != cudaSuccess) {
    if (ev) cudaEventDestroy(ev);
    return;
  }
  struct Event {
    cudaEvent_t e;
    int device;
    ~Event() {
      cudaSetDevice(device);
      cudaEventDestroy(e);
    }
  };
  std::shared_ptr<Event> event(new Event{ev, device});  // destroyed with the watch's last probe
  Watchdog::instance().add(
      owner, seconds,
      [event] {
        // This thread's queries must not invalidate a capture that another thread began in the global mode.
        static thread_local bool relaxed = [] {
          cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
          return cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
        }();
        (void)relaxed;
        cudaSetDevice(event->device);
        return cudaEventQuery(event->e) != cudaErrorNotReady;  // done, or failed: nothing left to wait for
      },
      std::move(expire));
}

ncclResult_t connectPeers(ncclComm_t comm, const std::vector<char>& sendTo, const std::vector<char>& recvFrom,
                          const void* owner, double seconds, cudaStream_t stream, std::function<void()> expire,
                          const char* what) {
  const int n = (int)sendTo.size();
  bool any = false;
  for (int r = 0; r < n; r++) any = any || sendTo[r] || recvFrom[r];
  if (!any) return ncclSuccess;
  char* bytes = nullptr;
  // The bytes sent are zeroed: their value means nothing, but NCCL's kernel reads them (initcheck saw it).
  if (cudaMallocAsync(reinterpret_cast<void**>(&bytes), 2 * (size_t)n, stream) != cudaSuccess)
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: connecting to the peers: cudaMallocAsync failed",
                what);
  if (cudaMemsetAsync(bytes, 0, 2 * (size_t)n, stream) != cudaSuccess) {
    cudaFreeAsync(bytes, stream);
    return fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s: connecting to the peers: cudaMemsetAsync failed",
                what);
  }
  const uint64_t watch = Watchdog::instance().add(owner, seconds, [] { return false; }, expire);
  ncclResult_t res = ncclGroupStart();
  for (int r = 0; r < n && res == ncclSuccess; r++) {
    if (sendTo[r]) res = ncclSend(bytes + r, 1, ncclUint8, r, comm, stream);
    if (recvFrom[r] && res == ncclSuccess) res = ncclRecv(bytes + n + r, 1, ncclUint8, r, comm, stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  // The host call returned: the rest is device work, which the stream wait bounds.
  Watchdog::instance().setProbe(watch, [] { return true; });
  if (res != ncclSuccess || ended != ncclSuccess)
    return fail(res != ncclSuccess ? res : ended, __FILE__, __LINE__, "%s: connecting to the peers: %s", what,
                ncclGetLastError(comm));
  const ncclResult_t waited = waitStream(stream, seconds, what);
  if (waited != ncclSuccess) {
    expire();  // the exchange's kernels must not outlive the caller's error
    return waited;
  }
  cudaFreeAsync(bytes, stream);
  return ncclSuccess;
}

}  // namespace ncclext
