// batchnorm2d: the op over the kernels of kernels/cpu/batchnorm.cpp.
//
// Outputs: y, plus two hidden (C) slots that backward reads. Training: the batch mean and
// 1/sqrt(var + eps). Eval: snapshots of running_mean and running_var, so that backward uses the
// statistics forward used even if the buffers change in between. Both modes have three slots,
// so a node's structure never depends on the mode.
//
// Training forward updates running_mean/running_var in place (a side effect on two inputs, as in
// PyTorch) except when the remat runtime replays it: a replay must leave no trace.
// Gradient checks: tests/test_gradcheck_vision.cpp; running stats and replay:
// tests/test_ops_vision.cpp. A 16-bit x (bf16, f16; the precision policy's fp32_statistics) reads
// f32 gamma, beta and running stats, writes a 16-bit y and f32 hidden statistics, and gives a
// 16-bit dx and f32 dgamma and dbeta: tests/test_amp_ops.cpp.
#include "regen/autograd/op_util.h"
#include "regen/kernels/lowp_launchers.h"

namespace regen {

using namespace detail;

namespace {
struct BnDims {
  int64_t N, C, HW;
};
BnDims bn_dims(const Shape& x) {
  return {x[0], x[1], x[2] * x[3]};
}

// P: the dtype of the per-channel arrays, acc_t<T> (f32 beside a 16-bit x).
template <class T>
void bn_fwd(OpContext& c) {
  using P = acc_t<T>;
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1], &beta = c.inputs[2];
  const Tensor &rmean = c.inputs[3], &rvar = c.inputs[4];
  const BatchNormAttrs& a = c.attr<BatchNormAttrs>();
  const BnDims d = bn_dims(x.shape());
  const Device dev = x.device();
  Tensor y = empty_like(x);
  Tensor s0 = empty({d.C}, gamma.dtype(), dev), s1 = empty({d.C}, gamma.dtype(), dev);
  if (a.training) {
    P* rm = c.replay ? nullptr : rmean.data<P>();
    P* rv = c.replay ? nullptr : rvar.data<P>();
    if constexpr (is_half_v<T>) {
      REGEN_LAUNCH(dev, T, batchnorm_forward_train_lowp, x.data<T>(), gamma.data<P>(),
                   beta.data<P>(), y.data<T>(), s0.data<P>(), s1.data<P>(), rm, rv, d.N, d.C, d.HW,
                   a.momentum, a.eps);
    } else {
      REGEN_LAUNCH(dev, T, batchnorm_forward_train, x.data<T>(), gamma.data<T>(), beta.data<T>(),
                   y.data<T>(), s0.data<T>(), s1.data<T>(), rm, rv, d.N, d.C, d.HW, a.momentum,
                   a.eps);
    }
  } else {
    if constexpr (is_half_v<T>) {
      REGEN_LAUNCH(dev, T, batchnorm_forward_eval_lowp, x.data<T>(), gamma.data<P>(),
                   beta.data<P>(), rmean.data<P>(), rvar.data<P>(), y.data<T>(), d.N, d.C, d.HW,
                   a.eps);
    } else {
      REGEN_LAUNCH(dev, T, batchnorm_forward_eval, x.data<T>(), gamma.data<T>(), beta.data<T>(),
                   rmean.data<T>(), rvar.data<T>(), y.data<T>(), d.N, d.C, d.HW, a.eps);
    }
    REGEN_LAUNCH(dev, P, copy, rmean.data<P>(), s0.data<P>(), d.C);
    REGEN_LAUNCH(dev, P, copy, rvar.data<P>(), s1.data<P>(), d.C);
  }
  c.outputs = {y, s0, s1};
}
void bn_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "batchnorm2d", bn_fwd, c);
}

