// The packed GEMM's register tile for AVX2 + FMA (packed_tile_simd.h): the 8-row tile as
// sub-tiles of 4 rows x 3 ymm. CMake compiles this file alone with -mavx2 -mfma on x86-64;
// packed_tile.cpp calls it only on CPUs that report both. Nothing here may be shared with other
// translation units (see packed_tile_simd.h), hence the file-local vector type.
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "regen/kernels/cpu/packed_tile_simd.h"

namespace regen::cpu::packed {
namespace {

// AVX2 has no mask registers: a mask is a vector whose lanes are all ones (kept) or zeros.
// maskload reads zeros and maskstore writes nothing in the lanes left out, so edge columns touch
// no byte outside their run, as with AVX-512's masks.
template <class T>
struct Ymm;
template <>
struct Ymm<float> {
  static constexpr int kWidth = 8;
  using V = __m256;
  using Mask = __m256i;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi): lo <= lane < hi
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), lane),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lane));
  }
  static V mask_load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void mask_store(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
};
template <>
struct Ymm<double> {
  static constexpr int kWidth = 4;
  using V = __m256d;
  using Mask = __m256i;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static V bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi): lo <= lane < hi
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
    return _mm256_andnot_si256(_mm256_cmpgt_epi64(_mm256_set1_epi64x(lo), lane),
                               _mm256_cmpgt_epi64(_mm256_set1_epi64x(hi), lane));
  }
  static V mask_load(Mask m, const double* p) { return _mm256_maskload_pd(p, m); }
  static void mask_store(double* p, Mask m, V v) { _mm256_maskstore_pd(p, m, v); }
};

}  // namespace

template <class T>
TileFn<T> avx2_tile() {
  return &simd::run_tile<Ymm<T>, 4, T>;
}
template TileFn<float> avx2_tile<float>();
template TileFn<double> avx2_tile<double>();

}  // namespace regen::cpu::packed
#endif
