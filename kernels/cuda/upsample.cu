// CUDA 2x upsampling (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/upsample.cpp, which derives the bilinear weights; test tests/cuda/test_cuda_ops.cpp).
//
// Forward: one thread per output element. Backward gathers: one thread per input element sums the
// outputs that read it (2 x 2 for nearest, at most 4 x 4 for bilinear) in the CPU's order, so no
// atomics are needed. Products and sums use round-to-nearest intrinsics (no FMA contraction), in
// the CPU's expression order: nearest is bit-identical to the CPU, bilinear too unless the host
// compiler contracts its multiply-adds. Indices inside a plane are 32-bit (checked).
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

struct Planes {
  int64_t NC;
  int H, W;
};

Planes params(const char* name, int64_t NC, int64_t H, int64_t W) {
  REGEN_CHECK(NC >= 0 && H > 0 && W > 0, name, ": bad shape NC=", NC, " H=", H, " W=", W);
  REGEN_CHECK(4 * H * W <= 0x7fffffff, name, ": planes of ", H, "x", W, " are too large");
  return {NC, static_cast<int>(H), static_cast<int>(W)};
}

// Output i of an axis of extent n: input indices i0, i1 and the weight of i1 (see upsample.cpp).
__device__ __forceinline__ void source(int i, int n, int& i0, int& i1, float& l1) {
  const int k = i >> 1;
  if (i & 1) {
    i0 = k;
    l1 = 0.25f;
  } else if (k == 0) {
    i0 = 0;
    l1 = 0.0f;
  } else {
    i0 = k - 1;
    l1 = 0.75f;
  }
  i1 = i0 < n - 1 ? i0 + 1 : i0;
}

// Outputs [lo, lo + count) that read input h of an axis of extent n, and their weights.
__device__ __forceinline__ int readers(int h, int n, int& lo, float (&w)[4]) {
  int count = 0;
  lo = h >= 1 ? 2 * h - 1 : 0;
  if (h >= 1) w[count++] = 0.25f;
  w[count++] = h == 0 ? 1.0f : 0.75f;
  w[count++] = h == n - 1 ? 1.0f : 0.75f;
  if (h < n - 1) w[count++] = 0.25f;
  return count;
}

// x: (NC, H, W) -> y: (NC, 2H, 2W)
// A 16-bit element widened to f32 (float as is).
template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i) {
  return static_cast<float>(p[i]);
}

template <class T>
__global__ void nearest_forward_kernel(const T* x, T* y, Planes s) {
  const int W2 = 2 * s.W, plane = 4 * s.H * s.W;
  const int64_t total = s.NC * plane;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t p = i / plane;
    const int hw = static_cast<int>(i - p * plane), oh = hw / W2, ow = hw - oh * W2;
    y[i] = x[p * s.H * s.W + (oh >> 1) * s.W + (ow >> 1)];  // a copy: the same bits
  }
}

// dy: (NC, 2H, 2W) -> dx: (NC, H, W), each 2x2 block summed as (top pair) + (bottom pair).
template <class T>
__global__ void nearest_backward_kernel(const T* dy, T* dx, Planes s) {
  const int W2 = 2 * s.W, plane = s.H * s.W;
  const int64_t total = s.NC * plane;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t p = i / plane;
    const int hw = static_cast<int>(i - p * plane), h = hw / s.W, w = hw - h * s.W;
    const T* top = dy + p * 4 * plane + (2 * h) * W2 + 2 * w;
    const T* bottom = top + W2;
    dx[i] =
        T(__fadd_rn(__fadd_rn(ld(top, 0), ld(top, 1)), __fadd_rn(ld(bottom, 0), ld(bottom, 1))));
  }
}

// x: (NC, H, W) -> y: (NC, 2H, 2W)
template <class T>
__global__ void bilinear_forward_kernel(const T* x, T* y, Planes s) {
  const int W2 = 2 * s.W, plane = 4 * s.H * s.W;
  const int64_t total = s.NC * plane;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t p = i / plane;
    const int hw = static_cast<int>(i - p * plane), oh = hw / W2, ow = hw - oh * W2;
    int h0, h1, w0, w1;
    float lh1, lw1;
    source(oh, s.H, h0, h1, lh1);
    source(ow, s.W, w0, w1, lw1);
    const float lh0 = 1.0f - lh1, lw0 = 1.0f - lw1;
    const T* r0 = x + p * s.H * s.W + h0 * s.W;
    const T* r1 = x + p * s.H * s.W + h1 * s.W;
    const float top = __fadd_rn(__fmul_rn(lw0, ld(r0, w0)), __fmul_rn(lw1, ld(r0, w1)));
    const float bottom = __fadd_rn(__fmul_rn(lw0, ld(r1, w0)), __fmul_rn(lw1, ld(r1, w1)));
    y[i] = T(__fadd_rn(__fmul_rn(lh0, top), __fmul_rn(lh1, bottom)));
  }
}

