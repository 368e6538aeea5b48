// The fuzz campaigns' shared machinery: a seeded generator, the per-call checks every public function must pass,
// a call counter and a watchdog. Deterministic: every iteration draws from its own generator, seeded from the run's
// seed, the campaign's name and the iteration number, so any iteration replays alone.
//
// Environment (read by the test binary only, never by the libraries):
//   NCCL_EXT_FUZZ_SEED      the run's seed (decimal or 0x-hex); default kDefaultSeed, which CI uses
//   NCCL_EXT_FUZZ_SCALE     multiplies every campaign's iteration count (soak runs: 100); default 1
//   NCCL_EXT_FUZZ_ITER      replay this one iteration of each campaign, printing its arguments
//   NCCL_EXT_FUZZ_CALL_S    a call that runs longer than this many seconds is a hang: abort with its replay line (60)
//   NCCL_EXT_FUZZ_ASSUME_GPU=1  generate as if a GPU were visible (only arguments rejected before any CUDA call
//                           reach the fake EP objects), so that a machine without one checks that restriction
#pragma once

#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace fuzz {

// NCCL's ncclDataType_t holding any int, an unknown value included, written and read as the int it is: C++ leaves
// loading an enum value outside its enumerators undefined, and these tests store such values on purpose.
inline void storeDtype(ncclDataType_t* field, int v) { std::memcpy(field, &v, sizeof v); }
inline int dtypeInt(const ncclDataType_t& field) {
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

constexpr uint64_t kDefaultSeed = 0x6e63636c65787431ull;  // 'ncclext1'

// splitmix64: tiny, fast and the same on every platform (the standard distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); 0 when n is 0.
  uint64_t below(uint64_t n) { return n ? (uint64_t)(((unsigned __int128)next() * n) >> 64) : 0; }
  // Uniform in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) { return lo + (int64_t)below((uint64_t)(hi - lo) + 1); }
  bool chance(int num, int den) { return below((uint64_t)den) < (uint64_t)num; }
  template <typename T, size_t N>
  T pick(const T (&v)[N]) {
    return v[below(N)];
  }

 private:
  uint64_t s_;
};

// Bytes per element of a valid dtype (8 for anything else): the fuzzers' own oracle, independent of the libraries'.
int64_t dtypeBytes(ncclDataType_t t);

uint64_t seed();
int64_t scaled(int64_t iterations);
bool gpuVisible();  // a CUDA device is visible (or assumed): fake objects must never reach a kernel launch

enum class Lib { kEp, kM2n };

// One campaign: `iterations` draws of one generator against a group of functions. Counts and times every call,
// checks the contract every public function shares, and reports a failing check with the line that replays it.
class Campaign {
 public:
  Campaign(const char* name, int64_t iterations);
  ~Campaign();  // prints the summary line

  // Runs body(rng, iteration) for every iteration (or only NCCL_EXT_FUZZ_ITER's).
  void run(const std::function<void(Rng&, int64_t)>& body);

  // What the current iteration passes, printed with any failure (built only then).
  void describe(std::function<std::string()> d) { describe_ = std::move(d); }

  // Calls `f` (one public function), then checks: a valid ncclResult_t, and a non-empty last-error text on failure.
  ncclResult_t call(Lib lib, const char* function, const std::function<ncclResult_t()>& f);

  // A failed check of the current iteration: a gtest failure carrying the arguments and the replay line.
  void fail(const std::string& what);
  // `poison` != NULL: the arguments are invalid by construction (it says why), so the call must be rejected by its
  // argument checks: ncclInvalidArgument or ncclInvalidUsage, never a success or a CUDA/NCCL error.
  void expectRejected(ncclResult_t r, const char* function, const char* poison);

  bool replaying() const { return replay_ >= 0; }
  int64_t calls() const { return calls_; }

 private:
  std::string name_;
  int64_t iterations_;
  int64_t replay_ = -1;
  int64_t iteration_ = 0;
  int64_t calls_ = 0, failures_ = 0;
  int64_t byCode_[ncclNumResults] = {};
  double slowest_ = 0;
  int64_t slowestIteration_ = -1;
  std::string slowestFunction_;
  std::function<std::string()> describe_;
};

// Calls made by every campaign of this process, for the closing line.
int64_t totalCalls();

}  // namespace fuzz
