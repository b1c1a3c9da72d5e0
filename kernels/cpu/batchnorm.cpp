// CPU batch normalization over (N, C, HW) (declared in kernels/kernels.h): training forward with
// batch statistics and PyTorch's running-stat update, eval forward, and both backwards.
// Every per-channel reduction is summed by one thread, image by image, in double, into a fixed
// set of partial sums: the result is identical on every run and does not depend on the thread
// count. Forward reads x twice (statistics, normalize), backward reads dy and x twice. Tests:
// tests/test_ops_vision.cpp (running stats, replay), tests/test_gradcheck_vision.cpp (gradients),
// tests/test_amp_ops.cpp (16-bit). The 16-bit launchers (batchnorm_*_lowp, declared beside the op
// in autograd/ops_batchnorm.cpp) read x and dy and write y and dx in bf16 or f16, with gamma, beta,
// the statistics, the running stats, dgamma and dbeta in f32: the same templates, arithmetic in f32
// or double, one rounding per stored element. Their planes are widened block by block into f32
// stack buffers (kernels/cpu/lowp_blocks.h) that run the same expressions, with each element in the
// same partial sum, so the bits are those of converting element by element.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this one thread is faster

constexpr int kLanes = 8;  // independent partial sums: lets the reductions vectorize

// Whether the statistics' sums widen x in blocks (lowp_blocks.h): f16 always; bf16 too where
// the build lacks AVX-512, whose per-element bf16 loop did not vectorize there (the forward of a
// (4, 256, 56 x 56) bf16 batch took 2.2-2.7 ms against f32's 1.4-1.9; in blocks 1.4-1.7, this
// 2-core Zen 4, x86-64-v3 build, 2026-11-30). With AVX-512 the per-element loop was the faster
// (1.26 ms against 1.50 in blocks). The same sums either way (lowp_blocks.h).
template <class T>
#ifdef __AVX512F__
constexpr bool kWidenBlocks = lowp::kBlocksFor<T>;
#else
constexpr bool kWidenBlocks = is_half_v<T>;
#endif

// Adds element i of p[0, len) (f32, f64, or 16 bits widened) into partial sums a[i % kLanes] and
// b[i % kLanes], in order. A 16-bit plane comes in blocks of lowp::kBlock, a multiple of kLanes,
// so every element meets the same partial sums in the same order as in one call.
// The partial sums are copied into locals for the loop: through the pointers (which may alias
// each other) GCC kept every sum in memory, one scalar load and store per element; in locals they
// are two vectors (the same operations in the same order, so the same bits).
template <class S>
void add_moments(const S* p, int64_t len, double shift, double* a_out, double* b_out) {
  double a[kLanes], b[kLanes];
  std::copy(a_out, a_out + kLanes, a);
  std::copy(b_out, b_out + kLanes, b);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    double d[kLanes];
    for (int j = 0; j < kLanes; ++j) d[j] = static_cast<double>(p[i + j]) - shift;
    for (int j = 0; j < kLanes; ++j) a[j] += d[j];
    for (int j = 0; j < kLanes; ++j) b[j] += d[j] * d[j];
  }
  for (; i < len; ++i) {
    const double d = static_cast<double>(p[i]) - shift;
    a[i % kLanes] += d;
    b[i % kLanes] += d * d;
  }
  std::copy(a, a + kLanes, a_out);
  std::copy(b, b + kLanes, b_out);
}
static_assert(lowp::kBlock % kLanes == 0, "16-bit blocks keep each element's partial sum");

// Over channel c of x (N, C, HW): s1 = sum (x - shift), s2 = sum (x - shift)^2, in double.
// Each of kLanes partial sums runs over a fixed subset of the elements and they are combined in
// a fixed order, so the result is the same on every run and for any thread count.
template <class T>
void channel_moments(const T* x, int64_t N, int64_t C, int64_t HW, int64_t c, double shift,
                     double& s1, double& s2) {
  double a[kLanes] = {}, b[kLanes] = {};
  for (int64_t n = 0; n < N; ++n) {
    const T* p = x + (n * C + c) * HW;
    if constexpr (kWidenBlocks<T>) {
      lowp::for_blocks(
          p, HW, [&](int64_t, const float* v, int64_t len) { add_moments(v, len, shift, a, b); });
    } else {
      add_moments(p, HW, shift, a, b);
    }
  }
  s1 = 0;
  s2 = 0;
  for (int j = 0; j < kLanes; ++j) {
    s1 += a[j];
    s2 += b[j];
  }
}

