// The CPU loops of the unary element-wise ops (kernels/unary_ops.h), one template instantiated for
// every functor of REGEN_UNARY_OPS in float, double, bfloat16 and float16, and their packed-mask
// forms. A 16-bit array is processed in blocks of kBlock elements: widened into an f32 buffer on
// the stack (kernels/cpu/convert.h, vectorized), computed there by the f32 loop, narrowed once on
// store; so each 16-bit result is the f32 op's result on the widened input, rounded. Tests: the op
// table (tests/op_table.h) checks every op against its f64 reference; tests/test_amp_ops.cpp the
// 16-bit paths against f32; the CUDA launchers are in kernels/cuda/unary.cu.
#include <omp.h>

#include <algorithm>

#include "regen/core/error.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/unary_ops.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
// 16-bit paths: elements per block (a multiple of 32, so a mask word never spans two blocks).
constexpr int64_t kBlock = 512;
static_assert(kBlock % 32 == 0, "a 16-bit block is whole mask words");
constexpr int64_t blocks_of(int64_t n) {
  return (n + kBlock - 1) / kBlock;
}
}  // namespace

template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n) {
  if constexpr (is_half_v<T>) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t b = 0; b < blocks_of(n); ++b) {
      const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
      float buf[kBlock];
      convert::widen_span(x + i0, buf, len);
      for (int64_t i = 0; i < len; ++i) buf[i] = F::value(buf[i]);
      convert::narrow_span(buf, y + i0, len);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = F::value(x[i]);
  }
}

template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n) {
  if constexpr (is_half_v<T>) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t b = 0; b < blocks_of(n); ++b) {
      const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
      float g[kBlock], v[kBlock];
      convert::widen_span(dy + i0, g, len);
      convert::widen_span(s + i0, v, len);
      for (int64_t i = 0; i < len; ++i) g[i] = F::grad(g[i], v[i]);
      convert::narrow_span(g, dx + i0, len);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) dx[i] = F::grad(dy[i], s[i]);
  }
}

// One mask word per iteration: 32 elements, so threads never share a word. The 16-bit form takes
// the bits from the stored (rounded) values, which are what the unpacked backward reads.
template <class T, class F>
void unary_forward_mask(F, const T* x, T* y, uint32_t* mask, int64_t n) {
  if constexpr (unary::has_mask<F>::value && is_half_v<T>) {
    constexpr bool reads_output = F::reads == unary::Reads::output;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t b = 0; b < blocks_of(n); ++b) {
      const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
      float in[kBlock], out[kBlock];
      convert::widen_span(x + i0, in, len);
      for (int64_t i = 0; i < len; ++i) out[i] = F::value(in[i]);
      convert::narrow_span(out, y + i0, len);
      if (reads_output) convert::widen_span(y + i0, out, len);
      const float* read = reads_output ? out : in;
      for (int64_t w = 0; w < mask_words(len); ++w) {
        uint32_t bits = 0;
        for (int64_t i = w * 32; i < std::min<int64_t>(len, w * 32 + 32); ++i) {
          bits |= static_cast<uint32_t>(F::mask(read[i])) << (i - w * 32);
        }
        mask[i0 / 32 + w] = bits;
      }
    }
  } else if constexpr (unary::has_mask<F>::value) {
    constexpr bool reads_output = F::reads == unary::Reads::output;
    const int64_t words = mask_words(n);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t w = 0; w < words; ++w) {
      const int64_t i0 = w * 32, i1 = std::min<int64_t>(n, i0 + 32);
      uint32_t bits = 0;
      for (int64_t i = i0; i < i1; ++i) {
        const T in = x[i];
        const T out = F::value(in);
        y[i] = out;
        bits |= static_cast<uint32_t>(F::mask(reads_output ? out : in)) << (i - i0);
      }
      mask[w] = bits;
    }
  } else {
    REGEN_FAIL(unary::name_of<F>::value, ": has no packed mask form");
  }
}

template <class T, class F>
void unary_backward_mask(F, const T* dy, const uint32_t* mask, T* dx, int64_t n) {
  if constexpr (unary::has_mask<F>::value && is_half_v<T>) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t b = 0; b < blocks_of(n); ++b) {
      const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
      float g[kBlock];
      convert::widen_span(dy + i0, g, len);
      // Word by word, as the wide form below (a block is whole words: kBlock % 32 == 0).
      for (int64_t w = 0; w < mask_words(len); ++w) {
        const uint32_t bits = mask[i0 / 32 + w];
        float* gw = g + w * 32;
        const int64_t wl = std::min<int64_t>(32, len - w * 32);
        for (int64_t j = 0; j < wl; ++j) gw[j] = F::grad_masked(gw[j], ((bits >> j) & 1u) != 0);
      }
      convert::narrow_span(g, dx + i0, len);
    }
  } else if constexpr (unary::has_mask<F>::value) {
    // Word by word: the 32 elements of a word read the same bits with shifts 0..31, a loop GCC
    // vectorizes with AVX2 too (per element, the word's index and shift kept it scalar there).
    const int64_t words = mask_words(n);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t w = 0; w < words; ++w) {
      const uint32_t bits = mask[w];
      const int64_t i0 = w * 32, len = std::min<int64_t>(32, n - i0);
      for (int64_t j = 0; j < len; ++j) {
        dx[i0 + j] = F::grad_masked(dy[i0 + j], ((bits >> j) & 1u) != 0);
      }
    }
  } else {
    REGEN_FAIL(unary::name_of<F>::value, ": has no packed mask form");
  }
}

#define REGEN_UNARY_INSTANTIATE_T(T, name)                                                         \
  template void unary_forward<T, unary::name>(unary::name, const T*, T*, int64_t);                 \
  template void unary_backward<T, unary::name>(unary::name, const T*, const T*, T*, int64_t);      \
  template void unary_forward_mask<T, unary::name>(unary::name, const T*, T*, uint32_t*, int64_t); \
  template void unary_backward_mask<T, unary::name>(unary::name, const T*, const uint32_t*, T*,    \
                                                    int64_t);
#define REGEN_UNARY_INSTANTIATE(name)       \
  REGEN_UNARY_INSTANTIATE_T(float, name)    \
  REGEN_UNARY_INSTANTIATE_T(double, name)   \
  REGEN_UNARY_INSTANTIATE_T(bfloat16, name) \
  REGEN_UNARY_INSTANTIATE_T(float16, name)
REGEN_UNARY_OPS(REGEN_UNARY_INSTANTIATE)
#undef REGEN_UNARY_INSTANTIATE
#undef REGEN_UNARY_INSTANTIATE_T

}  // namespace regen::cpu
