// The autograd engine: the tape's records, saved tensors and their release, gradient
// accumulation, memory after backward, determinism with dropout, training an MLP and a CNN, the
// no-grad scope, and the errors (backward twice, mismatched shapes, wrong dtypes, mixed devices).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "autograd/ops.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/optim.h"
#include "models/train.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {
// A container so parameters get unique full names ("l1.weight").
class Net : public Module {
 public:
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    M& ref = register_module(name, std::move(m));
    assign_full_names();
    return ref;
  }
};

int64_t allocated(Category c) {
  return allocator_for(Device::cpu()).stats().allocated_by[static_cast<int>(c)].current;
}
}  // namespace

TEST_CASE("tape: nodes, values and saved tensors are recorded, then released by backward") {
  Generator g(1);
  Tensor w = uniform({4, 3}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({5, 3}, -1, 1, g);
  Tape& tape = Tape::current();
  REQUIRE(tape.empty());
  Tensor h = relu(linear(x, w));
  Tensor loss = mean(h);
  h = Tensor();
  REQUIRE(tape.nodes().size() == 3);
  CHECK(tape.node(0).kind == OpKind::linear);
  CHECK(tape.node(1).kind == OpKind::relu);
  CHECK(tape.node(2).kind == OpKind::mean);
  // linear saves x and w (leaves); relu saves its output, an activation.
  const Node& r = tape.node(1);
  REQUIRE(r.saved.size() == 1);
  const Value& out = tape.value(r.saved[0]);
  CHECK(out.producer == 1);
  const SavedTensor& s = tape.saved_tensor(out.saved);
  CHECK(s.producer == 1);
  CHECK(s.bytes == 5 * 4 * 4);
  CHECK(s.category == Category::activation);
  CHECK(s.state == SavedState::resident);
  CHECK(s.readers == std::vector<int32_t>{1});
  backward(loss);
  CHECK(tape.empty());
  CHECK(w.grad().defined());
}

TEST_CASE("backward: parameter gradients accumulate and activation memory is gone afterwards") {
  Generator g(2);
  Tensor w = uniform({8, 8}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({16, 8}, -1, 1, g);
  const int64_t act_before = allocated(Category::activation);
  backward(sum(relu(linear(relu(linear(x, w)), w))));  // w used twice: contributions add
  const std::vector<float> once = w.grad().to_vector<float>();
  CHECK(allocated(Category::activation) == act_before);
  backward(sum(relu(linear(relu(linear(x, w)), w))));
  const std::vector<float> twice = w.grad().to_vector<float>();
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]));
  CHECK(allocated(Category::activation) == act_before);
  zero_grad({w});
  for (float v : w.grad().to_vector<float>()) CHECK(v == 0.0f);
}

TEST_CASE("backward twice over a released tape is an error naming the tensor") {
  Generator g(3);
  Tensor w = uniform({3}, -1, 1, g).set_requires_grad(true);
  Tensor loss = sum(mul(w, w));
  backward(loss);
  const std::string msg = error_of([&] { backward(loss); });
  CHECK(msg.find("already released") != std::string::npos);
  CHECK(msg.find("f32[] on cpu") != std::string::npos);
  // A tensor that never required grad.
  CHECK(error_of([&] { backward(sum(ones({3}))); }).find("not produced by a recorded op") !=
        std::string::npos);
  // A non-scalar loss.
  Tensor v = mul(w, w);
  CHECK(error_of([&] { backward(v); }).find("not a scalar") != std::string::npos);
  Tape::current().clear();
}

TEST_CASE("no-grad scope records nothing") {
  Tensor w = ones({3}).set_requires_grad(true);
  {
    NoGradScope ng;
    Tensor y = mul(w, w);
    CHECK(Tape::current().empty());
    CHECK_FALSE(y.requires_grad());
  }
  CHECK(grad_mode_enabled());
}

