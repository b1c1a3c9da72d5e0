// conv2d: the op over the kernels of kernels/cpu/conv2d.cpp (and their CUDA counterparts).
// bf16 and f16 (autocast's class low): 16-bit x, weight and bias in, 16-bit y out, products and
// sums in f32 (the kernels round once per element); dx and dw have the operands' dtype. Saves the
// 16-bit x and weight. Tests of the 16-bit path: tests/test_amp_gemm_ops.cpp (CPU),
// tests/cuda/test_cuda_ops.cpp and test_cuda_autograd.cpp (CUDA against the CPU).
// Gradient checks: tests/test_gradcheck_vision.cpp; forward values and errors:
// tests/test_ops_vision.cpp.
#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
ConvShape conv_shape(const Shape& x, const Shape& w, const Conv2dAttrs& a) {
  return make_conv_shape(x[0], x[1], x[2], x[3], w[0], w[2], w[3], a.stride_h, a.stride_w, a.pad_h,
                         a.pad_w);
}

template <class T>
void conv_fwd(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2];
  const ConvShape s = conv_shape(x.shape(), w.shape(), c.attr<Conv2dAttrs>());
  Tensor y = empty({s.N, s.K, s.P, s.Q}, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, conv2d_forward, x.data<T>(), w.data<T>(),
               b.defined() ? b.data<T>() : nullptr, y.data<T>(), s);
  c.outputs = {y};
}
void conv_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "conv2d", conv_fwd, c);
}

// The bias gradient alone (the weight needs none, e.g. a frozen weight): dbias[k] is the sum of
// dy over images and pixels, as plane sums dy (N*K, PQ) * ones (PQ) and then a column sum over
// images, instead of running the filter-gradient GEMM for a dw nobody reads. The plane sums run
// in T (the filter-gradient launcher sums in double), so the two paths agree to rounding.
template <class T>
Tensor conv_bias_grad(const Tensor& dy, const ConvShape& s) {
  const Device dev = dy.device();
  const int64_t pq = s.P * s.Q;
  Workspace ones(dev, static_cast<uint64_t>(pq) * sizeof(T));
  Workspace plane_sums(dev, static_cast<uint64_t>(s.N * s.K) * sizeof(T));
  REGEN_LAUNCH(dev, T, fill, ones.as<T>(), pq, T(1));
  // plane_sums: (N*K, 1) = dy: (N*K, PQ) * ones: (PQ, 1)
  REGEN_LAUNCH(dev, T, gemm, false, false, s.N * s.K, int64_t{1}, pq, T(1), dy.data<T>(), pq,
               ones.as<T>(), int64_t{1}, T(0), plane_sums.as<T>(), int64_t{1});
  Tensor db = empty({s.K}, dy.dtype(), dev);
  // db: (K) = column sums of plane_sums viewed as (N, K)
  REGEN_LAUNCH(dev, T, sum_rows, plane_sums.as<T>(), db.data<T>(), s.N, s.K);
  return db;
}

template <class T>
void conv_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), w = c.saved_input(1);
  const Tensor& dy = c.grad_output(0);
  const ConvShape s = conv_shape(x.shape(), w.shape(), c.attr<Conv2dAttrs>());
  const Device dev = dy.device();
  if (c.needs_grad(0)) {
    Tensor dx = empty_like(x);
    REGEN_LAUNCH(dev, T, conv2d_backward_data, dy.data<T>(), w.data<T>(), dx.data<T>(), s);
    c.set_grad_input(0, dx);
  }
  const bool need_bias = c.attr<Conv2dAttrs>().has_bias && c.needs_grad(2);
  if (c.needs_grad(1)) {
    Tensor dw = empty_like(w);
    Tensor db = need_bias ? empty({s.K}, dy.dtype(), dev) : Tensor();
    REGEN_LAUNCH(dev, T, conv2d_backward_filter, x.data<T>(), dy.data<T>(), dw.data<T>(),
                 need_bias ? db.data<T>() : nullptr, s);
    c.set_grad_input(1, dw);
    if (need_bias) c.set_grad_input(2, db);
  } else if (need_bias) {
    if constexpr (is_half_v<T>) {  // the 16-bit filter launcher sums dbias alone (dw null)
      Tensor db = empty({s.K}, dy.dtype(), dev);
      REGEN_LAUNCH(dev, T, conv2d_backward_filter, x.data<T>(), dy.data<T>(),
                   static_cast<T*>(nullptr), db.data<T>(), s);
      c.set_grad_input(2, db);
    } else {
      c.set_grad_input(2, conv_bias_grad<T>(dy, s));
    }
  }
}
void conv_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "conv2d backward", conv_bwd, c);
}
void conv_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1);
}
constexpr OpDef kConv2d{"conv2d", 1, 1, false, conv_forward, conv_backward, conv_saves};
REGEN_REGISTER_OP(conv2d, kConv2d);
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
              int64_t padding) {
  return conv2d(x, weight, bias, stride, stride, padding, padding);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride_h,
              int64_t stride_w, int64_t pad_h, int64_t pad_w) {
  check_defined("conv2d", x, "input");
  check_defined("conv2d", weight, "weight");
  check_floating("conv2d", x);
  check_same_dtype_or_autocast("conv2d", x, weight);
  REGEN_CHECK(x.dim() == 4, "conv2d: input ", sh(x.shape()), " must be 4-D (N, C, H, W)");
  REGEN_CHECK(weight.dim() == 4, "conv2d: weight ", sh(weight.shape()),
              " must be 4-D (K, C, R, S)");
  REGEN_CHECK(x.size(1) == weight.size(1), "conv2d: input ", sh(x.shape()), " has ", x.size(1),
              " channels but weight ", sh(weight.shape()), " expects ", weight.size(1));
  if (bias.defined()) {
    check_same_dtype_or_autocast("conv2d", x, bias);
    REGEN_CHECK(bias.shape() == Shape{weight.size(0)}, "conv2d: bias ", sh(bias.shape()),
                " does not match weight ", sh(weight.shape()), " (expected [", weight.size(0),
                "])");
  }
  REGEN_CHECK(stride_h > 0 && stride_w > 0, "conv2d: stride ", stride_h, "x", stride_w,
              " must be positive (input ", sh(x.shape()), ", weight ", sh(weight.shape()), ")");
  REGEN_CHECK(pad_h >= 0 && pad_w >= 0, "conv2d: padding ", pad_h, "x", pad_w,
              " must be non-negative (input ", sh(x.shape()), ", weight ", sh(weight.shape()), ")");
  REGEN_CHECK(x.size(2) + 2 * pad_h >= weight.size(2) && x.size(3) + 2 * pad_w >= weight.size(3),
              "conv2d: kernel ", weight.size(2), "x", weight.size(3), " of weight ",
              sh(weight.shape()), " is larger than input ", sh(x.shape()), " padded by ", pad_h,
              "x", pad_w);
  const Conv2dAttrs a{stride_h, stride_w, pad_h, pad_w, bias.defined()};
  return apply_op(OpKind::conv2d, a, {x, weight, bias})[0];
}

}  // namespace regen
