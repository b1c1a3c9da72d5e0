// Finite-difference gradient checks (f64, CPU) for upsample2x (nearest, bilinear) and
// conv_transpose2d over strides, paddings, output paddings and kernel sizes, with and without bias,
// through the harness of tests/gradcheck.h. All are linear in each input, so linear_op_tol
// applies. Forward values and errors: tests/test_ops_upsample.cpp.
#include <string>

#include "tests/gradcheck.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("gradcheck: upsample2x nearest and bilinear, including one-pixel rows and columns") {
  uint64_t seed = 1;
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 2, 1, 3}, Shape{1, 1, 3, 1}, Shape{1, 1, 1, 1},
                         Shape{2, 1, 2, 2}}) {
    for (UpsampleMode mode : {UpsampleMode::nearest, UpsampleMode::bilinear}) {
      gradcheck(
          std::string("upsample2x ") + (mode == UpsampleMode::bilinear ? "bilinear " : "nearest ") +
              shape_str(s),
          [mode](const std::vector<Tensor>& t) { return upsample2x(t[0], mode); },
          {rand64(s, seed++)}, linear_op_tol());
    }
  }
  // Through a following op, so the gradient reaching upsample2x is not the cotangent itself.
  gradcheck(
      "upsample2x bilinear then mul",
      [](const std::vector<Tensor>& t) {
        return mul(upsample2x(t[0], UpsampleMode::bilinear), t[1]);
      },
      {rand64({1, 2, 3, 3}, 20), rand64({1, 2, 6, 6}, 21)}, linear_op_tol());
}

namespace {
struct Case {
  int64_t N, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, oph, opw;
  bool bias;
};
}  // namespace

TEST_CASE(
    "gradcheck: conv_transpose2d over strides, paddings, output paddings, with and without "
    "bias") {
  const Case cases[] = {
      {2, 3, 3, 4, 2, 2, 2, 2, 2, 0, 0, 0, 0, true},   // U-Net's 2x2 stride-2 upsampling
      {1, 2, 3, 3, 3, 3, 3, 2, 2, 1, 1, 1, 1, true},   // 3x3 stride 2, output padding 1
      {2, 2, 4, 3, 2, 3, 3, 1, 1, 1, 1, 0, 0, false},  // stride 1
      {1, 3, 2, 3, 2, 1, 1, 1, 1, 0, 0, 0, 0, true},   // 1x1
      {1, 2, 3, 2, 2, 3, 2, 3, 2, 1, 0, 2, 1, true},   // asymmetric everything
      {1, 1, 2, 2, 2, 4, 4, 2, 2, 2, 2, 0, 0, false},  // padding equal to the stride
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    std::vector<Tensor> in = {rand64({c.N, c.Cin, c.H, c.W}, seed++),
                              rand64({c.Cin, c.Cout, c.kh, c.kw}, seed++)};
    if (c.bias) in.push_back(rand64({c.Cout}, seed++));
    const std::string name =
        "conv_transpose2d x[" + std::to_string(c.N) + "," + std::to_string(c.Cin) + "," +
        std::to_string(c.H) + "," + std::to_string(c.W) + "] k" + std::to_string(c.kh) + "x" +
        std::to_string(c.kw) + " s" + std::to_string(c.sh) + "x" + std::to_string(c.sw) + " p" +
        std::to_string(c.ph) + "x" + std::to_string(c.pw) + " op" + std::to_string(c.oph) + "x" +
        std::to_string(c.opw) + (c.bias ? " bias" : "");
    gradcheck(
        name,
        [c](const std::vector<Tensor>& t) {
          return conv_transpose2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.sh, c.sw, c.ph, c.pw,
                                  c.oph, c.opw);
        },
        in, linear_op_tol());
  }
}

TEST_CASE("gradcheck: conv_transpose2d where only the weight or only the bias needs a gradient") {
  Tensor x = rand64({2, 2, 3, 3}, 1), w = rand64({2, 3, 3, 3}, 2), b = rand64({3}, 3);
  GradcheckOptions only_w = linear_op_tol();
  only_w.inputs = {1};
  gradcheck(
      "conv_transpose2d (weight only)",
      [](const std::vector<Tensor>& t) { return conv_transpose2d(t[0], t[1], t[2], 2, 1, 1); },
      {x, w, b}, only_w);
  GradcheckOptions only_b = linear_op_tol();
  only_b.inputs = {2};
  gradcheck(
      "conv_transpose2d (bias only)",
      [](const std::vector<Tensor>& t) { return conv_transpose2d(t[0], t[1], t[2], 1, 0, 0); },
      {x, w, b}, only_b);
}

TEST_CASE("gradcheck: a U-Net level (pool, transposed conv, upsampling, concat skip, split)") {
  // At most quadratic in each input element, so linear_op_tol applies.
  gradcheck(
      "unet level",
      [](const std::vector<Tensor>& t) {
        Tensor skip = conv2d(t[0], t[1], Tensor(), 1, 1);         // (1, 3, 6, 6)
        Tensor down = avg_pool2d(skip, 2, 2, 0);                  // (1, 3, 3, 3)
        Tensor up = conv_transpose2d(down, t[2], t[3], 2, 0, 0);  // (1, 2, 6, 6)
        Tensor side = upsample2x(down, UpsampleMode::bilinear);   // (1, 3, 6, 6)
        Tensor joined = concat({up, skip, side}, 1);              // (1, 8, 6, 6)
        const std::vector<Tensor> p = split(joined, {3, 5}, 1);   // (1, 3 | 5, 6, 6)
        return narrow(concat({mul(p[0], p[0]), p[1]}, 1), 2, 1, 4);
      },
      {rand64({1, 2, 6, 6}, 50), rand64({3, 2, 3, 3}, 51), rand64({3, 2, 2, 2}, 52),
       rand64({2}, 53)},
      linear_op_tol());
}