TEST_CASE("bad input: mismatched shapes, wrong dtypes and mixed devices name the op and shapes") {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  std::string m = error_of([&] { linear(a, b); });
  CHECK(m.find("linear") != std::string::npos);
  CHECK(m.find("[2, 3]") != std::string::npos);
  CHECK(m.find("[4, 5]") != std::string::npos);
  m = error_of([&] { matmul(a, b); });
  CHECK(m.find("matmul: shapes [2, 3] and [4, 5]") != std::string::npos);
  m = error_of([&] { add(a, zeros({2})); });
  CHECK(m.find("add: shapes [2, 3] and [2] do not broadcast") != std::string::npos);
  m = error_of([&] { mul(a, zeros({2, 3}, DType::f64)); });
  CHECK(m.find("mul: dtype mismatch") != std::string::npos);
  m = error_of([&] { relu(zeros({3}, DType::i64)); });
  CHECK(m.find("relu: expected a floating-point tensor") != std::string::npos);
  // A zero-element tensor that claims to live on cuda:0 is enough to reach the device check.
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = {2, 0};
  impl->device = Device::cuda(0);
  Tensor on_gpu(impl);
  m = error_of([&] { add(zeros({2, 0}), on_gpu); });
  CHECK(m.find("add: inputs on different devices") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  m = error_of([&] { conv2d(zeros({1, 3, 8, 8}), zeros({4, 2, 3, 3})); });
  CHECK(m.find("conv2d") != std::string::npos);
  CHECK(m.find("[1, 3, 8, 8]") != std::string::npos);
}

TEST_CASE("determinism: same seed, bitwise identical losses and gradients over 3 steps, dropout on") {
  auto run = [] {
    ModelConfig c = model_preset("transformer-tiny");
    c.dropout = 0.2f;
    manual_seed(77);
    auto model = make_model(c);
    AdamW opt(model->parameters(), AdamWOptions{});
    auto data = make_data_source("", c, 5);
    Trainer t(*model, opt, *data, 3, Device::cpu());
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(t.step().loss);
    std::vector<float> grads;
    for (const Tensor& p : model->parameters()) {
      const std::vector<float> g = p.grad().to_vector<float>();
      grads.insert(grads.end(), g.begin(), g.end());
    }
    return std::make_pair(losses, grads);
  };
  const auto a = run(), b = run();
  CHECK(a.first == b.first);
  REQUIRE(a.second.size() == b.second.size());
  CHECK(std::memcmp(a.second.data(), b.second.data(), a.second.size() * sizeof(float)) == 0);
}

TEST_CASE("training: an MLP's loss falls below 20% of its start within 100 steps") {
  // y = class of the sign pattern of x's first two coordinates (4 classes), fixed data.
  Generator g(11);
  Tensor x = uniform({64, 8}, -1, 1, g);
  std::vector<int64_t> labels(64);
  const std::vector<float> xv = x.to_vector<float>();
  for (int i = 0; i < 64; ++i) labels[i] = (xv[i * 8] > 0 ? 1 : 0) + (xv[i * 8 + 1] > 0 ? 2 : 0);
  Tensor y = from_vector<int64_t>(labels, {64});
  Net net;
  Linear& l1 = net.add("l1", std::make_unique<Linear>("l1", 8, 32, true, g));
  Linear& l2 = net.add("l2", std::make_unique<Linear>("l2", 32, 4, true, g));
  AdamW opt(net.parameters(), AdamWOptions{0.01, 0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(l2.forward(relu(l1.forward(x))), y);
    last = loss.item<float>();
    if (step == 0) first = last;
    backward(loss);
    opt.step();
  }
  MESSAGE("MLP loss ", first, " -> ", last);
  CHECK(last < 0.2 * first);
}

TEST_CASE("training: a small CNN's loss falls below 30% of its start within 60 steps") {
  // 8x8 single-channel images whose class is which quadrant holds a bright square.
  std::vector<float> img(32 * 64, 0.0f);
  std::vector<int64_t> labels(32);
  Generator noise_gen(5);
  const std::vector<float> noise = uniform({32 * 64}, -0.1, 0.1, noise_gen).to_vector<float>();
  for (int i = 0; i < 32; ++i) {
    labels[i] = i % 4;
    const int oy = (labels[i] / 2) * 4, ox = (labels[i] % 2) * 4;
    for (int p = 0; p < 64; ++p) img[i * 64 + p] = noise[i * 64 + p];
    for (int yy = 0; yy < 3; ++yy) {
      for (int xx = 0; xx < 3; ++xx) img[i * 64 + (oy + yy) * 8 + ox + xx] += 1.0f;
    }
  }
  Tensor x = from_vector<float>(img, {32, 1, 8, 8});
  Tensor y = from_vector<int64_t>(labels, {32});
  Generator g(6);
  Net net;
  Conv2d& c1 = net.add("c1", std::make_unique<Conv2d>("c1", 1, 8, 3, 1, 1, true, g));
  BatchNorm2d& bn = net.add("bn", std::make_unique<BatchNorm2d>("bn", 8));
  Linear& fc = net.add("fc", std::make_unique<Linear>("fc", 8 * 4 * 4, 4, true, g));
  SGD opt(net.parameters(), SGDOptions{0.05, 0.9, 0.0, 0.0, false});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor h = max_pool2d(relu(bn.forward(c1.forward(x))), 2, 2);
    Tensor loss = cross_entropy(fc.forward(flatten(h, 1)), y);
    last = loss.item<float>();
    if (step == 0) first = last;
    backward(loss);
    opt.step();
  }
  MESSAGE("CNN loss ", first, " -> ", last);
  CHECK(last < 0.3 * first);
}
