#include "tests/harness/cli.h"

#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace ncclext {
namespace harness {
namespace {

// The whole of `s` as a number, or false.
template <typename T, typename Parse>
bool whole(const char* s, T* out, Parse parse) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const auto v = parse(s, &end);
  if (errno != 0 || *end != '\0') return false;
  *out = static_cast<T>(v);
  return static_cast<decltype(v)>(*out) == v;  // fits T
}

}  // namespace

void Cli::flag(const char* name, bool* v) {
  opts_.push_back({name, "", [v](const char*) {
                     *v = true;
                     return true;
                   }});
}

void Cli::option(const char* name, int* v) {
  custom(name, "N",
         [v](const char* s) { return whole(s, v, [](const char* a, char** e) { return strtol(a, e, 0); }); });
}

void Cli::option(const char* name, int64_t* v) {
  custom(name, "N",
         [v](const char* s) { return whole(s, v, [](const char* a, char** e) { return strtoll(a, e, 0); }); });
}

void Cli::option(const char* name, uint64_t* v) {
  custom(name, "N", [v](const char* s) {
    return *s != '-' && whole(s, v, [](const char* a, char** e) { return strtoull(a, e, 0); });
  });
}

void Cli::option(const char* name, double* v) {
  custom(name, "S", [v](const char* s) { return whole(s, v, [](const char* a, char** e) { return strtod(a, e); }); });
}

void Cli::option(const char* name, std::string* v, const char* meta) {
  custom(name, meta, [v](const char* s) {
    *v = s;
    return true;
  });
}

void Cli::oneGpu(OneGpu* v, bool mixedToo) {
  custom("one-gpu", mixedToo ? "off|nodes|virtual|mixed" : "off|nodes|virtual",
         [v, mixedToo](const char* s) { return parseOneGpu(s, v, mixedToo); });
}

void Cli::custom(const char* name, const char* meta, std::function<bool(const char*)> set) {
  opts_.push_back({name, meta, std::move(set)});
}

bool Cli::parse(int argc, char** argv) {
  std::vector<struct ::option> longs;
  for (size_t i = 0; i < opts_.size(); i++)
    longs.push_back(
        {opts_[i].name.c_str(), opts_[i].meta.empty() ? no_argument : required_argument, nullptr, (int)(1000 + i)});
  longs.push_back({nullptr, 0, nullptr, 0});
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "", longs.data(), nullptr)) != -1) {
    if (c < 1000 || c >= 1000 + (int)opts_.size()) {
      fprintf(stderr, "%s: unknown option or missing value: %s\n", program_.c_str(),
              optind - 1 < argc ? argv[optind - 1] : "?");
      usage();
      return false;
    }
    const Opt& o = opts_[c - 1000];
    if (!o.set(optarg)) {
      fprintf(stderr, "%s: --%s %s: expected %s\n", program_.c_str(), o.name.c_str(), optarg ? optarg : "",
              o.meta.c_str());
      usage();
      return false;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument: %s\n", program_.c_str(), argv[optind]);
    usage();
    return false;
  }
  return true;
}

bool Cli::require(bool ok, const char* why) const {
  if (!ok) {
    fprintf(stderr, "%s: %s\n", program_.c_str(), why);
    usage();
  }
  return ok;
}

void Cli::usage() const {
  std::string line = "usage: " + program_;
  for (const Opt& o : opts_) line += " [--" + o.name + (o.meta.empty() ? "" : " " + o.meta) + "]";
  fprintf(stderr, "%s\n", line.c_str());
}

bool writeJsonLine(const std::string& path, const std::string& line) {
  printf("RESULT %s\n", line.c_str());
  if (path.empty()) return true;
  FILE* f = fopen(path.c_str(), "a");
  if (!f) {
    fprintf(stderr, "cannot append to %s\n", path.c_str());
    return false;
  }
  const bool ok = fprintf(f, "%s\n", line.c_str()) > 0;
  return fclose(f) == 0 && ok;
}

}  // namespace harness
}  // namespace ncclext
