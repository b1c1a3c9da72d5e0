// Operand sources for the packed GEMM (kernels/cpu/packed_gemm.h) that read f32, bf16 or f16
// matrices and pack them as f32 panels, widening as they copy (kernels/cpu/convert.h). The panels
// are the ones an f32 source would pack from the widened matrix, value for value and in the same
// layout, so the f32 register tile that multiplies them gives C bit for bit as the f32 GEMM on
// widened operands does: the accumulation is f32 whatever the storage. Used by
// kernels/cpu/gemm_lowp.cpp; tests: tests/test_lowp_kernels.cpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/packed_gemm.h"

namespace regen::cpu::packed {

// The left operand A (M, K), element E (float, bfloat16 or float16): stored row-major with rows
// ld apart (A(m, k) = p[m * ld + k]), or, when trans, stored (K, M) (A(m, k) = p[k * ld + m]).
template <class E>
struct WideningA {
  const E* p;
  int64_t ld;
  bool trans;
  // dst[k * kMR + i] = A(m0 + i, k0 + k) for i < rows, 0 for the panel's rows past them.
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    if (trans) {  // each k's rows are contiguous in the source
      for (int64_t k = 0; k < kc; ++k) {
        float* d = dst + k * kMR;
        convert::widen_span(p + (k0 + k) * ld + m0, d, rows);
        std::fill(d + rows, d + kMR, 0.0f);
      }
      return;
    }
    // Each row's depth is contiguous: widen rows into a buffer that stays in L1, then interleave
    // them into the panel, instead of writing the panel with a stride.
    float rows_buf[kMR * kKC];
    for (int64_t i = 0; i < rows; ++i)
      convert::widen_span(p + (m0 + i) * ld + k0, rows_buf + i * kc, kc);
    for (int64_t k = 0; k < kc; ++k) {
      float* d = dst + k * kMR;
      for (int64_t i = 0; i < rows; ++i) d[i] = rows_buf[i * kc + k];
      for (int64_t i = rows; i < kMR; ++i) d[i] = 0.0f;
    }
  }
};

// The right operand B (K, N): stored row-major with rows ld apart (B(k, n) = p[k * ld + n]), or,
// when trans, stored (N, K) (B(k, n) = p[n * ld + k]).
template <class E>
struct WideningB {
  const E* p;
  int64_t ld;
  bool trans;
  // dst[k * w + j] = B(k0 + k, j0 + j) for j < cols, 0 for the columns from cols to w.
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    if (!trans) {
      for (int64_t k = 0; k < kc; ++k) {
        float* d = dst + k * w;
        convert::widen_span(p + (k0 + k) * ld + j0, d, cols);
        std::fill(d + cols, d + w, 0.0f);
      }
      return;
    }
    float cols_buf[kNR<float> * kKC];  // as WideningA: contiguous runs first, then the transpose
    for (int64_t j = 0; j < cols; ++j)
      convert::widen_span(p + (j0 + j) * ld + k0, cols_buf + j * kc, kc);
    for (int64_t k = 0; k < kc; ++k) {
      float* d = dst + k * w;
      for (int64_t j = 0; j < cols; ++j) d[j] = cols_buf[j * kc + k];
      for (int64_t j = cols; j < w; ++j) d[j] = 0.0f;
    }
  }
};

}  // namespace regen::cpu::packed