template <class T>
void bn_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), gamma = c.saved_input(1), s0 = c.saved_output(1),
               s1 = c.saved_output(2);
  const Tensor& dy = c.grad_output(0);
  const BatchNormAttrs& a = c.attr<BatchNormAttrs>();
  const BnDims d = bn_dims(x.shape());
  const Device dev = dy.device();
  Tensor dx = c.needs_grad(0) ? empty_like(x) : Tensor();
  Tensor dgamma = c.needs_grad(1) ? empty_like(gamma) : Tensor();
  Tensor dbeta = c.needs_grad(2) ? empty_like(gamma) : Tensor();
  using P = acc_t<T>;
  T* dx_p = dx.defined() ? dx.data<T>() : nullptr;
  P* dg_p = dgamma.defined() ? dgamma.data<P>() : nullptr;
  P* db_p = dbeta.defined() ? dbeta.data<P>() : nullptr;
  if constexpr (is_half_v<T>) {
    if (a.training) {
      REGEN_LAUNCH(dev, T, batchnorm_backward_lowp, dy.data<T>(), x.data<T>(), gamma.data<P>(),
                   s0.data<P>(), s1.data<P>(), dx_p, dg_p, db_p, d.N, d.C, d.HW);
    } else {
      REGEN_LAUNCH(dev, T, batchnorm_backward_eval_lowp, dy.data<T>(), x.data<T>(), gamma.data<P>(),
                   s0.data<P>(), s1.data<P>(), dx_p, dg_p, db_p, d.N, d.C, d.HW, a.eps);
    }
  } else if (a.training) {
    REGEN_LAUNCH(dev, T, batchnorm_backward, dy.data<T>(), x.data<T>(), gamma.data<T>(),
                 s0.data<T>(), s1.data<T>(), dx_p, dg_p, db_p, d.N, d.C, d.HW);
  } else {
    REGEN_LAUNCH(dev, T, batchnorm_backward_eval, dy.data<T>(), x.data<T>(), gamma.data<T>(),
                 s0.data<T>(), s1.data<T>(), dx_p, dg_p, db_p, d.N, d.C, d.HW, a.eps);
  }
  if (dx.defined()) c.set_grad_input(0, dx);
  if (dgamma.defined()) c.set_grad_input(1, dgamma);
  if (dbeta.defined()) c.set_grad_input(2, dbeta);
}
void bn_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "batchnorm2d backward", bn_bwd, c);
}
// x, gamma and the two hidden statistics (batch or running, see the file comment).
void bn_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1).output(1).output(2);
}
constexpr OpDef kBatchNorm{"batchnorm2d", 3, 1, false, bn_forward, bn_backward, bn_saves};
REGEN_REGISTER_OP(batchnorm2d, kBatchNorm);
}  // namespace

Tensor batchnorm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                   const Tensor& running_mean, const Tensor& running_var, bool training,
                   double momentum, double eps) {
  check_defined("batchnorm2d", x, "input");
  check_defined("batchnorm2d", gamma, "gamma");
  check_defined("batchnorm2d", beta, "beta");
  check_defined("batchnorm2d", running_mean, "running_mean");
  check_defined("batchnorm2d", running_var, "running_var");
  check_floating("batchnorm2d", x);
  REGEN_CHECK(x.dim() == 4, "batchnorm2d: input ", sh(x.shape()), " must be 4-D (N, C, H, W)");
  const Shape cs{x.size(1)};
  const std::pair<const char*, const Tensor*> params[] = {{"gamma", &gamma},
                                                          {"beta", &beta},
                                                          {"running_mean", &running_mean},
                                                          {"running_var", &running_var}};
  for (const auto& [name, t] : params) {
    check_param_dtype("batchnorm2d", x, *t, name);
    REGEN_CHECK(t->shape() == cs, "batchnorm2d: ", name, " ", sh(t->shape()),
                " does not match the ", x.size(1), " channels of input ", sh(x.shape()));
  }
  REGEN_CHECK(!running_mean.requires_grad() && !running_var.requires_grad(),
              "batchnorm2d: running_mean and running_var are buffers and cannot require grad");
  REGEN_CHECK(!training || x.size(0) * x.size(2) * x.size(3) > 1,
              "batchnorm2d: training needs more than one value per channel, input ", sh(x.shape()),
              " has ", x.size(0) * x.size(2) * x.size(3));
  REGEN_CHECK(eps > 0 && momentum >= 0 && momentum <= 1, "batchnorm2d: eps ", eps,
              " must be positive and momentum ", momentum, " in [0, 1]");
  const BatchNormAttrs a{training, momentum, eps};
  return apply_op(OpKind::batchnorm2d, a, {x, gamma, beta, running_mean, running_var})[0];
}

}  // namespace regen
