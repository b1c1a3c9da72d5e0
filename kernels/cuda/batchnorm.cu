// CUDA batch normalization over (N, C, HW) (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/batchnorm.cpp; test tests/cuda/test_cuda_ops.cpp).
//
// Every per-channel reduction is two kernels with a partition that depends only on the shape:
// bn_partial_kernel (grid: chunks x C) sums a fixed range of the channel's N*HW elements in
// double with a fixed block tree, and a per-channel kernel adds the chunks in order. No atomics.
// Statistics use the sum and sum of squares of x - x[0, c, 0] (a per-channel shift) in double,
// which does not cancel for realistic activations. The per-channel coefficients are computed in
// double with the CPU reference's expressions, and the element-wise passes apply them with
// round-to-nearest intrinsics (no FMA contraction) in the CPU's order; the remaining differences
// come from the summation order of the statistics and from FMA contraction on the host.
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkTarget = 4096;  // elements per reduction block, roughly
constexpr int64_t kMaxChunks = 64;

enum class Sums { stats, backward };

// Channel c = blockIdx.y, chunk = blockIdx.x of the channel's E = N*HW elements.
// stats:    s1 = sum(x - K), s2 = sum((x - K)^2), K = x[0, c, 0]
// backward: s1 = sum(dy),    s2 = sum(dy * (x - center[c]))
// partial: (C, chunks, 2) doubles.
// T: the element type of x and dy (float, or 16-bit, widened as it is read).
template <class T>
__device__ __forceinline__ double wide(const T* p, int64_t i) {
  return static_cast<double>(static_cast<float>(p[i]));
}

template <Sums kind, class T>
__global__ void __launch_bounds__(kThreads)
    bn_partial_kernel(const T* x, const T* dy, const float* center, int64_t C, int64_t HW,
                      int64_t E, int64_t chunk_elems, double* partial) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.y, chunk = blockIdx.x;
  const int64_t e0 = chunk * chunk_elems;
  const int64_t e1 = e0 + chunk_elems < E ? e0 + chunk_elems : E;
  const double shift = kind == Sums::stats ? wide(x, c * HW) : static_cast<double>(center[c]);
  // (n, hw) of this thread's element, advanced by kThreads elements per step without division.
  int64_t e = e0 + threadIdx.x;
  int64_t n = e / HW, hw = e - n * HW;
  const int64_t step_n = kThreads / HW, step_hw = kThreads - step_n * HW;
  double s1 = 0.0, s2 = 0.0;
  for (; e < e1; e += kThreads) {
    const int64_t off = (n * C + c) * HW + hw;
    const double xv = wide(x, off) - shift;
    if (kind == Sums::stats) {
      s1 += xv;
      s2 += xv * xv;
    } else {
      const double g = wide(dy, off);
      s1 += g;
      s2 += g * xv;
    }
    hw += step_hw;
    n += step_n;
    if (hw >= HW) {
      hw -= HW;
      ++n;
    }
  }
  s1 = dev::block_sum(s1, scratch);
  s2 = dev::block_sum(s2, scratch);
  if (threadIdx.x == 0) {
    partial[(c * gridDim.x + chunk) * 2] = s1;
    partial[(c * gridDim.x + chunk) * 2 + 1] = s2;
  }
}

