// Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp): the input written to a private
// scratch folder, since regen's readers take paths, and the rule every harness checks: a bad
// input ends in regen::Error, never another exception, a crash or a sanitizer report.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "regen/core/error.h"

namespace regen::fuzz {

// A folder of this process's own, made once and reused for every input.
inline const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/regen-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    return std::string(tmpl);
  }();
  return dir;
}

inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Runs f(); regen::Error (a refused input, with its message) is the expected way out.
template <class F>
void refuse_or_accept(F f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace regen::fuzz
