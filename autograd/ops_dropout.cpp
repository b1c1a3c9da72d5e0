// dropout: inverted dropout whose mask is a Philox stream drawn when the op is called and kept in
// the node's attributes; backward and remat replays regenerate the mask, so nothing is saved.
// A 16-bit input (bf16, f16) runs dropout_*_lowp (kernels/lowp_launchers.h), which draw
// the f32 kernel's mask: the same elements are kept. Gradient check: tests/test_gradcheck_nlp.cpp;
// mask statistics and replay: tests/test_ops_nlp.cpp; 16-bit: tests/test_amp_ops.cpp.
#include "regen/autograd/op_util.h"
#include "regen/kernels/lowp_launchers.h"

namespace regen {

using namespace detail;

namespace {
template <class T>
void dropout_fwd(OpContext& c) {
  const DropoutAttrs& a = c.attr<DropoutAttrs>();
  const Tensor& x = c.inputs[0];
  Tensor y = empty_like(x);
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(x.device(), T, dropout_forward_lowp, x.data<T>(), y.data<T>(), x.numel(), a.p,
                 a.seed, a.stream);
  } else {
    REGEN_LAUNCH(x.device(), T, dropout_forward, x.data<T>(), y.data<T>(), x.numel(), a.p, a.seed,
                 a.stream);
  }
  c.outputs = {y};
}
void dropout_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "dropout", dropout_fwd, c);
}

template <class T>
void dropout_bwd(BackwardContext& c) {
  const DropoutAttrs& a = c.attr<DropoutAttrs>();
  const Tensor& dy = c.grad_output(0);
  Tensor dx = empty_like(dy);
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(dy.device(), T, dropout_backward_lowp, dy.data<T>(), dx.data<T>(), dy.numel(), a.p,
                 a.seed, a.stream);
  } else {
    REGEN_LAUNCH(dy.device(), T, dropout_backward, dy.data<T>(), dx.data<T>(), dy.numel(), a.p,
                 a.seed, a.stream);
  }
  c.set_grad_input(0, dx);
}
void dropout_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "dropout backward", dropout_bwd, c);
}
constexpr OpDef kDropout{"dropout", 1, 1, false, dropout_forward_op, dropout_backward_op, no_saves};
REGEN_REGISTER_OP(dropout, kDropout);
}  // namespace

Tensor dropout(const Tensor& x, float p, bool training) {
  check_defined("dropout", x, "input");
  check_floating("dropout", x);
  REGEN_CHECK(p >= 0.0f && p <= 1.0f, "dropout: p ", p, " must be in [0, 1] (input ", x.str(), ")");
  if (!training || p == 0.0f) return x;
  DropoutAttrs a;
  a.p = p;
  a.seed = rng_seed();
  RngStreamDraw draw;  // given back if the op throws
  a.stream = draw.stream();
  Tensor y = apply_op(OpKind::dropout, a, {x})[0];
  draw.commit();
  return y;
}

}  // namespace regen
