// File helpers: atomic writes (temporary file in the same folder, fsync, rename), so a crash or
// a full disk never leaves a half-written checkpoint, profile or table behind; whole-file reads;
// an up-front check that an output path can be written. Tests: tests/test_cli.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace regen {

// Writes a file atomically (a temporary file in the same folder, fsync, rename), piece by piece
// as the caller adds them, so large data (tensor bytes) can go from where it lives straight to
// the file. Nothing appears at `path` until commit(); if commit() is never reached (an error was
// thrown on the way), the destructor closes the descriptor and removes the temporary file; on
// SIGINT, SIGTERM or SIGHUP (where the program left their handling at the default) the pending
// temporaries are removed before the process dies. An existing target that is not a regular
// file (a device node, a FIFO, a directory) is refused. Errors throw regen::Error naming the path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, uint64_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // its entry in the table of temporaries removed on SIGINT, SIGTERM, SIGHUP
  uint64_t written_ = 0;
};

// Writes `content` to `path` atomically (one AtomicFileWriter). Throws regen::Error naming the path on failure; on
// every failure path the descriptor is closed and the temporary file removed.
void write_file_atomic(const std::string& path, const std::string& content);
// Reads a whole regular file. Throws regen::Error naming the path when it does not exist, is a
// directory or cannot be read.
std::string read_file(const std::string& path);
// Why `path` cannot be written by write_file_atomic, or "" when it can: checks that its folder
// exists and accepts a new file (by creating and removing a temporary one) and that `path` is
// not a directory. Leaves nothing behind. For commands that write results only at the end.
std::string why_not_writable(const std::string& path);

}  // namespace regen
