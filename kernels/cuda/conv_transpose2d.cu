// CUDA transposed convolution (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/conv_transpose2d.cpp; test tests/cuda/test_cuda_ops.cpp). As on the CPU, each pass
// is a pass of the conv2d that s describes, run by the conv2d launchers (native implicit GEMM or
// cuDNN, whichever set_conv_algo chose): forward = conv2d backward-data (+ bias), backward-data =
// conv2d forward, backward-filter = conv2d backward-filter with dy and x as its input and output
// gradient. Bias: an element-wise add per plane; dbias: one block per channel, a fixed-order block
// reduction in double (no atomics: the same bits on every run). The dry path (kernels.h) is
// conv2d's: its passes request their workspaces; the bias kernels take none and are skipped.
// 16-bit tensors (bf16, f16) take conv2d's 16-bit passes (f32 inside, one rounding per element);
// the forward adds the bias in f32 before that rounding (conv2d_backward_data_with_bias), and dbias
// is summed in double and rounded once, as kernels/cpu/conv_transpose2d.cpp does.
#include "regen/core/dry_run.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

// y: (N, C, HW) += bias[c]
__global__ void add_bias_kernel(float* y, const float* bias, int64_t C, int64_t HW, int64_t total) {
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    y[i] = __fadd_rn(y[i], bias[(i / HW) % C]);
  }
}

// dy: (N, C, HW) -> dbias: (C); block c sums its channel, image by image, each thread a fixed
// stride of every plane, in double, rounded to f32 (then to E).
template <class E>
__global__ void __launch_bounds__(kThreads)
    channel_sum_kernel(const E* dy, E* dbias, int64_t N, int64_t C, int64_t HW) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  double s = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const E* plane = dy + (n * C + c) * HW;
    for (int64_t j = threadIdx.x; j < HW; j += kThreads)
      s += static_cast<double>(static_cast<float>(plane[j]));
  }
  s = dev::block_sum(s, scratch);
  if (threadIdx.x == 0) dbias[c] = E(static_cast<float>(s));
}

template <class E>
void channel_sum(const E* dy, E* dbias, const ConvShape& s) {
  REGEN_CHECK(s.C > 0 && s.C <= 0x7fffffff, "conv_transpose2d_backward_filter: ", s.C,
              " output channels");
  if (dry_run_active()) return;
  channel_sum_kernel<E>
      <<<static_cast<unsigned>(s.C), kThreads, 0, stream()>>>(dy, dbias, s.N, s.C, s.H * s.W);
  REGEN_CUDA_LAUNCH_CHECK("conv_transpose2d_backward_filter (dbias)");
}

}  // namespace

void conv_transpose2d_forward(const float* x, const float* w, const float* bias, float* y,
                              const ConvShape& s) {
  conv2d_backward_data(x, w, y, s);
  if (!bias || dry_run_active()) return;
  const int64_t hw = s.H * s.W, total = s.N * s.C * hw;
  if (total == 0) return;
  add_bias_kernel<<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(y, bias, s.C, hw,
                                                                                   total);
  REGEN_CUDA_LAUNCH_CHECK("conv_transpose2d_forward (bias)");
}

void conv_transpose2d_backward_data(const float* dy, const float* w, float* dx,
                                    const ConvShape& s) {
  conv2d_forward(dy, w, nullptr, dx, s);
}

void conv_transpose2d_backward_filter(const float* x, const float* dy, float* dw, float* dbias,
                                      const ConvShape& s) {
  if (dw) conv2d_backward_filter(dy, x, dw, nullptr, s);
  if (dbias) channel_sum(dy, dbias, s);
}

// The 16-bit forms (cuda_kernels.h).
template <class T>
void conv_transpose2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  conv2d_backward_data_with_bias<T>(x, w, bias, y, s);
}

template <class T>
void conv_transpose2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  conv2d_forward<T>(dy, w, nullptr, dx, s);
}

template <class T>
void conv_transpose2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias,
                                      const ConvShape& s) {
  if (dw) conv2d_backward_filter<T>(dy, x, dw, nullptr, s);
  if (dbias) channel_sum(dy, dbias, s);
}

#define REGEN_CONV_TRANSPOSE_HALF(T)                                                             \
  template void conv_transpose2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv_transpose2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv_transpose2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_CONV_TRANSPOSE_HALF(bfloat16)
REGEN_CONV_TRANSPOSE_HALF(float16)
#undef REGEN_CONV_TRANSPOSE_HALF

}  // namespace regen::cuda
