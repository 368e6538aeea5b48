// bf16 or fp32 -> fp8 e4m3 with one fp32 scale per 128 columns, in the executor (pure host C++ here: the batch
// rewrite and the per-rank descriptors; move.h's quantizeBlock is the kernel's and the emulator's code).
//
// A tensor whose destination is e4m3 and whose source is bf16 or fp32 is followed in the public batch by an entry
// with both layouts NULL: its scales, a second destination tensor [..., rows, ceil(C / 128)] fp32 over the
// destination's mesh, each rank's part the blocks of its columns, dense. Every source and destination part must
// hold whole blocks: a part's columns start on a multiple of 128 and end on one, or at the last column (else the
// batch is refused, naming the tensor and the part). Each rank holding a source part then quantises it (any
// replica gives the same bytes) into the plan's scratch before the moves, and the batch is planned as two tensors:
// the e4m3 values (source: the scratch, dense, the source's mesh) and the scales (source: the scratch, the blocks
// of the source's parts). They move as any other tensors do, the values at one byte an element.
#pragma once

#include <string>
#include <vector>

#include "nccl_m2n/src/move.h"
#include "nccl_m2n/src/plan.h"

namespace ncclm2n {

// A tensor of the batch quantised to e4m3; `tensor + 1` is its scales.
struct Fp8Tensor {
  int tensor = 0;
  int blockRows = 1;  // 1: blocks of one row; 128: 128 x 128
  Layout source;      // the caller's source layout (dtype and local strides), before the rewrite
};

// Does a pair (source dtype, destination dtype) ask for block-scaled e4m3?
bool quantizesToFp8(ncclDataType_t src, ncclDataType_t dst);

// The layout of a scales tensor for element layout `l` (valid): the same mesh, the last dim in blocks of 128 (and
// the dim before it in blocks of blockRows), each position's box the blocks of its part, fp32, dense.
Layout scalesLayout(const Layout& l, int blockRows = 1);

// Rewrites `p` (translated: scales entries have no layouts yet and `isScales` marks them) as described above.
// False with `why` (naming the tensor) when an entry or a part breaks the rules; `p` is then partly rewritten.
// blockRows: 1, or 128 (128 x 128 blocks: every quantised tensor needs two dims).
bool rewriteFp8(Problem* p, const std::vector<char>& isScales, int blockRows, std::vector<Fp8Tensor>* fp8,
                std::string* why);

// This rank's quantisation work: one descriptor per quantised tensor whose source this rank holds (non-empty),
// with its scratch offsets (16-byte aligned); *scratchBytes their total.
std::vector<QuantDesc> quantDescs(const std::vector<Fp8Tensor>& fp8, int rank, int64_t* scratchBytes);

}  // namespace ncclm2n
