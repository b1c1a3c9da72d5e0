// The CPU loops of the unary element-wise ops (kernels/unary_ops.h), one template instantiated for
// every functor of REGEN_UNARY_OPS in float and double, and their packed-mask forms. Tests: the op
// table (tests/op_table.h) checks every op against its f64 reference; the CUDA launchers are in
// kernels/cuda/unary.cu.
#include <omp.h>

#include <algorithm>

#include "regen/core/error.h"
#include "regen/kernels/unary_ops.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
}  // namespace

template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = F::value(x[i]);
}

template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = F::grad(dy[i], s[i]);
}

// One mask word per iteration: 32 elements, so threads never share a word.
template <class T, class F>
void unary_forward_mask(F, const T* x, T* y, uint32_t* mask, int64_t n) {
  if constexpr (unary::has_mask<F>::value) {
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
  if constexpr (unary::has_mask<F>::value) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      dx[i] = F::grad_masked(dy[i], ((mask[i >> 5] >> (i & 31)) & 1u) != 0);
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
#define REGEN_UNARY_INSTANTIATE(name)    \
  REGEN_UNARY_INSTANTIATE_T(float, name) \
  REGEN_UNARY_INSTANTIATE_T(double, name)
REGEN_UNARY_OPS(REGEN_UNARY_INSTANTIATE)
#undef REGEN_UNARY_INSTANTIATE
#undef REGEN_UNARY_INSTANTIATE_T

}  // namespace regen::cpu