__device__ __forceinline__ double dmul(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ double dadd(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ double dsub(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ double ddiv(double a, double b) {
  return __ddiv_rn(a, b);
}

// One thread per channel: finish the statistics, update the running stats, and form the affine
// coefficients y = x * coef_a[c] + coef_b[c].
template <class T>
__global__ void bn_stats_final_kernel(const T* x, const double* partial, int64_t chunks,
                                      const float* gamma, const float* beta, float* mean,
                                      float* invstd, float* running_mean, float* running_var,
                                      int64_t C, int64_t HW, int64_t E, double momentum, double eps,
                                      float* coef_a, float* coef_b) {
  for (int64_t c = dev::global_thread(); c < C; c += dev::grid_stride()) {
    double s1 = 0.0, s2 = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      s1 += partial[(c * chunks + k) * 2];
      s2 += partial[(c * chunks + k) * 2 + 1];
    }
    double mu = 0.0, var = 0.0;
    if (E > 0) {
      const double shifted_mean = s1 / static_cast<double>(E);
      mu = static_cast<double>(static_cast<float>(x[c * HW])) + shifted_mean;
      var = s2 / static_cast<double>(E) - shifted_mean * shifted_mean;
      if (var < 0.0) var = 0.0;
    }
    const double is = ddiv(1.0, sqrt(dadd(var, eps)));
    mean[c] = static_cast<float>(mu);
    invstd[c] = static_cast<float>(is);
    const double a = dmul(gamma ? static_cast<double>(gamma[c]) : 1.0, is);
    coef_a[c] = static_cast<float>(a);
    coef_b[c] = static_cast<float>(dsub(beta ? static_cast<double>(beta[c]) : 0.0, dmul(mu, a)));
    if (running_mean && running_var) {
      const double unbiased =
          E > 1 ? var * static_cast<double>(E) / static_cast<double>(E - 1) : var;
      running_mean[c] = static_cast<float>(
          dadd(dmul(1.0 - momentum, static_cast<double>(running_mean[c])), dmul(momentum, mu)));
      running_var[c] = static_cast<float>(dadd(
          dmul(1.0 - momentum, static_cast<double>(running_var[c])), dmul(momentum, unbiased)));
    }
  }
}

// Eval: coefficients from the running statistics.
__global__ void bn_eval_coef_kernel(const float* gamma, const float* beta,
                                    const float* running_mean, const float* running_var, int64_t C,
                                    double eps, float* coef_a, float* coef_b) {
  for (int64_t c = dev::global_thread(); c < C; c += dev::grid_stride()) {
    const double is = ddiv(1.0, sqrt(dadd(static_cast<double>(running_var[c]), eps)));
    const double a = dmul(gamma ? static_cast<double>(gamma[c]) : 1.0, is);
    coef_a[c] = static_cast<float>(a);
    coef_b[c] = static_cast<float>(dsub(beta ? static_cast<double>(beta[c]) : 0.0,
                                        dmul(static_cast<double>(running_mean[c]), a)));
  }
}

// x, y: (N, C, HW): y = x * a[c] + b[c]. Index arithmetic in Index (32-bit when it fits).
template <class Index, class T>
__global__ void bn_affine_kernel(const T* x, T* y, const float* a, const float* b, int64_t total,
                                 int64_t C, int64_t HW) {
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const Index c = (static_cast<Index>(i) / static_cast<Index>(HW)) % static_cast<Index>(C);
    y[i] = T(__fadd_rn(__fmul_rn(static_cast<float>(x[i]), a[c]), b[c]));
  }
}

// Training backward, one thread per channel: dgamma, dbeta and the dx coefficients
// dx = k * dy + kx * x + k0 (doubles), with the CPU's expressions.
__global__ void bn_backward_final_kernel(const double* partial, int64_t chunks, const float* gamma,
                                         const float* mean, const float* invstd, int64_t C,
                                         int64_t E, float* dgamma, float* dbeta, double* coef) {
  for (int64_t c = dev::global_thread(); c < C; c += dev::grid_stride()) {
    double sum_dy = 0.0, sum_dy_xmu = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      sum_dy += partial[(c * chunks + k) * 2];
      sum_dy_xmu += partial[(c * chunks + k) * 2 + 1];
    }
    const double mu = static_cast<double>(mean[c]), is = static_cast<double>(invstd[c]);
    const double sum_dy_xhat = dmul(sum_dy_xmu, is);
    if (dbeta) dbeta[c] = static_cast<float>(sum_dy);
    if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xhat);
    if (E == 0) continue;
    const double k = dmul(gamma ? static_cast<double>(gamma[c]) : 1.0, is);
    const double mean_dy = ddiv(sum_dy, static_cast<double>(E));
    const double kx = ddiv(dmul(dmul(-k, is), sum_dy_xhat), static_cast<double>(E));
    const double k0 = dsub(dmul(-k, mean_dy), dmul(kx, mu));
    coef[c * 3] = k;
    coef[c * 3 + 1] = kx;
    coef[c * 3 + 2] = k0;
  }
}

