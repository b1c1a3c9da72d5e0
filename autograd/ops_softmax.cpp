// softmax over the last dimension; backward reads only the output (kernels/cpu/softmax.cpp).
// Gradient check: tests/test_gradcheck_nlp.cpp; values: tests/test_ops_nlp.cpp.
#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
template <class T>
void softmax_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  const int64_t N = x.size(-1), M = N > 0 ? x.numel() / N : 0;
  Tensor y = empty_like(x);
  REGEN_LAUNCH(x.device(), T, softmax_forward, x.data<T>(), y.data<T>(), M, N);
  c.outputs = {y};
}
void softmax_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "softmax", softmax_fwd, c);
}

template <class T>
void softmax_bwd(BackwardContext& c) {
  const Tensor y = c.saved_output(0);
  const Tensor& dy = c.grad_output(0);
  const int64_t N = y.size(-1), M = N > 0 ? y.numel() / N : 0;
  Tensor dx = empty_like(y);
  REGEN_LAUNCH(dy.device(), T, softmax_backward, dy.data<T>(), y.data<T>(), dx.data<T>(), M, N);
  c.set_grad_input(0, dx);
}
void softmax_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "softmax backward", softmax_bwd, c);
}
void softmax_saves(const AttrBlob&, SaveList& s) {
  s.output(0);
}
constexpr OpDef kSoftmax{"softmax",    1, 1, false, softmax_forward_op, softmax_backward_op,
                         softmax_saves};
REGEN_REGISTER_OP(softmax, kSoftmax);
}  // namespace

Tensor softmax(const Tensor& x) {
  check_defined("softmax", x, "input");
  check_floating("softmax", x);
  REGEN_CHECK(x.dim() >= 1, "softmax: input ", x.str(), " needs at least one dimension");
  return apply_op(OpKind::softmax, NoAttrs{}, {x})[0];
}

}  // namespace regen
