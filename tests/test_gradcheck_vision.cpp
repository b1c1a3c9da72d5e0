// Finite-difference gradient checks (f64, CPU) for conv2d, batchnorm2d (train and eval),
// max_pool2d, avg_pool2d, transpose and permute, beyond the op table's rows (tests/op_table.h,
// which also gradchecks global_avg_pool). The harness is tests/gradcheck.h (with the per-op
// tolerances); forward values are checked in tests/test_ops_vision.cpp.
#include <cmath>
#include <string>

#include "tests/gradcheck.h"

using namespace regen;
using namespace regen::testing;

namespace {
struct ConvCase {
  int64_t N, C, H, W, K, R, S, sh, sw, ph, pw;
  bool bias;
};

std::string conv_name(const ConvCase& c) {
  return "conv2d x[" + std::to_string(c.N) + "," + std::to_string(c.C) + "," + std::to_string(c.H) +
         "," + std::to_string(c.W) + "] w[" + std::to_string(c.K) + "," + std::to_string(c.C) +
         "," + std::to_string(c.R) + "," + std::to_string(c.S) + "] stride " +
         std::to_string(c.sh) + "x" + std::to_string(c.sw) + " pad " + std::to_string(c.ph) + "x" +
         std::to_string(c.pw) + (c.bias ? " bias" : "");
}
}  // namespace

TEST_CASE("gradcheck: conv2d over strides, paddings, kernel sizes, with and without bias") {
  const ConvCase cases[] = {
      {2, 3, 5, 6, 4, 1, 1, 1, 1, 0, 0, true},   // 1x1 stride 1: GEMM on x itself
      {1, 4, 5, 5, 3, 1, 1, 1, 1, 0, 0, false},  // the same, one image
      {2, 3, 7, 6, 4, 1, 1, 2, 2, 0, 0, false},  // 1x1 stride 2 (downsample)
      {2, 2, 6, 5, 3, 3, 3, 1, 1, 1, 1, true},   // 3x3 same padding
      {1, 3, 7, 7, 2, 3, 3, 2, 2, 1, 1, false},  // 3x3 stride 2, odd input
      {2, 2, 9, 11, 3, 7, 7, 2, 2, 3, 3, true},  // 7x7 stride 2 pad 3 (the stem)
      {3, 2, 5, 7, 2, 2, 3, 2, 1, 0, 2, true},   // asymmetric kernel, stride and padding
      {1, 1, 4, 4, 1, 4, 4, 1, 1, 0, 0, false},  // kernel covering the whole input
  };
  for (const ConvCase& c : cases) {
    const uint64_t seed = static_cast<uint64_t>(c.N * 100 + c.C * 10 + c.R);
    std::vector<Tensor> in = {rand64({c.N, c.C, c.H, c.W}, seed),
                              rand64({c.K, c.C, c.R, c.S}, seed + 1)};
    if (c.bias) in.push_back(rand64({c.K}, seed + 2));
    gradcheck(
        conv_name(c),
        [c](const std::vector<Tensor>& t) {
          return conv2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.sh, c.sw, c.ph, c.pw);
        },
        in, linear_op_tol());
  }
}

TEST_CASE("gradcheck: conv2d where only the weight or only the bias needs a gradient") {
  Tensor x = rand64({2, 2, 5, 5}, 1), w = rand64({3, 2, 3, 3}, 2), b = rand64({3}, 3);
  GradcheckOptions only_w = linear_op_tol();
  only_w.inputs = {1};
  gradcheck(
      "conv2d (weight only)",
      [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], 1, 1); }, {x, w, b},
      only_w);
  GradcheckOptions only_b = linear_op_tol();
  only_b.inputs = {2};
  gradcheck(
      "conv2d (bias only)",
      [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], 2, 0); }, {x, w, b},
      only_b);
}

TEST_CASE("gradcheck: batchnorm2d in training mode (x, gamma, beta)") {
  // The running statistics are buffers (no gradient); they travel outside the checked inputs.
  Tensor rm = zeros({3}, DType::f64), rv = ones({3}, DType::f64);
  gradcheck(
      "batchnorm2d train",
      [&](const std::vector<Tensor>& t) {
        return batchnorm2d(t[0], t[1], t[2], rm, rv, /*training=*/true, 0.1, 1e-5);
      },
      {rand64({3, 3, 4, 5}, 1, -2, 3), rand64({3}, 2, 0.5, 1.5), rand64({3}, 3)}, smooth_op_tol());
  // One image with a 1x2 plane: the smallest batch that has a variance.
  gradcheck(
      "batchnorm2d train (two values per channel)",
      [&](const std::vector<Tensor>& t) {
        return batchnorm2d(t[0], t[1], t[2], rm, rv, true, 0.1, 1e-3);
      },
      {rand64({1, 3, 1, 2}, 4), rand64({3}, 5, 0.5, 1.5), rand64({3}, 6)}, smooth_op_tol());
}

