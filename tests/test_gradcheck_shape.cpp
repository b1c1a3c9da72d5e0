// Finite-difference gradient checks (f64, CPU) for concat, split and narrow, through the harness of
// tests/gradcheck.h. All three are linear (copies), so linear_op_tol applies. Values and errors:
// tests/test_ops_shape.cpp.
#include <string>

#include "tests/gradcheck.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("gradcheck: concat along every dimension, inputs of different extents") {
  for (int64_t dim : {0, 1, 2, -1}) {
    const int d = dim < 0 ? 2 : static_cast<int>(dim);
    Shape a{2, 3, 4}, b{2, 3, 4}, c{2, 3, 4};
    a[d] = 1;
    b[d] = 3;
    c[d] = 2;
    const uint64_t seed = 10 + static_cast<uint64_t>(d);
    gradcheck(
        "concat dim " + std::to_string(dim),
        [dim](const std::vector<Tensor>& t) {
          return concat({t[0], t[1], t[2]}, dim);
        },
        {rand64(a, seed), rand64(b, seed + 1), rand64(c, seed + 2)}, linear_op_tol());
  }
  // The same tensor twice (its gradient is the sum of both slices), through a following mul.
  gradcheck(
      "concat {x, x} then mul",
      [](const std::vector<Tensor>& t) {
        return mul(concat({t[0], t[0]}, 0), t[1]);
      },
      {rand64({2, 3}, 20), rand64({4, 3}, 21)}, linear_op_tol());
}

TEST_CASE("gradcheck: split, with pieces used out of order and pieces unused") {
  gradcheck(
      "split dim 1, pieces 2 and 0 used",
      [](const std::vector<Tensor>& t) {
        const std::vector<Tensor> p = split(t[0], {2, 1, 3}, 1);
        return concat({p[2], p[0]}, 1);
      },
      {rand64({2, 6, 3}, 30)}, linear_op_tol());
  gradcheck(
      "split dim 0 into ones, one piece used twice",
      [](const std::vector<Tensor>& t) {
        const std::vector<Tensor> p = split(t[0], {1, 1, 1, 1}, 0);
        return add(mul(p[1], p[1]), p[3]);
      },
      {rand64({4, 5}, 31)}, linear_op_tol());
  gradcheck(
      "split dim -1 with an empty piece",
      [](const std::vector<Tensor>& t) {
        const std::vector<Tensor> p = split(t[0], {0, 3, 2}, -1);
        return concat({p[1], p[2], p[0]}, 2);
      },
      {rand64({2, 2, 5}, 32)}, linear_op_tol());
}

TEST_CASE("gradcheck: narrow on every dimension and from the end") {
  gradcheck(
      "narrow dim 0", [](const std::vector<Tensor>& t) { return narrow(t[0], 0, 1, 2); },
      {rand64({4, 3}, 40)}, linear_op_tol());
  gradcheck(
      "narrow dim 2", [](const std::vector<Tensor>& t) { return narrow(t[0], 2, 0, 1); },
      {rand64({2, 3, 4}, 41)}, linear_op_tol());
  gradcheck(
      "narrow dim -2 start -3",
      [](const std::vector<Tensor>& t) { return narrow(t[0], -2, -3, 2); }, {rand64({2, 5, 3}, 42)},
      linear_op_tol());
  // Two overlapping narrows of one input: their gradients add where they overlap.
  gradcheck(
      "narrow twice, overlapping",
      [](const std::vector<Tensor>& t) {
        return mul(narrow(t[0], 1, 0, 3), narrow(t[0], 1, 1, 3));
      },
      {rand64({3, 4}, 43)}, linear_op_tol());
}
