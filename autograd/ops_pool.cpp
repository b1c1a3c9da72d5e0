// max_pool2d, avg_pool2d and global_avg_pool: the ops over kernels/cpu/pool.cpp.
// max_pool2d has a hidden i32 output, the argmax of each window (an index into the H*W plane), or
// packed (docs/ops.md, "Packed saves") its position inside the window in a few bits, which is all
// its backward reads; the average pools save nothing (backward needs only shapes).
// Gradient checks: tests/test_gradcheck_vision.cpp; forward values and errors:
// tests/test_ops_vision.cpp.
#include <cstdint>

#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
PoolShape pool_shape(const Shape& x, const Pool2dAttrs& a) {
  return make_pool_shape(x[0], x[1], x[2], x[3], a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h,
                         a.pad_w);
}
const Shape& input_shape(const BackwardContext& c) {
  return c.tape().value(c.node().inputs[0]).shape;
}

template <class T>
void maxpool_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  const PoolShape s = pool_shape(x.shape(), c.attr<Pool2dAttrs>());
  Tensor y = empty({s.N, s.C, s.P, s.Q}, x.dtype(), x.device());
  if (c.packed) {
    Tensor codes = empty({s.N, s.C, pool_code_words_per_plane(s)}, DType::i32, x.device());
    REGEN_LAUNCH(x.device(), T, maxpool2d_forward_packed, x.data<T>(), y.data<T>(),
                 reinterpret_cast<uint32_t*>(codes.data<int32_t>()), s);
    c.outputs = {y, codes};
    return;
  }
  Tensor argmax = empty({s.N, s.C, s.P, s.Q}, DType::i32, x.device());
  REGEN_LAUNCH(x.device(), T, maxpool2d_forward, x.data<T>(), y.data<T>(), argmax.data<int32_t>(),
               s);
  c.outputs = {y, argmax};
}
void maxpool_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "max_pool2d", maxpool_fwd, c);
}
template <class T>
void maxpool_bwd(BackwardContext& c) {
  const Tensor argmax = c.saved_output(1);
  const Tensor& dy = c.grad_output(0);
  const PoolShape s = pool_shape(input_shape(c), c.attr<Pool2dAttrs>());
  Tensor dx = empty(input_shape(c), dy.dtype(), dy.device());
  if (c.node().packed) {
    REGEN_LAUNCH(dy.device(), T, maxpool2d_backward_packed, dy.data<T>(),
                 reinterpret_cast<const uint32_t*>(argmax.data<int32_t>()), dx.data<T>(), s);
  } else {
    REGEN_LAUNCH(dy.device(), T, maxpool2d_backward, dy.data<T>(), argmax.data<int32_t>(),
                 dx.data<T>(), s);
  }
  c.set_grad_input(0, dx);
}
void maxpool_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "max_pool2d backward", maxpool_bwd, c);
}
void maxpool_saves(const AttrBlob&, SaveList& s) {
  s.output(1);
}
// Output 1 is the argmax, or packed (OpDef::packed_output) the same choice as window positions in
// a few bits (kernels/shapes.h pool_code_bits): only max_pool2d reads it, so whenever packed saves
// are on, it is packed.
constexpr OpDef kMaxPool{"max_pool2d",  2, 1, false, maxpool_forward, maxpool_backward,
                         maxpool_saves, 1};
REGEN_REGISTER_OP(max_pool2d, kMaxPool);

template <class T>
void avgpool_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  const PoolShape s = pool_shape(x.shape(), c.attr<Pool2dAttrs>());
  Tensor y = empty({s.N, s.C, s.P, s.Q}, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, avgpool2d_forward, x.data<T>(), y.data<T>(), s);
  c.outputs = {y};
}
void avgpool_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "avg_pool2d", avgpool_fwd, c);
}
template <class T>
void avgpool_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const PoolShape s = pool_shape(input_shape(c), c.attr<Pool2dAttrs>());
  Tensor dx = empty(input_shape(c), dy.dtype(), dy.device());
  REGEN_LAUNCH(dy.device(), T, avgpool2d_backward, dy.data<T>(), dx.data<T>(), s);
  c.set_grad_input(0, dx);
}
void avgpool_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "avg_pool2d backward", avgpool_bwd, c);
}
constexpr OpDef kAvgPool{"avg_pool2d", 1, 1, false, avgpool_forward, avgpool_backward, no_saves};
REGEN_REGISTER_OP(avg_pool2d, kAvgPool);

template <class T>
void gap_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor y = empty({x.size(0), x.size(1), 1, 1}, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, global_avgpool_forward, x.data<T>(), y.data<T>(),
               x.size(0) * x.size(1), x.size(2) * x.size(3));
  c.outputs = {y};
}
void gap_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "global_avg_pool", gap_fwd, c);
}
template <class T>
void gap_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const Shape& xs = input_shape(c);
  Tensor dx = empty(xs, dy.dtype(), dy.device());
  REGEN_LAUNCH(dy.device(), T, global_avgpool_backward, dy.data<T>(), dx.data<T>(), xs[0] * xs[1],
               xs[2] * xs[3]);
  c.set_grad_input(0, dx);
}
void gap_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "global_avg_pool backward", gap_bwd, c);
}
constexpr OpDef kGap{"global_avg_pool", 1, 1, false, gap_forward, gap_backward, no_saves};
REGEN_REGISTER_OP(global_avg_pool, kGap);

// Shared validation of max_pool2d and avg_pool2d, with messages naming the op and the input.
Pool2dAttrs check_pool(const char* op, const Tensor& x, int64_t kernel, int64_t stride,
                       int64_t padding) {
  check_defined(op, x, "input");
  check_floating(op, x);
  REGEN_CHECK(x.dim() == 4, op, ": input ", sh(x.shape()), " must be 4-D (N, C, H, W)");
  REGEN_CHECK(kernel > 0 && stride > 0, op, ": kernel ", kernel, " and stride ", stride,
              " must be positive (input ", sh(x.shape()), ")");
  REGEN_CHECK(padding >= 0 && 2 * padding <= kernel, op, ": padding ", padding,
              " must be between 0 and half the kernel ", kernel, " (input ", sh(x.shape()), ")");
  REGEN_CHECK(x.size(2) + 2 * padding >= kernel && x.size(3) + 2 * padding >= kernel, op,
              ": kernel ", kernel, "x", kernel, " is larger than input ", sh(x.shape()),
              " padded by ", padding);
  // Argmax indices are i32: the plane must fit.
  REGEN_CHECK(x.size(2) * x.size(3) <= INT32_MAX, op, ": input plane of ", sh(x.shape()),
              " is too large");
  return Pool2dAttrs{kernel, kernel, stride, stride, padding, padding};
}
}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const Pool2dAttrs a = check_pool("max_pool2d", x, kernel, stride, padding);
  return apply_op(OpKind::max_pool2d, a, {x})[0];
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const Pool2dAttrs a = check_pool("avg_pool2d", x, kernel, stride, padding);
  return apply_op(OpKind::avg_pool2d, a, {x})[0];
}

Tensor global_avg_pool(const Tensor& x) {
  check_defined("global_avg_pool", x, "input");
  check_floating("global_avg_pool", x);
  REGEN_CHECK(x.dim() == 4, "global_avg_pool: input ", sh(x.shape()), " must be 4-D (N, C, H, W)");
  REGEN_CHECK(x.size(2) * x.size(3) > 0, "global_avg_pool: input ", sh(x.shape()),
              " has an empty plane");
  return apply_op(OpKind::global_avg_pool, NoAttrs{}, {x})[0];
}

}  // namespace regen
