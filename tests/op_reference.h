// The f64 reference formulas of the op table (tests/op_table.h): for each op of the unary list
// (kernels/unary_ops.h) its value written apart from its functor, in another form where one exists
// (gelu through erfc, not erf), and the inputs it is checked on. The table compares every unary
// op's f64, f32 and CUDA outputs with this formula, so a formula wrong the same way in the
// functor's value and grad (which the gradcheck cannot see) fails. Rows of the other ops are
// checked against PyTorch's values (tests/data/op_reference.safetensors, written by
// tools/make_op_reference.py) or their own formula in tests/op_table.h.
#pragma once

#include <cmath>
#include <vector>

namespace regen::testing {

struct UnaryReference {
  const char* op;             // the name in REGEN_UNARY_OPS
  double (*value)(double x);  // the op's value in f64
  double lo = -3, hi = 3;     // inputs uniform in [lo, hi)
  double gap = 0;             // and pushed at least this far from 0 (a kink there)
  bool smooth = true;         // smooth_op_tol for the gradcheck; false: piecewise linear
};

inline const std::vector<UnaryReference>& unary_references() {
  static const std::vector<UnaryReference> refs = {
      {"relu", [](double x) { return std::fmax(x, 0.0); }, -1, 1, 0.1, false},
      {"gelu", [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }},
      {"gelu_tanh",
       [](double x) {
         return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
       }},
  };
  return refs;
}

}  // namespace regen::testing
