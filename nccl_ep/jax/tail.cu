// nccl.ep.jax's worst-case outputs past the received rows: zeroed on the GPU, only those rows. The Python layer
// promises zeros there (a dense expert computation over every row must not meet uninitialised memory, whose NaNs
// would reach the weights' gradients); a select over the whole output read and wrote every row of it each step.
#include "nccl_ep/jax/tail.h"

#include <cstddef>

// In ncclep (internal linkage all the same): `make gpu-sanitize` instruments the library's kernels by that name.
namespace ncclep {
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

// Rows of `blocks` blocks of `width` rows each ([blocks * width][rowBytes]) past their block's count: rows
// [b * width + counts[b], (b + 1) * width), counts clamped to [0, width]. A warp a row (a row is whole or untouched:
// one division a row, not a 16-byte store), its lanes storing the row's 16-byte vectors.
__global__ void zeroPastBlocksKernel(char* base, size_t rowBytes, int64_t width, int64_t rows, const int* counts) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const size_t vecs = rowBytes / 16;
  for (int64_t row = warp; row < rows; row += warps) {
    const int64_t b = row / width;
    const int64_t count = min((int64_t)max(counts[b], 0), width);
    if (row - b * width < count) continue;  // a received row
    int4* dst = reinterpret_cast<int4*>(base + (size_t)row * rowBytes);
    for (size_t i = lane; i < vecs; i += 32) dst[i] = make_int4(0, 0, 0, 0);
  }
}

}  // namespace
}  // namespace ncclep

cudaError_t ncclEpJaxLoadTailKernel() {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, ncclep::zeroPastKernel);
  return e != cudaSuccess ? e : cudaFuncGetAttributes(&attr, ncclep::zeroPastBlocksKernel);
}

cudaError_t ncclEpJaxZeroPastCounts(void* base, size_t rowBytes, int64_t rows, const int* counts, int nCounts,
                                    cudaStream_t stream) {
  if (rows <= 0 || rowBytes == 0) return cudaSuccess;
  if (rowBytes % 16 != 0) return cudaErrorInvalidValue;
  ncclep::zeroPastKernel<<<132, 512, 0, stream>>>(static_cast<char*>(base), rowBytes, rows, counts, nCounts);
  return cudaGetLastError();
}

cudaError_t ncclEpJaxZeroPastBlockCounts(void* base, size_t rowBytes, int64_t rows, const int* counts, int blocks,
                                         cudaStream_t stream) {
  if (rows <= 0 || rowBytes == 0) return cudaSuccess;
  if (rowBytes % 16 != 0 || blocks <= 0 || rows % blocks != 0) return cudaErrorInvalidValue;
  ncclep::zeroPastBlocksKernel<<<132, 512, 0, stream>>>(static_cast<char*>(base), rowBytes, rows / blocks, rows,
                                                         counts);
  return cudaGetLastError();
}
