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
  static constexpr bool kHasMask = unary::has_mask<F>::value;

  // Packed (a functor with a mask, where nothing else saves what it reads): a hidden output 1, the
  // 1-bit mask of what grad reads, (mask_words(n)) i32 words, which the node saves instead.
  template <class T>
  static void fwd(OpContext& c) {
    const Tensor& x = c.inputs[0];
    Tensor y = empty_like(x);
    if (c.packed) {
      Tensor mask = empty({mask_words(x.numel())}, DType::i32, x.device());
      REGEN_LAUNCH(x.device(), T, unary_forward_mask, F{}, x.data<T>(), y.data<T>(),
                   reinterpret_cast<uint32_t*>(mask.data<int32_t>()), x.numel());
      c.outputs = {y, mask};
      return;
    }
    REGEN_LAUNCH(x.device(), T, unary_forward, F{}, x.data<T>(), y.data<T>(), x.numel());
    c.outputs = {y};
  }
  template <class T>
  static void bwd(BackwardContext& c) {
    const Tensor& dy = c.grad_output(0);
    if (c.node().packed) {
      const Tensor mask = c.saved_output(1);
      Tensor dx = empty_like(dy);
      REGEN_LAUNCH(dy.device(), T, unary_backward_mask, F{}, dy.data<T>(),
                   reinterpret_cast<const uint32_t*>(mask.data<int32_t>()), dx.data<T>(),
                   dy.numel());
      c.set_grad_input(0, dx);
      return;
    }
    const Tensor s = kReadsOutput ? c.saved_output(0) : c.saved_input(0);
    Tensor dx = empty_like(s);
    REGEN_LAUNCH(dy.device(), T, unary_backward, F{}, dy.data<T>(), s.data<T>(), dx.data<T>(),
                 s.numel());
    c.set_grad_input(0, dx);
  }
  static void forward(OpContext& c) { REGEN_FLOATING_LOWP(c.inputs[0].dtype(), kName, fwd, c); }
  static void backward(BackwardContext& c) {
    REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), kName, bwd, c);
  }
  static void saves(const AttrBlob&, SaveList& s) {
    if (kHasMask && s.packed()) {
      s.output(1);
    } else if (kReadsOutput) {
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

// One output, and a hidden mask when packed (kVariableOutputs: the count is the forward's).
#define REGEN_UNARY_DEFINE(name)                                               \
  constexpr OpDef kUnary_##name{#name,                                         \
                                kVariableOutputs,                              \
                                1,                                             \
                                false,                                         \
                                UnaryOp<unary::name>::forward,                 \
                                UnaryOp<unary::name>::backward,                \
                                UnaryOp<unary::name>::saves,                   \
                                unary::has_mask<unary::name>::value ? 0 : -1}; \
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
