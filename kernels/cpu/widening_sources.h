// Operand sources for the packed GEMM (kernels/cpu/packed_gemm.h) that read f32, bf16 or f16
// matrices and pack them as f32 panels, widening as they copy (kernels/cpu/convert.h). The panels
// are the ones an f32 source would pack from the widened matrix, value for value and in the same
// layout, so the f32 register tile that multiplies them gives C bit for bit as the f32 GEMM on
// widened operands does: the accumulation is f32 whatever the storage.
//
// For a bf16 x bf16 product, gemm_lowp multiplies depth pairs: the bf16 pair tile where the CPU
// has one (PairWordsA/B below pack its 32-bit words), and elsewhere the f32 tiles on widened panels
// whose depth pairs are swapped (swap_pairs): both sum each pair odd element first, so both give
// the same bits (packed_gemm.h, bf16_pair_tile). Used by kernels/cpu/gemm_lowp.cpp and gemm.cpp
// (conv2d.cpp packs its 16-bit panels with its own sources, in the same orders); tests:
// tests/test_lowp_kernels.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/panel_transpose.h"

namespace regen::cpu::packed {

// dst[0, n) = src[0, n) widened and dst[n, width) = 0; with src null, dst[0, width) = 0.
template <class E>
void widen_or_zero(const E* src, float* dst, int64_t n, int64_t width) {
  if (src == nullptr) n = 0;
  if (n > 0) convert::widen_span(src, dst, n);
  std::fill(dst + n, dst + width, 0.0f);
}

// The left operand A (M, K), element E (float, bfloat16 or float16): stored row-major with rows
// ld apart (A(m, k) = p[m * ld + k]), or, when trans, stored (K, M) (A(m, k) = p[k * ld + m]).
// With swap_pairs, the GEMM's depth is `depth` rounded up to even, A(m, k) is 0 for k >= depth,
// and the panel holds depth k0 + (k ^ 1) at k (k0 and kc are even: the blocks' kKC is).
template <class E>
struct WideningA {
  const E* p;
  int64_t ld;
  bool trans;
  bool swap_pairs = false;
  int64_t depth = 0;  // with swap_pairs: A's depth
  // dst[k * kMR + i] = A(m0 + i, k0 + k) for i < rows, 0 for the panel's rows past them.
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    if (swap_pairs) {
      pack_swapped(m0, rows, k0, kc, dst);
      return;
    }
    if (trans) {  // each k's rows are contiguous in the source
      if constexpr (std::is_same_v<E, float>) {
        // A whole f32 panel: one fixed-size copy per k, which the compiler turns into a vector
        // move; memcpy's call per 32 bytes cost a dW product (dy^T x) 3-5% of its time.
        if (rows == kMR) {
          for (int64_t k = 0; k < kc; ++k) {
            std::memcpy(dst + k * kMR, p + (k0 + k) * ld + m0, sizeof(float) * kMR);
          }
          return;
        }
      }
      for (int64_t k = 0; k < kc; ++k) {
        float* d = dst + k * kMR;
        convert::widen_span(p + (k0 + k) * ld + m0, d, rows);
        std::fill(d + rows, d + kMR, 0.0f);
      }
      return;
    }
    // Each row's depth is contiguous: transposed into the panel straight from the source, 16-bit
    // values widened as they are loaded.
    transpose_into_panel(p + m0 * ld + k0, ld, rows, kc, dst, kMR, kMR);
  }
  void pack_swapped(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    const int64_t have = std::max<int64_t>(0, std::min(kc, depth - k0));  // depth left, <= kc
    if (trans) {  // depth k's rows from source row k0 + (k ^ 1), or zeros past the depth
      for (int64_t k = 0; k < kc; ++k) {
        const int64_t from = k ^ 1;
        widen_or_zero(from < have ? p + (k0 + from) * ld + m0 : nullptr, dst + k * kMR, rows, kMR);
      }
      return;
    }
    transpose_into_panel(p + m0 * ld + k0, ld, rows, kc, dst, kMR, kMR, /*swap_pairs=*/true, have);
  }
};

// The right operand B (K, N): stored row-major with rows ld apart (B(k, n) = p[k * ld + n]), or,
// when trans, stored (N, K) (B(k, n) = p[n * ld + k]).
// swap_pairs and depth as WideningA's.
template <class E>
struct WideningB {
  const E* p;
  int64_t ld;
  bool trans;
  bool swap_pairs = false;
  int64_t depth = 0;
  // dst[k * w + j] = B(k0 + k, j0 + j) for j < cols, 0 for the columns from cols to w.
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    if (swap_pairs) {
      pack_swapped(k0, kc, j0, cols, w, dst);
      return;
    }
    if (!trans) {
      for (int64_t k = 0; k < kc; ++k) {
        float* d = dst + k * w;
        convert::widen_span(p + (k0 + k) * ld + j0, d, cols);
        std::fill(d + cols, d + w, 0.0f);
      }
      return;
    }
    // As WideningA's rows: straight from the source, widened as they are loaded.
    transpose_into_panel(p + j0 * ld + k0, ld, cols, kc, dst, w, w);
  }
  void pack_swapped(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    const int64_t have = std::max<int64_t>(0, std::min(kc, depth - k0));
    if (!trans) {
      for (int64_t k = 0; k < kc; ++k) {
        const int64_t from = k ^ 1;
        widen_or_zero(from < have ? p + (k0 + from) * ld + j0 : nullptr, dst + k * w, cols, w);
      }
      return;
    }
    transpose_into_panel(p + j0 * ld + k0, ld, cols, kc, dst, w, w, /*swap_pairs=*/true, have);
  }
};

