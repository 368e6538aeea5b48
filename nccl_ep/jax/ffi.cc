// XLA FFI handlers of nccl_ep for JAX (libnccl_ep_jax.so; Python: nccl.ep.jax). Built against XLA's header-only FFI
// API (xla/ffi/api/ffi.h from jaxlib's jax.ffi.include_dir()); nothing of jaxlib is linked: XLA hands every call its
// API table in the call frame.
//
// Handles. A jitted program names a handle by an int64 attribute `handle_id`, registered here by
// ncclEpJaxHandleCreate outside jit (collective for High-Throughput, as ncclEpCreateHandle): a handle of worst-case
// sizing (static output shapes, no host wait) and a routing buffer [num_tokens, topk] int32 owned by the entry. Each
// dispatch copies its topk_idx operand into that buffer and binds it (ncclEpUpdateHandle) on XLA's stream: the
// library reads the bound routing again in later calls (the backward pass's redispatch and combine), after XLA may
// have reused the operand's memory, so the routing must live in memory of the handle's own, as the torch layer's
// Handle keeps its topk_idx tensor alive.
//
// Streams and ordering. Every handler runs its calls on the stream XLA gives it (PlatformStream) and never waits on
// the host. The group's calls must run in the same order on every rank: one SPMD program compiled alike on every
// rank gives that. A handle's combine and redispatch use the routing of the last dispatch on that handle: one
// handle per dispatch site (a MoE layer); the data dependence from dispatch's outputs to combine's input orders a
// layer's calls.
//
// Errors. A failed call returns an ffi::Error carrying ncclEpGetLastError's text (XLA raises it in Python at the
// call); a device wait that timed out reaches the host through ncclEpGroupGetAsyncError (nccl.ep.jax's
// Group.check()). No exception leaves this file.
#include "xla/ffi/api/ffi.h"

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/jax/tail.h"

namespace ffi = xla::ffi;

#define NCCL_EP_JAX_API extern "C" __attribute__((visibility("default")))

namespace {

// One registered handle: the library's handle, the routing buffer it is bound to, and the static facts the
// handlers check the buffers against (the shapes the Python layer traced with).
struct Entry {
  ncclEpHandle_t handle = nullptr;
  int* routing = nullptr;     // [numTokens, topk] int32, device memory of `device`
  int* rankCounts = nullptr;  // High-Throughput: [nRanks] int32, the bound routing's rows from each source rank
  int device = -1;
  int numTokens = 0, topk = 0, localExperts = 0, nRanks = 0;
  int64_t maxRows = 0;
  bool lowLatency = false;
  ncclEpLayout_t layout = NCCL_EP_LAYOUT_UNSET;
  double waitSeconds = 0;  // the host's deadline for the waits of create and destroy
};

// `stream`'s work, waited for at most `seconds` (its kernels' device waits end within the group's budget; this is
// the host's own deadline). cudaSuccess, the stream's error, or cudaErrorTimeout once the deadline passed.
cudaError_t waitStreamWithin(cudaStream_t stream, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const cudaError_t ce = cudaStreamQuery(stream);
    if (ce != cudaErrorNotReady) return ce;
    if (std::chrono::steady_clock::now() > until) return cudaErrorTimeout;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Every queued kernel of `device` (XLA's streams are not known here) finished, waited for at most `seconds`: the
// device synchronisation runs on a thread of its own, which is left behind, blocked, if the deadline passes
// (cudaErrorTimeout then; what the caller would have freed stays allocated).
cudaError_t synchronizeDeviceWithin(int device, double seconds) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    cudaError_t result = cudaSuccess;
  };
  auto w = std::make_shared<Wait>();
  std::thread([w, device] {
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess) ce = cudaDeviceSynchronize();
    std::lock_guard<std::mutex> lock(w->mu);
    w->result = ce;
    w->done = true;
    w->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(w->mu);
  if (!w->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return w->done; })) return cudaErrorTimeout;
  return w->result;
}

std::mutex& registryMutex() {
  static std::mutex* m = new std::mutex;  // never destroyed: a call during the process's exit still finds it
  return *m;
}
std::unordered_map<int64_t, Entry>& registry() {
  static auto* r = new std::unordered_map<int64_t, Entry>;
  return *r;
}

thread_local std::string lastError;

ncclResult_t fail(ncclResult_t rc, const std::string& text) {
  lastError = "[nccl_ep.jax] " + text;
  return rc;
}

// The library's failure as this library's last error, named by `what`.
ncclResult_t failed(ncclResult_t rc, const char* what) {
  return fail(rc, std::string(what) + ": " + ncclEpGetLastError());
}