// As add_moments, for channel_grad_sums: a += dy, b += dy * (x - mean).
template <class S>
void add_grad_sums(const S* g, const S* p, int64_t len, double mean, double* a_out, double* b_out) {
  double a[kLanes], b[kLanes];
  std::copy(a_out, a_out + kLanes, a);
  std::copy(b_out, b_out + kLanes, b);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    double d[kLanes], e[kLanes];
    for (int j = 0; j < kLanes; ++j) d[j] = static_cast<double>(g[i + j]);
    for (int j = 0; j < kLanes; ++j) e[j] = static_cast<double>(p[i + j]) - mean;
    for (int j = 0; j < kLanes; ++j) a[j] += d[j];
    for (int j = 0; j < kLanes; ++j) b[j] += d[j] * e[j];
  }
  for (; i < len; ++i) {
    const double d = static_cast<double>(g[i]);
    a[i % kLanes] += d;
    b[i % kLanes] += d * (static_cast<double>(p[i]) - mean);
  }
  std::copy(a, a + kLanes, a_out);
  std::copy(b, b + kLanes, b_out);
}

// Over channel c: sum dy and sum dy * (x - mean), in double, as channel_moments.
template <class T>
void channel_grad_sums(const T* dy, const T* x, int64_t N, int64_t C, int64_t HW, int64_t c,
                       double mean, double& sum_dy, double& sum_dy_xmu) {
  double a[kLanes] = {}, b[kLanes] = {};
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dy + (n * C + c) * HW;
    const T* p = x + (n * C + c) * HW;
    if constexpr (lowp::kBlocksFor<T>) {
      lowp::for_blocks2(g, p, HW, [&](int64_t, const float* gv, const float* pv, int64_t len) {
        add_grad_sums(gv, pv, len, mean, a, b);
      });
    } else {
      add_grad_sums(g, p, HW, mean, a, b);
    }
  }
  sum_dy = 0;
  sum_dy_xmu = 0;
  for (int j = 0; j < kLanes; ++j) {
    sum_dy += a[j];
    sum_dy_xmu += b[j];
  }
}

// y = x * a[c] + b[c] over channel c.
template <class T>
void channel_affine(const T* x, T* y, int64_t N, int64_t C, int64_t HW, int64_t c, acc_t<T> a,
                    acc_t<T> b) {
  using A = acc_t<T>;
  for (int64_t n = 0; n < N; ++n) {
    const T* p = x + (n * C + c) * HW;
    T* q = y + (n * C + c) * HW;
    if constexpr (lowp::kBlocksFor<T>) {
      float out[lowp::kBlock];
      lowp::for_blocks(p, HW, [&](int64_t i0, const float* v, int64_t len) {
        for (int64_t i = 0; i < len; ++i) out[i] = v[i] * a + b;
        convert::narrow_span(out, q + i0, len);
      });
    } else {
      for (int64_t i = 0; i < HW; ++i) q[i] = T(A(p[i]) * a + b);
    }
  }
}

