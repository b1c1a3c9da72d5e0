// CPU layer normalization over the last dimension (declared in kernels/kernels.h), with the
// biased variance and eps inside the square root, as torch.nn.functional.layer_norm. Row sums and
// the dgamma/dbeta column sums accumulate in double in a fixed order, so results do not depend on
// the thread count. The 16-bit launchers (layernorm_forward_lowp / layernorm_backward_lowp,
// declared beside the op in autograd/ops_layernorm.cpp) read x and dy and write y and dx in bf16 or
// f16, with gamma, beta, mean, rstd, dgamma and dbeta in f32; they run the same template with the
// arithmetic in f32 (acc_t) and round once per stored element; their rows are widened block by
// block into f32 stack buffers (kernels/cpu/lowp_blocks.h) and run the same expressions as the
// per-element loops, so the bits are those of converting element by element. An f32 x under
// autocast (layernorm_forward_save_xhat / layernorm_backward_xhat, kernels/lowp_launchers.h) keeps
// its normalized input rounded once to 16 bits for backward, in place of x. Tests:
// tests/test_ops_nlp.cpp (values), tests/test_gradcheck_nlp.cpp, tests/test_amp_ops.cpp (16-bit
// against f32).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/lowp_launchers.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster
constexpr int64_t kColumnBlock = 64;       // columns one dgamma/dbeta task owns
// f16's output loops (y, dx) convert element by element: the compiler fuses (or not) their
// multiply-adds differently there than in a loop over f32 buffers, so a blocked loop would change
// some f16 results by one unit in the last place. The statistics' sums are blocked for both.
template <class T>
constexpr bool kOutputPerElement = std::is_same<T, float16>::value;

// T: the element type of x, y, dy, dx; P: of gamma, beta, the statistics and their gradients
// (T, or f32 beside a 16-bit T). Arithmetic is in A = acc_t<T>.
// S: the element type of xs, the normalized input kept for backward (bf16 or f16 beside an f32 x:
// layernorm_forward_save_xhat), or float with xs null.
template <class T, class P, class S = float>
void layernorm_forward_impl(const T* x, const P* gamma, const P* beta, T* y, P* mean, P* rstd,
                            int64_t M, int64_t N, double eps, S* xs = nullptr) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    double sum = 0;
    double sq = 0;
    A mu_t, rs_t;
    if constexpr (is_half_v<T>) {
      lowp::for_blocks(xr, N, [&](int64_t, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j) sum += static_cast<double>(v[j]);
      });
      const double mu = sum / static_cast<double>(N);
      lowp::for_blocks(xr, N, [&](int64_t, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j) {
          const double d = static_cast<double>(v[j]) - mu;
          sq += d * d;
        }
      });
      const double rs = 1.0 / std::sqrt(sq / static_cast<double>(N) + eps);
      mu_t = static_cast<A>(mu);
      rs_t = static_cast<A>(rs);
      if constexpr (kOutputPerElement<T>) {
        for (int64_t j = 0; j < N; ++j) {
          const A xhat = (A(xr[j]) - mu_t) * rs_t;
          yr[j] = T((gamma ? xhat * A(gamma[j]) : xhat) + (beta ? A(beta[j]) : A(0)));
        }
      } else {
        float out[lowp::kBlock];
        lowp::for_blocks(xr, N, [&](int64_t j0, const float* v, int64_t len) {
          const P* g = gamma ? gamma + j0 : nullptr;
          const P* b = beta ? beta + j0 : nullptr;
          for (int64_t j = 0; j < len; ++j) {
            const A xhat = (v[j] - mu_t) * rs_t;
            out[j] = (g ? xhat * A(g[j]) : xhat) + (b ? A(b[j]) : A(0));
          }
          convert::narrow_span(out, yr + j0, len);
        });
      }
    } else {
      for (int64_t j = 0; j < N; ++j) sum += static_cast<double>(xr[j]);
      const double mu = sum / static_cast<double>(N);
      // Two passes: the centred sum of squares does not cancel catastrophically.
      for (int64_t j = 0; j < N; ++j) {
        const double d = static_cast<double>(xr[j]) - mu;
        sq += d * d;
      }
      const double rs = 1.0 / std::sqrt(sq / static_cast<double>(N) + eps);
      mu_t = static_cast<A>(mu);
      rs_t = static_cast<A>(rs);
      if constexpr (is_half_v<S>) {
        // The same expressions, xhat also kept in a block and narrowed once per element.
        float kept[lowp::kBlock];
        S* xsr = xs + r * N;
        for (int64_t j0 = 0; j0 < N; j0 += lowp::kBlock) {
          const int64_t len = std::min(lowp::kBlock, N - j0);
          for (int64_t j = j0; j < j0 + len; ++j) {
            const A xhat = (A(xr[j]) - mu_t) * rs_t;
            kept[j - j0] = xhat;
            yr[j] = T((gamma ? xhat * A(gamma[j]) : xhat) + (beta ? A(beta[j]) : A(0)));
          }
          convert::narrow_span(kept, xsr + j0, len);
        }
      } else {
        for (int64_t j = 0; j < N; ++j) {
          const A xhat = (A(xr[j]) - mu_t) * rs_t;
          yr[j] = T((gamma ? xhat * A(gamma[j]) : xhat) + (beta ? A(beta[j]) : A(0)));
        }
      }
    }
    mean[r] = P(mu_t);
    rstd[r] = P(rs_t);
  }
}

