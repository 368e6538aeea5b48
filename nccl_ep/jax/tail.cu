// nccl.ep.jax's worst-case outputs past the received rows: zeroed on the GPU, only those rows. The Python layer
// promises zeros there (a dense expert computation over every row must not meet uninitialised memory, whose NaNs
// would reach the weights' gradients); a select over the whole output read and wrote every row of it each step.
#include "nccl_ep/jax/tail.h"

#include <cstddef>

namespace {

// Rows [n, rows) of a [rows][rowBytes] buffer, n the sum of counts[0..nCounts): every block sums the counts (a few
// ints), then writes its share of the tail in 16-byte stores (rowBytes is a multiple of 16).
__global__ void zeroPastKernel(char* base, size_t rowBytes, int64_t rows, const int* counts, int nCounts) {
  __shared__ int64_t n;
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int i = 0; i < nCounts; i++) sum += counts[i];
    n = sum < 0 ? 0 : sum > rows ? rows : sum;
  }
  __syncthreads();
  int4* tail = reinterpret_cast<int4*>(base + (size_t)n * rowBytes);
  const size_t vecs = (size_t)(rows - n) * (rowBytes / 16);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < vecs; i += (size_t)gridDim.x * blockDim.x)
    tail[i] = make_int4(0, 0, 0, 0);
}

}  // namespace

cudaError_t ncclEpJaxLoadTailKernel() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, zeroPastKernel);
}

cudaError_t ncclEpJaxZeroPastCounts(void* base, size_t rowBytes, int64_t rows, const int* counts, int nCounts,
                                    cudaStream_t stream) {
  if (rows <= 0 || rowBytes == 0) return cudaSuccess;
  if (rowBytes % 16 != 0) return cudaErrorInvalidValue;
  zeroPastKernel<<<132, 512, 0, stream>>>(static_cast<char*>(base), rowBytes, rows, counts, nCounts);
  return cudaGetLastError();
}
