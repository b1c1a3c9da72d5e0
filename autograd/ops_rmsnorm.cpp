// rmsnorm over the last dimension: y = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps) per
// row, as torch.nn.functional.rms_norm. The op in one file: its launchers' one declaration for the
// CPU and CUDA (defined in kernels/cpu/rmsnorm.cpp and kernels/cuda/rmsnorm.cu), its OpDef (saves
// x, weight and the hidden per-row rstd), the function (declared in autograd/ops.h beside its op
// list entry) and its binding into Python's regen.ops. Tests: the op table's rmsnorm rows
// (tests/op_table.h): f64 gradcheck, an f64 reference, CPU f32 and f64 and CUDA f32 values.
#include "regen/autograd/functions.h"
#include "regen/autograd/op_util.h"
#include "regen/kernels/lowp_launchers.h"

namespace regen {

// x, y: (M, N); weight: (N); rstd: (M), written.
REGEN_LAUNCHER(rmsnorm_forward,
               (const T* x, const T* weight, T* y, T* rstd, int64_t M, int64_t N, double eps))
// dy, x, dx: (M, N); weight, dweight: (N); rstd: (M). dx and dweight are written (=), each only
// when not null.
REGEN_LAUNCHER(rmsnorm_backward, (const T* dy, const T* x, const T* weight, const T* rstd, T* dx,
                                  T* dweight, int64_t M, int64_t N))
// The 16-bit forms (rmsnorm_*_lowp): kernels/lowp_launchers.h. A 16-bit rmsnorm saves its 16-bit
// x.

using namespace detail;

namespace {
struct RMSNormAttrs {
  double eps;
};

template <class T>
void rmsnorm_fwd(OpContext& c) {
  const Tensor &x = c.inputs[0], &weight = c.inputs[1];
  const int64_t N = x.size(-1), M = x.numel() / N;
  Tensor y = empty_like(x);
  Tensor rstd = empty(Shape(x.shape().begin(), x.shape().end() - 1), weight.dtype(), x.device());
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(x.device(), T, rmsnorm_forward_lowp, x.data<T>(), weight.data<float>(),
                 y.data<T>(), rstd.data<float>(), M, N, c.attr<RMSNormAttrs>().eps);
  } else {
    REGEN_LAUNCH(x.device(), T, rmsnorm_forward, x.data<T>(), weight.data<T>(), y.data<T>(),
                 rstd.data<T>(), M, N, c.attr<RMSNormAttrs>().eps);
  }
  c.outputs = {y, rstd};
}
void rmsnorm_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "rmsnorm", rmsnorm_fwd, c);
}

template <class T>
void rmsnorm_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), weight = c.saved_input(1), rstd = c.saved_output(1);
  const Tensor& dy = c.grad_output(0);
  const int64_t N = x.size(-1), M = x.numel() / N;
  Tensor dx = c.needs_grad(0) ? empty_like(x) : Tensor();
  Tensor dweight = c.needs_grad(1) ? empty_like(weight) : Tensor();
  using P = acc_t<T>;
  T* dx_p = dx.defined() ? dx.data<T>() : nullptr;
  P* dweight_p = dweight.defined() ? dweight.data<P>() : nullptr;
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(dy.device(), T, rmsnorm_backward_lowp, dy.data<T>(), x.data<T>(), weight.data<P>(),
                 rstd.data<P>(), dx_p, dweight_p, M, N);
  } else {
    REGEN_LAUNCH(dy.device(), T, rmsnorm_backward, dy.data<T>(), x.data<T>(), weight.data<T>(),
                 rstd.data<T>(), dx_p, dweight_p, M, N);
  }
  c.set_grad_input(0, dx);
  c.set_grad_input(1, dweight);
}
void rmsnorm_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "rmsnorm backward", rmsnorm_bwd, c);
}
void rmsnorm_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1).output(1);
}
constexpr OpDef kRMSNorm{"rmsnorm",    2, 1, false, rmsnorm_forward_op, rmsnorm_backward_op,
                         rmsnorm_saves};
REGEN_REGISTER_OP(rmsnorm, kRMSNorm);
}  // namespace

Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps) {
  check_defined("rmsnorm", x, "input");
  check_defined("rmsnorm", weight, "weight");
  check_floating("rmsnorm", x);
  check_param_dtype("rmsnorm", x, weight, "weight");
  REGEN_CHECK(x.dim() >= 1 && x.size(-1) > 0 && weight.shape() == Shape{x.size(-1)},
              "rmsnorm: input ", sh(x.shape()), " and weight ", sh(weight.shape()),
              " do not match (expected (..., D) and (D) with D > 0)");
  REGEN_CHECK(eps > 0, "rmsnorm: eps ", eps, " must be positive");
  return apply_op(OpKind::rmsnorm, RMSNormAttrs{eps}, {x, weight})[0];
}

REGEN_REGISTER_FUNCTION(
    rmsnorm,
    "RMS normalization over the last dimension: x * weight / sqrt(mean(x^2) + eps) per row, as "
    "torch.nn.functional.rms_norm; x (..., D), weight (D). Saves x, weight and each row's rstd",
    {"x", "weight"}, {{"eps", 1e-6}},
    [](const std::vector<Tensor>& t, const std::vector<double>& n) {
      return rmsnorm(t[0], t[1], n[0]);
    });

}  // namespace regen