ffi::ErrorCode errorCode(ncclResult_t rc) {
  switch (rc) {
    case ncclInvalidArgument:
      return ffi::ErrorCode::kInvalidArgument;
    case ncclInvalidUsage:
      return ffi::ErrorCode::kFailedPrecondition;
    case ncclRemoteError:
      return ffi::ErrorCode::kUnavailable;
    default:
      return ffi::ErrorCode::kInternal;
  }
}

ffi::Error callError(ncclResult_t rc, const char* target, const char* call) {
  return ffi::Error(errorCode(rc),
                    std::string("[nccl_ep.jax] ") + target + ": " + call + " failed: " + ncclEpGetLastError());
}

ffi::Error argError(const char* target, const std::string& text) {
  return ffi::Error::InvalidArgument(std::string("[nccl_ep.jax] ") + target + ": " + text);
}

bool ncclType(ffi::DataType t, ncclDataType_t* out) {
  switch (t) {
    case ffi::DataType::BF16:
      *out = ncclBfloat16;
      return true;
    case ffi::DataType::F16:
      *out = ncclFloat16;
      return true;
    case ffi::DataType::F32:
      *out = ncclFloat32;
      return true;
    case ffi::DataType::S32:
      *out = ncclInt32;
      return true;
    case ffi::DataType::S64:
      *out = ncclInt64;
      return true;
    case ffi::DataType::F8E4M3FN:
      *out = ncclFloat8e4m3;
      return true;
    default:
      return false;
  }
}

std::string shapeText(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The descriptor of an XLA buffer (data NULL when empty, as the C API wants for zero-size tensors); false with a
// message when its dtype or rank has no descriptor.
bool describe(const ffi::AnyBuffer& b, const char* target, const char* name, ncclEpTensor_t* t, ffi::Error* err) {
  ncclEpTensor_t d = NCCL_EP_TENSOR_INIT;
  auto dims = b.dimensions();
  if (dims.size() < 1 || dims.size() > NCCL_EP_MAX_TENSOR_DIMS) {
    *err = argError(target, std::string(name) + " has shape " + shapeText(dims) + ": 1 to 4 dimensions expected");
    return false;
  }
  if (!ncclType(b.element_type(), &d.datatype)) {
    *err = argError(target, std::string(name) + ": dtype code " + std::to_string((int)b.element_type()) +
                                " has no NCCL equivalent");
    return false;
  }
  d.ndim = (unsigned)dims.size();
  for (size_t i = 0; i < dims.size(); i++) d.sizes[i] = dims[i];
  d.data = b.element_count() ? b.untyped_data() : nullptr;
  *t = d;
  return true;
}

// The registered entry `id`, checked against the call: its mode, its device. The handler holds registryMutex() for
// its whole call: ncclEpJaxHandleDestroy then unregisters the handle either before the call looks it up (the call
// fails cleanly) or after the call has queued its work (which the destroy waits for), never while a call uses it.
bool lookup(int64_t id, bool lowLatency, int32_t device, const char* target, Entry* out, ffi::Error* err) {
  auto it = registry().find(id);
  if (it == registry().end()) {
    *err = ffi::Error(ffi::ErrorCode::kNotFound,
                      std::string("[nccl_ep.jax] ") + target + ": no handle registered as " + std::to_string(id) +
                          " (handles are made outside jit, in this process, by nccl.ep.jax.Group.handle)");
    return false;
  }
  const Entry& e = it->second;
  if (e.lowLatency != lowLatency) {
    *err = ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string("[nccl_ep.jax] ") + target + ": handle " + std::to_string(id) + " is a " +
                          (e.lowLatency ? "Low-Latency" : "High-Throughput") + " handle");
    return false;
  }
  if (e.device != device) {
    *err = ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string("[nccl_ep.jax] ") + target + ": handle " + std::to_string(id) + " lives on GPU " +
                          std::to_string(e.device) + "; this call runs on device ordinal " + std::to_string(device));
    return false;
  }
  *out = e;
  return true;
}

bool checkRows(const ffi::AnyBuffer& b, int64_t rows, const char* target, const char* name, ffi::Error* err) {
  auto dims = b.dimensions();
  if (dims.size() < 1 || dims[0] != rows) {
    *err = argError(target, std::string(name) + " has shape " + shapeText(dims) + "; the handle's shapes want " +
                                std::to_string(rows) + " rows");
    return false;
  }
  return true;
}

