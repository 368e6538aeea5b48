// The command line and the JSON lines of the GPU tests and benchmarks. Options are declared once, each bound to the
// variable it sets; parse() reads `--name VALUE` / `--name=VALUE` / `--flag` (getopt_long), refuses an unknown
// option, a missing value or a number that does not parse whole, and prints the reason and a usage line built from
// the declarations. writeJsonLine() prints a result line and appends it to the run's JSON-lines file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/harness/launcher.h"

namespace ncclext {
namespace harness {

class Cli {
 public:
  explicit Cli(std::string program) : program_(std::move(program)) {}

  void flag(const char* name, bool* v);
  void option(const char* name, int* v);
  void option(const char* name, int64_t* v);
  void option(const char* name, uint64_t* v);  // decimal, or 0x hex
  void option(const char* name, double* v);
  void option(const char* name, std::string* v, const char* meta = "FILE");
  // --one-gpu off|nodes|virtual (and mixed with `mixedToo`): parseOneGpu.
  void oneGpu(OneGpu* v, bool mixedToo = false);
  // Any other value: `set` returns false to refuse it; `meta` names the values in the usage line.
  void custom(const char* name, const char* meta, std::function<bool(const char*)> set);

  // False after printing why and the usage to stderr.
  bool parse(int argc, char** argv);
  // A check of the parsed values: when `ok` is false, prints `why` and the usage to stderr. Returns `ok`.
  bool require(bool ok, const char* why) const;
  void usage() const;

 private:
  struct Opt {
    std::string name, meta;  // meta empty: a flag
    std::function<bool(const char*)> set;
  };
  std::string program_;
  std::vector<Opt> opts_;
};

// Prints "RESULT <line>" and appends the line to `path` (none when `path` is empty). False when the file cannot be
// written.
bool writeJsonLine(const std::string& path, const std::string& line);

}  // namespace harness
}  // namespace ncclext
