// regen::Error: see error.h.
#include "regen/core/error.h"

namespace regen {

namespace {
const char* short_path(const char* file) {
  // Keep paths relative to the source root so messages read "core/tensor.cpp:42".
  std::string f(file);
  for (const char* root :
       {"/core/", "/kernels/", "/autograd/", "/models/", "/remat/", "/tools/", "/tests/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) return file + pos + 1;
  }
  return file;
}
}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(message + " [" + short_path(file) + ":" + std::to_string(line) + "]"),
      message_(message),
      file_(short_path(file)),
      line_(line) {}

namespace detail {
void throw_error(const char* file, int line, const std::string& message) {
  throw Error(message, file, line);
}
void throw_oom(const char* file, int line, const std::string& message) {
  throw OutOfMemory(message, file, line);
}
}  // namespace detail
}  // namespace regen
