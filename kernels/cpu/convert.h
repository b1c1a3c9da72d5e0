// Conversions between f32 arrays and 16-bit float arrays (bfloat16, IEEE binary16; core/half.h):
// narrow (f32 -> 16 bits, round to nearest, ties to even) and widen (16 bits -> f32, exact). Every
// result is bit for bit the one of core/half.h's scalar functions, NaN payloads, subnormals,
// overflow and ties included, so CPU code may convert with either and get the same bits.
//
// Two layers: the span functions below (namespace convert), inline and single-threaded, for
// kernels that convert as they go (the widening GEMM sources, kernels/cpu/widening_sources.h); and
// the array functions narrow/widen (kernels/cpu/convert.cpp), which split large arrays over the
// OpenMP threads and do nothing in a dry run (core/dry_run.h). Tests:
// tests/test_lowp_kernels.cpp (every 16-bit pattern, and f32 ties, subnormals, infinities, NaNs
// and random bit patterns, at lengths that end inside each vector width).
//
// How each path matches core/half.h:
//  - bf16 narrow and widen are integer arithmetic on the f32 bits, the same formulas as half.h
//    (AVX512-BF16's vcvtneps2bf16 is not used: it flushes f32 subnormals to zero).
//  - f16 narrow is the hardware conversion (vcvtps2ph, AVX-512F or F16C) in round-to-nearest-even:
//    it rounds subnormals and ties as half.h does, overflows to infinity, and turns a NaN into
//    sign | 0x7e00 | the top 9 payload bits, which is half.h's quiet NaN. A denormal f32 input
//    (what MXCSR.DAZ would change) becomes a signed zero either way.
//  - f16 widen is the hardware conversion (vcvtph2ps) except for NaN lanes: the hardware sets the
//    quiet bit of a signalling NaN, half.h keeps the payload as it is, so NaN lanes are rebuilt
//    from the integer bits.
// The vector loops run 16 lanes (AVX-512), then 8 (AVX2, F16C for f16), then the scalar
// functions of half.h for the tail or on machines without them.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "regen/core/half.h"
#include "regen/core/types.h"

// GCC 12's AVX-512 shifts and conversions start from _mm512_undefined_*, and when inlined they trip
// -Wmaybe-uninitialized (GCC bug 105593), as in kernels/cpu/gemm.cpp; the lanes are all written.
// Clang has no such warning (and would warn about the unknown name).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace regen::cpu {

// y[i] = x[i] converted, for i in [0, n). Large arrays are split over the OpenMP threads; the
// result does not depend on the thread count. In a dry run nothing is read or written.
void narrow(const float* x, bfloat16* y, int64_t n);
void narrow(const float* x, float16* y, int64_t n);
void widen(const bfloat16* x, float* y, int64_t n);
void widen(const float16* x, float* y, int64_t n);
// The cast op's conversion (autograd/ops_cast.cpp; declared in kernels/kernels.h): y (n) of dtype
// `to` = x (n) of dtype `from`, each of f32, f64, bf16, f16. Every conversion goes through f32:
// widening is exact, f64 -> f32 rounds to nearest even, and f32 -> bf16/f16 is narrow above; so
// bf16 <-> f16 is one rounding (bf16 -> f16 may overflow or go subnormal; f16 -> bf16 may lose
// mantissa bits), and f64 -> bf16/f16 rounds twice (to f32, then to 16 bits), as a cast through
// f32 would. Split over the OpenMP threads as narrow and widen are; nothing in a dry run.
void cast(const void* x, DType from, void* y, DType to, int64_t n);

namespace convert {

inline void narrow_span(const float* x, bfloat16* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  {
    const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
      const __m512i u = _mm512_loadu_si512(x + i);
      const __m512i hi = _mm512_srli_epi32(u, 16);
      // (u + 0x7fff + lsb) >> 16; the sum wraps only for NaNs, which are replaced below.
      __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, round), _mm512_and_si512(hi, one));
      r = _mm512_srli_epi32(r, 16);
      const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
      r = _mm512_mask_or_epi32(r, nan, hi, quiet);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(r));
    }
  }
#endif
#ifdef __AVX2__
  {
    const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      const __m256i hi = _mm256_srli_epi32(u, 16);
      __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, round), _mm256_and_si256(hi, one));
      r = _mm256_srli_epi32(r, 16);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
      // Every lane is at most 0xffff, so the unsigned saturating pack keeps it as it is.
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), packed);
    }
  }
#endif
  for (; i < n; ++i) y[i].bits = half::to_bf16(x[i]);
}

// Eight 16-bit values at x widened into one 256-bit vector, as widen_span does them (so, bit for
// bit, half.h's): the vector loops of widen_span, and the panel transposes that widen as they read
// (kernels/cpu/panel_transpose.h).
#ifdef __AVX2__
inline __m256 widen8(const bfloat16* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif
#if defined(__AVX2__) && defined(__F16C__)
inline __m256 widen8(const float16* x) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
  const __m256i sign = _mm256_set1_epi32(0x8000), mant = _mm256_set1_epi32(0x3ff);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m256i r = _mm256_castps_si256(_mm256_cvtph_ps(h));
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs_mask), inf);
  const __m256i as_is =
      _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, sign), 16), exp),
                      _mm256_slli_epi32(_mm256_and_si256(w, mant), 13));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(r, as_is, nan));
}
#endif

inline void widen_span(const bfloat16* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#endif
#ifdef __AVX2__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, widen8(x + i));
#endif
  for (; i < n; ++i) y[i] = half::from_bf16(x[i].bits);
}

inline void narrow_span(const float* x, float16* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) {
    const __m256i h =
        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), h);
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
#endif
  for (; i < n; ++i) y[i].bits = half::to_fp16(x[i]);
}

inline void widen_span(const float16* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7c00);
    const __m512i sign = _mm512_set1_epi32(0x8000), mant = _mm512_set1_epi32(0x3ff);
    const __m512i exp = _mm512_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      __m512i r = _mm512_castps_si512(_mm512_cvtph_ps(h));
      const __m512i w = _mm512_cvtepu16_epi32(h);
      const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(w, abs_mask), inf);
      // half.h's NaN: sign << 16 | 0x7f800000 | mantissa << 13, the quiet bit as it was.
      const __m512i as_is =
          _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, sign), 16), exp),
                          _mm512_slli_epi32(_mm512_and_si512(w, mant), 13));
      r = _mm512_mask_mov_epi32(r, nan, as_is);
      _mm512_storeu_si512(y + i, r);
    }
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, widen8(x + i));
#endif
  for (; i < n; ++i) y[i] = half::from_fp16(x[i].bits);
}

// f32 "widens" to itself: the widening GEMM sources take f32 operands through the same code.
inline void widen_span(const float* x, float* y, int64_t n) {
  if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace convert
}  // namespace regen::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
