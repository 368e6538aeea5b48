// The one logger. Lines go to stderr as "[<library>] rank <r> <LEVEL> [file:line] message" ("rank <r> " left out
// until a library object knows its rank); the level comes from
// NCCL_EXT_LOG (common/env.h).
#pragma once

#include "common/env.h"

namespace ncclext {

// The communicator rank printed in every line: the calling thread's (virtual ranks are threads of one process), else
// the last one any thread set; -1 until a library object learns it.
void setLogRank(int rank);
int logRank();
// "rank <r><sep>" in buf, or "" while the rank is unknown (-1).
const char* rankPrefix(char (&buf)[32], const char* sep);

bool logEnabled(LogLevel level);
void logMessage(LogLevel level, const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 4, 5)));

}  // namespace ncclext

#define NCCLEXT_WARN(...) ::ncclext::logMessage(::ncclext::LogLevel::kWarn, __FILE__, __LINE__, __VA_ARGS__)
#define NCCLEXT_INFO(...) ::ncclext::logMessage(::ncclext::LogLevel::kInfo, __FILE__, __LINE__, __VA_ARGS__)
#define NCCLEXT_DEBUG(...) ::ncclext::logMessage(::ncclext::LogLevel::kDebug, __FILE__, __LINE__, __VA_ARGS__)
