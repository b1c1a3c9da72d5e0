// Ops through autograd on cuda:0 against the same graph on the CPU: forward values and gradients
// within FP32 tolerance, and a second CUDA backward that must give the same gradient bits
// (determinism). Covers the differentiable ops of autograd/ops_basic.cpp (linear, matmul, bmm,
// relu, gelu, add/mul with broadcast, scale, reshape, sum, mean) and the chunked
// linear_cross_entropy of autograd/ops_cross_entropy.cpp; and the 16-bit (bf16, f16) paths of
// linear with a bias, scale, sum, mean, conv2d, conv_transpose2d and linear_cross_entropy on cuda:0
// against the CPU's 16-bit paths, with tolerances from the format's unit roundoff. Skipped (exit
// 77) without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/core/cuda/runtime.h"
#include "regen/core/tensor.h"

using namespace regen;

namespace {

using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs drawn from one Philox stream: the same values on every device.
std::vector<Tensor> make_inputs(const std::vector<Shape>& shapes, Device device) {
  Generator g(2024);
  std::vector<Tensor> in;
  for (const Shape& s : shapes) {
    Tensor t = uniform(s, -1.0, 1.0, g, DType::f32, device);
    t.set_requires_grad(true);
    in.push_back(t);
  }
  return in;
}

struct Run {
  std::vector<float> value;
  std::vector<std::vector<float>> grads;
};

Run run(const Graph& f, const std::vector<Shape>& shapes, Device device) {
  std::vector<Tensor> in = make_inputs(shapes, device);
  Tensor loss = f(in);
  Run r;
  r.value = loss.to_vector<float>();
  backward(loss);
  loss = Tensor();
  for (const Tensor& t : in) {
    REQUIRE_MESSAGE(t.grad().defined(), "an input received no gradient");
    CHECK(t.grad().device() == device);
    r.grads.push_back(t.grad().to_vector<float>());
  }
  return r;
}

// |got - ref| <= rtol * (|ref| + max |ref|): relative to the tensor's scale, since gradients of a
// mean are tiny in absolute terms.
void close(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref,
           double rtol) {
  REQUIRE(got.size() == ref.size());
  double scale = 0;
  for (float r : ref) scale = std::max(scale, std::fabs(static_cast<double>(r)));
  const double atol = rtol * scale;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!std::isfinite(got[i]) || d > atol + rtol * std::fabs(ref[i])) ++bad;
    worst = std::max(worst, d);
  }
  MESSAGE(what << ": n=" << got.size() << " max_abs=" << worst);
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " elements out of tolerance (rtol " << rtol
                               << " of |ref| + max |ref|)");
}

void compare(const std::string& name, const Graph& f, const std::vector<Shape>& shapes) {
  INFO("graph: " << name);
  cuda::set_device(0);
  const Run cpu = run(f, shapes, Device::cpu());
  const Run gpu = run(f, shapes, Device::cuda(0));
  close(name + " forward", gpu.value, cpu.value, 1e-4);
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    close(name + " grad " + std::to_string(i), gpu.grads[i], cpu.grads[i], 1e-4);
  const Run again = run(f, shapes, Device::cuda(0));
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    CHECK_MESSAGE(std::memcmp(again.grads[i].data(), gpu.grads[i].data(),
                              gpu.grads[i].size() * sizeof(float)) == 0,
                  name << ": gradient " << i << " differs between two CUDA runs");
  }
}

// The unit roundoff of a 16-bit dtype.
double unit_roundoff(DType dt) {
  return dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
}

