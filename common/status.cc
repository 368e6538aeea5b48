#include "common/status.h"

#include <cstdarg>
#include <cstdio>

#include "common/log.h"

namespace ncclext {
namespace {
thread_local char tLastError[1024] = "";
}

ncclResult_t fail(ncclResult_t code, const char* file, int line, const char* fmt, ...) {
  char msg[896];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  char tag[32];
  snprintf(tLastError, sizeof(tLastError), "[" NCCL_EXT_LIB_TAG "] %s%s", rankPrefix(tag, ": "), msg);
  logMessage(LogLevel::kWarn, file, line, "%s (%s)", msg, ncclGetErrorString(code));
  return code;
}

const char* lastError() { return tLastError; }
void clearLastError() { tLastError[0] = '\0'; }

}  // namespace ncclext
