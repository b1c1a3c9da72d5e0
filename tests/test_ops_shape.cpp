// concat, split and narrow: values against a reference that walks full multi-indices (ranks 1 to
// 5, every dimension, negative dims, empty pieces, rows long enough to be cut over threads), the
// slice_copy launcher's untouched rows, gradients routed by backward (zeros where nothing flowed),
// replay of a split node, and the error messages. Finite-difference checks are in
// tests/test_gradcheck_shape.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/kernels/kernels.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

template <class T>
Tensor rand_t(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return uniform(s, -1.0, 1.0, g, dtype_of<T>::value);
}

// Row-major coordinates of flat index i in shape s, and back.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    c[d] = i % s[d];
    i /= s[d];
  }
  return c;
}
int64_t ravel(const std::vector<int64_t>& c, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + c[d];
  return i;
}

// concat by coordinates: output element c comes from the input whose range holds c[dim].
template <class T>
std::vector<T> ref_concat(const std::vector<Tensor>& xs, int dim) {
  Shape ys = xs[0].shape();
  ys[dim] = 0;
  for (const Tensor& x : xs) ys[dim] += x.size(dim);
  std::vector<T> y(static_cast<size_t>(shape_numel(ys)));
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    std::vector<int64_t> c = unravel(i, ys);
    size_t k = 0;
    while (c[dim] >= xs[k].size(dim)) c[dim] -= xs[k++].size(dim);
    y[static_cast<size_t>(i)] = xs[k].data<T>()[ravel(c, xs[k].shape())];
  }
  return y;
}

// narrow by coordinates.
template <class T>
std::vector<T> ref_narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  Shape ys = x.shape();
  ys[dim] = length;
  std::vector<T> y(static_cast<size_t>(shape_numel(ys)));
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    std::vector<int64_t> c = unravel(i, ys);
    c[dim] += start;
    y[static_cast<size_t>(i)] = x.data<T>()[ravel(c, x.shape())];
  }
  return y;
}

const Shape kShapes[] = {{7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 5}, {2, 3, 1, 2, 3}};

}  // namespace

TEST_CASE_TEMPLATE("concat, split and narrow match coordinate loops on every dim of ranks 1-5", T,
                   float, double) {
  uint64_t seed = 1;
  for (const Shape& base : kShapes) {
    const int nd = static_cast<int>(base.size());
    for (int dim = 0; dim < nd; ++dim) {
      const std::string tag = shape_str(base) + " dim " + std::to_string(dim);
      // Three inputs of extents 2, 0 and 3 along dim.
      std::vector<Tensor> xs;
      for (int64_t e : {int64_t{2}, int64_t{0}, int64_t{3}}) {
        Shape s = base;
        s[dim] = e;
        xs.push_back(rand_t<T>(s, seed++));
      }
      // A negative dim names the same dimension.
      const int64_t neg = dim - nd;
      Tensor y = concat(xs, dim % 2 ? neg : dim);
      Shape want_shape = base;
      want_shape[dim] = 5;
      REQUIRE_MESSAGE(y.shape() == want_shape, tag);
      CHECK_MESSAGE(y.to_vector<T>() == ref_concat<T>(xs, dim), tag, " concat");

      const std::vector<Tensor> parts = split(y, {2, 0, 3}, dim % 2 ? dim : neg);
      REQUIRE(parts.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CHECK_MESSAGE(parts[k].shape() == xs[k].shape(), tag, " split piece ", k);
        CHECK_MESSAGE(parts[k].to_vector<T>() == xs[k].to_vector<T>(), tag, " split piece ", k);
      }
      for (int64_t start : {int64_t{0}, int64_t{1}, int64_t{-2}}) {
        const int64_t first = start < 0 ? start + 5 : start;
        Tensor z = narrow(y, dim, start, 2);
        CHECK_MESSAGE(z.to_vector<T>() == ref_narrow<T>(y, dim, first, 2), tag, " narrow ", start);
      }
      CHECK(narrow(y, dim, 5, 0).numel() == 0);
    }
  }
}

