// The 512-bit vector types of the packed GEMM's AVX-512 register tiles (packed_tile_simd.h's W),
// included only by the tile files compiled with -mavx512f (packed_tile_avx512.cpp and
// packed_tile_avx512bf16.cpp). The types sit in an unnamed namespace on purpose: each including
// file gets its own copies, compiled with its own -m flags, so nothing built for one instruction
// set can be linked in where another is expected (packed_tile_simd.h).
#pragma once

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace regen::cpu::packed {
namespace {

// The mask of lanes [lo, hi) (hi <= 16).
template <class Mask>
Mask lane_bits(int64_t lo, int64_t hi) {
  return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

template <class T>
struct Zmm;
template <>
struct Zmm<float> {
  static constexpr int kWidth = 16;  // lanes
  using V = __m512;
  using Mask = __mmask16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static Mask mask(int64_t lo, int64_t hi) { return lane_bits<Mask>(lo, hi); }
  static V mask_load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void mask_store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};
template <>
struct Zmm<double> {
  static constexpr int kWidth = 8;
  using V = __m512d;
  using Mask = __mmask8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static V bcast(const double* p) { return _mm512_set1_pd(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static Mask mask(int64_t lo, int64_t hi) { return lane_bits<Mask>(lo, hi); }
  static V mask_load(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void mask_store(double* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
};

}  // namespace
}  // namespace regen::cpu::packed
#endif
