// The unary element-wise ops (kernels/unary_ops.h): one template gives, for every entry of
// REGEN_UNARY_OPS, the OpDef (forward, backward, what it saves), its registration and the function
// `Tensor name(const Tensor& x)`. Tests: the op table (tests/op_table.h) gradchecks every entry in
// f64 and compares its values with the reference of tests/op_reference.h.
#include "regen/autograd/ops_unary.h"

#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
template <class F>
struct UnaryOp {
  static constexpr const char* kName = unary::name_of<F>::value;
  static constexpr bool kReadsOutput = F::reads == unary::Reads::output;

  template <class T>
  static void fwd(OpContext& c) {
    const Tensor& x = c.inputs[0];
    Tensor y = empty_like(x);
    REGEN_LAUNCH(x.device(), T, unary_forward, F{}, x.data<T>(), y.data<T>(), x.numel());
    c.outputs = {y};
  }
  template <class T>
  static void bwd(BackwardContext& c) {
    const Tensor s = kReadsOutput ? c.saved_output(0) : c.saved_input(0);
    const Tensor& dy = c.grad_output(0);
    Tensor dx = empty_like(s);
    REGEN_LAUNCH(dy.device(), T, unary_backward, F{}, dy.data<T>(), s.data<T>(), dx.data<T>(),
                 s.numel());
    c.set_grad_input(0, dx);
  }
  static void forward(OpContext& c) { REGEN_FLOATING(c.inputs[0].dtype(), kName, fwd, c); }
  static void backward(BackwardContext& c) {
    REGEN_FLOATING(c.grad_output(0).dtype(), kName, bwd, c);
  }
  static void saves(const AttrBlob&, SaveList& s) {
    if (kReadsOutput) {
      s.output(0);
    } else {
      s.input(0);
    }
  }
  static Tensor call(OpKind kind, const Tensor& x) {
    check_defined(kName, x, "input");
    check_floating(kName, x);
    return apply_op(kind, NoAttrs{}, {x})[0];
  }
};

#define REGEN_UNARY_DEFINE(name)                                \
  constexpr OpDef kUnary_##name{#name,                          \
                                1,                              \
                                1,                              \
                                false,                          \
                                UnaryOp<unary::name>::forward,  \
                                UnaryOp<unary::name>::backward, \
                                UnaryOp<unary::name>::saves};   \
  REGEN_REGISTER_OP(name, kUnary_##name);
REGEN_UNARY_OPS(REGEN_UNARY_DEFINE)
#undef REGEN_UNARY_DEFINE
}  // namespace

#define REGEN_UNARY_FUNCTION(name)                      \
  Tensor name(const Tensor& x) {                        \
    return UnaryOp<unary::name>::call(OpKind::name, x); \
  }
REGEN_UNARY_OPS(REGEN_UNARY_FUNCTION)
#undef REGEN_UNARY_FUNCTION

}  // namespace regen
