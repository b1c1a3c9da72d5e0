// A GEMM whose operands may be stored in 16 bits (bf16 or f16; core/half.h) and whose result and
// accumulation are f32, as under PyTorch's autocast: C (M, N) = op(A) op(B) [+ bias], or
// C += op(A) op(B). The operands are widened to f32 while they are packed
// (kernels/cpu/widening_sources.h), so the multiply is the f32 packed GEMM of
// kernels/cpu/packed_gemm.h and C is, bit for bit, what that GEMM gives on the widened operands;
// it is also independent of the thread count and the same in AVX2 and AVX-512 builds, as there.
// bf16 x bf16 is summed in depth pairs, odd element first (a zero element past an odd K): on a CPU
// with AVX-512 BF16 by VDPBF16PS (packed_gemm.h, bf16_pair_tile), at twice the f32 rate, and
// elsewhere by the f32 tiles on panels packed in that order, with the same bits, except that the
// instruction takes subnormal inputs, products and sums as zero.
// Tests: tests/test_lowp_kernels.cpp (bitwise against the f32 packed GEMM on widened operands,
// pairs swapped for bf16 x bf16, and against a float64 product within a rounding-error bound).
#pragma once

#include <cstdint>

#include "regen/core/types.h"

namespace regen::cpu {

// Shapes and strides as cpu::gemm's (kernels/kernels.h), with alpha = 1:
//   A: (M, K) with rows lda apart, or, when trans_a, stored (K, M) with rows lda apart;
//   B: (K, N) with rows ldb apart, or, when trans_b, stored (N, K) with rows ldb apart;
//   C: (M, N) f32, rows ldc apart.
// a_dtype and b_dtype are each f32, bf16 or f16 (A and B point at elements of that type).
// Without accumulate, C = op(A) op(B) + bias[m] (bias, of M floats, per row of C, or null for
// none), and C's prior contents are ignored; with accumulate, C += op(A) op(B) and bias is not
// used (as the packed GEMM's). Sums are f32 over k in order (bf16 x bf16: in pairs, odd first),
// per depth block of the packed GEMM.
// In a dry run (core/dry_run.h) the packing workspace is requested and nothing is computed.
// A product of fewer than parallel_flops (2 M N K) runs on the calling thread alone; more, on
// OpenMP's threads, each with its own packing workspace (the bits are the same either way).
// With `scratch` (at least gemm_lowp_scratch(M, N, K) floats, 64-byte aligned), the product runs
// on the calling thread alone, packs into scratch and requests no workspace (packed_gemm.h, gemm's
// scratch): for products run on several threads at once. The same bits.
void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType a_dtype,
               const void* A, int64_t lda, DType b_dtype, const void* B, int64_t ldb,
               const float* bias, bool accumulate, float* C, int64_t ldc,
               double parallel_flops = 4e6 /* packed::kParallelFlops */, float* scratch = nullptr);
// The floats gemm_lowp's scratch needs for a product of M x N over K, whatever the dtypes.
int64_t gemm_lowp_scratch(int64_t M, int64_t N, int64_t K);

// The same product stored in C's own dtype, rounded once per element:
//   C (M, N) = round(alpha * op(A) op(B) + beta * C + bias[n])
// with every term in f32 (C's old value and the bias widened; beta = 0 ignores C, NaNs included).
// c_dtype and bias_dtype are each f32, bf16 or f16; bias holds N elements, one per column of C (a
// linear layer's bias), or is null. The f32 products are made in strips (lowp_strips) in a
// workspace of about 4 MiB, never (M, N) floats, and each strip is rounded into C; every element's
// f32 value is bit for bit gemm_lowp's (strips do not change the order of any element's sums), so
// with alpha = 1, beta = 0 and no bias C is gemm_lowp's f32 result narrowed
// (kernels/cpu/convert.h). In a dry run the strip and the packing workspace are requested, in the
// order of a real call, and nothing is computed.
void gemm_lowp_store(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType a_dtype,
                     const void* A, int64_t lda, DType b_dtype, const void* B, int64_t ldb,
                     float alpha, float beta, DType bias_dtype, const void* bias, DType c_dtype,
                     void* C, int64_t ldc);
// How gemm_lowp_store cuts a product of M x N into strips of about 2^20 floats: by rows (all N
// columns, `extent` rows a strip: a multiple of 8, at least 8, at most M), or, when the product
// needs more than one strip and N > M, by columns (all M rows, `extent` columns a strip: a
// multiple of 16, at least 16, at most N). Each strip packs its part of one operand and all of the
// other, so the cut goes across the longer side: a (1024, 30000) product (an unfused LM head's
// logits) in row strips of 32 would pack all of B 32 times, in column strips of 1024 packs A 30
// times, a thirtieth of it.
struct LowpStrips {
  bool by_columns = false;
  int64_t extent = 1;
};
LowpStrips lowp_strips(int64_t M, int64_t N);

}  // namespace regen::cpu
