#include "common/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#ifndef NCCL_EXT_LIB_TAG
#error "NCCL_EXT_LIB_TAG names the library common/ is compiled into (see cmake/NcclExtCommon.cmake)"
#endif

namespace ncclext {
namespace {
// The rank of the thread's library objects (virtual ranks are threads of one process), else the last one set.
std::atomic<int> gRank{-1};
thread_local int tRank = -1;

const char* baseName(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void setLogRank(int rank) {
  tRank = rank;
  gRank.store(rank, std::memory_order_relaxed);
}
int logRank() { return tRank >= 0 ? tRank : gRank.load(std::memory_order_relaxed); }

const char* rankPrefix(char (&buf)[32], const char* sep) {
  const int r = logRank();
  if (r < 0) return "";  // no library object has told us its rank yet
  snprintf(buf, sizeof(buf), "rank %d%s", r, sep);
  return buf;
}

bool logEnabled(LogLevel level) { return level != LogLevel::kNone && level <= env().logLevel; }

void logMessage(LogLevel level, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  // One fprintf per line so that lines of concurrent ranks do not interleave mid-line.
  char tag[32];
  if (level == LogLevel::kWarn) {
    fprintf(stderr, "[" NCCL_EXT_LIB_TAG "] %sWARN %s:%d %s\n", rankPrefix(tag, " "), baseName(file), line, msg);
  } else {
    fprintf(stderr, "[" NCCL_EXT_LIB_TAG "] %s%s %s\n", rankPrefix(tag, " "), logLevelName(level), msg);
  }
}

}  // namespace ncclext
