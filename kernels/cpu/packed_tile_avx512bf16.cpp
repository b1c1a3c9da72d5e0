// The bf16 pair tile of packed_gemm.h (bf16_pair_tile): the AVX-512 tile's 8 rows x 3 zmm
// (packed_tile_simd.h), each packed 32-bit word two bf16 values of consecutive depth, multiplied by
// VDPBF16PS, which does twice the multiply-adds of an f32 FMA per instruction. Per lane and word it
// computes C += a_odd b_odd, then C += a_even b_even: each product of two bf16 values is exact in
// f32, so each step is one rounding, as a fused multiply-add on the widened values, and the sums
// are those of the f32 tiles on panels whose depth pairs are swapped (the order gemm_lowp's other
// tiles are given; tests/test_lowp_kernels.cpp checks the two bit for bit). The instruction takes
// subnormal inputs and results as zero, where the f32 tiles keep them. CMake compiles this file
// alone with -mavx512f -mavx512bw -mavx512bf16; packed_tile.cpp calls it only on CPUs that report
// all three. Nothing here may be shared with other translation units (see packed_tile_simd.h).
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "regen/kernels/cpu/packed_tile_simd.h"

namespace regen::cpu::packed {
namespace {

// The vector type of packed_tile_simd.h over bf16 pairs: loads and broadcasts move 32-bit words
// (as floats, bit for bit), fma is the pair dot product; C's side (add, store, masks) is f32.
struct ZmmPairs {
  static constexpr int kWidth = 16;  // f32 lanes of C, one bf16 pair per lane of A and B
  using V = __m512;
  using Mask = __mmask16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) {
    return _mm512_dpbf16_ps(c, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi)
    return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }
  static V mask_load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void mask_store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};

}  // namespace

TileFn<float> avx512_bf16_pair_tile() {
  return &simd::run_tile<ZmmPairs, kMR, float>;
}

}  // namespace regen::cpu::packed
#endif
