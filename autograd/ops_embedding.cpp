// embedding: a table lookup whose weight gradient is a dense (V, D) tensor, zeroed and then
// scattered in token order (kernels/cpu/embedding.cpp). Gradient check:
// tests/test_gradcheck_nlp.cpp; errors: tests/test_ops_nlp.cpp.
#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
template <class T>
void embedding_fwd(OpContext& c) {
  const Tensor &ids = c.inputs[0], &w = c.inputs[1];
  const int64_t V = w.size(0), D = w.size(1);
  Shape ys = ids.shape();
  ys.push_back(D);
  Tensor y = empty(ys, w.dtype(), w.device());
  REGEN_LAUNCH(w.device(), T, embedding_forward, w.data<T>(), ids.data<int64_t>(), y.data<T>(),
               ids.numel(), V, D);
  c.outputs = {y};
}
void embedding_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[1].dtype(), "embedding", embedding_fwd, c);
}

template <class T>
void embedding_bwd(BackwardContext& c) {
  if (!c.needs_grad(1)) return;  // ids (i64) never take a gradient
  const Tensor ids = c.saved_input(0);
  const Tensor& dy = c.grad_output(0);
  const Shape& ws = c.tape().value(c.node().inputs[1]).shape;
  Tensor dw = empty(ws, dy.dtype(), dy.device());
  REGEN_LAUNCH(dy.device(), T, embedding_backward, dy.data<T>(), ids.data<int64_t>(), dw.data<T>(),
               ids.numel(), ws[0], ws[1]);
  c.set_grad_input(1, dw);
}
void embedding_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "embedding backward", embedding_bwd, c);
}
void embedding_saves(const AttrBlob&, SaveList& s) {
  s.input(0);
}
constexpr OpDef kEmbedding{"embedding",    1, 1, false, embedding_forward_op, embedding_backward_op,
                           embedding_saves};
REGEN_REGISTER_OP(embedding, kEmbedding);
}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  check_defined("embedding", ids, "ids");
  check_defined("embedding", weight, "weight");
  REGEN_CHECK(ids.dtype() == DType::i64, "embedding: ids ", ids.str(), " must be i64");
  REGEN_CHECK(is_floating(weight.dtype()) && weight.dim() == 2, "embedding: weight ", weight.str(),
              " must be a floating-point (V, D) table");
  return apply_op(OpKind::embedding, NoAttrs{}, {ids, weight})[0];
}

}  // namespace regen
