// Finite-difference gradient checks (f64, CPU) beyond the op table's rows (tests/op_table.h, which
// gradchecks every op once): linear without bias and on 3-d input, bmm with every transpose, add
// and mul on the same tensor and broadcast, reshape and flatten. The harness and the per-op
// tolerances (linear_op_tol: exact central differences; smooth_op_tol) are in tests/gradcheck.h.
#include "tests/gradcheck.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("gradcheck: linear with and without bias, 3-d input") {
  gradcheck(
      "linear", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
      {rand64({2, 3, 5}, 1), rand64({4, 5}, 2), rand64({4}, 3)}, linear_op_tol());
  gradcheck(
      "linear (no bias)", [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
      {rand64({7, 5}, 4), rand64({3, 5}, 5)}, linear_op_tol());
}

TEST_CASE("gradcheck: bmm with every transpose combination") {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Shape as = ta ? Shape{2, 4, 3} : Shape{2, 3, 4};
      const Shape bs = tb ? Shape{2, 5, 4} : Shape{2, 4, 5};
      gradcheck(
          "bmm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
          [=](const std::vector<Tensor>& in) { return bmm(in[0], in[1], ta, tb); },
          {rand64(as, 10 + ta), rand64(bs, 20 + tb)}, linear_op_tol());
    }
  }
}

TEST_CASE("gradcheck: add and mul, same shape and broadcast bias") {
  gradcheck(
      "add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); },
      {rand64({3, 4}, 1), rand64({3, 4}, 2)}, linear_op_tol());
  gradcheck(
      "add (broadcast)", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); },
      {rand64({2, 3, 4}, 3), rand64({4}, 4)}, linear_op_tol());
  gradcheck(
      "mul", [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
      {rand64({3, 4}, 5), rand64({3, 4}, 6)}, linear_op_tol());
  gradcheck(
      "mul (broadcast)", [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
      {rand64({2, 3, 4}, 7), rand64({3, 4}, 8)}, linear_op_tol());
  // The same tensor on both sides: gradients from two uses accumulate.
  gradcheck(
      "mul (x*x)", [](const std::vector<Tensor>& in) { return mul(in[0], in[0]); },
      {rand64({6}, 9)}, linear_op_tol());
  gradcheck(
      "add (x+x)", [](const std::vector<Tensor>& in) { return add(in[0], in[0]); },
      {rand64({6}, 10)}, linear_op_tol());
}

TEST_CASE("gradcheck: reshape and flatten") {
  gradcheck(
      "reshape",
      [](const std::vector<Tensor>& in) {
        return mul(reshape(in[0], {3, -1}), in[1]);
      },
      {rand64({2, 3, 2}, 1), rand64({3, 4}, 2)}, linear_op_tol());
  gradcheck(
      "flatten", [](const std::vector<Tensor>& in) { return flatten(in[0]); },
      {rand64({2, 3, 2, 2}, 3)}, linear_op_tol());
}
