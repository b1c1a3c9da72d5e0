// Finite-difference gradient checking in f64 on the CPU, for every differentiable op.
// gradcheck() runs f on f64 inputs, back-propagates a fixed random cotangent R through the tape,
// and compares each checked input's gradient with central differences of <f(x), R>, within the
// tolerance the call passes for its op (linear_op_tol, smooth_op_tol).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"

namespace regen::testing {

// Every call passes the tolerance of its op (linear_op_tol or smooth_op_tol below); the defaults
// here are the loosest, for an op that fits neither.
struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-7;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-5;
  std::vector<int> inputs;  // which inputs to check (default: every floating input)
  // Skip element `index` of input `input` (non-smooth points such as a max tie).
  std::function<bool(int input, int64_t index)> skip;
  uint64_t seed = 7;
};

// An op that is linear, or a polynomial of degree <= 2, in each checked element while the others
// stay fixed: linear, matmul, bmm, add, mul (x * x too), scale, views and copies, sum, mean,
// conv2d, average pooling, embedding, dropout, batchnorm in eval mode, and relu / max_pool away
// from their kinks. Its central difference is exact up to rounding for any step, so a large step
// (rounding error ~ 1e-16 * |<f, R>| / eps) allows a tolerance 100x tighter than the default.
// The step must stay below the distance to any kink (relu's inputs are pushed 0.1 away).
inline GradcheckOptions linear_op_tol(double eps = 1e-2) {
  GradcheckOptions o;
  o.eps = eps;
  o.atol = 1e-9;
  o.rtol = 1e-8;
  return o;
}

// A smooth nonlinear op (gelu, softmax, layernorm, batchnorm in training mode, attention,
// cross_entropy, chains of them): at eps = 1e-5 the truncation error (~ eps^2 * f''') and the
// rounding error (~ 1e-16 * |<f, R>| / eps) are both near 1e-10; measured errors stay below 5e-9.
inline GradcheckOptions smooth_op_tol() {
  GradcheckOptions o;
  o.eps = 1e-5;
  o.atol = 1e-8;
  o.rtol = 1e-7;
  return o;
}

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// Returns the number of mismatching elements (0 on success) and reports through doctest.
inline int gradcheck(const std::string& name, const TensorFn& f, std::vector<Tensor> inputs,
                     GradcheckOptions opt) {
  std::vector<int> check = opt.inputs;
  if (check.empty()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].dtype() == DType::f64)
        check.push_back(static_cast<int>(i));
    }
  }
  for (int i : check) {
    REQUIRE(inputs[i].dtype() == DType::f64);
    inputs[i].impl()->grad.reset();
    inputs[i].set_requires_grad(true);
  }
  Tensor out = f(inputs);
  Generator g(opt.seed);
  Tensor R = uniform(out.shape(), -1.0, 1.0, g, DType::f64);
  Tape::current().backward(out, R);
  out = Tensor();

  int failures = 0;
  for (int i : check) {
    Tensor analytic = inputs[i].grad();
    REQUIRE_MESSAGE(analytic.defined(), name, ": input ", i, " received no gradient");
    const std::vector<double> ag = analytic.to_vector<double>();
    double* x = inputs[i].data<double>();
    double worst = 0;
    int64_t worst_at = -1;
    int printed = 0;
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      if (opt.skip && opt.skip(i, j)) continue;
      const double saved = x[j];
      double fp, fm;
      {
        NoGradScope ng;
        x[j] = saved + opt.eps;
        fp = dot(f(inputs), R);
        x[j] = saved - opt.eps;
        fm = dot(f(inputs), R);
        x[j] = saved;
      }
      const double numeric = (fp - fm) / (2 * opt.eps);
      const double err = std::fabs(ag[j] - numeric);
      const double tol = opt.atol + opt.rtol * std::fabs(numeric);
      if (!(err <= tol)) {  // NaN counts as a failure
        ++failures;
        if (printed++ < 5) {
          std::printf("%s: input %d element %lld: analytic %.10g numeric %.10g (err %.3g > %.3g)\n",
                      name.c_str(), i, static_cast<long long>(j), ag[j], numeric, err, tol);
        }
      }
      if (err - tol > worst) {
        worst = err - tol;
        worst_at = j;
      }
    }
    if (worst_at >= 0) {
      std::printf("%s: input %d worst excess error %.3g at element %lld\n", name.c_str(), i, worst,
                  static_cast<long long>(worst_at));
    }
    inputs[i].set_requires_grad(false);
    inputs[i].impl()->grad.reset();
  }
  CHECK_MESSAGE(failures == 0, name, ": ", failures, " gradient elements out of tolerance");
  return failures;
}

// f64 uniform input in [lo, hi).
inline Tensor rand64(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  return uniform(s, lo, hi, g, DType::f64);
}

}  // namespace regen::testing
