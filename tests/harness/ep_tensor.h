// Tensor descriptors for nccl_ep tests and benchmarks.
#pragma once

#include <cstdio>
#include <initializer_list>

#include "nccl_ep/include/nccl_ep.h"

namespace ncclext {
namespace harness {

// A dense descriptor of `data` with the given sizes (as many dims as sizes).
inline ncclEpTensor_t epTensor(void* data, ncclDataType_t dt, std::initializer_list<int64_t> sizes) {
  ncclEpTensor_t t = NCCL_EP_TENSOR_INIT;
  t.datatype = dt;
  t.data = data;
  for (int64_t s : sizes) t.sizes[t.ndim++] = s;
  return t;
}

}  // namespace harness
}  // namespace ncclext

// In a benchmark's rank body (a `ctx` RankContext in scope, returning int): an nccl_ep call that must succeed, else
// the rank prints the call, the code and the library's last error and returns 1.
#define NCCLEXT_BENCH_EP(call)                                                                                  \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    if (r_ != ncclSuccess) {                                                                                    \
      fprintf(stderr, "rank %d: %s -> %s: %s\n", ctx.rank, #call, ncclGetErrorString(r_), ncclEpGetLastError()); \
      return 1;                                                                                                 \
    }                                                                                                           \
  } while (0)
