// CPU softmax over the last dimension (declared in kernels/kernels.h). The row maximum is
// subtracted before exponentiating, and row sums accumulate in double. Rows are independent, so
// results do not depend on the thread count. Tests: tests/test_ops_nlp.cpp (values, including
// large logits), tests/test_gradcheck_nlp.cpp. A 16-bit row (bfloat16, float16) computes in f32 as
// the f32 kernel does and rounds each output once: it is widened into an f32 stack buffer
// (kernels/cpu/lowp_blocks.h), which holds its exponentials, computed once, as the f32 kernel's
// output row does; a row longer than the buffer is widened block by block and computes each
// exponential twice (for the sum and for the output), with the same bits. Tests:
// tests/test_amp_ops.cpp (16-bit against f32, and bit for bit against a per-element reference).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster
}  // namespace

template <class T>
void softmax_forward(const T* x, T* y, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    using A = acc_t<T>;
    A mx = -INFINITY;
    double sum = 0;
    if constexpr (is_half_v<T>) {
      if (N <= lowp::kRowMax) {
        float e[lowp::kRowMax];
        convert::widen_span(xr, e, N);
        for (int64_t j = 0; j < N; ++j) mx = std::max(mx, e[j]);
        for (int64_t j = 0; j < N; ++j) {
          e[j] = std::exp(e[j] - mx);
          sum += static_cast<double>(e[j]);
        }
        const A inv = static_cast<A>(1.0 / sum);
        for (int64_t j = 0; j < N; ++j) e[j] *= inv;
        convert::narrow_span(e, yr, N);
      } else {
        lowp::for_blocks(xr, N, [&](int64_t, const float* v, int64_t len) {
          for (int64_t j = 0; j < len; ++j) mx = std::max(mx, v[j]);
        });
        lowp::for_blocks(xr, N, [&](int64_t, const float* v, int64_t len) {
          for (int64_t j = 0; j < len; ++j) sum += static_cast<double>(std::exp(v[j] - mx));
        });
        const A inv = static_cast<A>(1.0 / sum);
        float out[lowp::kBlock];
        lowp::for_blocks(xr, N, [&](int64_t j0, const float* v, int64_t len) {
          for (int64_t j = 0; j < len; ++j) out[j] = std::exp(v[j] - mx) * inv;
          convert::narrow_span(out, yr + j0, len);
        });
      }
    } else {
      for (int64_t j = 0; j < N; ++j) mx = std::max(mx, static_cast<A>(xr[j]));
      for (int64_t j = 0; j < N; ++j) {
        yr[j] = std::exp(xr[j] - mx);
        sum += static_cast<double>(yr[j]);
      }
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t j = 0; j < N; ++j) yr[j] *= inv;
    }
  }
}

template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t M, int64_t N) {
  // dx = y * (dy - <dy, y>) per row.
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T *yr = y + r * N, *dyr = dy + r * N;
    T* dxr = dx + r * N;
    double dot = 0;
    using A = acc_t<T>;
    if constexpr (lowp::kBlocksFor<T>) {
      lowp::for_blocks2(dyr, yr, N, [&](int64_t, const float* g, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j)
          dot += static_cast<double>(g[j]) * static_cast<double>(v[j]);
      });
      const A d = static_cast<A>(dot);
      float out[lowp::kBlock];
      lowp::for_blocks2(dyr, yr, N, [&](int64_t j0, const float* g, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j) out[j] = v[j] * (g[j] - d);
        convert::narrow_span(out, dxr + j0, len);
      });
    } else {
      for (int64_t j = 0; j < N; ++j) {
        dot += static_cast<double>(dyr[j]) * static_cast<double>(yr[j]);
      }
      const A d = static_cast<A>(dot);
      for (int64_t j = 0; j < N; ++j) dxr[j] = T(A(yr[j]) * (A(dyr[j]) - d));
    }
  }
}

template void softmax_forward<float>(const float*, float*, int64_t, int64_t);
template void softmax_forward<double>(const double*, double*, int64_t, int64_t);
template void softmax_backward<float>(const float*, const float*, float*, int64_t, int64_t);
template void softmax_backward<double>(const double*, const double*, double*, int64_t, int64_t);
template void softmax_forward<bfloat16>(const bfloat16*, bfloat16*, int64_t, int64_t);
template void softmax_forward<float16>(const float16*, float16*, int64_t, int64_t);
template void softmax_backward<bfloat16>(const bfloat16*, const bfloat16*, bfloat16*, int64_t,
                                         int64_t);
template void softmax_backward<float16>(const float16*, const float16*, float16*, int64_t, int64_t);

}  // namespace regen::cpu
