// Errors are values: every failure returns an ncclResult_t and leaves a thread-local text that the public
// *GetLastError() calls hand out ("[nccl_ep] rank 3: topk_idx[17][2] = 300 >= num_experts 256").
#pragma once

#include <nccl.h>

namespace ncclext {

// Records the text of a failure (prefixed with library and rank), logs it at WARN and returns `code`.
ncclResult_t fail(ncclResult_t code, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

// The text of the last failure on this thread; "" when there was none since clearLastError().
const char* lastError();
void clearLastError();

}  // namespace ncclext
