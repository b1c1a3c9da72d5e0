// The packed GEMM's register tile for AVX-512 (packed_tile_simd.h): 8 rows x 3 zmm. CMake compiles
// this file alone with -mavx512f -mfma on x86-64; packed_tile.cpp calls it only on CPUs that
// report AVX-512F. Nothing here may be shared with other translation units (see
// packed_tile_simd.h), hence the file-local vector type.
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>

#include "regen/kernels/cpu/packed_tile_simd.h"

namespace regen::cpu::packed {
namespace {

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
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi)
    return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }
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
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi)
    return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }
  static V mask_load(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void mask_store(double* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
};

}  // namespace

template <class T>
TileFn<T> avx512_tile() {
  return &simd::run_tile<Zmm<T>, kMR, T>;
}
template TileFn<float> avx512_tile<float>();
template TileFn<double> avx512_tile<double>();

}  // namespace regen::cpu::packed
#endif
