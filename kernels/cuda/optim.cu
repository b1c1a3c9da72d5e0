// CUDA fused optimizer updates (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/optim.cpp; test tests/cuda/test_cuda_ops.cpp).
//
// torch.optim.SGD and torch.optim.AdamW (single-tensor path), each element updated in double and
// rounded once, as the CPU reference does. Every double operation is a round-to-nearest intrinsic
// (no FMA contraction) in the CPU's evaluation order, and the step-dependent scalars are computed
// on the host with the same expressions. The results equal the CPU's bit for bit where the host
// compiler evaluates the same expressions without contracting a*b + c into an FMA; GCC does
// contract under -march=native, so the test allows a one-ulp difference (docs/kernels.md).
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

#include <cmath>

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double dmul(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ double dadd(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ double dsub(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ double ddiv(double a, double b) {
  return __ddiv_rn(a, b);
}

// param, grad, momentum_buf: (n); momentum_buf null when momentum == 0.
__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buf, int64_t n,
                           double lr, double momentum, double one_minus_dampening,
                           double weight_decay, bool nesterov, bool first_step) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    const double p = static_cast<double>(param[i]);
    double d = dadd(static_cast<double>(grad[i]), dmul(weight_decay, p));
    if (momentum_buf) {
      const double buf = first_step ? d
                                    : dadd(dmul(momentum, static_cast<double>(momentum_buf[i])),
                                           dmul(one_minus_dampening, d));
      momentum_buf[i] = static_cast<float>(buf);
      d = nesterov ? dadd(d, dmul(momentum, buf)) : buf;
    }
    param[i] = static_cast<float>(dsub(p, dmul(lr, d)));
  }
}

// param, grad, exp_avg, exp_avg_sq: (n)
__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                             int64_t n, double beta1, double one_minus_beta1, double beta2,
                             double one_minus_beta2, double eps, double bias_correction2_sqrt,
                             double step_size, double decay) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    const double g = static_cast<double>(grad[i]);
    const double m = dadd(dmul(beta1, static_cast<double>(exp_avg[i])), dmul(one_minus_beta1, g));
    const double v =
        dadd(dmul(beta2, static_cast<double>(exp_avg_sq[i])), dmul(dmul(one_minus_beta2, g), g));
    exp_avg[i] = static_cast<float>(m);
    exp_avg_sq[i] = static_cast<float>(v);
    const double denom = dadd(ddiv(__dsqrt_rn(v), bias_correction2_sqrt), eps);
    param[i] = static_cast<float>(
        dsub(dmul(static_cast<double>(param[i]), decay), ddiv(dmul(step_size, m), denom)));
  }
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, double lr,
              double momentum, double dampening, double weight_decay, bool nesterov,
              bool first_step) {
  REGEN_CHECK(n >= 0, "sgd_step: negative size ", n);
  REGEN_CHECK(momentum == 0.0 || momentum_buf != nullptr, "sgd_step: momentum ", momentum,
              " needs a momentum buffer");
  if (n == 0) return;
  sgd_kernel<<<detail::grid_blocks(n, kThreads), kThreads, 0, stream()>>>(
      param, grad, momentum != 0.0 ? momentum_buf : nullptr, n, lr, momentum, 1.0 - dampening,
      weight_decay, nesterov, first_step);
  REGEN_CUDA_LAUNCH_CHECK("sgd_step");
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                double lr, double beta1, double beta2, double eps, double weight_decay,
                int64_t step) {
  REGEN_CHECK(n >= 0, "adamw_step: negative size ", n);
  REGEN_CHECK(step >= 1, "adamw_step: step ", step, " must count from 1");
  if (n == 0) return;
  // The CPU reference's scalar expressions, on the host.
  const double s = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, s);
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, s));
  const double step_size = lr / bias_correction1;
  const double decay = 1.0 - lr * weight_decay;
  adamw_kernel<<<detail::grid_blocks(n, kThreads), kThreads, 0, stream()>>>(
      param, grad, exp_avg, exp_avg_sq, n, beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps,
      bias_correction2_sqrt, step_size, decay);
  REGEN_CUDA_LAUNCH_CHECK("adamw_step");
}

}  // namespace regen::cuda
