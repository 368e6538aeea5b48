// The check macros. Each returns from the enclosing function (which returns ncclResult_t) on failure, except
// NCCLEXT_WARN_ON, which is for teardown paths that must go on.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <exception>
#include <new>
#include <type_traits>

#include "common/log.h"
#include "common/status.h"

// Propagates a failure of one of our own functions (which already recorded its text).
#define NCCLEXT_CHECK(call)                 \
  do {                                      \
    ncclResult_t res_ = (call);             \
    if (res_ != ncclSuccess) return res_;   \
  } while (0)

// Calls NCCL; on failure records NCCL's own last-error text beside the call.
#define NCCLEXT_NCCL(call)                                                                                   \
  do {                                                                                                       \
    ncclResult_t res_ = (call);                                                                              \
    if (res_ != ncclSuccess && res_ != ncclInProgress)                                                       \
      return ::ncclext::fail(res_, __FILE__, __LINE__, "%s failed: %s", #call, ncclGetLastError(nullptr)); \
  } while (0)

// Calls the CUDA runtime; a failure becomes ncclUnhandledCudaError with CUDA's text.
#define NCCLEXT_CUDA(call)                                                                                     \
  do {                                                                                                         \
    cudaError_t err_ = (call);                                                                                 \
    if (err_ != cudaSuccess)                                                                                   \
      return ::ncclext::fail(ncclUnhandledCudaError, __FILE__, __LINE__, "%s failed: %s (%s)", #call,          \
                             cudaGetErrorString(err_), cudaGetErrorName(err_));                                \
  } while (0)

// Rejects bad input: ncclInvalidArgument with the message when `cond` does not hold.
#define NCCLEXT_ARG(cond, ...)                                                         \
  do {                                                                                 \
    if (!(cond)) return ::ncclext::fail(ncclInvalidArgument, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Rejects a call made in the wrong state or order: ncclInvalidUsage.
#define NCCLEXT_USAGE(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) return ::ncclext::fail(ncclInvalidUsage, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Teardown: logs a failed call and carries on.
#define NCCLEXT_WARN_ON(call)                                                  \
  do {                                                                         \
    auto res_ = (call);                                                        \
    if (res_ != decltype(res_)(0)) NCCLEXT_WARN("%s failed (%d)", #call, (int)res_); \
  } while (0)

namespace ncclext {

// The C boundary of a function that allocates on the host: runs `body` (returning ncclResult_t) and turns any C++
// exception, std::bad_alloc above all, into an error code with a message: nothing escapes the ABI.
template <typename Body>
ncclResult_t guardAbi(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, __FILE__, __LINE__, "%s: out of host memory", function);
  } catch (const std::exception& e) {
    return fail(ncclInternalError, __FILE__, __LINE__, "%s: %s", function, e.what());
  } catch (...) {
    return fail(ncclInternalError, __FILE__, __LINE__, "%s: unexpected exception", function);
  }
}

// The int a C caller stored in a field of NCCL's ncclDataType_t, read as an int: C++ leaves loading a value outside
// the enumerators as the enum undefined, and a caller may store any int there. A known value converts back.
inline int storedInt(const ncclDataType_t& field) {
  static_assert(sizeof(ncclDataType_t) == sizeof(int), "ncclDataType_t is an int");
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}
inline bool isNcclDataType(int v) { return v >= 0 && v < (int)ncclNumTypes; }

}  // namespace ncclext
