// libFuzzer: a safetensors file as `regen train --load` reads it (header length, JSON header,
// dtypes, shapes, offsets, the data's extent).
#include <cstdint>

#include "regen/core/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = regen::fuzz::write_input("model.safetensors", data, size);
  regen::fuzz::refuse_or_accept([&] { regen::load_safetensors(path); });
  return 0;
}
