// Small helpers shared by the test suites.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "regen/core/error.h"

namespace regen::testing {

// The message of the regen::Error that `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs fn, expects a regen::Error whose message contains every piece.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  bool thrown = false;
  try {
    fn();
  } catch (const Error& e) {
    thrown = true;
    for (const std::string& p : pieces) {
      CHECK_MESSAGE(e.message().find(p) != std::string::npos, "message \"", e.message(),
                    "\" lacks \"", p, "\"");
    }
  }
  CHECK_MESSAGE(thrown, "no regen::Error thrown; expected one containing \"", pieces.at(0), "\"");
}

}  // namespace regen::testing
