// File helpers: atomic writes (temporary file in the same folder, fsync, rename), so a crash or
// a full disk never leaves a half-written checkpoint, profile or table behind.
#pragma once

#include <string>

namespace regen {

// Writes `content` to `path` atomically. Throws regen::Error naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& content);
// Reads a whole file. Throws regen::Error naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace regen
