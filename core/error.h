// regen::Error and the REGEN_CHECK macro family.
// Every failure a user can cause (bad shapes, wrong dtype, mixed devices, bad files, out of
// memory) throws regen::Error with file:line and a message that names the op, the shapes and
// the device. Tests catch these; nothing in regen calls exit() or abort() on bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace regen {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  // The message without the "[file:line]" suffix.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// Thrown when an allocation would pass the allocator's limit or the backing arena is exhausted.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (void)std::initializer_list<int>{((os << args), 0)...};
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_oom(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace regen

// REGEN_CHECK(cond, parts...): throws regen::Error("parts..." [file:line]) when cond is false.
#define REGEN_CHECK(cond, ...)                                                                 \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::regen::detail::throw_error(__FILE__, __LINE__, ::regen::detail::str_cat(__VA_ARGS__)); \
    }                                                                                          \
  } while (0)

// REGEN_FAIL(parts...): throws unconditionally.
#define REGEN_FAIL(...) \
  ::regen::detail::throw_error(__FILE__, __LINE__, ::regen::detail::str_cat(__VA_ARGS__))

// Internal invariants (a bug in regen, not a user mistake); still throw so tests see them.
#define REGEN_ASSERT(cond)                                                        \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::regen::detail::throw_error(__FILE__, __LINE__,                            \
                                   "internal error: assertion " #cond " failed"); \
    }                                                                             \
  } while (0)
