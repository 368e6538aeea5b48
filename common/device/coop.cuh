// The threads of one CTA as a cooperative unit, for device functions that every thread of a CTA calls together
// (NCCL's ncclCoopCta has the same shape; ours keeps the kernels free of NCCL's headers, common/device/peers.h).
#pragma once

namespace ncclext {
namespace dev {

struct CoopCta {
  __device__ __forceinline__ int thread_rank() const { return (int)threadIdx.x; }
  __device__ __forceinline__ int size() const { return (int)blockDim.x; }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};

}  // namespace dev
}  // namespace ncclext