// dy: (NC, 2H, 2W) -> dx: (NC, H, W), gathered row by row of dy.
template <class T>
__global__ void bilinear_backward_kernel(const T* dy, T* dx, Planes s) {
  const int W2 = 2 * s.W, plane = s.H * s.W;
  const int64_t total = s.NC * plane;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t p = i / plane;
    const int hw = static_cast<int>(i - p * plane), h = hw / s.W, w = hw - h * s.W;
    int oh0, ow0;
    float wh[4], ww[4];
    const int nh = readers(h, s.H, oh0, wh), nw = readers(w, s.W, ow0, ww);
    const T* g = dy + p * 4 * plane;
    float acc = 0.0f;
    for (int a = 0; a < nh; ++a) {
      const T* row = g + (oh0 + a) * W2 + ow0;
      float part = 0.0f;
      for (int b = 0; b < nw; ++b) part = __fadd_rn(part, __fmul_rn(ww[b], ld(row, b)));
      acc = __fadd_rn(acc, __fmul_rn(wh[a], part));
    }
    dx[i] = T(acc);
  }
}

}  // namespace

template <class T>
void upsample2x_nearest_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W) {
  const Planes s = params("upsample2x_nearest_forward", NC, H, W);
  const int64_t total = NC * 4 * H * W;
  if (total == 0) return;
  nearest_forward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(x, y, s);
  REGEN_CUDA_LAUNCH_CHECK("upsample2x_nearest_forward");
}

template <class T>
void upsample2x_nearest_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W) {
  const Planes s = params("upsample2x_nearest_backward", NC, H, W);
  const int64_t total = NC * H * W;
  if (total == 0) return;
  nearest_backward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(dy, dx, s);
  REGEN_CUDA_LAUNCH_CHECK("upsample2x_nearest_backward");
}

template <class T>
void upsample2x_bilinear_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W) {
  const Planes s = params("upsample2x_bilinear_forward", NC, H, W);
  const int64_t total = NC * 4 * H * W;
  if (total == 0) return;
  bilinear_forward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(x, y, s);
  REGEN_CUDA_LAUNCH_CHECK("upsample2x_bilinear_forward");
}

template <class T>
void upsample2x_bilinear_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W) {
  const Planes s = params("upsample2x_bilinear_backward", NC, H, W);
  const int64_t total = NC * H * W;
  if (total == 0) return;
  bilinear_backward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(dy, dx, s);
  REGEN_CUDA_LAUNCH_CHECK("upsample2x_bilinear_backward");
}

// The float launchers, and the 16-bit forms (each output's f32 value rounded once).
#define REGEN_UPSAMPLE(T)                                                                \
  template void upsample2x_nearest_forward<T>(const T*, T*, int64_t, int64_t, int64_t);  \
  template void upsample2x_nearest_backward<T>(const T*, T*, int64_t, int64_t, int64_t); \
  template void upsample2x_bilinear_forward<T>(const T*, T*, int64_t, int64_t, int64_t); \
  template void upsample2x_bilinear_backward<T>(const T*, T*, int64_t, int64_t, int64_t);
REGEN_UPSAMPLE(bfloat16)
REGEN_UPSAMPLE(float16)
#undef REGEN_UPSAMPLE
void upsample2x_nearest_forward(const float* x, float* y, int64_t NC, int64_t H, int64_t W) {
  upsample2x_nearest_forward<float>(x, y, NC, H, W);
}
void upsample2x_nearest_backward(const float* dy, float* dx, int64_t NC, int64_t H, int64_t W) {
  upsample2x_nearest_backward<float>(dy, dx, NC, H, W);
}
void upsample2x_bilinear_forward(const float* x, float* y, int64_t NC, int64_t H, int64_t W) {
  upsample2x_bilinear_forward<float>(x, y, NC, H, W);
}
void upsample2x_bilinear_backward(const float* dy, float* dx, int64_t NC, int64_t H, int64_t W) {
  upsample2x_bilinear_backward<float>(dy, dx, NC, H, W);
}

}  // namespace regen::cuda