// A graph whose f32 leaves are cast to `dt` inside (so its ops run their 16-bit paths and the
// gradients come back through the casts' backward, f32), on the CPU and cuda:0. Each device rounds
// every stored 16-bit element once, after f32 sums in its own order (a few hundred terms at these
// shapes: their f32 reorderings stay below 2^-24 * 300 < u): an element may land one 16-bit
// rounding (2u) away. The forward value gets `value_ulps` such roundings; each gradient element
// 8u of |ref| + max |ref|: the op's output (2u) reaches the cotangent through the loss, the
// cotangent's own rounding (2u) and the gradient's (2u), plus margin for the f32 reorderings.
void compare_lowp(const std::string& name, DType dt, const Graph& f,
                  const std::vector<Shape>& shapes, double value_ulps) {
  INFO("graph: " << name << " in " << dtype_name(dt));
  cuda::set_device(0);
  const double u = unit_roundoff(dt);
  const Run cpu = run(f, shapes, Device::cpu());
  const Run gpu = run(f, shapes, Device::cuda(0));
  close(name + " " + dtype_name(dt) + " forward", gpu.value, cpu.value, value_ulps * 2 * u);
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    close(name + " " + dtype_name(dt) + " grad " + std::to_string(i), gpu.grads[i], cpu.grads[i],
          8 * u);
  }
  const Run again = run(f, shapes, Device::cuda(0));
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    CHECK_MESSAGE(std::memcmp(again.grads[i].data(), gpu.grads[i].data(),
                              gpu.grads[i].size() * sizeof(float)) == 0,
                  name << ": gradient " << i << " differs between two CUDA runs");
  }
}

// sum of y^2 over y's elements, in f32 (every term positive: no cancellation, so a relative
// difference of y's elements bounds the loss's).
Tensor squares(const Tensor& y) {
  const Tensor w = cast(y, DType::f32);
  return mean(mul(w, w));
}

}  // namespace

// The ops whose 16-bit CUDA paths autograd dispatches (linear with a bias, scale, sum's and mean's
// backward, conv2d, conv_transpose2d, linear_cross_entropy): CUDA against the CPU's 16-bit path.
TEST_CASE("cuda autograd: 16-bit linear with bias, scale, sum, mean, conv, transposed conv") {
  for (const DType dt : {DType::bf16, DType::f16}) {
    compare_lowp(
        "linear bias, scale, sum", dt,
        [dt](const std::vector<Tensor>& in) {
          // x: (6, 20), w: (9, 20), b: (9)
          const Tensor y = linear(cast(in[0], dt), cast(in[1], dt), cast(in[2], dt));  // 16-bit
          const Tensor z = scale(y, 0.3);
          // sum and mean of a 16-bit tensor: 16-bit scalars (their backward fills dx)
          const Tensor s = add(cast(sum(mul(z, z)), DType::f32), cast(mean(z), DType::f32));
          return add(s, squares(z));
        },
        {{6, 20}, {9, 20}, {9}}, 8);
    compare_lowp(
        "conv2d bias stride 2", dt,
        [dt](const std::vector<Tensor>& in) {
          // x: (2, 3, 7, 7), w: (4, 3, 3, 3), b: (4)
          return squares(conv2d(cast(in[0], dt), cast(in[1], dt), cast(in[2], dt), 2, 1));
        },
        {{2, 3, 7, 7}, {4, 3, 3, 3}, {4}}, 4);
    compare_lowp(
        "conv2d 1x1 no bias", dt,
        [dt](const std::vector<Tensor>& in) {
          return squares(conv2d(cast(in[0], dt), cast(in[1], dt), Tensor(), 1, 0));
        },
        {{2, 5, 4, 4}, {3, 5, 1, 1}}, 4);
    compare_lowp(
        "conv_transpose2d bias stride 2", dt,
        [dt](const std::vector<Tensor>& in) {
          // x: (2, 4, 3, 3), w: (4, 3, 3, 3) = (C_in, C_out, kh, kw), b: (3)
          return squares(
              conv_transpose2d(cast(in[0], dt), cast(in[1], dt), cast(in[2], dt), 2, 1, 1));
        },
        {{2, 4, 3, 3}, {4, 3, 3, 3}, {3}}, 4);
  }
}

