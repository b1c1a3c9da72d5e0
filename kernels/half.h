// Saved activations held narrow in one of core/half.h's 16-bit formats (--compress bf16|fp16,
// docs/remat.md "Compression"). The CPU and CUDA launchers (kernels/cpu/elementwise.cpp,
// kernels/cuda/elementwise.cu) narrow and widen with the functions below, so they give the same
// bits. Tests: tests/test_compress.cpp.
#pragma once

#include <cstdint>

#include "regen/core/half.h"

namespace regen {

// How saved activations are held between their last forward use and backward: in full (f32), or
// narrowed to 16 bits and widened back for backward.
enum class Compression : uint8_t { none, bf16, fp16 };

namespace half {

REGEN_HD uint16_t narrow(float f, Compression c) {
  return c == Compression::bf16 ? to_bf16(f) : to_fp16(f);
}
REGEN_HD float widen(uint16_t h, Compression c) {
  return c == Compression::bf16 ? from_bf16(h) : from_fp16(h);
}

}  // namespace half
}  // namespace regen