// Copies the call's routing [T, K] int32 into the entry's buffer and binds it (collective in High-Throughput).
ffi::Error bindRouting(const Entry& e, const ffi::AnyBuffer& topkIdx, const ncclEpLayoutInfo_t* info,
                       cudaStream_t stream, const char* target) {
  auto dims = topkIdx.dimensions();
  if (topkIdx.element_type() != ffi::DataType::S32 || dims.size() != 2 || dims[0] != e.numTokens || dims[1] != e.topk) {
    return argError(target, "topk_idx must be int32 [" + std::to_string(e.numTokens) + ", " + std::to_string(e.topk) +
                                "] (the handle's); got shape " + shapeText(dims));
  }
  const size_t bytes = (size_t)e.numTokens * e.topk * sizeof(int);
  if (bytes) {
    cudaError_t ce = cudaMemcpyAsync(e.routing, topkIdx.untyped_data(), bytes, cudaMemcpyDeviceToDevice, stream);
    if (ce != cudaSuccess) {
      return ffi::Error::Internal(std::string("[nccl_ep.jax] ") + target +
                                  ": copying topk_idx: " + cudaGetErrorString(ce));
    }
  }
  ncclEpTensor_t t = NCCL_EP_TENSOR_INIT;
  t.ndim = 2;
  t.datatype = ncclInt32;
  t.data = bytes ? e.routing : nullptr;
  t.sizes[0] = e.numTokens;
  t.sizes[1] = e.topk;
  ncclResult_t rc = ncclEpUpdateHandle(e.handle, &t, info, stream);
  if (rc != ncclSuccess) return callError(rc, target, "ncclEpUpdateHandle");
  return ffi::Error::Success();
}

// The entry's rank counts (of the routing as bound) into the call's output.
ffi::Error copyRankCounts(const Entry& e, const ffi::AnyBuffer& out, cudaStream_t stream, const char* target) {
  if (e.nRanks == 0) return ffi::Error::Success();
  cudaError_t ce = cudaMemcpyAsync(out.untyped_data(), e.rankCounts, (size_t)e.nRanks * sizeof(int),
                                   cudaMemcpyDeviceToDevice, stream);
  if (ce != cudaSuccess) {
    return ffi::Error::Internal(std::string("[nccl_ep.jax] ") + target +
                                ": copying rank_counts: " + cudaGetErrorString(ce));
  }
  return ffi::Error::Success();
}

// A dispatch output's rows past the received ones, zeroed: High-Throughput, those past the sum of the device ints
// counts[0, n) (the bound routing's rank counts); with `perBlock` (Low-Latency), in each of n blocks of rows those
// past the block's count (tail.h).
ffi::Error zeroTail(const Entry& e, ffi::AnyBuffer& tokens, const int* counts, int n, bool perBlock,
                    cudaStream_t stream, const char* target) {
  if (e.maxRows == 0 || tokens.size_bytes() == 0) return ffi::Error::Success();
  const size_t rowBytes = tokens.size_bytes() / (size_t)e.maxRows;
  void* base = tokens.untyped_data();
  cudaError_t ce = perBlock ? ncclEpJaxZeroPastBlockCounts(base, rowBytes, e.maxRows, counts, n, stream)
                            : ncclEpJaxZeroPastCounts(base, rowBytes, e.maxRows, counts, n, stream);
  if (ce != cudaSuccess) {
    return ffi::Error::Internal(std::string("[nccl_ep.jax] ") + target +
                                ": zeroing the rows past the received ones: " + cudaGetErrorString(ce));
  }
  return ffi::Error::Success();
}

ncclEpTensor_t counter(const ffi::AnyBuffer& b) {
  ncclEpTensor_t t = NCCL_EP_TENSOR_INIT;
  t.ndim = 1;
  t.datatype = ncclInt32;
  t.sizes[0] = b.dimensions().size() ? b.dimensions()[0] : 0;
  t.data = b.element_count() ? b.untyped_data() : nullptr;
  return t;
}

// Runs `body` (returning ffi::Error) so that no exception leaves a handler.
template <typename F>
ffi::Error guarded(const char* target, F&& body) {
  try {
    return body();
  } catch (const std::exception& ex) {
    return ffi::Error::Internal(std::string("[nccl_ep.jax] ") + target + ": " + ex.what());
  } catch (...) {
    return ffi::Error::Internal(std::string("[nccl_ep.jax] ") + target + ": unknown exception");
  }
}

// ---- High-Throughput (FLAT layout) -------------------------------------------------------------------------------

