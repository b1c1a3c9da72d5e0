// CPU layer normalization over the last dimension (declared in kernels/kernels.h), with the
// biased variance and eps inside the square root, as torch.nn.functional.layer_norm. Row sums and
// the dgamma/dbeta column sums accumulate in double in a fixed order, so results do not depend on
// the thread count. Tests: tests/test_ops_nlp.cpp (values), tests/test_gradcheck_nlp.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster
constexpr int64_t kColumnBlock = 64;       // columns one dgamma/dbeta task owns
}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t M,
                       int64_t N, double eps) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    double sum = 0;
    for (int64_t j = 0; j < N; ++j) sum += static_cast<double>(xr[j]);
    const double mu = sum / static_cast<double>(N);
    // Two passes: the centred sum of squares does not cancel catastrophically.
    double sq = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double d = static_cast<double>(xr[j]) - mu;
      sq += d * d;
    }
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(N) + eps);
    const T mu_t = static_cast<T>(mu), rs_t = static_cast<T>(rs);
    for (int64_t j = 0; j < N; ++j) {
      const T xhat = (xr[j] - mu_t) * rs_t;
      yr[j] = (gamma ? xhat * gamma[j] : xhat) + (beta ? beta[j] : T(0));
    }
    mean[r] = mu_t;
    rstd[r] = rs_t;
  }
}

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, int64_t M, int64_t N) {
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T *xr = x + r * N, *dyr = dy + r * N;
    T* dxr = dx + r * N;
    const T mu = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < N; ++j) {
      const T g = gamma ? dyr[j] * gamma[j] : dyr[j];
      sum_g += static_cast<double>(g);
      sum_gx += static_cast<double>(g) * static_cast<double>((xr[j] - mu) * rs);
    }
    const T a = static_cast<T>(sum_g / static_cast<double>(N));
    const T b = static_cast<T>(sum_gx / static_cast<double>(N));
    for (int64_t j = 0; j < N; ++j) {
      const T g = gamma ? dyr[j] * gamma[j] : dyr[j];
      const T xhat = (xr[j] - mu) * rs;
      dxr[j] = rs * (g - a - xhat * b);
    }
  }
  if (!dgamma && !dbeta) return;
  // Column sums over rows, each column summed in row order by one task.
  const int64_t blocks = (N + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (M * N > kParallelMin && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock, c1 = std::min(N, c0 + kColumnBlock);
    double acc_g[kColumnBlock] = {0}, acc_b[kColumnBlock] = {0};
    for (int64_t r = 0; r < M; ++r) {
      const T *xr = x + r * N, *dyr = dy + r * N;
      const T mu = mean[r], rs = rstd[r];
      for (int64_t c = c0; c < c1; ++c) {
        acc_g[c - c0] += static_cast<double>(dyr[c]) * static_cast<double>((xr[c] - mu) * rs);
        acc_b[c - c0] += static_cast<double>(dyr[c]);
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dgamma) dgamma[c] = static_cast<T>(acc_g[c - c0]);
      if (dbeta) dbeta[c] = static_cast<T>(acc_b[c - c0]);
    }
  }
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, double);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, double);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*,
                                        const float*, float*, float*, float*, int64_t, int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*,
                                         const double*, double*, double*, double*, int64_t,
                                         int64_t);

}  // namespace regen::cpu
