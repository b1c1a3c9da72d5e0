// CPU RMS normalization over the last dimension (declared once for the CPU and CUDA beside its op,
// autograd/ops_rmsnorm.cpp): y = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps) per row, as
// torch.nn.functional.rms_norm. Row sums and the dweight column sums accumulate in double; each
// partition depends only on (M, N), so results do not depend on the thread count. The CUDA kernels
// are kernels/cuda/rmsnorm.cu. The 16-bit launchers (rmsnorm_forward_lowp / rmsnorm_backward_lowp)
// read x and dy and write y and dx in bf16 or f16, with weight, rstd and dweight in f32: the same
// template, arithmetic in f32 (acc_t), one rounding per stored element; rows are widened block by
// block into f32 stack buffers (kernels/cpu/lowp_blocks.h) and run the same expressions, so the
// bits are those of converting element by element. Tests: the op table's
// rmsnorm rows (tests/op_table.h), tests/test_amp_ops.cpp (16-bit against f32).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster
constexpr int64_t kColumnBlock = 64;       // columns one dweight task owns
// The row sums of squares of f16 rows are summed from blocks, in row order, as the per-element
// loop's (whose conversion does not vectorize) were. bf16's widening vectorizes inline, so its
// rows keep the one vectorized (omp simd) reduction over the whole row, and its order.
template <class T>
constexpr bool kBlockedSums = std::is_same<T, float16>::value;

// T: the element type of x, y, dy, dx; P: of weight, rstd, dweight (T, or f32 beside a 16-bit T).
template <class T, class P>
void rmsnorm_forward_impl(const T* x, const P* weight, T* y, P* rstd, int64_t M, int64_t N,
                          double eps) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    double sq = 0;
    if constexpr (kBlockedSums<T>) {
      lowp::for_blocks(xr, N, [&](int64_t, const float* xv, int64_t len) {
        for (int64_t j = 0; j < len; ++j) {
          const double v = xv[j];
          sq += v * v;
        }
      });
    } else {
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < N; ++j) {
        const double v = static_cast<A>(xr[j]);
        sq += v * v;
      }
    }
    const A rs = static_cast<A>(1.0 / std::sqrt(sq / static_cast<double>(N) + eps));
    if constexpr (is_half_v<T>) {
      float out[lowp::kBlock];
      lowp::for_blocks(xr, N, [&](int64_t j0, const float* xv, int64_t len) {
        for (int64_t j = 0; j < len; ++j) out[j] = xv[j] * rs * A(weight[j0 + j]);
        convert::narrow_span(out, yr + j0, len);
      });
    } else {
      for (int64_t j = 0; j < N; ++j) yr[j] = T(A(xr[j]) * rs * A(weight[j]));
    }
    rstd[r] = P(rs);
  }
}

template <class T, class P>
void rmsnorm_backward_impl(const T* dy, const T* x, const P* weight, const P* rstd, T* dx,
                           P* dweight, int64_t M, int64_t N) {
  using A = acc_t<T>;
  // With xhat = x * rstd and g = dy * weight: dx = rstd * (g - xhat * mean(g * xhat)).
  if (dx) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
    for (int64_t r = 0; r < M; ++r) {
      const T *xr = x + r * N, *dyr = dy + r * N;
      T* dxr = dx + r * N;
      const A rs = rstd[r];
      double sum_gx = 0;
      if constexpr (kBlockedSums<T>) {
        lowp::for_blocks2(
            dyr, xr, N, [&](int64_t j0, const float* dv, const float* xv, int64_t len) {
              const P* w = weight + j0;
              for (int64_t j = 0; j < len; ++j) {
                sum_gx += static_cast<double>(dv[j] * A(w[j])) * static_cast<double>(xv[j] * rs);
              }
            });
      } else {
#pragma omp simd reduction(+ : sum_gx)
        for (int64_t j = 0; j < N; ++j) {
          sum_gx +=
              static_cast<double>(A(dyr[j]) * A(weight[j])) * static_cast<double>(A(xr[j]) * rs);
        }
      }
      const A b = static_cast<A>(sum_gx / static_cast<double>(N));
      // Element by element for both formats: bf16's conversion vectorizes inline, and over f32
      // buffers the compiler fuses f16's multiply-adds differently (one-ulp changes).
      for (int64_t j = 0; j < N; ++j) {
        dxr[j] = T(rs * (A(dyr[j]) * A(weight[j]) - A(xr[j]) * rs * b));
      }
    }
  }
  if (!dweight) return;
  // dweight[c] = sum over rows of dy * xhat, each column summed in row order by one task.
  const int64_t blocks = (N + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (M * N > kParallelMin && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock, c1 = std::min(N, c0 + kColumnBlock);
    double acc[kColumnBlock] = {0};
    for (int64_t r = 0; r < M; ++r) {
      const T *xr = x + r * N, *dyr = dy + r * N;
      const A rs = rstd[r];
      if constexpr (lowp::kBlocksFor<T>) {
        float dv[kColumnBlock], xv[kColumnBlock];
        convert::widen_span(dyr + c0, dv, c1 - c0);
        convert::widen_span(xr + c0, xv, c1 - c0);
#pragma omp simd
        for (int64_t c = 0; c < c1 - c0; ++c) {
          acc[c] += static_cast<double>(dv[c]) * static_cast<double>(xv[c] * rs);
        }
      } else {
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          acc[c - c0] += static_cast<double>(A(dyr[c])) * static_cast<double>(A(xr[c]) * rs);
        }
      }
    }
    for (int64_t c = c0; c < c1; ++c) dweight[c] = static_cast<P>(acc[c - c0]);
  }
}
}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, int64_t M, int64_t N, double eps) {
  rmsnorm_forward_impl<T, T>(x, weight, y, rstd, M, N, eps);
}
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                      int64_t M, int64_t N) {
  rmsnorm_backward_impl<T, T>(dy, x, weight, rstd, dx, dweight, M, N);
}
template <class T>
void rmsnorm_forward_lowp(const T* x, const float* weight, T* y, float* rstd, int64_t M, int64_t N,
                          double eps) {
  rmsnorm_forward_impl<T, float>(x, weight, y, rstd, M, N, eps);
}
template <class T>
void rmsnorm_backward_lowp(const T* dy, const T* x, const float* weight, const float* rstd, T* dx,
                           float* dweight, int64_t M, int64_t N) {
  rmsnorm_backward_impl<T, float>(dy, x, weight, rstd, dx, dweight, M, N);
}

#define REGEN_INSTANTIATE_LOWP(T)                                                             \
  template void rmsnorm_forward_lowp<T>(const T*, const float*, T*, float*, int64_t, int64_t, \
                                        double);                                              \
  template void rmsnorm_backward_lowp<T>(const T*, const T*, const float*, const float*, T*,  \
                                         float*, int64_t, int64_t);
REGEN_INSTANTIATE_LOWP(bfloat16)
REGEN_INSTANTIATE_LOWP(float16)
#undef REGEN_INSTANTIATE_LOWP

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, float*, int64_t, int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*,
                                       double*, double*, int64_t, int64_t);

}  // namespace regen::cpu
