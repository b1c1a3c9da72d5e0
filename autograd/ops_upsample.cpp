// upsample2x: the op over kernels/cpu/upsample.cpp (and kernels/cuda/upsample.cu), nearest or
// bilinear (align_corners=False) by the mode attribute. Both are linear maps whose backward needs
// only the input's shape (the node's input value): nothing is saved.
// Gradient checks: tests/test_gradcheck_upsample.cpp; values and errors:
// tests/test_ops_upsample.cpp.
#include <cstdint>

#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {

template <class T>
void upsample_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  Tensor y = empty({N, C, 2 * H, 2 * W}, x.dtype(), x.device());
  if (c.attr<UpsampleAttrs>().mode == UpsampleMode::bilinear) {
    REGEN_LAUNCH(x.device(), T, upsample2x_bilinear_forward, x.data<T>(), y.data<T>(), N * C, H, W);
  } else {
    REGEN_LAUNCH(x.device(), T, upsample2x_nearest_forward, x.data<T>(), y.data<T>(), N * C, H, W);
  }
  c.outputs = {y};
}
void upsample_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "upsample2x", upsample_fwd, c);
}

template <class T>
void upsample_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const Shape& xs = c.tape().value(c.node().inputs[0]).shape;
  Tensor dx = empty(xs, dy.dtype(), dy.device());
  if (c.attr<UpsampleAttrs>().mode == UpsampleMode::bilinear) {
    REGEN_LAUNCH(dy.device(), T, upsample2x_bilinear_backward, dy.data<T>(), dx.data<T>(),
                 xs[0] * xs[1], xs[2], xs[3]);
  } else {
    REGEN_LAUNCH(dy.device(), T, upsample2x_nearest_backward, dy.data<T>(), dx.data<T>(),
                 xs[0] * xs[1], xs[2], xs[3]);
  }
  c.set_grad_input(0, dx);
}
void upsample_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "upsample2x backward", upsample_bwd, c);
}
constexpr OpDef kUpsample{"upsample2x", 1, 1, false, upsample_forward, upsample_backward, no_saves};
REGEN_REGISTER_OP(upsample2x, kUpsample);

}  // namespace

Tensor upsample2x(const Tensor& x, UpsampleMode mode) {
  check_defined("upsample2x", x, "input");
  check_floating("upsample2x", x);
  REGEN_CHECK(mode == UpsampleMode::nearest || mode == UpsampleMode::bilinear,
              "upsample2x: unknown mode ", static_cast<int>(mode), " (nearest or bilinear)");
  REGEN_CHECK(x.dim() == 4, "upsample2x: input ", sh(x.shape()), " must be 4-D (N, C, H, W)");
  REGEN_CHECK(x.size(2) > 0 && x.size(3) > 0, "upsample2x: input ", sh(x.shape()),
              " has an empty plane");
  // The CUDA kernels index a plane with 32 bits; the output plane is 4 H W.
  REGEN_CHECK(x.size(2) * x.size(3) <= (INT32_MAX >> 2), "upsample2x: input plane of ",
              sh(x.shape()), " is too large");
  UpsampleAttrs a;
  a.mode = mode;
  return apply_op(OpKind::upsample2x, a, {x})[0];
}

}  // namespace regen
