// The text of a nlohmann/json exception for a person: without the library's "[json.exception.
// type_error.302] " prefix, with the field it names (the readers build with JSON_DIAGNOSTICS, which
// puts the field's JSON pointer in parentheses) said as "at /nodes/3/fwd_ms:". Used by the profile
// and plan readers; tests: tests/test_remat.cpp ("malformed profile and plan files").
#pragma once

#include <exception>
#include <string>

namespace regen {

inline std::string json_error_text(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0) {
    const auto close = m.find("] ");
    if (close != std::string::npos) m.erase(0, close + 2);
  }
  if (!m.empty() && m[0] == '(') {
    const auto close = m.find(") ");
    if (close != std::string::npos) {
      const std::string where = m.substr(1, close - 1);
      m = "at " + (where.empty() ? std::string("the top level") : where) + ": " +
          m.substr(close + 2);
    }
  }
  return m;
}

}  // namespace regen
