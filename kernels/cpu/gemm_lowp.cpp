// The mixed-precision GEMM of kernels/cpu/gemm_lowp.h: the widening sources of
// kernels/cpu/widening_sources.h for each operand's storage type, fed to the f32 packed GEMM, and
// for bf16 x bf16 the depth pairs (the bf16 pair tile, or the f32 tiles with pairs swapped).
// Tests: tests/test_lowp_kernels.cpp.
#include "regen/kernels/cpu/gemm_lowp.h"

#include <omp.h>

#include <algorithm>

#include "regen/core/error.h"
#include "regen/core/half.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/widening_sources.h"

namespace regen::cpu {
namespace {

// Calls f with the widening source for an operand stored as `dtype`.
template <template <class> class Source, class F>
void with_source(const char* operand, DType dtype, const void* p, int64_t ld, bool trans, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(Source<float>{static_cast<const float*>(p), ld, trans});
      return;
    case DType::bf16:
      f(Source<bfloat16>{static_cast<const bfloat16*>(p), ld, trans});
      return;
    case DType::f16:
      f(Source<float16>{static_cast<const float16*>(p), ld, trans});
      return;
    default:
      REGEN_CHECK(false, "gemm_lowp: operand ", operand, " is ", dtype_name(dtype),
                  "; it must be f32, bf16 or f16");
  }
}

void check_operand_dtype(const char* what, DType dtype) {
  REGEN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
              "gemm_lowp_store: ", what, " is ", dtype_name(dtype),
              "; it must be f32, bf16 or f16");
}

// narrow_span for every C dtype: f32 is a copy.
inline void narrow_to(const float* x, float* y, int64_t n) {
  convert::widen_span(x, y, n);
}
template <class TC>
inline void narrow_to(const float* x, TC* y, int64_t n) {
  convert::narrow_span(x, y, n);
}

// n elements of an f32, bf16 or f16 array from element n0, widened into y.
inline void widen_from(DType dtype, const void* p, int64_t n0, float* y, int64_t n) {
  switch (dtype) {
    case DType::bf16:
      convert::widen_span(static_cast<const bfloat16*>(p) + n0, y, n);
      return;
    case DType::f16:
      convert::widen_span(static_cast<const float16*>(p) + n0, y, n);
      return;
    default:
      convert::widen_span(static_cast<const float*>(p) + n0, y, n);
  }
}

// Rows [0, rows) x columns [0, N) of C (ldc apart) = round(alpha * acc + beta * C + bias[n0 + n])
// from the f32 strip acc (rows, N), in C's dtype: per element v = alpha * acc,
// then v += beta * C, then v += bias, in f32, rounded once (kernels/cpu/convert.h, bit for bit
// half.h's). Columns go in chunks of a stack buffer, each term over the whole chunk, so the loops
// vectorize; with alpha 1, beta 0 and no bias, each row is narrowed straight from the strip. Each
// row is independent: the threads change no bit.
template <class TC>
void store_strip(const float* acc, int64_t rows, int64_t N, float alpha, float beta,
                 DType bias_dtype, const void* bias, int64_t bias_n0, TC* C, int64_t ldc) {
  constexpr int64_t kChunk = 512;
  const bool plain = alpha == 1.0f && beta == 0.0f && bias == nullptr;
#pragma omp parallel for schedule(static) if (rows * N > (1 << 15) && !omp_in_parallel())
  for (int64_t i = 0; i < rows; ++i) {
    const float* a = acc + i * N;
    TC* c = C + i * ldc;
    if (plain) {
      narrow_to(a, c, N);
      continue;
    }
    alignas(64) float v[kChunk];
    alignas(64) float w[kChunk];
    for (int64_t n0 = 0; n0 < N; n0 += kChunk) {
      const int64_t len = std::min(kChunk, N - n0);
      for (int64_t j = 0; j < len; ++j) v[j] = alpha * a[n0 + j];
      if (beta != 0.0f) {
        widen_from(dtype_of<TC>::value, c, n0, w, len);
        for (int64_t j = 0; j < len; ++j) v[j] += beta * w[j];
      }
      if (bias) {
        widen_from(bias_dtype, bias, bias_n0 + n0, w, len);
        for (int64_t j = 0; j < len; ++j) v[j] += w[j];
      }
      narrow_to(v, c + n0, len);
    }
  }
}

}  // namespace

LowpStrips lowp_strips(int64_t M, int64_t N) {
  constexpr int64_t kStripFloats = int64_t{1} << 20, kRowMultiple = 8, kColumnMultiple = 16;
  LowpStrips s;
  if (M <= 0 || N <= 0 || M * N <= kStripFloats || N <= M) {
    int64_t rows = kStripFloats / std::max<int64_t>(N, 1) / kRowMultiple * kRowMultiple;
    rows = std::max(rows, kRowMultiple);
    s.extent = std::max<int64_t>(std::min(rows, M), 1);
    return s;
  }
  int64_t cols = kStripFloats / M / kColumnMultiple * kColumnMultiple;
  cols = std::max(cols, kColumnMultiple);
  s.by_columns = true;
  s.extent = std::min(cols, N);
  return s;
}

