// Helpers of the 16-bit (bfloat16, float16) CPU kernels that compute in f32: a row or plane is
// widened into f32 buffers on the stack with the vectorized conversions of kernels/cpu/convert.h,
// the f32 arithmetic runs on the buffers, and results are narrowed once on store. The conversions
// are exact (widen) and bitwise equal to core/half.h's (narrow), so a kernel that runs the same
// expressions on the buffers gives the same bits as one that converts element by element; only
// faster (f16's scalar conversion branches, which stops loops from vectorizing).
// Users: kernels/cpu/{layernorm,rmsnorm,batchnorm,softmax,pool,upsample}.cpp. Test:
// tests/test_amp_ops.cpp (the kernels against per-element scalar references, bit for bit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "regen/kernels/cpu/convert.h"

namespace regen::cpu::lowp {

// Whether a kernel's reductions and the loops that read two 16-bit arrays go through blocks for
// T: f16, whose scalar conversion branches and does not vectorize. bf16's conversion is a shift
// that vectorizes inline, and its per-element loops there are faster than blocks (measured by
// tests/test_amp_ops.cpp's bench case); bf16 takes blocks where they save work (softmax's
// exponentials) or where its loops did not vectorize (pools, upsampling's forward).
template <class T>
constexpr bool kBlocksFor = std::is_same<T, float16>::value;

// Elements per stack block (a multiple of 8 and 32: batchnorm's partial-sum lanes keep their
// element-to-lane assignment across blocks). 2 KiB of f32.
constexpr int64_t kBlock = 512;
// The longest row, and the largest plane, that a kernel widens whole (16 and 64 KiB of f32); a
// longer one takes the kernel's per-element path, which gives the same bits.
constexpr int64_t kRowMax = 4096;
constexpr int64_t kPlaneMax = 16384;

// f(j0, v, len) for the blocks [j0, j0 + len) of x[0, n), v = x[j0, j0 + len) widened to f32.
template <class T, class F>
inline void for_blocks(const T* x, int64_t n, F&& f) {
  float v[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t len = std::min(kBlock, n - j0);
    convert::widen_span(x + j0, v, len);
    f(j0, static_cast<const float*>(v), len);
  }
}

// f(j0, u, v, len): as for_blocks over two arrays of the same length.
template <class T, class F>
inline void for_blocks2(const T* a, const T* b, int64_t n, F&& f) {
  float u[kBlock], v[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t len = std::min(kBlock, n - j0);
    convert::widen_span(a + j0, u, len);
    convert::widen_span(b + j0, v, len);
    f(j0, static_cast<const float*>(u), static_cast<const float*>(v), len);
  }
}

}  // namespace regen::cpu::lowp
