// The bf16 pair tile of packed_gemm.h (bf16_pair_tile): the AVX-512 tile's 8 rows x 3 zmm
// (packed_tile_simd.h), each packed 32-bit word two bf16 values of consecutive depth, multiplied by
// VDPBF16PS, which does twice the multiply-adds of an f32 FMA per instruction. Per lane and word it
// computes C += a_odd b_odd, then C += a_even b_even: each product of two bf16 values is exact in
// f32, so each step is one rounding, as a fused multiply-add on the widened values, and the sums
// are those of the f32 tiles on panels whose depth pairs are swapped (the order gemm_lowp's other
// tiles are given; tests/test_lowp_kernels.cpp checks the two bit for bit). The instruction takes
// subnormal inputs and results as zero, where the f32 tiles keep them. CMake compiles this file
// alone with -mavx512f -mavx512bw -mavx512bf16; packed_tile.cpp calls it only on CPUs that report
// all three. Nothing here may be shared with other translation units (see packed_tile_simd.h):
// the vector types are file-local (packed_tile_zmm.h).
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "regen/kernels/cpu/packed_tile_simd.h"
#include "regen/kernels/cpu/packed_tile_zmm.h"

namespace regen::cpu::packed {
namespace {

// The vector type of packed_tile_simd.h over bf16 pairs: the f32 one (loads and broadcasts move
// 32-bit words bit for bit; C's side is f32) with the pair dot product as its multiply-add.
struct ZmmPairs : Zmm<float> {
  static V fma(V a, V b, V c) {
    return _mm512_dpbf16_ps(c, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
};

}  // namespace

TileFn<float> avx512_bf16_pair_tile() {
  return &simd::run_tile<ZmmPairs, kMR, float>;
}

}  // namespace regen::cpu::packed
#endif