// dy, x, dx: (N, C, HW): dx = (float)(k*dy + kx*x + k0) in double.
template <class Index, class T>
__global__ void bn_backward_apply_kernel(const T* dy, const T* x, T* dx, const double* coef,
                                         int64_t total, int64_t C, int64_t HW) {
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const Index c = (static_cast<Index>(i) / static_cast<Index>(HW)) % static_cast<Index>(C);
    const double k = coef[c * 3], kx = coef[c * 3 + 1], k0 = coef[c * 3 + 2];
    const double g = static_cast<double>(static_cast<float>(dy[i]));
    const double v = static_cast<double>(static_cast<float>(x[i]));
    dx[i] = T(static_cast<float>(dadd(dadd(dmul(k, g), dmul(kx, v)), k0)));
  }
}

// Eval backward, one thread per channel: dgamma, dbeta and k = (float)(gamma / sqrt(var + eps)).
__global__ void bn_backward_eval_final_kernel(const double* partial, int64_t chunks,
                                              const float* gamma, const float* running_var,
                                              int64_t C, double eps, float* dgamma, float* dbeta,
                                              float* k_out) {
  for (int64_t c = dev::global_thread(); c < C; c += dev::grid_stride()) {
    const double is = ddiv(1.0, sqrt(dadd(static_cast<double>(running_var[c]), eps)));
    if (partial) {
      double sum_dy = 0.0, sum_dy_xmu = 0.0;
      for (int64_t k = 0; k < chunks; ++k) {
        sum_dy += partial[(c * chunks + k) * 2];
        sum_dy_xmu += partial[(c * chunks + k) * 2 + 1];
      }
      if (dbeta) dbeta[c] = static_cast<float>(sum_dy);
      if (dgamma) dgamma[c] = static_cast<float>(dmul(sum_dy_xmu, is));
    }
    k_out[c] = static_cast<float>(dmul(gamma ? static_cast<double>(gamma[c]) : 1.0, is));
  }
}

// dy, dx: (N, C, HW): dx = dy * k[c]
template <class Index, class T>
__global__ void bn_scale_kernel(const T* dy, T* dx, const float* k, int64_t total, int64_t C,
                                int64_t HW) {
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const Index c = (static_cast<Index>(i) / static_cast<Index>(HW)) % static_cast<Index>(C);
    dx[i] = T(__fmul_rn(static_cast<float>(dy[i]), k[c]));
  }
}

struct Partition {
  int64_t E = 0, chunks = 1, chunk_elems = 1;
};

Partition partition(int64_t N, int64_t HW) {
  Partition p;
  p.E = N * HW;
  p.chunks = detail::ceil_div(p.E, kChunkTarget);
  if (p.chunks > kMaxChunks) p.chunks = kMaxChunks;
  if (p.chunks < 1) p.chunks = 1;
  p.chunk_elems = detail::ceil_div(p.E, p.chunks);
  if (p.chunk_elems < 1) p.chunk_elems = 1;
  p.chunks = detail::ceil_div(p.E, p.chunk_elems);
  if (p.chunks < 1) p.chunks = 1;
  return p;
}

void check_shape(const char* name, int64_t N, int64_t C, int64_t HW) {
  REGEN_CHECK(N >= 0 && C >= 0 && HW >= 0, name, ": negative shape (", N, ", ", C, ", ", HW, ")");
  REGEN_CHECK(C <= 65535, name, ": ", C,
              " channels are more than the CUDA kernels support (65535)");
}