TEST_CASE("slice_copy writes only its rows, and long rows cut over threads give the same bits") {
  // x: (2, 4, 3) rows [1, 3) -> y: (2, 5, 3) rows [2, 4); every other element of y stays.
  std::vector<double> x(24), y(30, -7.0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  SliceShape s;
  s.outer = 2;
  s.len = 2;
  s.inner = 3;
  s.x_dim = 4;
  s.x_start = 1;
  s.y_dim = 5;
  s.y_start = 2;
  cpu::slice_copy<double>(x.data(), y.data(), s);
  for (int64_t o = 0; o < 2; ++o)
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t i = 0; i < 3; ++i) {
        const double got = y[static_cast<size_t>((o * 5 + r) * 3 + i)];
        const double want =
            r >= 2 && r < 4 ? x[static_cast<size_t>((o * 4 + r - 1) * 3 + i)] : -7.0;
        CHECK(got == want);
      }
  // concat along dim 0 of two long vectors: outer = 1, rows of 300001 and 70000 elements are cut
  // into pieces; 1 and 4 threads must agree with the reference.
  Tensor a = rand_t<float>({300001}, 3), b = rand_t<float>({70000}, 4);
  const std::vector<float> want = ref_concat<float>({a, b}, 0);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 4}) {
    omp_set_num_threads(threads);
    CHECK(concat({a, b}, 0).to_vector<float>() == want);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("concat, split and narrow backward route the gradient, zeros where nothing flowed") {
  Tensor a = arange(6, DType::f64).reshape({2, 3}).set_requires_grad(true);
  Tensor b = arange(4, DType::f64).reshape({2, 2}).set_requires_grad(true);
  // y = [a | b] (2, 5); the cotangent R = 1..10 row-major.
  Tensor y = concat({a, b}, 1);
  Tensor r = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  Tape::current().backward(y, r);
  CHECK(a.grad().to_vector<double>() == std::vector<double>{1, 2, 3, 6, 7, 8});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{4, 5, 9, 10});

  // Only the last of three pieces reaches the loss: the others' rows of dx are zero.
  Tensor x = arange(12, DType::f64).reshape({4, 3}).set_requires_grad(true);
  std::vector<Tensor> p = split(x, {1, 1, 2}, 0);
  backward(sum(mul(p[2], p[2])));  // d/dx = 2x on rows 2..3
  CHECK(x.grad().to_vector<double>() ==
        std::vector<double>{0, 0, 0, 0, 0, 0, 12, 14, 16, 18, 20, 22});
  // Two pieces used, one of them narrowed.
  Tensor x2 = arange(12, DType::f64).reshape({3, 4}).set_requires_grad(true);
  p = split(x2, {3, 1}, 1);
  backward(sum(add(scale(p[1], 3.0), narrow(p[0], 1, 2, 1))));
  CHECK(x2.grad().to_vector<double>() == std::vector<double>{0, 0, 1, 3, 0, 0, 1, 3, 0, 0, 1, 3});

  Tensor z = arange(10, DType::f64).reshape({2, 5}).set_requires_grad(true);
  Tensor n = narrow(z, -1, 1, 3);
  Tape::current().backward(n, from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  CHECK(z.grad().to_vector<double>() == std::vector<double>{0, 1, 2, 3, 0, 0, 4, 5, 6, 0});
}

TEST_CASE("split records one node with one visible output per piece, and replays bit for bit") {
  Tape& tape = Tape::current();
  tape.clear();
  Tensor x = rand_t<float>({4, 6, 5}, 9).set_requires_grad(true);
  const std::vector<Tensor> p = split(x, {1, 3, 2}, 1);
  REQUIRE(tape.nodes().size() == 1);
  const Node& node = tape.node(0);
  CHECK(node.kind == OpKind::split);
  CHECK(std::string(op_name(node.kind)) == "split");
  CHECK(node.num_visible_outputs == 3);
  CHECK(node.outputs.size() == 3);
  CHECK(node.saved.empty());  // shapes only
  for (size_t k = 0; k < 3; ++k) CHECK(p[k].requires_grad());
  const std::vector<Tensor> again = tape.replay(0, {x});
  REQUIRE(again.size() == 3);
  for (size_t k = 0; k < 3; ++k) CHECK(again[k].to_vector<float>() == p[k].to_vector<float>());
  tape.clear();
  // Without grad no node is recorded, and every piece still comes back.
  const std::vector<Tensor> q = split(rand_t<float>({5}, 2), {1, 1, 1, 1, 1}, 0);
  CHECK(q.size() == 5);
  CHECK(tape.empty());
}

TEST_CASE("concat, split and narrow reject bad input with messages naming the op and the shapes") {
  Tensor x = zeros({2, 3, 4});
  expect_error([] { concat({}, 0); }, {"concat: no tensors to join"});
  expect_error(
      [&] {
        concat({x, zeros({2, 5, 5})}, 1);
      },
      {"concat: tensor 1 [2, 5, 5] does not match tensor 0 [2, 3, 4] outside dim 1"});
  expect_error(
      [&] {
        concat({x, zeros({2, 3})}, 0);
      },
      {"concat: tensor 1 [2, 3] does not match tensor 0 [2, 3, 4]"});
  expect_error(
      [&] {
        concat({x, x}, 3);
      },
      {"concat: dim 3 out of range for input [2, 3, 4] of 3 dimensions"});
  expect_error([&] { concat({x, x}, -4); }, {"concat: dim -4 out of range"});
  expect_error([&] { concat({x, x.to(DType::f64)}, 0); }, {"concat", "dtype mismatch"});
  expect_error([&] { concat({x, Tensor()}, 0); }, {"concat: tensor 1 is undefined"});
  expect_error([&] { concat({zeros({2}, DType::i64)}, 0); },
               {"concat: expected a floating-point tensor"});
  expect_error([] { concat({zeros({})}, 0); }, {"concat: input [] is a scalar"});

  expect_error(
      [&] {
        split(x, {1, 1}, 1);
      },
      {"split: sizes (1, 1) sum to 2, not to size 3 of dim 1 of input [2, 3, 4]"});
  expect_error(
      [&] {
        split(x, {4, -1}, 1);
      },
      {"split: sizes (4, -1) of input [2, 3, 4] must be non-negative"});
  expect_error([&] { split(x, {}, 0); }, {"split: 0 pieces () of input [2, 3, 4]; 1 to 11"});
  expect_error([&] { split(zeros({12}), std::vector<int64_t>(12, 1), 0); },
               {"split: 12 pieces", "1 to 11 are supported"});
  expect_error([&] { split(x, {2}, -5); }, {"split: dim -5 out of range for input [2, 3, 4]"});
  expect_error([] { split(Tensor(), {1}, 0); }, {"split: input is undefined"});

  expect_error([&] { narrow(x, 2, 3, 2); },
               {"narrow: start 3 + length 2 exceeds size 4 of dim 2 of input [2, 3, 4]"});
  expect_error([&] { narrow(x, 1, -4, 1); },
               {"narrow: start -4 out of range for size 3 of dim 1 of input [2, 3, 4]"});
  expect_error([&] { narrow(x, 0, 0, -1); },
               {"narrow: length -1 must be non-negative (input [2, 3, 4])"});
  expect_error([&] { narrow(x, 3, 0, 1); }, {"narrow: dim 3 out of range for input [2, 3, 4]"});
  expect_error([] { narrow(zeros({3}, DType::i32), 0, 0, 1); },
               {"narrow: expected a floating-point tensor"});
}
