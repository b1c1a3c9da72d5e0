// cross_entropy: log-softmax fused with the mean negative log-likelihood over rows whose target
// is not ignore_index (kernels/cpu/cross_entropy.cpp). The row logsumexp is a hidden output that
// backward reads with the logits and targets. Gradient check: tests/test_gradcheck_nlp.cpp;
// values and errors: tests/test_ops_nlp.cpp.
#include "autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
template <class T>
void cross_entropy_fwd(OpContext& c) {
  const Tensor &logits = c.inputs[0], &targets = c.inputs[1];
  const int64_t M = logits.size(0), V = logits.size(1);
  Tensor loss = empty({}, logits.dtype(), logits.device());
  Tensor lse = empty({M}, logits.dtype(), logits.device());
  REGEN_LAUNCH(logits.device(), T, cross_entropy_forward, logits.data<T>(), targets.data<int64_t>(),
               loss.data<T>(), lse.data<T>(), M, V, c.attr<CrossEntropyAttrs>().ignore_index);
  c.outputs = {loss, lse};
}
void cross_entropy_forward_op(OpContext& c) {
  REGEN_FLOATING(c.inputs[0].dtype(), "cross_entropy", cross_entropy_fwd, c);
}

template <class T>
void cross_entropy_bwd(BackwardContext& c) {
  const Tensor logits = c.saved(0), targets = c.saved(1), lse = c.saved(2);
  const Tensor& dloss = c.grad_output(0);
  const int64_t M = logits.size(0), V = logits.size(1);
  Tensor dlogits = empty_like(logits);
  REGEN_LAUNCH(dloss.device(), T, cross_entropy_backward, dloss.data<T>(), logits.data<T>(),
               targets.data<int64_t>(), lse.data<T>(), dlogits.data<T>(), M, V,
               c.attr<CrossEntropyAttrs>().ignore_index);
  c.set_grad_input(0, dlogits);
}
void cross_entropy_backward_op(BackwardContext& c) {
  REGEN_FLOATING(c.grad_output(0).dtype(), "cross_entropy backward", cross_entropy_bwd, c);
}
void cross_entropy_saves(const AttrBlob&, std::vector<SaveRef>& s) {
  s = {{false, 0}, {false, 1}, {true, 1}};
}
const OpDef kCrossEntropy{
    "cross_entropy",    2, 1, false, cross_entropy_forward_op, cross_entropy_backward_op,
    cross_entropy_saves};
REGEN_REGISTER_OP(cross_entropy, kCrossEntropy);
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_defined("cross_entropy", logits, "logits");
  check_defined("cross_entropy", targets, "targets");
  check_floating("cross_entropy", logits);
  REGEN_CHECK(targets.dtype() == DType::i64, "cross_entropy: targets ", targets.str(),
              " must be i64");
  REGEN_CHECK(logits.dim() == 2 && logits.size(1) > 0 && targets.dim() == 1 &&
                  targets.size(0) == logits.size(0),
              "cross_entropy: logits ", sh(logits.shape()), " and targets ", sh(targets.shape()),
              " do not match (expected (M, V) with V > 0 and (M))");
  return apply_op(OpKind::cross_entropy, CrossEntropyAttrs{ignore_index}, {logits, targets})[0];
}

}  // namespace regen