template <Sums kind, class T>
void launch_partial(const char* name, const T* x, const T* dy, const float* center, int64_t C,
                    int64_t HW, const Partition& p, double* partial) {
  if (p.E == 0) {
    REGEN_CUDA_CHECK(cudaMemsetAsync(
        partial, 0, static_cast<size_t>(C * p.chunks * 2) * sizeof(double), stream()));
    return;
  }
  const dim3 grid(static_cast<unsigned>(p.chunks), static_cast<unsigned>(C));
  bn_partial_kernel<kind, T>
      <<<grid, kThreads, 0, stream()>>>(x, dy, center, C, HW, p.E, p.chunk_elems, partial);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

template <class Kernel, class... Args>
void launch_elementwise(const char* name, int64_t total, Kernel k32, Kernel k64, Args... args) {
  if (total == 0) return;
  if (total <= 0x7fffffff) {
    k32<<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(args...);
  } else {
    k64<<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(args...);
  }
  REGEN_CUDA_LAUNCH_CHECK(name);
}

// x, y: (N, C, HW); gamma, beta, mean, invstd, running_mean, running_var: (C). One body for float
// and the 16-bit T (x, y, dy, dx); every (C) array f32.
template <class T>
void bn_forward_train(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                      float* invstd, float* running_mean, float* running_var, int64_t N, int64_t C,
                      int64_t HW, double momentum, double eps) {
  const char* name = "batchnorm_forward_train";
  check_shape(name, N, C, HW);
  if (C == 0) return;
  const Partition p = partition(N, HW);
  // [partial: C*chunks*2 doubles | coef_a: C floats | coef_b: C floats]
  Workspace ws(detail::device(), static_cast<uint64_t>(C * p.chunks * 2) * sizeof(double) +
                                     2 * static_cast<uint64_t>(C) * sizeof(float));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  double* partial = ws.as<double>();
  float* coef_a = reinterpret_cast<float*>(partial + C * p.chunks * 2);
  float* coef_b = coef_a + C;
  launch_partial<Sums::stats>(name, x, static_cast<const T*>(nullptr), nullptr, C, HW, p, partial);
  bn_stats_final_kernel<T><<<detail::grid_blocks(C, kThreads), kThreads, 0, stream()>>>(
      x, partial, p.chunks, gamma, beta, mean, invstd, running_mean, running_var, C, HW, p.E,
      momentum, eps, coef_a, coef_b);
  REGEN_CUDA_LAUNCH_CHECK(name);
  const int64_t total = p.E * C;
  launch_elementwise(name, total, bn_affine_kernel<uint32_t, T>, bn_affine_kernel<int64_t, T>, x, y,
                     static_cast<const float*>(coef_a), static_cast<const float*>(coef_b), total, C,
                     HW);
}

template <class T>
void bn_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                     const float* running_var, T* y, int64_t N, int64_t C, int64_t HW, double eps) {
  const char* name = "batchnorm_forward_eval";
  check_shape(name, N, C, HW);
  if (C == 0 || N * HW == 0) return;
  Workspace ws(detail::device(), 2 * static_cast<uint64_t>(C) * sizeof(float));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  float* coef_a = ws.as<float>();
  float* coef_b = coef_a + C;
  bn_eval_coef_kernel<<<detail::grid_blocks(C, kThreads), kThreads, 0, stream()>>>(
      gamma, beta, running_mean, running_var, C, eps, coef_a, coef_b);
  REGEN_CUDA_LAUNCH_CHECK(name);
  const int64_t total = N * C * HW;
  launch_elementwise(name, total, bn_affine_kernel<uint32_t, T>, bn_affine_kernel<int64_t, T>, x, y,
                     static_cast<const float*>(coef_a), static_cast<const float*>(coef_b), total, C,
                     HW);
}

// dy, x, dx: (N, C, HW); dx, dgamma, dbeta may be null (not computed).
template <class T>
void bn_backward(const T* dy, const T* x, const float* gamma, const float* mean,
                 const float* invstd, T* dx, float* dgamma, float* dbeta, int64_t N, int64_t C,
                 int64_t HW) {
  const char* name = "batchnorm_backward";
  check_shape(name, N, C, HW);
  if (C == 0) return;
  const Partition p = partition(N, HW);
  // [partial: C*chunks*2 doubles | coef: 3*C doubles]
  Workspace ws(detail::device(), static_cast<uint64_t>(C * p.chunks * 2 + 3 * C) * sizeof(double));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  double* partial = ws.as<double>();
  double* coef = partial + C * p.chunks * 2;
  launch_partial<Sums::backward>(name, x, dy, mean, C, HW, p, partial);
  bn_backward_final_kernel<<<detail::grid_blocks(C, kThreads), kThreads, 0, stream()>>>(
      partial, p.chunks, gamma, mean, invstd, C, p.E, dgamma, dbeta, coef);
  REGEN_CUDA_LAUNCH_CHECK(name);
  if (!dx) return;
  const int64_t total = p.E * C;
  launch_elementwise(name, total, bn_backward_apply_kernel<uint32_t, T>,
                     bn_backward_apply_kernel<int64_t, T>, dy, x, dx,
                     static_cast<const double*>(coef), total, C, HW);
}

