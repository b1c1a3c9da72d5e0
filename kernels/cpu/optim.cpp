// CPU fused optimizer updates (declared in kernels/kernels.h) with the formulas of
// torch.optim.SGD and torch.optim.AdamW (single-tensor, non-fused path). Each element is updated
// in double and rounded once, so f32 parameters see no extra rounding between the terms.
// Tests: tests/test_ops_nlp.cpp compares against a plain double-precision transcription of
// torch's formulas; models/optim.cpp is the caller.
#include <omp.h>

#include <cmath>

#include "regen/core/error.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements below which one thread is faster
}  // namespace

template <class T>
void sgd_step(T* param, const T* grad, T* momentum_buf, int64_t n, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov, bool first_step) {
  REGEN_CHECK(momentum == 0.0 || momentum_buf != nullptr, "sgd_step: momentum ", momentum,
              " needs a momentum buffer");
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double p = static_cast<double>(param[i]);
    double d = static_cast<double>(grad[i]) + weight_decay * p;
    if (momentum != 0.0) {
      // torch starts the buffer at the first gradient, without dampening.
      const double buf =
          first_step ? d : momentum * static_cast<double>(momentum_buf[i]) + (1.0 - dampening) * d;
      momentum_buf[i] = static_cast<T>(buf);
      d = nesterov ? d + momentum * buf : buf;
    }
    param[i] = static_cast<T>(p - lr * d);
  }
}

template <class T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  REGEN_CHECK(step >= 1, "adamw_step: step ", step, " must count from 1");
  const double s = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, s);
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, s));
  const double step_size = lr / bias_correction1;
  const double decay = 1.0 - lr * weight_decay;  // decoupled: applied to the parameter first
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grad[i]);
    const double m = beta1 * static_cast<double>(exp_avg[i]) + (1.0 - beta1) * g;
    const double v = beta2 * static_cast<double>(exp_avg_sq[i]) + (1.0 - beta2) * g * g;
    exp_avg[i] = static_cast<T>(m);
    exp_avg_sq[i] = static_cast<T>(v);
    const double denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = static_cast<T>(static_cast<double>(param[i]) * decay - step_size * m / denom);
  }
}

template void sgd_step<float>(float*, const float*, float*, int64_t, double, double, double, double,
                              bool, bool);
template void sgd_step<double>(double*, const double*, double*, int64_t, double, double, double,
                               double, bool, bool);
template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double,
                                double, double, double, int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, double, double,
                                 double, double, double, int64_t);

}  // namespace regen::cpu