TEST_CASE("cuda autograd: 16-bit fused linear + cross-entropy, with and without bias") {
  // x: (M, K), weight: (V, K), bias: (V); every fifth row ignored; in chunks of 8 and in one; the
  // gradients made in the forward and recomputed in the backward.
  const int64_t M = 21, K = 12, V = 37;
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < M; ++r) tv.push_back(r % 5 == 1 ? -100 : (r * 13) % V);
  for (const DType dt : {DType::bf16, DType::f16}) {
    for (const bool recompute : {false, true}) {
      for (const int64_t chunk : {int64_t{8}, int64_t{0}}) {
        const std::string how =
            "chunk " + std::to_string(chunk) + (recompute ? " recompute" : " forward gradients");
        // The loss is f32 from f32 logits of the same 16-bit operands: f32 roundoff apart (far
        // below one 16-bit rounding, the bar given).
        compare_lowp(
            "linear_cross_entropy " + how, dt,
            [&](const std::vector<Tensor>& in) {
              const Tensor t = from_vector<int64_t>(tv, {M}).to(in[0].device());
              return linear_cross_entropy(cast(in[0], dt), cast(in[1], dt), cast(in[2], dt), t,
                                          -100, chunk, recompute);
            },
            {{M, K}, {V, K}, {V}}, 1);
        compare_lowp(
            "linear_cross_entropy no bias " + how, dt,
            [&](const std::vector<Tensor>& in) {
              const Tensor t = from_vector<int64_t>(tv, {M}).to(in[0].device());
              return linear_cross_entropy(cast(in[0], dt), cast(in[1], dt), Tensor(), t, -100,
                                          chunk, recompute);
            },
            {{M, K}, {V, K}}, 1);
      }
    }
  }
}

TEST_CASE("cuda autograd: a two-layer MLP with broadcast ops") {
  compare("mlp",
          [](const std::vector<Tensor>& in) {
            // x: (16, 32), w1: (64, 32), b1: (64), w2: (8, 64), b2: (8), c: (8)
            const Tensor h = relu(linear(in[0], in[1], in[2]));
            const Tensor o = gelu(linear(h, in[3], in[4]));
            return mean(add(scale(mul(o, in[5]), 0.5), o));
          },
          {{16, 32}, {64, 32}, {64}, {8, 64}, {8}, {8}});
}

TEST_CASE("cuda autograd: matmul and bmm with transposes") {
  compare("bmm",
          [](const std::vector<Tensor>& in) {
            const Tensor a =
                bmm(in[0], in[1], false, true);           // (3, 5, 7) x (3, 6, 7)^T -> (3, 5, 6)
            const Tensor b = bmm(in[2], a, true, false);  // (3, 5, 4)^T x (3, 5, 6) -> (3, 4, 6)
            const Tensor m = matmul(reshape(b, {12, 6}), in[3]);  // (12, 6) x (6, 2)
            return sum(mul(m, m));
          },
          {{3, 5, 7}, {3, 6, 7}, {3, 5, 4}, {6, 2}});
}

TEST_CASE("cuda autograd: a transformer-sized feed-forward block") {
  compare("ffn",
          [](const std::vector<Tensor>& in) {
            // x: (2*128, 512) -> 2048 -> 512, residual
            const Tensor h = gelu(linear(in[0], in[1], in[2]));
            return mean(mul(add(linear(h, in[3], in[4]), in[0]), in[0]));
          },
          {{256, 512}, {2048, 512}, {2048}, {512, 2048}, {512}});
}

TEST_CASE("cuda autograd: fused linear + cross-entropy in chunks, with and without bias") {
  // x: (M, K), weight: (V, K), bias: (V); M = 37 rows in chunks of 8 (the last one 5 rows), every
  // fifth row ignored; then the same in one chunk.
  const int64_t M = 37, K = 24, V = 301;
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < M; ++r) tv.push_back(r % 5 == 1 ? -100 : (r * 13) % V);
  // Gradients made in the forward, and recomputed in the backward.
  for (const bool recompute : {false, true}) {
    for (const int64_t chunk : {int64_t{8}, int64_t{0}}) {
      const std::string how = std::to_string(chunk) + (recompute ? " recompute" : "");
      compare("linear_cross_entropy chunk " + how,
              [&](const std::vector<Tensor>& in) {
                const Tensor t = from_vector<int64_t>(tv, {M}).to(in[0].device());
                return linear_cross_entropy(in[0], in[1], in[2], t, -100, chunk, recompute);
              },
              {{M, K}, {V, K}, {V}});
      compare("linear_cross_entropy no bias chunk " + how,
              [&](const std::vector<Tensor>& in) {
                const Tensor t = from_vector<int64_t>(tv, {M}).to(in[0].device());
                return linear_cross_entropy(in[0], in[1], Tensor(), t, -100, chunk, recompute);
              },
              {{M, K}, {V, K}});
    }
  }
}
