// CUDA softmax over the last dimension (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/softmax.cpp; test tests/cuda/test_cuda_ops.cpp).
//
// Rows of up to 1024 columns go one warp per row, the row held in registers (one global read);
// longer rows go one block per row and are read three times (max, sum, write; the re-reads hit
// L2). Reductions are butterflies with a fixed order, so results are deterministic.
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// x, y: (M, N), N <= 32 * kPerLane; one warp per row.
template <class T, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    softmax_warp_kernel(const T* x, T* y, int64_t M, int N) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= M) return;  // whole warps leave together
  const T* xr = x + row * N;
  float v[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + 32 * k;
    v[k] = c < N ? static_cast<float>(xr[c]) : -INFINITY;
    mx = fmaxf(mx, v[k]);
  }
  mx = dev::warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    v[k] = lane + 32 * k < N ? expf(v[k] - mx) : 0.0f;
    sum += v[k];
  }
  sum = dev::warp_sum(sum);
  const float inv = 1.0f / sum;
  T* yr = y + row * N;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + 32 * k;
    if (c < N) yr[c] = T(v[k] * inv);
  }
}

// x, y: (M, N), one block per row.
template <class T>
__global__ void __launch_bounds__(kThreads) softmax_block_kernel(const T* x, T* y, int64_t N) {
  __shared__ float scratch[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * N;
  T* yr = y + static_cast<int64_t>(blockIdx.x) * N;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < N; c += kThreads) mx = fmaxf(mx, static_cast<float>(xr[c]));
  mx = dev::block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < N; c += kThreads) sum += expf(static_cast<float>(xr[c]) - mx);
  sum = dev::block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t c = threadIdx.x; c < N; c += kThreads)
    yr[c] = T(expf(static_cast<float>(xr[c]) - mx) * inv);
}

// dy, y, dx: (M, N); dx = y * (dy - <dy, y>), one warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_warp_kernel(const T* dy, const T* y, T* dx, int64_t M, int N) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= M) return;
  const T *dyr = dy + row * N, *yr = y + row * N;
  float dot = 0.0f;
  for (int c = lane; c < N; c += 32) dot += static_cast<float>(dyr[c]) * static_cast<float>(yr[c]);
  dot = dev::warp_sum(dot);
  T* dxr = dx + row * N;
  for (int c = lane; c < N; c += 32)
    dxr[c] = T(static_cast<float>(yr[c]) * (static_cast<float>(dyr[c]) - dot));
}

// One block per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_block_kernel(const T* dy, const T* y, T* dx, int64_t N) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * N;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < N; c += kThreads)
    dot += static_cast<float>(dy[base + c]) * static_cast<float>(y[base + c]);
  dot = dev::block_sum(dot, scratch);
  for (int64_t c = threadIdx.x; c < N; c += kThreads)
    dx[base + c] = T(static_cast<float>(y[base + c]) * (static_cast<float>(dy[base + c]) - dot));
}

void check_shape(const char* name, int64_t M, int64_t N) {
  REGEN_CHECK(M >= 0 && N >= 0, name, ": negative shape (", M, ", ", N, ")");
  REGEN_CHECK(M <= 0x7fffffffLL * kWarpsPerBlock, name, ": ", M, " rows are too many");
}

}  // namespace

// x, y: (M, N); float or 16-bit T (f32 max, exponentials and sums; one rounding on store).
template <class T>
void softmax_forward(const T* x, T* y, int64_t M, int64_t N) {
  check_shape("softmax_forward", M, N);
  if (M == 0 || N == 0) return;
  const unsigned warp_blocks = static_cast<unsigned>(detail::ceil_div(M, kWarpsPerBlock));
  if (N <= 128) {
    softmax_warp_kernel<T, 4><<<warp_blocks, kThreads, 0, stream()>>>(x, y, M, static_cast<int>(N));
  } else if (N <= 1024) {
    softmax_warp_kernel<T, 32>
        <<<warp_blocks, kThreads, 0, stream()>>>(x, y, M, static_cast<int>(N));
  } else {
    REGEN_CHECK(M <= 0x7fffffff, "softmax_forward: ", M, " rows are too many");
    softmax_block_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, stream()>>>(x, y, N);
  }
  REGEN_CUDA_LAUNCH_CHECK("softmax_forward");
}

// dy, y, dx: (M, N)
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t M, int64_t N) {
  check_shape("softmax_backward", M, N);
  if (M == 0 || N == 0) return;
  if (N <= 1024) {
    const unsigned blocks = static_cast<unsigned>(detail::ceil_div(M, kWarpsPerBlock));
    softmax_backward_warp_kernel<T>
        <<<blocks, kThreads, 0, stream()>>>(dy, y, dx, M, static_cast<int>(N));
  } else {
    REGEN_CHECK(M <= 0x7fffffff, "softmax_backward: ", M, " rows are too many");
    softmax_backward_block_kernel<T>
        <<<static_cast<unsigned>(M), kThreads, 0, stream()>>>(dy, y, dx, N);
  }
  REGEN_CUDA_LAUNCH_CHECK("softmax_backward");
}

void softmax_forward(const float* x, float* y, int64_t M, int64_t N) {
  softmax_forward<float>(x, y, M, N);
}
void softmax_backward(const float* dy, const float* y, float* dx, int64_t M, int64_t N) {
  softmax_backward<float>(dy, y, dx, M, N);
}
template void softmax_forward<bfloat16>(const bfloat16*, bfloat16*, int64_t, int64_t);
template void softmax_forward<float16>(const float16*, float16*, int64_t, int64_t);
template void softmax_backward<bfloat16>(const bfloat16*, const bfloat16*, bfloat16*, int64_t,
                                         int64_t);
template void softmax_backward<float16>(const float16*, const float16*, float16*, int64_t, int64_t);

}  // namespace regen::cuda
