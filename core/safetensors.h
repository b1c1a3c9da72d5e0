// The safetensors format (8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data), read and written with full
// validation: a truncated or corrupted file is a regen::Error naming the file and what is wrong.
// Tests: tests/test_safetensors.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "regen/core/io.h"
#include "regen/core/tensor.h"

namespace regen {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order (CPU tensors)
  std::map<std::string, std::string> metadata;          // "__metadata__", string to string
  const Tensor* find(const std::string& name) const;
};

// Tensors may live on any device; they are copied to the host for writing. Names must be unique
// and non-empty. The write is atomic.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// As save_safetensors, into `out` (opened on `path`), flushed to disk but not committed: the caller
// commits it, or lets it go to remove the temporary. A set of files that must appear together
// writes each so and commits none before all were written (session/checkpoint.cpp: a training
// state under mpirun, a file per rank).
void write_safetensors(AtomicFileWriter& out, const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The "__metadata__" of a safetensors file, reading its header only (empty when it has none).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);
// Loads every tensor onto the CPU (F32, F64, I32, I64, BF16, F16; anything else is an error).
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace regen
