// CPU RMS normalization over the last dimension (declared once for the CPU and CUDA beside its op,
// autograd/ops_rmsnorm.cpp): y = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps) per row, as
// torch.nn.functional.rms_norm. Row sums and the dweight column sums accumulate in double; each
// partition depends only on (M, N), so results do not depend on the thread count. The CUDA kernels
// are kernels/cuda/rmsnorm.cu. Tests: the op table's rmsnorm rows (tests/op_table.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster
constexpr int64_t kColumnBlock = 64;       // columns one dweight task owns
}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, int64_t M, int64_t N, double eps) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    double sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < N; ++j) sq += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const T rs = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(N) + eps));
    for (int64_t j = 0; j < N; ++j) yr[j] = xr[j] * rs * weight[j];
    rstd[r] = rs;
  }
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                      int64_t M, int64_t N) {
  // With xhat = x * rstd and g = dy * weight: dx = rstd * (g - xhat * mean(g * xhat)).
  if (dx) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
    for (int64_t r = 0; r < M; ++r) {
      const T *xr = x + r * N, *dyr = dy + r * N;
      T* dxr = dx + r * N;
      const T rs = rstd[r];
      double sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
      for (int64_t j = 0; j < N; ++j) {
        sum_gx += static_cast<double>(dyr[j] * weight[j]) * static_cast<double>(xr[j] * rs);
      }
      const T b = static_cast<T>(sum_gx / static_cast<double>(N));
      for (int64_t j = 0; j < N; ++j) dxr[j] = rs * (dyr[j] * weight[j] - xr[j] * rs * b);
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
      const T rs = rstd[r];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        acc[c - c0] += static_cast<double>(dyr[c]) * static_cast<double>(xr[c] * rs);
      }
    }
    for (int64_t c = c0; c < c1; ++c) dweight[c] = static_cast<T>(acc[c - c0]);
  }
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, float*, int64_t, int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*,
                                       double*, double*, int64_t, int64_t);

}  // namespace regen::cpu
