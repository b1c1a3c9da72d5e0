// Small helpers shared by the test suites.
#pragma once

#include <functional>
#include <string>

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

}  // namespace regen::testing