// x [T, H], topk_idx [T, K] int32, topk_weights [T, K] fp32 -> tokens [rows, H], local_ids [rows, K] int32,
// weights [rows, K] fp32, expert_counts [L] int32, rank_counts [R] int32, recv_dropped [1] int32 (rows for this
// rank past the group's receive cap, not delivered; 0 without a cap). tokens' rows past sum(rank_counts) are zeroed
// (zeroTail); local_ids' and weights' are not written.
// The binding writes the rank counts into the entry (redispatch reports them again), copied out here.
ffi::Error htDispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer topkIdx,
                      ffi::AnyBuffer topkWeights, ffi::Result<ffi::AnyBuffer> tokens,
                      ffi::Result<ffi::AnyBuffer> localIds, ffi::Result<ffi::AnyBuffer> weights,
                      ffi::Result<ffi::AnyBuffer> expertCounts, ffi::Result<ffi::AnyBuffer> rankCounts,
                      ffi::Result<ffi::AnyBuffer> recvDropped, int64_t handleId) {
  static const char* kTarget = "nccl_ep_ht_dispatch";
  return guarded(kTarget, [&]() -> ffi::Error {
    std::lock_guard<std::mutex> lock(registryMutex());
    Entry e;
    ffi::Error err;
    if (!lookup(handleId, false, device, kTarget, &e, &err)) return err;
    if (!checkRows(*tokens, e.maxRows, kTarget, "tokens", &err) ||
        !checkRows(*localIds, e.maxRows, kTarget, "local_ids", &err) ||
        !checkRows(*weights, e.maxRows, kTarget, "weights", &err) ||
        !checkRows(*expertCounts, e.localExperts, kTarget, "expert_counts", &err) ||
        !checkRows(*rankCounts, e.nRanks, kTarget, "rank_counts", &err) ||
        !checkRows(*recvDropped, 1, kTarget, "recv_dropped", &err))
      return err;
    ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
    info.expert_counters = counter(*expertCounts);
    info.src_rank_counters = counter(*rankCounts);
    info.src_rank_counters.data = e.rankCounts;
    info.recv_dropped_counter = counter(*recvDropped);
    err = bindRouting(e, topkIdx, &info, stream, kTarget);
    if (!err.success()) return err;
    err = copyRankCounts(e, *rankCounts, stream, kTarget);
    if (!err.success()) return err;
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    if (!describe(x, kTarget, "x", &in.tokens, &err) ||
        !describe(topkWeights, kTarget, "topk_weights", &in.topk_weights, &err) ||
        !describe(*tokens, kTarget, "tokens", &out.tokens, &err) ||
        !describe(*localIds, kTarget, "local_ids", &out.topk_idx, &err) ||
        !describe(*weights, kTarget, "weights", &out.topk_weights, &err))
      return err;
    ncclEpDispatchConfig_t cfg = NCCL_EP_DISPATCH_CONFIG_INIT;
    ncclResult_t rc = ncclEpDispatch(e.handle, &in, &out, nullptr, &cfg, stream);
    if (rc != ncclSuccess) return callError(rc, kTarget, "ncclEpDispatch");
    return zeroTail(e, *tokens, e.rankCounts, e.nRanks, false, stream, kTarget);
  });
}

// x [T, H] through the routing as bound (no new routing, no weights) -> tokens [rows, H] (rows past the received
// ones zeroed) and that routing's rank_counts [R] int32 (which rows hold data): combine's gradient. `after`, unread,
// is an array computed from the forward dispatch's outputs: as an operand it makes XLA run this call after that
// dispatch bound the routing.
ffi::Error htRedispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                        ffi::Result<ffi::AnyBuffer> tokens, ffi::Result<ffi::AnyBuffer> rankCounts, int64_t handleId) {
  static const char* kTarget = "nccl_ep_ht_redispatch";
  return guarded(kTarget, [&]() -> ffi::Error {
    std::lock_guard<std::mutex> lock(registryMutex());
    Entry e;
    ffi::Error err;
    if (!lookup(handleId, false, device, kTarget, &e, &err)) return err;
    if (!checkRows(*tokens, e.maxRows, kTarget, "tokens", &err) ||
        !checkRows(*rankCounts, e.nRanks, kTarget, "rank_counts", &err))
      return err;
    err = copyRankCounts(e, *rankCounts, stream, kTarget);
    if (!err.success()) return err;
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    if (!describe(x, kTarget, "x", &in.tokens, &err) || !describe(*tokens, kTarget, "tokens", &out.tokens, &err))
      return err;
    ncclEpDispatchConfig_t cfg = NCCL_EP_DISPATCH_CONFIG_INIT;
    ncclResult_t rc = ncclEpDispatch(e.handle, &in, &out, nullptr, &cfg, stream);
    if (rc != ncclSuccess) return callError(rc, kTarget, "ncclEpDispatch");
    return zeroTail(e, *tokens, e.rankCounts, e.nRanks, false, stream, kTarget);
  });
}

