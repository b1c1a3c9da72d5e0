// layernorm over the last dimension, with the row mean and 1/std as hidden outputs that backward
// reads (kernels/cpu/layernorm.cpp). A 16-bit x (bf16, f16; the precision policy's fp32_statistics)
// reads f32 gamma and beta and writes a 16-bit y, f32 mean and rstd, f32 dgamma and dbeta and a
// 16-bit dx; it saves the 16-bit x. An f32 x recorded under autocast (the Transformer's fp32
// residual stream: LayerNormAttrs::save_dtype bf16 or f16) computes in f32 as always but saves, in
// place of x, its normalized form xhat = (x - mean) * rstd rounded once to the 16-bit dtype, a
// fourth (hidden) output: half the bytes, and backward's dx, dgamma and dbeta from it and rstd.
// Gradient check: tests/test_gradcheck_nlp.cpp; values: tests/test_ops_nlp.cpp; 16-bit:
// tests/test_amp_ops.cpp.
#include "regen/autograd/op_util.h"
#include "regen/kernels/lowp_launchers.h"

namespace regen {

using namespace detail;

namespace {
// P: the dtype of the parameters and statistics, acc_t<T> (f32 beside a 16-bit x).
template <class T>
void layernorm_fwd(OpContext& c) {
  using P = acc_t<T>;
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1], &beta = c.inputs[2];
  const int64_t N = x.size(-1), M = x.numel() / N;
  const Shape rows(x.shape().begin(), x.shape().end() - 1);
  Tensor y = empty_like(x);
  Tensor mean = empty(rows, gamma.dtype(), x.device());
  Tensor rstd = empty(rows, gamma.dtype(), x.device());
  const DType save = c.attr<LayerNormAttrs>().save_dtype;
  if constexpr (std::is_same<T, float>::value) {
    if (save != DType::f32) {
      Tensor xhat = empty(x.shape(), save, x.device());
      const auto launch = [&](auto s) {
        using S = decltype(s);
        REGEN_LAUNCH(x.device(), S, layernorm_forward_save_xhat, x.data<float>(),
                     gamma.data<float>(), beta.data<float>(), y.data<float>(), mean.data<float>(),
                     rstd.data<float>(), xhat.data<S>(), M, N, c.attr<LayerNormAttrs>().eps);
      };
      save == DType::bf16 ? launch(bfloat16()) : launch(float16());
      c.outputs = {y, mean, rstd, xhat};
      return;
    }
  }
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(x.device(), T, layernorm_forward_lowp, x.data<T>(), gamma.data<P>(),
                 beta.data<P>(), y.data<T>(), mean.data<P>(), rstd.data<P>(), M, N,
                 c.attr<LayerNormAttrs>().eps);
  } else {
    REGEN_LAUNCH(x.device(), T, layernorm_forward, x.data<T>(), gamma.data<T>(), beta.data<T>(),
                 y.data<T>(), mean.data<T>(), rstd.data<T>(), M, N, c.attr<LayerNormAttrs>().eps);
  }
  c.outputs = {y, mean, rstd};
}
void layernorm_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "layernorm", layernorm_fwd, c);
}

// Backward from the saved xhat (save_dtype bf16 or f16; x, dy, dx f32).
template <class S>
void layernorm_bwd_xhat(BackwardContext& c) {
  const Tensor xhat = c.saved_output(3), gamma = c.saved_input(1), rstd = c.saved_output(2);
  const Tensor& dy = c.grad_output(0);
  const int64_t N = xhat.size(-1), M = xhat.numel() / N;
  Tensor dx = empty(xhat.shape(), DType::f32, dy.device());
  Tensor dgamma = c.needs_grad(1) ? empty_like(gamma) : Tensor();
  Tensor dbeta = c.needs_grad(2) ? empty_like(gamma) : Tensor();
  float* dgamma_p = dgamma.defined() ? dgamma.data<float>() : nullptr;
  float* dbeta_p = dbeta.defined() ? dbeta.data<float>() : nullptr;
  REGEN_LAUNCH(dy.device(), S, layernorm_backward_xhat, dy.data<float>(), xhat.data<S>(),
               gamma.data<float>(), rstd.data<float>(), dx.data<float>(), dgamma_p, dbeta_p, M, N);
  if (c.needs_grad(0)) c.set_grad_input(0, dx);
  c.set_grad_input(1, dgamma);
  c.set_grad_input(2, dbeta);
}

