// File helpers: atomic writes (temporary file in the same folder, fsync, rename), so a crash or
// a full disk never leaves a half-written checkpoint, profile or table behind; whole-file reads;
// an up-front check that an output path can be written. Tests: tests/test_cli.cpp.
#pragma once

#include <string>

namespace regen {

// Writes `content` to `path` atomically. Throws regen::Error naming the path on failure; on
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
