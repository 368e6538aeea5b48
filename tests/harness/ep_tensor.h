// Tensor descriptors for nccl_ep tests and benchmarks.
#pragma once

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
