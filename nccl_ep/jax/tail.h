// nccl.ep.jax (tail.cu): the rows of a worst-case output past the received ones, zeroed on the stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Loads the kernel (cudaFuncGetAttributes): at handle creation, so that no launch of it loads a module.
cudaError_t ncclEpJaxLoadTailKernel();

// Zeroes rows [n, rows) of `base` ([rows][rowBytes], rowBytes a multiple of 16), n = the sum of the device ints
// counts[0..nCounts) (clamped to [0, rows]), read on the GPU when the work runs: no host wait. Local to the library
// (not exported).
cudaError_t ncclEpJaxZeroPastCounts(void* base, size_t rowBytes, int64_t rows, const int* counts, int nCounts,
                                    cudaStream_t stream);

// Zeroes, in each of `blocks` blocks of rows / blocks rows, the rows past the block's count (counts[b], device ints,
// clamped to [0, rows / blocks]): a Low-Latency output's rows that no token filled (RANK_MAJOR: a block per source
// rank, counts = the rank counts; EXPERT_MAJOR: a block per local expert, counts = the expert counts). rows must be a
// multiple of blocks. Local to the library.
cudaError_t ncclEpJaxZeroPastBlockCounts(void* base, size_t rowBytes, int64_t rows, const int* counts, int blocks,
                                         cudaStream_t stream);
