// Output formats of the regen subcommands (output.h).
#include "tools/output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace regen::tool {

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string format_ms(double ms) {
  char buf[48];
  std::snprintf(buf, sizeof buf, ms < 100 ? "%.3f ms" : "%.1f ms", ms);
  return buf;
}

bool stdout_is_terminal() {
  return ::isatty(STDOUT_FILENO) == 1;
}

std::string plot_python() {
  const char* env = std::getenv("REGEN_PYTHON");
  struct stat py;
  return env ? env : (::stat("/usr/bin/python3", &py) == 0 ? "/usr/bin/python3" : "python3");
}

}  // namespace regen::tool