template <class T>
void bn_backward_eval(const T* dy, const T* x, const float* gamma, const float* running_mean,
                      const float* running_var, T* dx, float* dgamma, float* dbeta, int64_t N,
                      int64_t C, int64_t HW, double eps) {
  const char* name = "batchnorm_backward_eval";
  check_shape(name, N, C, HW);
  if (C == 0) return;
  const Partition p = partition(N, HW);
  const bool sums = dgamma || dbeta;
  Workspace ws(detail::device(),
               (sums ? static_cast<uint64_t>(C * p.chunks * 2) * sizeof(double) : 0) +
                   static_cast<uint64_t>(C) * sizeof(float));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  double* partial = sums ? ws.as<double>() : nullptr;
  float* k = sums ? reinterpret_cast<float*>(partial + C * p.chunks * 2) : ws.as<float>();
  if (sums) launch_partial<Sums::backward>(name, x, dy, running_mean, C, HW, p, partial);
  bn_backward_eval_final_kernel<<<detail::grid_blocks(C, kThreads), kThreads, 0, stream()>>>(
      partial, p.chunks, gamma, running_var, C, eps, dgamma, dbeta, k);
  REGEN_CUDA_LAUNCH_CHECK(name);
  if (!dx) return;
  const int64_t total = p.E * C;
  launch_elementwise(name, total, bn_scale_kernel<uint32_t, T>, bn_scale_kernel<int64_t, T>, dy, dx,
                     static_cast<const float*>(k), total, C, HW);
}

}  // namespace

void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y,
                             float* mean, float* invstd, float* running_mean, float* running_var,
                             int64_t N, int64_t C, int64_t HW, double momentum, double eps) {
  bn_forward_train(x, gamma, beta, y, mean, invstd, running_mean, running_var, N, C, HW, momentum,
                   eps);
}
void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y,
                            int64_t N, int64_t C, int64_t HW, double eps) {
  bn_forward_eval(x, gamma, beta, running_mean, running_var, y, N, C, HW, eps);
}
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t N,
                        int64_t C, int64_t HW) {
  bn_backward(dy, x, gamma, mean, invstd, dx, dgamma, dbeta, N, C, HW);
}
void batchnorm_backward_eval(const float* dy, const float* x, const float* gamma,
                             const float* running_mean, const float* running_var, float* dx,
                             float* dgamma, float* dbeta, int64_t N, int64_t C, int64_t HW,
                             double eps) {
  bn_backward_eval(dy, x, gamma, running_mean, running_var, dx, dgamma, dbeta, N, C, HW, eps);
}

// The 16-bit launchers (declared beside the op, autograd/ops_batchnorm.cpp): x, y, dy, dx bf16 or
// f16, widened as they are read; statistics, parameters and their gradients f32 (in double where
// the float kernels are); y and dx rounded once. Their dry paths are the float launchers'.
template <class T>
void batchnorm_forward_train_lowp(const T* x, const float* gamma, const float* beta, T* y,
                                  float* mean, float* invstd, float* running_mean,
                                  float* running_var, int64_t N, int64_t C, int64_t HW,
                                  double momentum, double eps) {
  bn_forward_train(x, gamma, beta, y, mean, invstd, running_mean, running_var, N, C, HW, momentum,
                   eps);
}
template <class T>
void batchnorm_forward_eval_lowp(const T* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, T* y,
                                 int64_t N, int64_t C, int64_t HW, double eps) {
  bn_forward_eval(x, gamma, beta, running_mean, running_var, y, N, C, HW, eps);
}
template <class T>
void batchnorm_backward_lowp(const T* dy, const T* x, const float* gamma, const float* mean,
                             const float* invstd, T* dx, float* dgamma, float* dbeta, int64_t N,
                             int64_t C, int64_t HW) {
  bn_backward(dy, x, gamma, mean, invstd, dx, dgamma, dbeta, N, C, HW);
}
template <class T>
void batchnorm_backward_eval_lowp(const T* dy, const T* x, const float* gamma,
                                  const float* running_mean, const float* running_var, T* dx,
                                  float* dgamma, float* dbeta, int64_t N, int64_t C, int64_t HW,
                                  double eps) {
  bn_backward_eval(dy, x, gamma, running_mean, running_var, dx, dgamma, dbeta, N, C, HW, eps);
}
#define REGEN_BATCHNORM_HALF(T)                                                                    \
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
REGEN_BATCHNORM_HALF(bfloat16)
REGEN_BATCHNORM_HALF(float16)
#undef REGEN_BATCHNORM_HALF

}  // namespace regen::cuda