void gemm_lowp_store(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType a_dtype,
                     const void* A, int64_t lda, DType b_dtype, const void* B, int64_t ldb,
                     float alpha, float beta, DType bias_dtype, const void* bias, DType c_dtype,
                     void* C, int64_t ldc) {
  check_operand_dtype("C", c_dtype);
  if (bias) check_operand_dtype("the bias", bias_dtype);
  REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_lowp_store: negative size M=", M, " N=", N,
              " K=", K);
  REGEN_CHECK(ldc >= N, "gemm_lowp_store: ldc=", ldc, " is less than N=", N);
  if (M == 0 || N == 0) return;
  const LowpStrips strips = lowp_strips(M, N);
  const int64_t strip_floats = strips.extent * (strips.by_columns ? M : N);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(strip_floats) * sizeof(float));
  const bool dry = dry_run_active();
  float* acc = ws.as<float>();
  const size_t a_size = dtype_size(a_dtype), b_size = dtype_size(b_dtype);
  const size_t c_size = dtype_size(c_dtype);
  const int64_t extent = strips.by_columns ? N : M;
  for (int64_t s0 = 0; s0 < extent; s0 += strips.extent) {
    const int64_t len = std::min(strips.extent, extent - s0);
    // Rows s0.. of op(A) (rows of A as stored, or columns when A is stored (K, M)) with all of B,
    // or all of A with columns s0.. of op(B) (columns of B as stored, or rows when B is stored
    // (N, K)).
    const int64_t m0 = strips.by_columns ? 0 : s0, n0 = strips.by_columns ? s0 : 0;
    const int64_t rows = strips.by_columns ? M : len, cols = strips.by_columns ? len : N;
    const void* a_part =
        static_cast<const char*>(A) + static_cast<size_t>(trans_a ? m0 : m0 * lda) * a_size;
    const void* b_part =
        static_cast<const char*>(B) + static_cast<size_t>(trans_b ? n0 * ldb : n0) * b_size;
    gemm_lowp(trans_a, trans_b, rows, cols, K, a_dtype, a_part, lda, b_dtype, b_part, ldb, nullptr,
              false, acc, cols);
    if (dry) continue;  // the dry path: each strip's packing workspace, requested and unused
    void* c_part = static_cast<char*>(C) + static_cast<size_t>(m0 * ldc + n0) * c_size;
    switch (c_dtype) {
      case DType::bf16:
        store_strip(acc, rows, cols, alpha, beta, bias_dtype, bias, n0,
                    static_cast<bfloat16*>(c_part), ldc);
        break;
      case DType::f16:
        store_strip(acc, rows, cols, alpha, beta, bias_dtype, bias, n0,
                    static_cast<float16*>(c_part), ldc);
        break;
      default:
        store_strip(acc, rows, cols, alpha, beta, bias_dtype, bias, n0, static_cast<float*>(c_part),
                    ldc);
    }
  }
}

void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType a_dtype,
               const void* A, int64_t lda, DType b_dtype, const void* B, int64_t ldb,
               const float* bias, bool accumulate, float* C, int64_t ldc, double parallel_flops,
               float* scratch) {
  REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_lowp: negative size M=", M, " N=", N, " K=", K);
  REGEN_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
              "gemm_lowp: leading dimensions lda=", lda, " ldb=", ldb, " ldc=", ldc,
              " too small for M=", M, " N=", N, " K=", K, trans_a ? " (A stored (K, M))" : "",
              trans_b ? " (B stored (N, K))" : "");
  // C's columns form one "image" of N columns: CView's image split never happens.
  const packed::CView<float> c{C, ldc, N > 0 ? N : 1, 0};
  if (a_dtype == DType::bf16 && b_dtype == DType::bf16) {
    // Depth pairs (kernels/cpu/widening_sources.h): the bf16 pair tile where the CPU has one, or
    // the f32 tiles on widened panels with each pair swapped; the same sums either way.
    const int64_t even = K + K % 2;
    if (const packed::TileFn<float> pairs = packed::bf16_pair_tile(packed::tile_isa())) {
      const auto* a16 = static_cast<const uint16_t*>(A);
      const auto* b16 = static_cast<const uint16_t*>(B);
      const packed::WordTile<float> words{pairs, 2};
      packed::gemm<float>(M, N, even / 2, packed::PairWordsA{a16, lda, trans_a, K},
                          packed::PairWordsB{b16, ldb, trans_b, K}, bias, accumulate, c, &words,
                          parallel_flops, scratch);
      return;
    }
    const auto* a16 = static_cast<const bfloat16*>(A);
    const auto* b16 = static_cast<const bfloat16*>(B);
    packed::gemm<float>(M, N, even, packed::WideningA<bfloat16>{a16, lda, trans_a, true, K},
                        packed::WideningB<bfloat16>{b16, ldb, trans_b, true, K}, bias, accumulate,
                        c, nullptr, parallel_flops, scratch);
    return;
  }
  with_source<packed::WideningA>("A", a_dtype, A, lda, trans_a, [&](const auto& a) {
    with_source<packed::WideningB>("B", b_dtype, B, ldb, trans_b, [&](const auto& b) {
      packed::gemm<float>(M, N, K, a, b, bias, accumulate, c, nullptr, parallel_flops, scratch);
    });
  });
}

int64_t gemm_lowp_scratch(int64_t M, int64_t N, int64_t K) {
  // bf16 x bf16 packs K rounded up to even (as pairs, or widened with the pairs swapped): the
  // most any dtype packs.
  return packed::serial_scratch_elems<float>(M, N, K + K % 2);
}

}  // namespace regen::cpu