template <class T>
void layernorm_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), gamma = c.saved_input(1), mean = c.saved_output(1),
               rstd = c.saved_output(2);
  const Tensor& dy = c.grad_output(0);
  const int64_t N = x.size(-1), M = x.numel() / N;
  // The launcher always writes dx; dgamma and dbeta only when asked for.
  Tensor dx = empty_like(x);
  Tensor dgamma = c.needs_grad(1) ? empty_like(gamma) : Tensor();
  Tensor dbeta = c.needs_grad(2) ? empty_like(gamma) : Tensor();
  using P = acc_t<T>;
  P* dgamma_p = dgamma.defined() ? dgamma.data<P>() : nullptr;
  P* dbeta_p = dbeta.defined() ? dbeta.data<P>() : nullptr;
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(dy.device(), T, layernorm_backward_lowp, dy.data<T>(), x.data<T>(),
                 gamma.data<P>(), mean.data<P>(), rstd.data<P>(), dx.data<T>(), dgamma_p, dbeta_p,
                 M, N);
  } else {
    REGEN_LAUNCH(dy.device(), T, layernorm_backward, dy.data<T>(), x.data<T>(), gamma.data<T>(),
                 mean.data<T>(), rstd.data<T>(), dx.data<T>(), dgamma_p, dbeta_p, M, N);
  }
  if (c.needs_grad(0)) c.set_grad_input(0, dx);
  c.set_grad_input(1, dgamma);
  c.set_grad_input(2, dbeta);
}
void layernorm_backward_op(BackwardContext& c) {
  const DType save = c.attr<LayerNormAttrs>().save_dtype;
  if (save == DType::bf16) return layernorm_bwd_xhat<bfloat16>(c);
  if (save == DType::f16) return layernorm_bwd_xhat<float16>(c);
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "layernorm backward", layernorm_bwd, c);
}
void layernorm_saves(const AttrBlob& a, SaveList& s) {
  if (a.as<LayerNormAttrs>().save_dtype != DType::f32) {
    s.input(1).output(2).output(3);
  } else {
    s.input(0).input(1).output(1).output(2);
  }
}
// Three outputs, or four with the saved xhat (kVariableOutputs: the count is the forward's).
constexpr OpDef kLayerNorm{"layernorm",           kVariableOutputs, 1, false, layernorm_forward_op,
                           layernorm_backward_op, layernorm_saves};
REGEN_REGISTER_OP(layernorm, kLayerNorm);
}  // namespace

Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check_defined("layernorm", x, "input");
  check_defined("layernorm", gamma, "gamma");
  check_defined("layernorm", beta, "beta");
  check_floating("layernorm", x);
  check_param_dtype("layernorm", x, gamma, "gamma");
  check_param_dtype("layernorm", x, beta, "beta");
  REGEN_CHECK(x.dim() >= 1 && x.size(-1) > 0 && gamma.shape() == Shape{x.size(-1)} &&
                  beta.shape() == gamma.shape(),
              "layernorm: input ", sh(x.shape()), ", gamma ", sh(gamma.shape()), " and beta ",
              sh(beta.shape()), " do not match (expected (..., D), (D) and (D) with D > 0)");
  REGEN_CHECK(eps > 0, "layernorm: eps ", eps, " must be positive");
  // Under autocast an f32 x (a residual stream kept in fp32) saves its normalized form in the
  // autocast dtype (LayerNormAttrs::save_dtype).
  const DType low = autocast_dtype();
  const DType save = x.dtype() == DType::f32 && is_low_precision(low) ? low : DType::f32;
  return apply_op(OpKind::layernorm, LayerNormAttrs{eps, save}, {x, gamma, beta})[0];
}

}  // namespace regen