// T: the element type of x, y, dy, dx; P: of every per-channel array (T, or f32 beside a 16-bit
// T).
template <class T, class P>
void batchnorm_forward_train_impl(const T* x, const P* gamma, const P* beta, T* y, P* mean,
                                  P* invstd, P* running_mean, P* running_var, int64_t N, int64_t C,
                                  int64_t HW, double momentum, double eps) {
  using A = acc_t<T>;
  const int64_t M = N * HW;
#pragma omp parallel for schedule(static) if (M * C > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    // One pass, shifted by the channel's first element: the shifted sums do not cancel even
    // when a channel's mean is far from zero.
    const double shift = M > 0 ? static_cast<double>(x[c * HW]) : 0.0;
    double s1, s2;
    channel_moments(x, N, C, HW, c, shift, s1, s2);
    const double d = M > 0 ? s1 / static_cast<double>(M) : 0.0;
    const double mu = shift + d;
    const double sq = std::max(0.0, s2 - s1 * d);  // sum (x - mu)^2
    const double var = M > 0 ? sq / static_cast<double>(M) : 0.0;
    const double is = 1.0 / std::sqrt(var + eps);
    mean[c] = static_cast<P>(mu);
    invstd[c] = static_cast<P>(is);
    const double a = static_cast<double>(gamma[c]) * is;
    channel_affine(x, y, N, C, HW, c, static_cast<A>(a),
                   static_cast<A>(static_cast<double>(beta[c]) - mu * a));
    if (running_mean && running_var) {
      const double unbiased = M > 1 ? sq / static_cast<double>(M - 1) : var;
      running_mean[c] = static_cast<P>((1.0 - momentum) * running_mean[c] + momentum * mu);
      running_var[c] = static_cast<P>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

template <class T, class P>
void batchnorm_forward_eval_impl(const T* x, const P* gamma, const P* beta, const P* running_mean,
                                 const P* running_var, T* y, int64_t N, int64_t C, int64_t HW,
                                 double eps) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (N * HW * C > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    const double is = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    const double a = static_cast<double>(gamma[c]) * is;
    const double b = static_cast<double>(beta[c]) - static_cast<double>(running_mean[c]) * a;
    channel_affine(x, y, N, C, HW, c, static_cast<A>(a), static_cast<A>(b));
  }
}

// With xhat = (x - mean) * invstd and M = N*HW elements per channel:
//   dbeta = sum dy, dgamma = sum dy * xhat,
//   dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M).
template <class T, class P>
void batchnorm_backward_impl(const T* dy, const T* x, const P* gamma, const P* mean,
                             const P* invstd, T* dx, P* dgamma, P* dbeta, int64_t N, int64_t C,
                             int64_t HW) {
  const int64_t M = N * HW;
#pragma omp parallel for schedule(static) if (M * C > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    const double mu = static_cast<double>(mean[c]), is = static_cast<double>(invstd[c]);
    double sum_dy, sum_dy_xhat;
    channel_grad_sums(dy, x, N, C, HW, c, mu, sum_dy, sum_dy_xhat);
    sum_dy_xhat *= is;
    if (dbeta) dbeta[c] = static_cast<P>(sum_dy);
    if (dgamma) dgamma[c] = static_cast<P>(sum_dy_xhat);
    if (!dx || M == 0) continue;
    // dx = k * dy + k_x * x + k_0, folded per channel.
    const double k = static_cast<double>(gamma[c]) * is;
    const double mean_dy = sum_dy / static_cast<double>(M);
    const double kx = -k * is * sum_dy_xhat / static_cast<double>(M);
    const double k0 = -k * mean_dy - kx * mu;
    for (int64_t n = 0; n < N; ++n) {
      const T* g = dy + (n * C + c) * HW;
      const T* p = x + (n * C + c) * HW;
      T* q = dx + (n * C + c) * HW;
      if constexpr (lowp::kBlocksFor<T>) {
        float out[lowp::kBlock];
        lowp::for_blocks2(g, p, HW, [&](int64_t i0, const float* gv, const float* pv, int64_t len) {
          for (int64_t i = 0; i < len; ++i) {
            out[i] = static_cast<float>(k * static_cast<double>(gv[i]) +
                                        kx * static_cast<double>(pv[i]) + k0);
          }
          convert::narrow_span(out, q + i0, len);
        });
      } else {
        for (int64_t i = 0; i < HW; ++i) {
          q[i] =
              static_cast<T>(k * static_cast<double>(g[i]) + kx * static_cast<double>(p[i]) + k0);
        }
      }
    }
  }
}

// Eval mode normalizes with constants: dx = dy * gamma / sqrt(running_var + eps).
template <class T, class P>
void batchnorm_backward_eval_impl(const T* dy, const T* x, const P* gamma, const P* running_mean,
                                  const P* running_var, T* dx, P* dgamma, P* dbeta, int64_t N,
                                  int64_t C, int64_t HW, double eps) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (N * HW * C > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    const double is = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    const double mu = static_cast<double>(running_mean[c]);
    if (dgamma || dbeta) {
      double sum_dy, sum_dy_xhat;
      channel_grad_sums(dy, x, N, C, HW, c, mu, sum_dy, sum_dy_xhat);
      if (dbeta) dbeta[c] = static_cast<P>(sum_dy);
      if (dgamma) dgamma[c] = static_cast<P>(sum_dy_xhat * is);
    }
    if (dx) {
      const A k = static_cast<A>(static_cast<double>(gamma[c]) * is);
      for (int64_t n = 0; n < N; ++n) {
        const T* g = dy + (n * C + c) * HW;
        T* q = dx + (n * C + c) * HW;
        if constexpr (lowp::kBlocksFor<T>) {
          float out[lowp::kBlock];
          lowp::for_blocks(g, HW, [&](int64_t i0, const float* v, int64_t len) {
            for (int64_t i = 0; i < len; ++i) out[i] = v[i] * k;
            convert::narrow_span(out, q + i0, len);
          });
        } else {
          for (int64_t i = 0; i < HW; ++i) q[i] = T(A(g[i]) * k);
        }
      }
    }
  }
}
}  // namespace