TEST_CASE("gradcheck: batchnorm2d in eval mode (x, gamma, beta)") {
  Tensor rm = rand64({4}, 7), rv = rand64({4}, 8, 0.5, 2.0);
  gradcheck(
      "batchnorm2d eval",
      [&](const std::vector<Tensor>& t) {
        return batchnorm2d(t[0], t[1], t[2], rm, rv, /*training=*/false, 0.1, 1e-5);
      },
      {rand64({2, 4, 3, 3}, 9), rand64({4}, 10, 0.5, 1.5), rand64({4}, 11)},
      linear_op_tol());  // eval: an affine map of x, gamma and beta each
}

TEST_CASE("gradcheck: max_pool2d away from ties") {
  struct Case {
    Shape x;
    int64_t k, s, p;
  };
  const Case cases[] = {{{2, 3, 6, 6}, 2, 2, 0}, {{1, 2, 7, 5}, 3, 2, 1}, {{2, 2, 5, 6}, 3, 1, 1}};
  uint64_t seed = 20;
  for (const Case& c : cases) {
    Tensor x = rand64(c.x, seed++);
    // A central difference moves an element by eps: skip elements within 1e-4 of another
    // element of the same plane, where the argmax could flip (a non-smooth point).
    const std::vector<double> v = x.to_vector<double>();
    const int64_t plane = c.x[2] * c.x[3];
    // Piecewise linear: exact differences, but the step must stay below the 1e-4 skip distance.
    GradcheckOptions opt = linear_op_tol(1e-5);
    opt.skip = [v, plane](int, int64_t j) {
      const int64_t base = j / plane * plane;
      for (int64_t i = base; i < base + plane; ++i) {
        if (i != j && std::fabs(v[i] - v[j]) < 1e-4) return true;
      }
      return false;
    };
    gradcheck(
        "max_pool2d k" + std::to_string(c.k) + " s" + std::to_string(c.s) + " p" +
            std::to_string(c.p),
        [c](const std::vector<Tensor>& t) { return max_pool2d(t[0], c.k, c.s, c.p); }, {x}, opt);
  }
}

TEST_CASE("gradcheck: avg_pool2d with padding and stride 1") {
  gradcheck(
      "avg_pool2d k3 s2 p1", [](const std::vector<Tensor>& t) { return avg_pool2d(t[0], 3, 2, 1); },
      {rand64({2, 3, 7, 6}, 30)}, linear_op_tol());
  gradcheck(
      "avg_pool2d k2 s1 p0", [](const std::vector<Tensor>& t) { return avg_pool2d(t[0], 2, 1, 0); },
      {rand64({1, 2, 4, 5}, 31)}, linear_op_tol());
}

TEST_CASE("gradcheck: transpose and permute") {
  gradcheck(
      "transpose (1, 2)", [](const std::vector<Tensor>& t) { return transpose(t[0], 1, 2); },
      {rand64({2, 3, 4}, 40)}, linear_op_tol());
  gradcheck(
      "transpose (-1, 0)", [](const std::vector<Tensor>& t) { return transpose(t[0], -1, 0); },
      {rand64({3, 5}, 41)}, linear_op_tol());
  gradcheck(
      "permute (2, 0, 3, 1)",
      [](const std::vector<Tensor>& t) {
        return permute(t[0], {2, 0, 3, 1});
      },
      {rand64({2, 3, 4, 2}, 42)}, linear_op_tol());
  gradcheck(
      "permute 6-d",
      [](const std::vector<Tensor>& t) {
        return permute(t[0], {5, 3, 1, 0, 4, 2});
      },
      {rand64({2, 1, 3, 2, 2, 3}, 43)}, linear_op_tol());
  // Through a following op, so the gradient reaching permute is not uniform.
  gradcheck(
      "permute then mul",
      [](const std::vector<Tensor>& t) {
        return mul(permute(t[0], {1, 0, 2}), t[1]);
      },
      {rand64({2, 3, 4}, 44), rand64({3, 2, 4}, 45)}, linear_op_tol());
}
