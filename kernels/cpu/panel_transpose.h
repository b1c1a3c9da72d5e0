// The transpose at the heart of packing a GEMM operand whose depth runs along its stored rows
// (kernels/cpu/packed_gemm.h): A stored (M, K) packs into panels dst[k * kMR + i], B stored
// (N, K) (a linear layer's weight, read transposed) into dst[k * w + j]. Both are
//   dst[k * stride + i] = src[i * ld + k]   for i < n and k < kc,   0 for n <= i < width,
// a copy of n rows of kc into kc rows of width. The scalar loop that did this cost the linear
// layers' forward GEMMs 3-9% of their time and GPT-2's logits 18% (docs/kernels.md); here 8 x 8
// blocks go through eight 256-bit registers, 8 rows of 8 loaded, 8 rows of 8 stored, in builds
// for AVX2 or AVX-512 (x86-64-v3, or -march=native on such a CPU); other builds keep the loop.
// Only copies: the panel's values, and so the GEMM's bits, are the scalar loop's; T = uint32_t
// moves the bf16 pair tile's words (PairWordsA/B) the same way. `swap_pairs` stores depth k at
// k ^ 1 (kc even), the order gemm_lowp's swapped panels need (both in
// kernels/cpu/widening_sources.h). A bf16 or f16 source packs into f32 panels, each value widened
// as it is loaded (kernels/cpu/convert.h's widen8, the bits of widen_span), so the 16-bit rows
// need no f32 copy first; depths from `have` on (a 16-bit operand's end inside a swapped depth
// block) are zeros. Tests: tests/test_kernels_cpu.cpp ("panel transpose").
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "regen/kernels/cpu/convert.h"

namespace regen::cpu::packed {

namespace detail {

// Whether this build has the 8 x 8 block path for source S into panel T.
template <class S, class T>
constexpr bool vector_transpose() {
#if defined(__AVX2__) || defined(__AVX512F__)
  if constexpr (std::is_same_v<S, T>)
    return std::is_same_v<T, float> || std::is_same_v<T, uint32_t>;
#endif
#if defined(__AVX2__)
  if constexpr (std::is_same_v<S, bfloat16>) return std::is_same_v<T, float>;
#endif
#if defined(__AVX2__) && defined(__F16C__)
  if constexpr (std::is_same_v<S, float16>) return std::is_same_v<T, float>;
#endif
  return false;
}

// One source row's 8 depths as a vector of 32-bit lanes.
#if defined(__AVX2__) || defined(__AVX512F__)
template <class S>
inline __m256 load_row8(const S* p) {
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, uint32_t>) {
    // 32-bit words move through the float registers bit for bit (no arithmetic).
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    return convert::widen8(p);
  }
}
#endif

}  // namespace detail

template <class S, class T>
void transpose_into_panel(const S* src, int64_t ld, int64_t n, int64_t kc, T* dst, int64_t stride,
                          int64_t width, bool swap_pairs = false,
                          int64_t have = std::numeric_limits<int64_t>::max()) {
  static_assert(std::is_same_v<S, T> || std::is_same_v<T, float>, "16-bit sources pack f32");
  const int64_t flip = swap_pairs ? 1 : 0;
  have = std::min(have, kc);
  int64_t i0 = 0;
#if defined(__AVX2__) || defined(__AVX512F__)
  if constexpr (detail::vector_transpose<S, T>()) {
    const int64_t k_blocks = have > 0 ? have / 8 * 8 : 0;
    for (; i0 + 8 <= n; i0 += 8) {
      for (int64_t k0 = 0; k0 < k_blocks; k0 += 8) {
        const S* s = src + i0 * ld + k0;
        // Rows r0..r7 of the source block, each 8 depths.
        const __m256 r0 = detail::load_row8(s), r1 = detail::load_row8(s + ld);
        const __m256 r2 = detail::load_row8(s + 2 * ld), r3 = detail::load_row8(s + 3 * ld);
        const __m256 r4 = detail::load_row8(s + 4 * ld), r5 = detail::load_row8(s + 5 * ld);
        const __m256 r6 = detail::load_row8(s + 6 * ld), r7 = detail::load_row8(s + 7 * ld);
        // Pairs of rows interleaved, then quads, then the 128-bit halves exchanged: column k of
        // the block ends in register k.
        const __m256 a0 = _mm256_unpacklo_ps(r0, r1), a1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 a2 = _mm256_unpacklo_ps(r2, r3), a3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 a4 = _mm256_unpacklo_ps(r4, r5), a5 = _mm256_unpackhi_ps(r4, r5);
        const __m256 a6 = _mm256_unpacklo_ps(r6, r7), a7 = _mm256_unpackhi_ps(r6, r7);
        const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee);
        const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xee);
        const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee);
        const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
        const __m256 c[8] = {
            _mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
            _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
            _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
            _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
        for (int64_t k = 0; k < 8; ++k) {
          _mm256_storeu_ps(reinterpret_cast<float*>(dst + (k0 + (k ^ flip)) * stride + i0), c[k]);
        }
      }
      for (int64_t k = k_blocks; k < kc; ++k) {
        T* d = dst + (k ^ flip) * stride + i0;
        for (int64_t i = 0; i < 8; ++i)
          d[i] = k < have ? static_cast<T>(src[(i0 + i) * ld + k]) : T(0);
      }
    }
  }
#endif
  for (int64_t k = 0; k < kc; ++k) {
    T* d = dst + (k ^ flip) * stride;
    for (int64_t i = i0; i < n; ++i) d[i] = k < have ? static_cast<T>(src[i * ld + k]) : T(0);
    std::fill(d + n, d + width, T(0));
  }
}

}  // namespace regen::cpu::packed
