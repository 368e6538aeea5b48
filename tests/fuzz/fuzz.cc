#include "tests/fuzz/fuzz.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "nccl_ep/include/nccl_ep.h"
#include "nccl_m2n/include/nccl_m2n.h"

namespace fuzz {
namespace {

constexpr int kMaxReported = 20;  // failing checks printed in full per campaign; the rest are counted

std::atomic<int64_t> gTotalCalls{0};

uint64_t parseU64(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  uint64_t x = strtoull(v, &end, 0);
  if (*end != '\0') {
    fprintf(stderr, "api_fuzz: %s=%s is not a number; using %" PRIu64 "\n", name, v, fallback);
    return fallback;
  }
  return x;
}

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xd6e8feb86659fd93ull));
  return r.next();
}

uint64_t hashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The watchdog: one thread per process that aborts when a call outlives NCCL_EXT_FUZZ_CALL_S, so that a hang
// fails fast with its replay line instead of running into ctest's timeout.
struct Watchdog {
  std::atomic<double> callStart{0};  // 0: no call in flight
  std::atomic<int64_t> iteration{0};
  char campaign[128] = "";
  char function[128] = "";
  double limit = (double)parseU64("NCCL_EXT_FUZZ_CALL_S", 60);
  Watchdog() {
    std::thread([this] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const double t = callStart.load(std::memory_order_acquire);
        if (t != 0 && now() - t > limit) {
          fprintf(stderr,
                  "api_fuzz: HANG: %s did not return within %.0f s: campaign %s, iteration %" PRId64
                  " (replay: NCCL_EXT_FUZZ_SEED=0x%" PRIx64 " NCCL_EXT_FUZZ_ITER=%" PRId64 ")\n",
                  function, limit, campaign, iteration.load(), seed(), iteration.load());
          fflush(stderr);
          std::abort();
        }
      }
    }).detach();
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog();  // never destroyed: its thread runs until the process exits
  return *w;
}

}  // namespace

uint64_t seed() {
  static const uint64_t s = parseU64("NCCL_EXT_FUZZ_SEED", kDefaultSeed);
  return s;
}

int64_t scaled(int64_t iterations) {
  static const uint64_t k = parseU64("NCCL_EXT_FUZZ_SCALE", 1);
  return iterations * (int64_t)(k ? k : 1);
}

bool gpuVisible() {
  static const bool visible = [] {
    if (parseU64("NCCL_EXT_FUZZ_ASSUME_GPU", 0) != 0) return true;
    int n = 0;
    const bool yes = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();  // no driver: clear the error so that nothing later sees it
    return yes;
  }();
  return visible;
}

int64_t totalCalls() { return gTotalCalls.load(); }

Campaign::Campaign(const char* name, int64_t iterations) : name_(name), iterations_(scaled(iterations)) {
  replay_ = (int64_t)parseU64("NCCL_EXT_FUZZ_ITER", UINT64_MAX);
  Watchdog& w = watchdog();
  snprintf(w.campaign, sizeof(w.campaign), "%s", name);
}

Campaign::~Campaign() {
  // Results by code show how deep the generator reaches: past every check, a call on the fakes fails with a CUDA
  // error (no GPU) instead of an argument error.
  static const char* const kNames[ncclNumResults] = {"success",        "unhandled CUDA error", "system error",
                                                     "internal error", "invalid argument",     "invalid usage",
                                                     "remote error",   "in progress"};
  std::string codes;
  for (int r = 0; r < ncclNumResults; r++)
    if (byCode_[r]) codes += std::string(codes.empty() ? "" : ", ") + kNames[r] + " " + std::to_string(byCode_[r]);
  printf("api_fuzz: %s: seed 0x%" PRIx64 ", %" PRId64 " iterations, %" PRId64 " calls, %" PRId64
         " failed checks; slowest call %.1f ms (%s, iteration %" PRId64 ")%s\n  results: %s\n",
         name_.c_str(), seed(), replaying() ? 1 : iterations_, calls_, failures_, slowest_ * 1e3,
         slowestFunction_.c_str(), slowestIteration_,
         gpuVisible() ? "; GPU visible (or assumed): fakes kept invalid" : "", codes.c_str());
  fflush(stdout);
}