// y [rows, H] (the dispatch output's layout), topk_weights [T, K] fp32 (Low-Latency EXPERT_MAJOR, owner-weighted,
// when given; else none) -> out [T, H]: each token's rows summed in fp32 (the routing as bound by the last dispatch
// on the handle). One body for both modes: `ll` picks the handle's kind that the lookup accepts.
ffi::Error combine(cudaStream_t stream, int32_t device, ffi::AnyBuffer y, const ffi::AnyBuffer* topkWeights,
                   ffi::Result<ffi::AnyBuffer> result, int64_t handleId, bool ll, const char* target) {
  return guarded(target, [&]() -> ffi::Error {
    std::lock_guard<std::mutex> lock(registryMutex());
    Entry e;
    ffi::Error err;
    if (!lookup(handleId, ll, device, target, &e, &err)) return err;
    if (!checkRows(y, e.maxRows, target, "y", &err) || !checkRows(*result, e.numTokens, target, "out", &err))
      return err;
    ncclEpCombineInputs_t in = NCCL_EP_COMBINE_INPUTS_INIT;
    ncclEpCombineOutputs_t out = NCCL_EP_COMBINE_OUTPUTS_INIT;
    if (!describe(y, target, "y", &in.tokens, &err) || !describe(*result, target, "out", &out.tokens, &err)) return err;
    if (topkWeights && !describe(*topkWeights, target, "topk_weights", &in.topk_weights, &err)) return err;
    ncclEpCombineConfig_t cfg = NCCL_EP_COMBINE_CONFIG_INIT;
    ncclResult_t rc = ncclEpCombine(e.handle, &in, &out, &cfg, stream);
    if (rc != ncclSuccess) return callError(rc, target, "ncclEpCombine");
    return ffi::Error::Success();
  });
}

ffi::Error htCombine(cudaStream_t stream, int32_t device, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> result,
                     int64_t handleId) {
  return combine(stream, device, y, nullptr, result, handleId, false, "nccl_ep_ht_combine");
}

// ---- Low-Latency (RANK_MAJOR or EXPERT_MAJOR) --------------------------------------------------------------------

// x [T, H] bf16, topk_idx [T, K] int32, topk_weights [T, K] fp32 (with_weights; else [0]) -> tokens [N, H] (bf16,
// or fp8 e4m3 quantised by the sender), scales [N, H/128] fp32 (fp8; else [0]), weights (RANK_MAJOR [N, K],
// EXPERT_MAJOR [N]; [0] without weights), local_ids (RANK_MAJOR [N, K] int32; else [0]), src_info [N] int32,
// expert_counts [L] int32, rank_counts [R] int32. The binding is local (Low-Latency). With zero_past_counts, bf16
// tokens' rows past their block's count (RANK_MAJOR: a source rank's M rows; EXPERT_MAJOR: a local expert's R * M)
// are zeroed here; without, they are left as they are.
ffi::Error llDispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer topkIdx,
                      ffi::AnyBuffer topkWeights, ffi::Result<ffi::AnyBuffer> tokens,
                      ffi::Result<ffi::AnyBuffer> scales, ffi::Result<ffi::AnyBuffer> weights,
                      ffi::Result<ffi::AnyBuffer> localIds, ffi::Result<ffi::AnyBuffer> srcInfo,
                      ffi::Result<ffi::AnyBuffer> expertCounts, ffi::Result<ffi::AnyBuffer> rankCounts,
                      int64_t handleId, bool withWeights, bool fp8, bool roundScale, bool zeroPastCounts) {
  static const char* kTarget = "nccl_ep_ll_dispatch";
  return guarded(kTarget, [&]() -> ffi::Error {
    std::lock_guard<std::mutex> lock(registryMutex());
    Entry e;
    ffi::Error err;
    if (!lookup(handleId, true, device, kTarget, &e, &err)) return err;
    const bool rankMajor = e.layout == NCCL_EP_LAYOUT_RANK_MAJOR;
    if (!checkRows(*tokens, e.maxRows, kTarget, "tokens", &err) ||
        !checkRows(*srcInfo, e.maxRows, kTarget, "src_info", &err) ||
        !checkRows(*expertCounts, e.localExperts, kTarget, "expert_counts", &err) ||
        !checkRows(*rankCounts, e.nRanks, kTarget, "rank_counts", &err))
      return err;
    err = bindRouting(e, topkIdx, nullptr, stream, kTarget);
    if (!err.success()) return err;
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    if (!describe(x, kTarget, "x", &in.tokens, &err) || !describe(*tokens, kTarget, "tokens", &out.tokens, &err) ||
        !describe(*srcInfo, kTarget, "src_info", &out.src_info, &err))
      return err;
    if (withWeights && (!describe(topkWeights, kTarget, "topk_weights", &in.topk_weights, &err) ||
                        !describe(*weights, kTarget, "weights", &out.topk_weights, &err)))
      return err;
    if (rankMajor && !describe(*localIds, kTarget, "local_ids", &out.topk_idx, &err)) return err;
    if (fp8 && !describe(*scales, kTarget, "scales", &out.scales, &err)) return err;
    ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
    info.expert_counters = counter(*expertCounts);
    info.src_rank_counters = counter(*rankCounts);
    ncclEpDispatchConfig_t cfg = NCCL_EP_DISPATCH_CONFIG_INIT;
    cfg.round_scale = roundScale ? 1 : 0;
    ncclResult_t rc = ncclEpDispatch(e.handle, &in, &out, &info, &cfg, stream);
    if (rc != ncclSuccess) return callError(rc, kTarget, "ncclEpDispatch");
    if (fp8 || !zeroPastCounts) return ffi::Error::Success();
    // bf16 rows that no token filled: a block of rows per source rank or local expert, its count this dispatch's.
    const auto& counts = rankMajor ? *rankCounts : *expertCounts;
    return zeroTail(e, *tokens, static_cast<const int*>(counts.untyped_data()), rankMajor ? e.nRanks : e.localExperts,
                    true, stream, kTarget);
  });
}

