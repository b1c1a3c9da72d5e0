// CUDA RMS normalization over the last dimension, float and, as rmsnorm_forward_lowp /
// rmsnorm_backward_lowp, 16-bit x and dy with f32 weight and rstd (declared once for the CPU and
// CUDA beside its op, autograd/ops_rmsnorm.cpp; CPU reference kernels/cpu/rmsnorm.cpp; tested on
// cuda:0 against the op table's f64 reference by tests/cuda/test_cuda_op_table.cpp, and without a
// GPU by scripts/cuda-emu/run.sh optable).
//
// Rows of at most kWarpRowMax elements: one warp per row, kRowsPerBlock rows a block; longer rows:
// one block of kBlockThreads per row. Row sums in float, combined in a fixed order (warp_sum,
// block_sum). dweight: a column kernel, block (32 columns, 8 row groups), each thread summing its
// column over every 8th row in double, the 8 partials combined in order: no atomics and no
// scratch, so the same bits on every run.
#include <type_traits>

#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"
#include "regen/kernels/cuda/common.cuh"

namespace regen::cuda {
namespace {

constexpr int kWarpRowMax = 1024;
constexpr int kRowsPerBlock = 8;
constexpr int kBlockThreads = 256;

// The sum over the kRowThreads threads of one row (a warp, or the whole block).
template <int kRowThreads>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  if constexpr (kRowThreads == 32) {
    return dev::warp_sum(v);
  } else {
    return dev::block_sum(v, scratch);
  }
}

// x, y: (M, N) of T (float, or 16-bit: widened on load, rounded once on store); weight: (N);
// rstd: (M). kRowThreads threads per row, kRows rows per block.
template <class T, int kRowThreads, int kRows>
__global__ void __launch_bounds__(kRowThreads* kRows)
    rms_forward_kernel(const T* x, const float* weight, T* y, float* rstd, int64_t M, int64_t N,
                       float eps) {
  __shared__ float scratch[32];
  const int t = static_cast<int>(threadIdx.x) % kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kRowThreads;
  if (row >= M) return;  // whole warps (kRows > 1) or none (kRows == 1, one block per row)
  const T* xr = x + row * N;
  float sq = 0.0f;
  for (int64_t c = t; c < N; c += kRowThreads) {
    const float v = static_cast<float>(xr[c]);
    sq = fmaf(v, v, sq);
  }
  sq = row_sum<kRowThreads>(sq, scratch);
  const float rs = 1.0f / sqrtf(sq / static_cast<float>(N) + eps);
  T* yr = y + row * N;
  for (int64_t c = t; c < N; c += kRowThreads)
    yr[c] = T(static_cast<float>(xr[c]) * rs * weight[c]);
  if (t == 0) rstd[row] = rs;
}

// dy, x, dx: (M, N); weight: (N); rstd: (M). dx = rstd * (g - xhat * mean(g * xhat)) with
// g = dy * weight, xhat = x * rstd.
template <class T, int kRowThreads, int kRows>
__global__ void __launch_bounds__(kRowThreads* kRows)
    rms_backward_kernel(const T* dy, const T* x, const float* weight, const float* rstd, T* dx,
                        int64_t M, int64_t N) {
  __shared__ float scratch[32];
  const int t = static_cast<int>(threadIdx.x) % kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kRowThreads;
  if (row >= M) return;
  const T *xr = x + row * N, *dyr = dy + row * N;
  const float rs = rstd[row];
  float sum_gx = 0.0f;
  for (int64_t c = t; c < N; c += kRowThreads)
    sum_gx = fmaf(static_cast<float>(dyr[c]) * weight[c], static_cast<float>(xr[c]) * rs, sum_gx);
  const float b = row_sum<kRowThreads>(sum_gx, scratch) / static_cast<float>(N);
  T* dxr = dx + row * N;
  for (int64_t c = t; c < N; c += kRowThreads) {
    dxr[c] = T(rs * (static_cast<float>(dyr[c]) * weight[c] - static_cast<float>(xr[c]) * rs * b));
  }
}

// dweight[c] = sum over rows of dy * x * rstd. Block (32, 8): column blockIdx.x * 32 + x, rows
// y, y + 8, ...
template <class T>
__global__ void __launch_bounds__(256)
    rms_dweight_kernel(const T* dy, const T* x, const float* rstd, float* dweight, int64_t M,
                       int64_t N) {
  __shared__ double part[8][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double acc = 0.0;
  if (c < N) {
    for (int64_t r = threadIdx.y; r < M; r += 8) {
      acc += static_cast<double>(static_cast<float>(dy[r * N + c])) *
             static_cast<double>(static_cast<float>(x[r * N + c]) * rstd[r]);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    double s = part[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += part[k][threadIdx.x];
    dweight[c] = static_cast<float>(s);
  }
}

void check_shape(const char* launcher, int64_t M, int64_t N) {
  REGEN_CHECK(M >= 0 && N > 0 && M <= (int64_t{1} << 31) - 1 && N <= (int64_t{1} << 31) - 1,
              launcher, ": rows ", M, " of ", N, " elements out of range");
}

// One body for float and the 16-bit T: x, y, dy, dx of T; weight, rstd, dweight f32.
template <class T>
void rms_forward(const T* x, const float* weight, T* y, float* rstd, int64_t M, int64_t N,
                 double eps) {
  check_shape("rmsnorm_forward", M, N);
  if (M == 0) return;
  if (N <= kWarpRowMax) {
    const auto blocks = static_cast<unsigned>(detail::ceil_div(M, kRowsPerBlock));
    rms_forward_kernel<T, 32, kRowsPerBlock><<<blocks, 32 * kRowsPerBlock, 0, stream()>>>(
        x, weight, y, rstd, M, N, static_cast<float>(eps));
  } else {
    rms_forward_kernel<T, kBlockThreads, 1>
        <<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(x, weight, y, rstd, M, N,
                                                                   static_cast<float>(eps));
  }
  REGEN_CUDA_LAUNCH_CHECK("rmsnorm_forward");
}

template <class T>
void rms_backward(const T* dy, const T* x, const float* weight, const float* rstd, T* dx,
                  float* dweight, int64_t M, int64_t N) {
  check_shape("rmsnorm_backward", M, N);
  if (dx && M > 0) {
    if (N <= kWarpRowMax) {
      const auto blocks = static_cast<unsigned>(detail::ceil_div(M, kRowsPerBlock));
      rms_backward_kernel<T, 32, kRowsPerBlock>
          <<<blocks, 32 * kRowsPerBlock, 0, stream()>>>(dy, x, weight, rstd, dx, M, N);
    } else {
      rms_backward_kernel<T, kBlockThreads, 1>
          <<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(dy, x, weight, rstd, dx, M, N);
    }
    REGEN_CUDA_LAUNCH_CHECK("rmsnorm_backward");
  }
  if (dweight) {
    const auto tiles = static_cast<unsigned>(detail::ceil_div(N, 32));
    rms_dweight_kernel<T><<<tiles, dim3(32, 8), 0, stream()>>>(dy, x, rstd, dweight, M, N);
    REGEN_CUDA_LAUNCH_CHECK("rmsnorm_backward");
  }
}

}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, int64_t M, int64_t N, double eps) {
  static_assert(std::is_same<T, float>::value, "rmsnorm_forward: the f32 launcher");
  rms_forward(x, weight, y, rstd, M, N, eps);
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                      int64_t M, int64_t N) {
  static_assert(std::is_same<T, float>::value, "rmsnorm_backward: the f32 launcher");
  rms_backward(dy, x, weight, rstd, dx, dweight, M, N);
}

// The 16-bit launchers (declared beside the op, autograd/ops_rmsnorm.cpp): x, y, dy, dx 16-bit;
// weight, rstd, dweight f32; the f32 kernels' expressions on widened elements, one rounding.
template <class T>
void rmsnorm_forward_lowp(const T* x, const float* weight, T* y, float* rstd, int64_t M, int64_t N,
                          double eps) {
  rms_forward(x, weight, y, rstd, M, N, eps);
}
template <class T>
void rmsnorm_backward_lowp(const T* dy, const T* x, const float* weight, const float* rstd, T* dx,
                           float* dweight, int64_t M, int64_t N) {
  rms_backward(dy, x, weight, rstd, dx, dweight, M, N);
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, float*, int64_t, int64_t);
#define REGEN_RMSNORM_HALF(T)                                                                 \
  template void rmsnorm_forward_lowp<T>(const T*, const float*, T*, float*, int64_t, int64_t, \
                                        double);                                              \
  template void rmsnorm_backward_lowp<T>(const T*, const T*, const float*, const float*, T*,  \
                                         float*, int64_t, int64_t);
REGEN_RMSNORM_HALF(bfloat16)
REGEN_RMSNORM_HALF(float16)
#undef REGEN_RMSNORM_HALF

}  // namespace regen::cuda
