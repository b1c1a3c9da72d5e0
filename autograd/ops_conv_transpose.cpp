// conv_transpose2d: the op over kernels/cpu/conv_transpose2d.cpp (and its CUDA counterpart),
// which run conv2d's kernels on the ConvShape of the conv2d this op is the adjoint of
// (make_conv_transpose_shape in kernels/shapes.h). Its own op kind with its own backward: the
// input gradient is a conv2d of dy with the weight, the weight gradient a correlation of dy with
// x, the bias gradient the per-channel sums of dy. Saves x and weight. bf16 and f16 as conv2d's
// (ops_conv.cpp): 16 bits in and out, f32 inside; tests/test_amp_gemm_ops.cpp.
// Gradient checks: tests/test_gradcheck_upsample.cpp; forward values and errors:
// tests/test_ops_upsample.cpp.
#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
ConvShape transpose_shape(const Shape& x, const Shape& w, const ConvTranspose2dAttrs& a) {
  return make_conv_transpose_shape(x[0], x[1], x[2], x[3], w[1], w[2], w[3], a.stride_h, a.stride_w,
                                   a.pad_h, a.pad_w, a.out_pad_h, a.out_pad_w);
}

template <class T>
void convt_fwd(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2];
  const ConvShape s = transpose_shape(x.shape(), w.shape(), c.attr<ConvTranspose2dAttrs>());
  Tensor y = empty({s.N, s.C, s.H, s.W}, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, conv_transpose2d_forward, x.data<T>(), w.data<T>(),
               b.defined() ? b.data<T>() : nullptr, y.data<T>(), s);
  c.outputs = {y};
}
void convt_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "conv_transpose2d", convt_fwd, c);
}

template <class T>
void convt_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), w = c.saved_input(1);
  const Tensor& dy = c.grad_output(0);
  const ConvTranspose2dAttrs& a = c.attr<ConvTranspose2dAttrs>();
  const ConvShape s = transpose_shape(x.shape(), w.shape(), a);
  const Device dev = dy.device();
  if (c.needs_grad(0)) {
    Tensor dx = empty_like(x);
    REGEN_LAUNCH(dev, T, conv_transpose2d_backward_data, dy.data<T>(), w.data<T>(), dx.data<T>(),
                 s);
    c.set_grad_input(0, dx);
  }
  const bool need_w = c.needs_grad(1), need_b = a.has_bias && c.needs_grad(2);
  if (need_w || need_b) {
    Tensor dw = need_w ? empty_like(w) : Tensor();
    Tensor db = need_b ? empty({s.C}, dy.dtype(), dev) : Tensor();
    REGEN_LAUNCH(dev, T, conv_transpose2d_backward_filter, x.data<T>(), dy.data<T>(),
                 need_w ? dw.data<T>() : nullptr, need_b ? db.data<T>() : nullptr, s);
    if (need_w) c.set_grad_input(1, dw);
    if (need_b) c.set_grad_input(2, db);
  }
}
void convt_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "conv_transpose2d backward", convt_bwd, c);
}
void convt_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1);
}
constexpr OpDef kConvTranspose2d{"conv_transpose2d", 1,          1, false, convt_forward,
                                 convt_backward,     convt_saves};
REGEN_REGISTER_OP(conv_transpose2d, kConvTranspose2d);
}  // namespace

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
                        int64_t padding, int64_t output_padding) {
  return conv_transpose2d(x, weight, bias, stride, stride, padding, padding, output_padding,
                          output_padding);
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride_h,
                        int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t out_pad_h,
                        int64_t out_pad_w) {
  const char* op = "conv_transpose2d";
  check_defined(op, x, "input");
  check_defined(op, weight, "weight");
  check_floating(op, x);
  check_same_dtype_or_autocast(op, x, weight);
  REGEN_CHECK(x.dim() == 4, op, ": input ", sh(x.shape()), " must be 4-D (N, C_in, H, W)");
  REGEN_CHECK(weight.dim() == 4, op, ": weight ", sh(weight.shape()),
              " must be 4-D (C_in, C_out, kH, kW)");
  REGEN_CHECK(x.size(1) == weight.size(0), op, ": input ", sh(x.shape()), " has ", x.size(1),
              " channels but weight ", sh(weight.shape()), " expects ", weight.size(0));
  if (bias.defined()) {
    check_same_dtype_or_autocast(op, x, bias);
    REGEN_CHECK(bias.shape() == Shape{weight.size(1)}, op, ": bias ", sh(bias.shape()),
                " does not match weight ", sh(weight.shape()), " (expected [", weight.size(1),
                "])");
  }
  REGEN_CHECK(stride_h > 0 && stride_w > 0, op, ": stride ", stride_h, "x", stride_w,
              " must be positive (input ", sh(x.shape()), ", weight ", sh(weight.shape()), ")");
  REGEN_CHECK(pad_h >= 0 && pad_w >= 0, op, ": padding ", pad_h, "x", pad_w,
              " must be non-negative (input ", sh(x.shape()), ", weight ", sh(weight.shape()), ")");
  REGEN_CHECK(out_pad_h >= 0 && out_pad_w >= 0 && out_pad_h < stride_h && out_pad_w < stride_w, op,
              ": output padding ", out_pad_h, "x", out_pad_w,
              " must be non-negative and smaller "
              "than the stride ",
              stride_h, "x", stride_w, " (input ", sh(x.shape()), ")");
  REGEN_CHECK(x.size(2) > 0 && x.size(3) > 0 && weight.size(2) > 0 && weight.size(3) > 0, op,
              ": input ", sh(x.shape()), " and weight ", sh(weight.shape()),
              " must have non-empty planes");
  const int64_t H = (x.size(2) - 1) * stride_h - 2 * pad_h + weight.size(2) + out_pad_h;
  const int64_t W = (x.size(3) - 1) * stride_w - 2 * pad_w + weight.size(3) + out_pad_w;
  REGEN_CHECK(H > 0 && W > 0, op, ": input ", sh(x.shape()), " with weight ", sh(weight.shape()),
              ", stride ", stride_h, "x", stride_w, " and padding ", pad_h, "x", pad_w,
              " gives an empty output ", H, "x", W);
  const ConvTranspose2dAttrs a{stride_h,  stride_w,  pad_h,         pad_w,
                               out_pad_h, out_pad_w, bias.defined()};
  return apply_op(OpKind::conv_transpose2d, a, {x, weight, bias})[0];
}

}  // namespace regen
