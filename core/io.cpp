// Atomic file writes and whole-file reads (io.h).
#include "core/io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace regen {

void write_file_atomic(const std::string& path, const std::string& content) {
  REGEN_CHECK(!path.empty(), "cannot write to an empty path");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REGEN_CHECK(fd >= 0, "cannot create '", tmp, "' to write '", path, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      REGEN_FAIL("writing '", path, "' failed after ", done, " of ", content.size(),
                 " bytes: ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    REGEN_FAIL("writing '", path, "' failed: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    REGEN_FAIL("cannot move '", tmp, "' to '", path, "': ", std::strerror(err));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REGEN_CHECK(in.good(), "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream os;
  os << in.rdbuf();
  REGEN_CHECK(!in.bad(), "reading '", path, "' failed");
  return os.str();
}

}  // namespace regen
