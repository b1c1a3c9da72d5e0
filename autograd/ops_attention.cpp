// attention: fused multi-head self-attention on a packed qkv projection (kernels/cpu/attention.cpp
// and the flash-style CUDA kernels). Backward reads qkv, the output, the row logsumexp (a hidden
// output) and the key-padding mask when there is one; it recomputes the probabilities, so nothing
// of size S x S is saved. Dropout draws its Philox stream when the op is called, so a remat replay
// sees the same mask. bf16 and f16 qkv (autocast's class low): a 16-bit output, the saved lse in
// f32, products and softmax in f32, a 16-bit dqkv (tests/test_amp_gemm_ops.cpp). Gradient check:
// tests/test_gradcheck_nlp.cpp; values: tests/test_ops_nlp.cpp.
#include <cmath>

#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
AttentionShape attention_shape(const Shape& qkv, const AttentionAttrs& a) {
  AttentionShape s;
  s.B = qkv[0];
  s.S = qkv[1];
  s.H = a.num_heads;
  s.Dh = qkv[2] / 3 / a.num_heads;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  s.causal = a.causal;
  s.dropout_p = a.dropout_p;
  s.seed = a.seed;
  s.stream = a.stream;
  return s;
}

template <class T>
void attention_fwd(OpContext& c) {
  const AttentionAttrs& a = c.attr<AttentionAttrs>();
  const Tensor& qkv = c.inputs[0];
  const AttentionShape s = attention_shape(qkv.shape(), a);
  Tensor out = empty({s.B, s.S, s.H * s.Dh}, qkv.dtype(), qkv.device());
  // The row statistics stay f32 for 16-bit qkv (acc_t); out has qkv's dtype.
  Tensor lse = empty({s.B, s.H, s.S}, dtype_of<acc_t<T>>::value, qkv.device());
  const int32_t* pad = a.has_mask ? c.inputs[1].data<int32_t>() : nullptr;
  REGEN_LAUNCH(qkv.device(), T, attention_forward, qkv.data<T>(), pad, out.data<T>(),
               lse.data<acc_t<T>>(), s);
  c.outputs = {out, lse};
}
void attention_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "attention", attention_fwd, c);
}

template <class T>
void attention_bwd(BackwardContext& c) {
  const AttentionAttrs& a = c.attr<AttentionAttrs>();
  const Tensor qkv = c.saved_input(0), out = c.saved_output(0), lse = c.saved_output(1);
  const Tensor mask = a.has_mask ? c.saved_input(1) : Tensor();
  const Tensor& dout = c.grad_output(0);
  const AttentionShape s = attention_shape(qkv.shape(), a);
  Tensor dqkv = empty_like(qkv);
  REGEN_LAUNCH(dout.device(), T, attention_backward, dout.data<T>(), qkv.data<T>(), out.data<T>(),
               lse.data<acc_t<T>>(), mask.defined() ? mask.data<int32_t>() : nullptr,
               dqkv.data<T>(), s);
  c.set_grad_input(0, dqkv);
}
void attention_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "attention backward", attention_bwd, c);
}
void attention_saves(const AttrBlob& attrs, SaveList& s) {
  s.input(0).output(0).output(1);
  if (attrs.as<AttentionAttrs>().has_mask) s.input(1);
}
constexpr OpDef kAttention{"attention",    2, 1, false, attention_forward_op, attention_backward_op,
                           attention_saves};
REGEN_REGISTER_OP(attention, kAttention);
}  // namespace

Tensor attention(const Tensor& qkv, int64_t num_heads, const Tensor& key_padding_mask, bool causal,
                 float dropout_p) {
  check_defined("attention", qkv, "qkv");
  check_floating("attention", qkv);
  REGEN_CHECK(qkv.dim() == 3, "attention: qkv ", sh(qkv.shape()),
              " must have 3 dimensions (batch, sequence, 3 * d_model)");
  REGEN_CHECK(num_heads > 0, "attention: num_heads ", num_heads, " must be positive");
  const int64_t width = qkv.size(2);
  REGEN_CHECK(width > 0 && width % 3 == 0 && (width / 3) % num_heads == 0, "attention: qkv ",
              sh(qkv.shape()),
              " last dimension must be 3 * d_model with d_model divisible by "
              "num_heads ",
              num_heads);
  REGEN_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, "attention: dropout_p ", dropout_p,
              " must be in [0, 1)");
  const Shape mask_shape{qkv.size(0), qkv.size(1)};
  if (key_padding_mask.defined()) {
    REGEN_CHECK(key_padding_mask.dtype() == DType::i32 && key_padding_mask.shape() == mask_shape,
                "attention: key_padding_mask ", key_padding_mask.str(), " must be i32 of shape ",
                sh(mask_shape), " (batch, sequence) for qkv ", sh(qkv.shape()));
  }
  AttentionAttrs a;
  a.num_heads = num_heads;
  a.causal = causal;
  a.has_mask = key_padding_mask.defined();
  a.dropout_p = dropout_p;
  if (dropout_p == 0.0f) return apply_op(OpKind::attention, a, {qkv, key_padding_mask})[0];
  a.seed = rng_seed();
  RngStreamDraw draw;  // given back if the op throws
  a.stream = draw.stream();
  Tensor out = apply_op(OpKind::attention, a, {qkv, key_padding_mask})[0];
  draw.commit();
  return out;
}

}  // namespace regen