template <class T, class P>
void layernorm_backward_impl(const T* dy, const T* x, const P* gamma, const P* mean, const P* rstd,
                             T* dx, P* dgamma, P* dbeta, int64_t M, int64_t N) {
  using A = acc_t<T>;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T *xr = x + r * N, *dyr = dy + r * N;
    T* dxr = dx + r * N;
    const A mu = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    if constexpr (lowp::kBlocksFor<T>) {
      lowp::for_blocks2(dyr, xr, N, [&](int64_t j0, const float* dv, const float* xv, int64_t len) {
        const P* gm = gamma ? gamma + j0 : nullptr;
        for (int64_t j = 0; j < len; ++j) {
          const A g = gm ? dv[j] * A(gm[j]) : dv[j];
          sum_g += static_cast<double>(g);
          sum_gx += static_cast<double>(g) * static_cast<double>((xv[j] - mu) * rs);
        }
      });
      const A a = static_cast<A>(sum_g / static_cast<double>(N));
      const A b = static_cast<A>(sum_gx / static_cast<double>(N));
      if constexpr (kOutputPerElement<T>) {
        for (int64_t j = 0; j < N; ++j) {
          const A g = gamma ? A(dyr[j]) * A(gamma[j]) : A(dyr[j]);
          const A xhat = (A(xr[j]) - mu) * rs;
          dxr[j] = T(rs * (g - a - xhat * b));
        }
      } else {
        float out[lowp::kBlock];
        lowp::for_blocks2(dyr, xr, N,
                          [&](int64_t j0, const float* dv, const float* xv, int64_t len) {
                            const P* gm = gamma ? gamma + j0 : nullptr;
                            for (int64_t j = 0; j < len; ++j) {
                              const A g = gm ? dv[j] * A(gm[j]) : dv[j];
                              const A xhat = (xv[j] - mu) * rs;
                              out[j] = rs * (g - a - xhat * b);
                            }
                            convert::narrow_span(out, dxr + j0, len);
                          });
      }
    } else {
      for (int64_t j = 0; j < N; ++j) {
        const A g = gamma ? A(dyr[j]) * A(gamma[j]) : A(dyr[j]);
        sum_g += static_cast<double>(g);
        sum_gx += static_cast<double>(g) * static_cast<double>((A(xr[j]) - mu) * rs);
      }
      const A a = static_cast<A>(sum_g / static_cast<double>(N));
      const A b = static_cast<A>(sum_gx / static_cast<double>(N));
      for (int64_t j = 0; j < N; ++j) {
        const A g = gamma ? A(dyr[j]) * A(gamma[j]) : A(dyr[j]);
        const A xhat = (A(xr[j]) - mu) * rs;
        dxr[j] = T(rs * (g - a - xhat * b));
      }
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
      const A mu = mean[r], rs = rstd[r];
      if constexpr (lowp::kBlocksFor<T>) {
        float dv[kColumnBlock], xv[kColumnBlock];
        convert::widen_span(dyr + c0, dv, c1 - c0);
        convert::widen_span(xr + c0, xv, c1 - c0);
        for (int64_t c = 0; c < c1 - c0; ++c) {
          const A g = dv[c];
          acc_g[c] += static_cast<double>(g) * static_cast<double>((xv[c] - mu) * rs);
          acc_b[c] += static_cast<double>(g);
        }
      } else {
        for (int64_t c = c0; c < c1; ++c) {
          const A g = dyr[c];
          acc_g[c - c0] += static_cast<double>(g) * static_cast<double>((A(xr[c]) - mu) * rs);
          acc_b[c - c0] += static_cast<double>(g);
        }
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dgamma) dgamma[c] = static_cast<P>(acc_g[c - c0]);
      if (dbeta) dbeta[c] = static_cast<P>(acc_b[c - c0]);
    }
  }
}
// As layernorm_backward_impl for an f32 dy, dx and statistics, with the normalized input read from
// xs (S: bf16, f16) instead of recomputed from x: g = dy * gamma, a = mean(g), b = mean(g * xhat),
// dx = rstd * (g - a - xhat * b); dgamma = sum over rows of dy * xhat, dbeta of dy.
template <class S>
void layernorm_backward_xhat_impl(const float* dy, const S* xs, const float* gamma,
                                  const float* rstd, float* dx, float* dgamma, float* dbeta,
                                  int64_t M, int64_t N) {
  // bf16 widens inline (a shift) in the loops; f16 through blocks (lowp::kBlocksFor).
  const auto row = [&](int64_t r, const float* xv) {
    const float* dyr = dy + r * N;
    float* dxr = dx + r * N;
    const float rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < N; ++j) {
      const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
      sum_g += static_cast<double>(g);
      sum_gx += static_cast<double>(g) * static_cast<double>(xv ? xv[j] : float(xs[r * N + j]));
    }
    const float a = static_cast<float>(sum_g / static_cast<double>(N));
    const float b = static_cast<float>(sum_gx / static_cast<double>(N));
    for (int64_t j = 0; j < N; ++j) {
      const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
      dxr[j] = rs * (g - a - (xv ? xv[j] : float(xs[r * N + j])) * b);
    }
  };
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    if constexpr (lowp::kBlocksFor<S>) {
      if (N <= lowp::kRowMax) {
        float xv[lowp::kRowMax];
        convert::widen_span(xs + r * N, xv, N);
        row(r, xv);
        continue;
      }
    }
    row(r, nullptr);
  }
  if (!dgamma && !dbeta) return;
  // Column sums over rows, each column summed in row order by one task.
  const int64_t blocks = (N + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (M * N > kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(N, c0 + kColumnBlock), w = c1 - c0;
    double acc_g[kColumnBlock] = {0}, acc_b[kColumnBlock] = {0};
    for (int64_t r = 0; r < M; ++r) {
      const float* dyr = dy + r * N + c0;
      const S* xr = xs + r * N + c0;
      if constexpr (lowp::kBlocksFor<S>) {
        float xv[kColumnBlock];
        convert::widen_span(xr, xv, w);
        for (int64_t c = 0; c < w; ++c) {
          acc_g[c] += static_cast<double>(dyr[c]) * static_cast<double>(xv[c]);
          acc_b[c] += static_cast<double>(dyr[c]);
        }
      } else {
        for (int64_t c = 0; c < w; ++c) {
          acc_g[c] += static_cast<double>(dyr[c]) * static_cast<double>(float(xr[c]));
          acc_b[c] += static_cast<double>(dyr[c]);
        }
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dgamma) dgamma[c] = static_cast<float>(acc_g[c - c0]);
      if (dbeta) dbeta[c] = static_cast<float>(acc_b[c - c0]);
    }
  }
}
}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t M,
                       int64_t N, double eps) {
  layernorm_forward_impl<T, T>(x, gamma, beta, y, mean, rstd, M, N, eps);
}
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, int64_t M, int64_t N) {
  layernorm_backward_impl<T, T>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}
