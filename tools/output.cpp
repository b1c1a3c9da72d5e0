// Output formats of the regen subcommands (output.h).
#include "tools/output.h"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "regen/core/error.h"

extern char** environ;

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

void run_plot(const std::vector<std::string>& args) {
  const std::string python = plot_python();
  REGEN_CHECK(!python.empty(),
              "plotting: REGEN_PYTHON is set but empty (unset it, or name a python)");
  std::vector<std::string> argv_text = {python, REGEN_SOURCE_DIR "/tools/plot.py"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::string shown;
  for (const std::string& a : argv_text) shown += (shown.empty() ? "" : " ") + a;
  std::printf("plotting: %s\n", shown.c_str());
  std::fflush(stdout);
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  REGEN_CHECK(err == 0, "plotting: cannot run '", python, "': ", std::strerror(err),
              std::getenv("REGEN_PYTHON") ? " (REGEN_PYTHON names it)" : "");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    REGEN_CHECK(errno == EINTR, "plotting: waiting for '", python, "': ", std::strerror(errno));
  }
  REGEN_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "plotting failed: ", python,
              " tools/plot.py ",
              WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                : std::string("was killed by a signal"),
              " (its message is above; without matplotlib: REGEN_WITH_PLOTS=1 bash "
              "scripts/install-deps.sh)");
}

}  // namespace regen::tool
