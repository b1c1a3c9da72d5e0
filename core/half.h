// The 16-bit floating-point formats: bfloat16 (f32's exponent, 7 mantissa bits) and IEEE 754
// binary16 (5 exponent bits, 10 mantissa bits, subnormals), their conversions from and to f32, and
// the element types of the tensors that hold them (DType::bf16, DType::f16; core/types.h).
// Conversions from f32 round to nearest, ties to even; binary16 overflows to infinity; a NaN stays
// a quiet NaN of the same sign. The functions are __host__ __device__ and pure integer arithmetic,
// so the CPU and CUDA code that calls them gives the same bits (the compression of saved
// activations, kernels/half.h, is one user). Tests: tests/test_compress.cpp (against GCC's _Float16
// and a rounding written in double), tests/test_core.cpp (the element types and tensors).
#pragma once

#include <cstdint>
#include <cstring>

#include "regen/core/host_device.h"

namespace regen {
namespace half {

REGEN_HD uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
REGEN_HD float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

REGEN_HD uint16_t to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
REGEN_HD float from_bf16(uint16_t h) {
  return float_of(static_cast<uint32_t>(h) << 16);
}

REGEN_HD uint16_t to_fp16(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // infinity, NaN (quiet, with the top mantissa bits kept)
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  const uint32_t e = a >> 23;
  if (e >= 113) {  // a normal binary16: drop 13 mantissa bits, round to nearest even
    uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (e < 102) return static_cast<uint16_t>(sign);  // at most 2^-25: rounds to zero
  // A subnormal binary16: m = value * 2^24, the 24-bit significand shifted right by 126 - e.
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14 .. 24
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (m & 1u))) ++m;  // may become the smallest normal
  return static_cast<uint16_t>(sign | m);
}
REGEN_HD float from_fp16(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
  if (e != 0) return float_of(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return float_of(sign);
  // Subnormal: m * 2^-24, normalized.
  uint32_t exp = 113, mm = m;
  while ((mm & 0x400u) == 0) {
    mm <<= 1;
    --exp;
  }
  return float_of(sign | (exp << 23) | ((mm & 0x3ffu) << 13));
}

}  // namespace half

// The element types of bf16 and f16 tensors: 16 bits of storage in format F, converted to and
// from f32 as above. Arithmetic is done in f32 (a conversion to float, then back), never in 16
// bits. Two formats, two distinct types (dtype_of tells them apart), one definition.
enum class HalfFormat : uint8_t { bf16, fp16 };
template <HalfFormat F>
struct Half16 {
  uint16_t bits;  // uninitialized by default, as a float is
  Half16() = default;
  REGEN_HD explicit Half16(float f)
      : bits(F == HalfFormat::bf16 ? half::to_bf16(f) : half::to_fp16(f)) {}
  REGEN_HD operator float() const {
    return F == HalfFormat::bf16 ? half::from_bf16(bits) : half::from_fp16(bits);
  }
  static REGEN_HD Half16 from_bits(uint16_t b) {
    Half16 h;
    h.bits = b;
    return h;
  }
};
using bfloat16 = Half16<HalfFormat::bf16>;
using float16 = Half16<HalfFormat::fp16>;
static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit element types");

}  // namespace regen