// ---- bf16 pairs for the bf16 pair tile (packed_gemm.h, bf16_pair_tile) --------------------------

// Word kk of a depth pair: the bits of op(X)(., 2kk) in the low half and op(X)(., 2kk + 1) in the
// high half, 0 past `depth`. Stored into the float panel by memcpy (the tile moves it bit for bit).
inline void put_word(float* dst, uint32_t word) {
  std::memcpy(dst, &word, sizeof word);
}

// n lines of bf16 pairs, line i at src + i * ld, from depth element `first` on (`depth` in all):
// buf[i * kc + kk] = pair kk of line i, the bits copied whole (low half the even element), an odd
// last element alone in its word, 0 past the depth.
inline void copy_words(const uint16_t* src, int64_t ld, int64_t n, int64_t first, int64_t kc,
                       int64_t depth, uint32_t* buf) {
  const int64_t have = std::max<int64_t>(0, std::min(2 * kc, depth - first));  // elements
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* b = buf + i * kc;
    const uint16_t* line = src + i * ld;
    std::memcpy(b, line, static_cast<size_t>(have / 2) * sizeof(uint32_t));
    if (have % 2) b[have / 2] = line[have - 1];
    for (int64_t kk = (have + 1) / 2; kk < kc; ++kk) b[kk] = 0;
  }
}

// The left operand A (M, K) in bf16, as WideningA's (trans alike); k0 and kc count words (depth
// pairs), and A's depth is `depth` elements. dst word (kk * kMR + i) = pair kk of row m0 + i.
struct PairWordsA {
  const uint16_t* p;  // the bf16 bits
  int64_t ld;
  bool trans;
  int64_t depth;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    if (!trans) {  // each row's pairs are whole words of the source: as PairWordsB's columns
      uint32_t rows_buf[kMR * (kKC / 2)];
      copy_words(p + m0 * ld + 2 * k0, ld, rows, 2 * k0, kc, depth, rows_buf);
      transpose_into_panel(rows_buf, kc, rows, kc, reinterpret_cast<uint32_t*>(dst), kMR, kMR);
      return;
    }
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = 2 * (k0 + kk);
      float* d = dst + kk * kMR;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t m = m0 + i;
        const uint32_t lo = k < depth ? (trans ? p[k * ld + m] : p[m * ld + k]) : 0;
        const uint32_t hi = k + 1 < depth ? (trans ? p[(k + 1) * ld + m] : p[m * ld + k + 1]) : 0;
        put_word(d + i, lo | hi << 16);
      }
      for (int64_t i = rows; i < kMR; ++i) put_word(d + i, 0);
    }
  }
};

// The right operand B (K, N) in bf16, as WideningB's; k0 and kc count words. dst word (kk * w + j)
// = pair kk of column j0 + j, 0 for the columns from cols to w.
struct PairWordsB {
  const uint16_t* p;
  int64_t ld;
  bool trans;
  int64_t depth;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    if (!trans) {  // two rows of B interleaved per word row
      for (int64_t kk = 0; kk < kc; ++kk) {
        const int64_t k = 2 * (k0 + kk);
        const uint16_t* even = p + k * ld + j0;
        const uint16_t* odd = even + ld;
        uint32_t* d = reinterpret_cast<uint32_t*>(dst + kk * w);
        if (k + 1 < depth) {
          for (int64_t j = 0; j < cols; ++j) d[j] = even[j] | static_cast<uint32_t>(odd[j]) << 16;
        } else {
          for (int64_t j = 0; j < cols; ++j) d[j] = even[j];
        }
        for (int64_t j = cols; j < w; ++j) d[j] = 0;
      }
      return;
    }
    // Each column's depth is contiguous: its words are copied whole into a buffer that stays in
    // L1, then transposed into the panel.
    uint32_t cols_buf[kNR<float> * (kKC / 2)];
    copy_words(p + j0 * ld + 2 * k0, ld, cols, 2 * k0, kc, depth, cols_buf);
    transpose_into_panel(cols_buf, kc, cols, kc, reinterpret_cast<uint32_t*>(dst), w, w);
  }
};

}  // namespace regen::cpu::packed