// y [N, H] bf16, topk_weights [T, K] fp32 (with_weights; else [0]) -> out [T, H] bf16. Follows a dispatch on the
// same handle.
ffi::Error llCombine(cudaStream_t stream, int32_t device, ffi::AnyBuffer y, ffi::AnyBuffer topkWeights,
                     ffi::Result<ffi::AnyBuffer> result, int64_t handleId, bool withWeights) {
  return combine(stream, device, y, withWeights ? &topkWeights : nullptr, result, handleId, true, "nccl_ep_ll_combine");
}

}  // namespace

// ---- Handlers (registered by nccl.ep.jax with jax.ffi.register_ffi_target(..., platform="CUDA")) ---------------
// Declared first for their visibility: the definitions below come from XLA's macro.
NCCL_EP_JAX_API XLA_FFI_Error* ncclEpJaxHtDispatch(XLA_FFI_CallFrame* call_frame);
NCCL_EP_JAX_API XLA_FFI_Error* ncclEpJaxHtRedispatch(XLA_FFI_CallFrame* call_frame);
NCCL_EP_JAX_API XLA_FFI_Error* ncclEpJaxHtCombine(XLA_FFI_CallFrame* call_frame);
NCCL_EP_JAX_API XLA_FFI_Error* ncclEpJaxLlDispatch(XLA_FFI_CallFrame* call_frame);
NCCL_EP_JAX_API XLA_FFI_Error* ncclEpJaxLlCombine(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(ncclEpJaxHtDispatch, htDispatch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // topk_idx
                                  .Arg<ffi::AnyBuffer>()  // topk_weights
                                  .Ret<ffi::AnyBuffer>()  // tokens
                                  .Ret<ffi::AnyBuffer>()  // local_ids
                                  .Ret<ffi::AnyBuffer>()  // weights
                                  .Ret<ffi::AnyBuffer>()  // expert_counts
                                  .Ret<ffi::AnyBuffer>()  // rank_counts
                                  .Ret<ffi::AnyBuffer>()  // recv_dropped
                                  .Attr<int64_t>("handle_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ncclEpJaxHtRedispatch, htRedispatch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // after (unread: orders the call after the forward's)
                                  .Ret<ffi::AnyBuffer>()  // tokens
                                  .Ret<ffi::AnyBuffer>()  // rank_counts
                                  .Attr<int64_t>("handle_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ncclEpJaxHtCombine, htCombine,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // y
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<int64_t>("handle_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ncclEpJaxLlDispatch, llDispatch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // topk_idx
                                  .Arg<ffi::AnyBuffer>()  // topk_weights or [0]
                                  .Ret<ffi::AnyBuffer>()  // tokens
                                  .Ret<ffi::AnyBuffer>()  // scales
                                  .Ret<ffi::AnyBuffer>()  // weights
                                  .Ret<ffi::AnyBuffer>()  // local_ids
                                  .Ret<ffi::AnyBuffer>()  // src_info
                                  .Ret<ffi::AnyBuffer>()  // expert_counts
                                  .Ret<ffi::AnyBuffer>()  // rank_counts
                                  .Attr<int64_t>("handle_id")
                                  .Attr<bool>("with_weights")
                                  .Attr<bool>("fp8")
                                  .Attr<bool>("round_scale")
                                  .Attr<bool>("zero_past_counts"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ncclEpJaxLlCombine, llCombine,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // y
                                  .Arg<ffi::AnyBuffer>()  // topk_weights or [0]
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<int64_t>("handle_id")
                                  .Attr<bool>("with_weights"));

// ---- The registry (called by nccl.ep.jax through ctypes, outside jit) -------------------------------------------

// Text of the last failure of an ncclEpJax* call on this thread; "" if none.
NCCL_EP_JAX_API const char* ncclEpJaxGetLastError(void) { return lastError.c_str(); }

// libnccl_ep's check of the loaded NCCL (the Python loader calls it for every library it binds).
NCCL_EP_JAX_API ncclResult_t ncclEpJaxCheckNcclRuntime(int* builtVersion, int* loadedVersion) {
  ncclResult_t rc = ncclEpCheckNcclRuntime(builtVersion, loadedVersion);
  if (rc != ncclSuccess) return failed(rc, "ncclEpCheckNcclRuntime");
  return ncclSuccess;
}

NCCL_EP_JAX_API ncclResult_t ncclEpJaxGetVersion(int* version) {
  ncclResult_t rc = ncclEpGetVersion(version);
  if (rc != ncclSuccess) return failed(rc, "ncclEpGetVersion");
  return ncclSuccess;
}

// COLLECTIVE for High-Throughput groups (as ncclEpCreateHandle), blocking: on GPU `device`, after the device's queued
// work (at most wait_seconds), makes a handle of
// `group` with worst-case sizing for routings [num_tokens, topk] int32 (layout: FLAT for High-Throughput groups,
// RANK_MAJOR or EXPERT_MAJOR for Low-Latency ones), bound once to "no expert" on a stream of its own and waited for
// (at most wait_seconds: past it ncclSystemError, and the handle is left allocated), and registers it as `id`
// (refused if taken). Writes the rows of a dispatch output to *max_rows.
NCCL_EP_JAX_API ncclResult_t ncclEpJaxHandleCreate(int64_t id, ncclEpGroup_t group, int device, int lowLatency,
                                                   int layout, int numTokens, int topk, int localExperts, int nRanks,
                                                   double waitSeconds, int64_t* maxRows) {
  try {
    if (maxRows == nullptr) return fail(ncclInvalidArgument, "ncclEpJaxHandleCreate: max_rows is NULL");
    if (numTokens < 0 || topk < 1) {
      return fail(ncclInvalidArgument, "ncclEpJaxHandleCreate: num_tokens " + std::to_string(numTokens) + " and topk " +
                                           std::to_string(topk) + ": num_tokens >= 0, topk >= 1");
    }
    if (!(waitSeconds > 0)) return fail(ncclInvalidArgument, "ncclEpJaxHandleCreate: wait_seconds must be > 0");
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      if (registry().count(id)) {
        return fail(ncclInvalidUsage, "ncclEpJaxHandleCreate: id " + std::to_string(id) + " is registered already");
      }
    }
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) return fail(ncclUnhandledCudaError, std::string("cudaSetDevice: ") + cudaGetErrorString(ce));
    // The tail kernel loaded now, as the library loads its own at group creation: never at a launch behind a kernel
    // that waits for peers.
    ce = ncclEpJaxLoadTailKernel();
    if (ce != cudaSuccess)
      return fail(ncclUnhandledCudaError, std::string("loading nccl_ep.jax's kernel: ") + cudaGetErrorString(ce));
    Entry e;
    e.device = device;
    e.numTokens = numTokens;
    e.topk = topk;
    e.localExperts = localExperts;
    e.nRanks = nRanks;
    e.lowLatency = lowLatency != 0;
    e.layout = (ncclEpLayout_t)layout;
    e.waitSeconds = waitSeconds;
    if (nRanks < 1 || localExperts < 1) {
      return fail(ncclInvalidArgument, "ncclEpJaxHandleCreate: n_ranks " + std::to_string(nRanks) +
                                           " and local_experts " + std::to_string(localExperts) + ": both >= 1");
    }
    const size_t bytes = (size_t)numTokens * topk * sizeof(int);
    const size_t countsAt = (bytes + 255) / 256 * 256;  // one block: the routing, then the rank counts
    const size_t total = countsAt + (size_t)nRanks * sizeof(int);
    void* routing = nullptr;
    cudaStream_t stream = nullptr;
    ncclEpHandle_t handle = nullptr;
    // Undoes what was made so far when a step fails.
    auto undo = [&](ncclResult_t rc) {
      if (handle) ncclEpHandleDestroy(handle);
      if (stream) cudaStreamDestroy(stream);
      if (routing) cudaFree(routing);
      return rc;
    };
    // The group's calls already queued (an XLA step still running) finish first: the binding is collective, and every
    // rank must make it after the same calls (the Python side has waited for JAX's live arrays before this).
    if ((ce = synchronizeDeviceWithin(device, waitSeconds)) != cudaSuccess)
      return fail(
          ce == cudaErrorTimeout ? ncclSystemError : ncclUnhandledCudaError,
          std::string("ncclEpJaxHandleCreate: waiting for the device's queued work: ") + cudaGetErrorString(ce));
    // The fills on the binding's stream, before the binding.
    if ((ce = cudaMalloc(&routing, total)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaMemsetAsync(routing, 0xff, bytes, stream)) != cudaSuccess ||  // -1 everywhere: no expert
        (ce = cudaMemsetAsync(static_cast<char*>(routing) + countsAt, 0, total - countsAt, stream)) != cudaSuccess) {
      return undo(fail(ncclUnhandledCudaError, std::string("ncclEpJaxHandleCreate: ") + cudaGetErrorString(ce)));
    }
    e.routing = static_cast<int*>(routing);
    e.rankCounts = reinterpret_cast<int*>(static_cast<char*>(routing) + countsAt);
    ncclEpTensor_t t = NCCL_EP_TENSOR_INIT;
    t.ndim = 2;
    t.datatype = ncclInt32;
    t.data = bytes ? routing : nullptr;
    t.sizes[0] = numTokens;
    t.sizes[1] = topk;
    ncclEpHandleConfig_t cfg = NCCL_EP_HANDLE_CONFIG_INIT;
    cfg.sizing = NCCL_EP_SIZING_WORST_CASE;
    ncclResult_t rc = ncclEpCreateHandle(&handle, group, (ncclEpLayout_t)layout, &t, nullptr, &cfg, stream);
    if (rc != ncclSuccess) return undo(failed(rc, "ncclEpCreateHandle"));
    if ((ce = waitStreamWithin(stream, waitSeconds)) != cudaSuccess) {
      if (ce == cudaErrorTimeout) {  // the binding may still run: what it uses stays allocated
        return fail(ncclSystemError, "ncclEpJaxHandleCreate: the binding did not finish within " +
                                         std::to_string(waitSeconds) + " s; its handle is left to the process");
      }
      return undo(fail(ncclUnhandledCudaError, std::string("ncclEpJaxHandleCreate: ") + cudaGetErrorString(ce)));
    }
    rc = ncclEpGroupGetAsyncError(group);
    if (rc != ncclSuccess) return undo(failed(rc, "ncclEpCreateHandle"));
    rc = ncclEpHandleGetMaxRecvRows(handle, &e.maxRows);
    if (rc != ncclSuccess) return undo(failed(rc, "ncclEpHandleGetMaxRecvRows"));
    cudaStreamDestroy(stream);
    stream = nullptr;
    e.handle = handle;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      if (!registry().emplace(id, e).second) {
        return undo(fail(ncclInvalidUsage, "ncclEpJaxHandleCreate: id " + std::to_string(id) + " was taken meanwhile"));
      }
    }
    *maxRows = e.maxRows;
    return ncclSuccess;
  } catch (const std::exception& ex) {
    return fail(ncclInternalError, std::string("ncclEpJaxHandleCreate: ") + ex.what());
  } catch (...) {
    return fail(ncclInternalError, "ncclEpJaxHandleCreate: unknown exception");
  }
}

// Local, blocking: waits for the handle's GPU (its queued work: XLA's stream is not known here; at most the create's
// wait_seconds, past which the handle is left allocated and ncclSystemError says so), destroys the handle
// and its routing buffer, and unregisters `id`. An id not registered: ncclInvalidArgument.
NCCL_EP_JAX_API ncclResult_t ncclEpJaxHandleDestroy(int64_t id) {
  try {
    Entry e;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto it = registry().find(id);
      if (it == registry().end()) {
        return fail(ncclInvalidArgument, "ncclEpJaxHandleDestroy: no handle registered as " + std::to_string(id));
      }
      e = it->second;
      registry().erase(it);
    }
    const cudaError_t ce = synchronizeDeviceWithin(e.device, e.waitSeconds);
    if (ce == cudaErrorTimeout) {  // queued work may still use the handle: it stays allocated
      return fail(ncclSystemError, "ncclEpJaxHandleDestroy: the GPU's queued work did not finish within " +
                                       std::to_string(e.waitSeconds) + " s; handle " + std::to_string(id) +
                                       " is left to the process");
    }
    cudaSetDevice(e.device);
    ncclResult_t rc = ncclEpHandleDestroy(e.handle);
    if (e.routing) cudaFree(e.routing);  // the rank counts with it
    if (rc != ncclSuccess) return failed(rc, "ncclEpHandleDestroy");
    if (ce != cudaSuccess)
      return fail(ncclUnhandledCudaError, std::string("ncclEpJaxHandleDestroy: ") + cudaGetErrorString(ce));
    return ncclSuccess;
  } catch (...) {
    return fail(ncclInternalError, "ncclEpJaxHandleDestroy: unknown exception");
  }
}