template <class T>
void layernorm_forward_lowp(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                            float* rstd, int64_t M, int64_t N, double eps) {
  layernorm_forward_impl<T, float>(x, gamma, beta, y, mean, rstd, M, N, eps);
}
template <class T>
void layernorm_backward_lowp(const T* dy, const T* x, const float* gamma, const float* mean,
                             const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M,
                             int64_t N) {
  layernorm_backward_impl<T, float>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}

template <class T>
void layernorm_forward_save_xhat(const float* x, const float* gamma, const float* beta, float* y,
                                 float* mean, float* rstd, T* xhat, int64_t M, int64_t N,
                                 double eps) {
  layernorm_forward_impl<float, float, T>(x, gamma, beta, y, mean, rstd, M, N, eps, xhat);
}
template <class T>
void layernorm_backward_xhat(const float* dy, const T* xhat, const float* gamma, const float* rstd,
                             float* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  layernorm_backward_xhat_impl<T>(dy, xhat, gamma, rstd, dx, dgamma, dbeta, M, N);
}

#define REGEN_INSTANTIATE_LOWP(T)                                                                \
  template void layernorm_forward_lowp<T>(const T*, const float*, const float*, T*, float*,      \
                                          float*, int64_t, int64_t, double);                     \
  template void layernorm_backward_lowp<T>(const T*, const T*, const float*, const float*,       \
                                           const float*, T*, float*, float*, int64_t, int64_t);  \
  template void layernorm_forward_save_xhat<T>(const float*, const float*, const float*, float*, \
                                               float*, float*, T*, int64_t, int64_t, double);    \
  template void layernorm_backward_xhat<T>(const float*, const T*, const float*, const float*,   \
                                           float*, float*, float*, int64_t, int64_t);
REGEN_INSTANTIATE_LOWP(bfloat16)
REGEN_INSTANTIATE_LOWP(float16)
#undef REGEN_INSTANTIATE_LOWP

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