// The launchers: P = T (f32, f64), or f32 beside a 16-bit T (the _lowp forms).
#define REGEN_BN_LAUNCHERS(suffix, P_OF)                                                           \
  template <class T>                                                                               \
  void batchnorm_forward_train##suffix(const T* x, const P_OF* gamma, const P_OF* beta, T* y,      \
                                       P_OF* mean, P_OF* invstd, P_OF* running_mean,               \
                                       P_OF* running_var, int64_t N, int64_t C, int64_t HW,        \
                                       double momentum, double eps) {                              \
    batchnorm_forward_train_impl<T, P_OF>(x, gamma, beta, y, mean, invstd, running_mean,           \
                                          running_var, N, C, HW, momentum, eps);                   \
  }                                                                                                \
  template <class T>                                                                               \
  void batchnorm_forward_eval##suffix(const T* x, const P_OF* gamma, const P_OF* beta,             \
                                      const P_OF* running_mean, const P_OF* running_var, T* y,     \
                                      int64_t N, int64_t C, int64_t HW, double eps) {              \
    batchnorm_forward_eval_impl<T, P_OF>(x, gamma, beta, running_mean, running_var, y, N, C, HW,   \
                                         eps);                                                     \
  }                                                                                                \
  template <class T>                                                                               \
  void batchnorm_backward##suffix(const T* dy, const T* x, const P_OF* gamma, const P_OF* mean,    \
                                  const P_OF* invstd, T* dx, P_OF* dgamma, P_OF* dbeta, int64_t N, \
                                  int64_t C, int64_t HW) {                                         \
    batchnorm_backward_impl<T, P_OF>(dy, x, gamma, mean, invstd, dx, dgamma, dbeta, N, C, HW);     \
  }                                                                                                \
  template <class T>                                                                               \
  void batchnorm_backward_eval##suffix(const T* dy, const T* x, const P_OF* gamma,                 \
                                       const P_OF* running_mean, const P_OF* running_var, T* dx,   \
                                       P_OF* dgamma, P_OF* dbeta, int64_t N, int64_t C,            \
                                       int64_t HW, double eps) {                                   \
    batchnorm_backward_eval_impl<T, P_OF>(dy, x, gamma, running_mean, running_var, dx, dgamma,     \
                                          dbeta, N, C, HW, eps);                                   \
  }
REGEN_BN_LAUNCHERS(, T)
REGEN_BN_LAUNCHERS(_lowp, float)
#undef REGEN_BN_LAUNCHERS

#define REGEN_INSTANTIATE(T)                                                                     \
  template void batchnorm_forward_train<T>(const T*, const T*, const T*, T*, T*, T*, T*, T*,     \
                                           int64_t, int64_t, int64_t, double, double);           \
  template void batchnorm_forward_eval<T>(const T*, const T*, const T*, const T*, const T*, T*,  \
                                          int64_t, int64_t, int64_t, double);                    \
  template void batchnorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,  \
                                      T*, int64_t, int64_t, int64_t);                            \
  template void batchnorm_backward_eval<T>(const T*, const T*, const T*, const T*, const T*, T*, \
                                           T*, T*, int64_t, int64_t, int64_t, double);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
#undef REGEN_INSTANTIATE

#define REGEN_INSTANTIATE_LOWP(T)                                                                  \
  template void batchnorm_forward_train_lowp<T>(const T*, const float*, const float*, T*, float*,  \
                                                float*, float*, float*, int64_t, int64_t, int64_t, \
                                                double, double);                                   \
  template void batchnorm_forward_eval_lowp<T>(const T*, const float*, const float*, const float*, \
                                               const float*, T*, int64_t, int64_t, int64_t,        \
                                               double);                                            \
  template void batchnorm_backward_lowp<T>(const T*, const T*, const float*, const float*,         \
                                           const float*, T*, float*, float*, int64_t, int64_t,     \
                                           int64_t);                                               \
  template void batchnorm_backward_eval_lowp<T>(const T*, const T*, const float*, const float*,    \
                                                const float*, T*, float*, float*, int64_t,         \
                                                int64_t, int64_t, double);
REGEN_INSTANTIATE_LOWP(bfloat16)
REGEN_INSTANTIATE_LOWP(float16)
#undef REGEN_INSTANTIATE_LOWP

}  // namespace regen::cpu