void Campaign::run(const std::function<void(Rng&, int64_t)>& body) {
  const uint64_t base = mix(seed(), hashName(name_));
  for (int64_t i = replaying() ? replay_ : 0; i < (replaying() ? replay_ + 1 : iterations_); i++) {
    iteration_ = i;
    watchdog().iteration.store(i);
    describe_ = nullptr;
    Rng rng(mix(base, (uint64_t)i));
    body(rng, i);
    describe_ = nullptr;  // it refers to the body's locals
  }
}

ncclResult_t Campaign::call(Lib lib, const char* function, const std::function<ncclResult_t()>& f) {
  Watchdog& w = watchdog();
  snprintf(w.function, sizeof(w.function), "%s", function);
  const double t0 = now();
  w.callStart.store(t0, std::memory_order_release);
  const ncclResult_t r = f();
  const double dt = now() - t0;
  w.callStart.store(0, std::memory_order_release);
  calls_++;
  gTotalCalls++;
  if (dt > slowest_) {
    slowest_ = dt;
    slowestIteration_ = iteration_;
    slowestFunction_ = function;
  }
  const char* text = lib == Lib::kEp ? ncclEpGetLastError() : ncclM2nGetLastError();
  if ((int)r < (int)ncclSuccess || (int)r >= (int)ncclNumResults)
    fail(std::string(function) + " returned " + std::to_string((int)r) + ", not an ncclResult_t");
  if ((int)r >= 0 && (int)r < ncclNumResults) byCode_[r]++;
  if (r != ncclSuccess && (text == nullptr || text[0] == '\0'))
    fail(std::string(function) + " failed with " + ncclGetErrorString(r) + " but left no last-error text");
  if (replaying())
    printf("api_fuzz:   %s -> %d (%s)%s%s\n      arguments: %s\n", function, (int)r, ncclGetErrorString(r),
           text && *text ? ": " : "", text ? text : "(NULL text)", describe_ ? describe_().c_str() : "(not described)");
  return r;
}

void Campaign::fail(const std::string& what) {
  if (++failures_ > kMaxReported) return;
  ADD_FAILURE() << name_ << " iteration " << iteration_ << ": " << what
                << "\n  arguments: " << (describe_ ? describe_() : std::string("(not described)"))
                << "\n  replay: NCCL_EXT_FUZZ_SEED=0x" << std::hex << seed() << std::dec
                << " NCCL_EXT_FUZZ_ITER=" << iteration_ << " api_fuzz --gtest_filter=" << name_;
  if (failures_ == kMaxReported) ADD_FAILURE() << name_ << ": further failing checks are counted, not printed";
}

void Campaign::expectRejected(ncclResult_t r, const char* function, const char* poison) {
  if (!poison || r == ncclInvalidArgument || r == ncclInvalidUsage) return;
  fail(std::string(function) + " returned " + ncclGetErrorString(r) + " for arguments invalid by construction (" +
       poison + ")");
}

int64_t dtypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

}  // namespace fuzz

#if defined(__SANITIZE_ADDRESS__)
// Defaults of the ASan build, compiled in so that the binary behaves the same under ctest and run by hand (the
// environment's ASAN_OPTIONS / LSAN_OPTIONS still override). protect_shadow_gap=0: the CUDA driver maps memory in
// the range ASan would otherwise reserve, and cudart fails to initialise on a GPU machine without it.
extern "C" const char* __asan_default_options() { return "protect_shadow_gap=0:detect_leaks=1"; }
extern "C" const char* __lsan_default_options() { return "suppressions=" NCCL_EXT_LSAN_SUPPRESSIONS; }
#endif

int main(int argc, char** argv) {
  setenv("NCCL_EXT_LOG", "NONE", 0);  // every rejection logs a WARN line; 100,000 of them say nothing
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (!GTEST_FLAG_GET(list_tests))
    printf("api_fuzz: %" PRId64 " calls in all (seed 0x%" PRIx64 ")\n", fuzz::totalCalls(), fuzz::seed());
  return rc;
}
