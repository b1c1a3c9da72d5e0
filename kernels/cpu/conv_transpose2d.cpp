// CPU transposed convolution (declared in kernels/kernels.h). A transposed convolution is the
// adjoint of a conv2d, so each pass is one of conv2d's passes (kernels/cpu/conv2d.cpp) on the
// ConvShape of that conv2d (make_conv_transpose_shape):
//   forward          y  = conv2d backward-data of x with w            (GEMM + col2im), + bias
//   backward-data    dx = conv2d forward of dy with w                 (implicit-im2col GEMM)
//   backward-filter  dw = conv2d backward-filter, dy as its input and x as its output gradient
// The bias terms are per-channel loops: y += bias[c] per plane, dbias[c] = the sum of dy's planes
// of channel c over images in order, in double (deterministic for any thread count). In a dry run
// (kernels.h, kDryRunLaunchers) only conv2d's passes run, on their dry path; the bias loops do not.
// 16-bit tensors (bf16, f16) take conv2d's 16-bit passes (f32 products and sums, one rounding per
// element); the forward adds the bias in f32 before that rounding (conv2d_lowp.h).
// Tests: tests/test_amp_gemm_ops.cpp (16-bit), tests/test_ops_upsample.cpp (against scatter loops
// and PyTorch values), tests/test_gradcheck_upsample.cpp.
#include <omp.h>

#include "regen/kernels/cpu/conv2d_lowp.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements; below this one thread is faster
}  // namespace

template <class T>
void conv_transpose2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  if constexpr (is_half_v<T>) {
    conv2d_backward_data_with_bias<T>(x, w, bias, y, s);
  } else {
    conv2d_backward_data<T>(x, w, y, s);
    if (!bias || dry_run_active()) return;
    const int64_t planes = s.N * s.C, hw = s.H * s.W;
#pragma omp parallel for schedule(static) if (planes * hw > kParallelMin)
    for (int64_t i = 0; i < planes; ++i) {
      const T b = bias[i % s.C];
      T* plane = y + i * hw;
      for (int64_t j = 0; j < hw; ++j) plane[j] += b;
    }
  }
}

template <class T>
void conv_transpose2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  conv2d_forward<T>(dy, w, nullptr, dx, s);
}

template <class T>
void conv_transpose2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias,
                                      const ConvShape& s) {
  if (dw) conv2d_backward_filter<T>(dy, x, dw, nullptr, s);
  if (!dbias || dry_run_active()) return;
  const int64_t hw = s.H * s.W;
#pragma omp parallel for schedule(static) if (s.N * s.C * hw > kParallelMin)
  for (int64_t c = 0; c < s.C; ++c) {
    double acc = 0;
    for (int64_t n = 0; n < s.N; ++n) {
      const T* plane = dy + (n * s.C + c) * hw;
      for (int64_t j = 0; j < hw; ++j) acc += static_cast<double>(static_cast<acc_t<T>>(plane[j]));
    }
    dbias[c] = T(static_cast<acc_t<T>>(acc));
  }
}

#define REGEN_INSTANTIATE(T)                                                                     \
  template void conv_transpose2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv_transpose2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv_transpose2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu
