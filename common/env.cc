#include "common/env.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <strings.h>

namespace ncclext {
namespace {

bool parseLevel(const char* s, LogLevel* out) {
  static const struct {
    const char* name;
    LogLevel level;
  } kLevels[] = {{"NONE", LogLevel::kNone}, {"WARN", LogLevel::kWarn}, {"INFO", LogLevel::kInfo},
                 {"DEBUG", LogLevel::kDebug}, {"TRACE", LogLevel::kDebug}};
  for (const auto& l : kLevels) {
    if (strcasecmp(s, l.name) == 0) {
      *out = l.level;
      return true;
    }
  }
  return false;
}

bool parseDouble(const char* s, double* out) {
  errno = 0;
  char* end = nullptr;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parseInt(const char* s, long* out) {
  errno = 0;
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

Env parseEnv(const std::function<const char*(const char*)>& lookup, std::vector<std::string>* problems) {
  Env e;
  auto complain = [&](const char* name, const char* value, const char* want) {
    if (problems) problems->push_back(std::string(name) + "=" + value + " ignored: expected " + want);
  };
  if (const char* v = lookup("NCCL_EXT_LOG")) {
    if (!parseLevel(v, &e.logLevel)) complain("NCCL_EXT_LOG", v, "NONE, WARN, INFO or DEBUG");
  }
  if (const char* v = lookup("NCCL_EXT_TIMEOUT_S")) {
    double t = 0;
    if (parseDouble(v, &t) && t > 0 && t <= 1e6) {
      e.timeoutSeconds = t;
    } else {
      complain("NCCL_EXT_TIMEOUT_S", v, "seconds in (0, 1e6]");
    }
  }
  // An integer variable in [lo, hi]; `what` says what it takes when it is not one.
  auto intVar = [&](const char* name, long lo, long hi, int* field, const char* what) {
    const char* v = lookup(name);
    if (!v) return;
    long k = 0;
    if (parseInt(v, &k) && k >= lo && k <= hi) {
      *field = static_cast<int>(k);
    } else {
      complain(name, v, what);
    }
  };
  intVar("NCCL_EXT_LSA_DOMAIN_SIZE", 0, 1 << 20, &e.lsaDomainSize, "an integer >= 0");
  intVar("NCCL_EXT_HT_HIERARCHICAL", 0, 1, &e.htHierarchical, "0 or 1");
  intVar("NCCL_EXT_RAIL_ROUND_TOKENS", 0, 1 << 20, &e.railRoundTokens, "an integer >= 0");
  intVar("NCCL_EXT_RAIL_OVERLAP", 0, 1, &e.railOverlap, "0 or 1");
  intVar("NCCL_EXT_M2N_NET_CHANNELS", 0, 64, &e.m2nNetChannels, "an integer in [0, 64]");
  return e;
}

const Env& env() {
  static Env parsed;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> problems;
    parsed = parseEnv([](const char* name) { return getenv(name); }, &problems);
    // The logger depends on this struct, so problems go straight to stderr.
    for (const std::string& p : problems) fprintf(stderr, "[nccl_ext] WARN %s\n", p.c_str());
  });
  return parsed;
}

const char* logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kNone: return "NONE";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
  }
  return "?";
}

std::string describeEnv(const Env& e) {
  char buf[320];
  snprintf(buf, sizeof(buf),
           "NCCL_EXT_LOG=%s NCCL_EXT_TIMEOUT_S=%g NCCL_EXT_LSA_DOMAIN_SIZE=%d NCCL_EXT_HT_HIERARCHICAL=%d "
           "NCCL_EXT_RAIL_ROUND_TOKENS=%d NCCL_EXT_RAIL_OVERLAP=%d NCCL_EXT_M2N_NET_CHANNELS=%d",
           logLevelName(e.logLevel), e.timeoutSeconds, e.lsaDomainSize, e.htHierarchical, e.railRoundTokens,
           e.railOverlap, e.m2nNetChannels);
  return buf;
}

}  // namespace ncclext
