// Gradient parity with PyTorch. tools/make_reference.py (PyTorch 1.13) wrote the fixtures in
// tests/data: weights, one batch, the loss and every parameter gradient of one training step,
// and the losses of five SGD steps. regen loads the same weights by torch's parameter names and
// must reproduce them in f32:
//   loss: relative error <= 1e-5; gradients and running statistics: every element within
//   1e-4 * max|reference| of the tensor (plus 1e-7); the five SGD losses: relative error <= 1e-4.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "regen/core/safetensors.h"
#include "regen/models/model.h"
#include "regen/models/optim.h"

using namespace regen;

namespace {

std::string data(const std::string& f) {
  return std::string(REGEN_TEST_DATA) + "/" + f;
}

// The fixture entries that belong to the model's state dict.
NamedTensors model_state(const SafetensorsFile& f) {
  NamedTensors out;
  for (const auto& kv : f.tensors) {
    const std::string& n = kv.first;
    if (n == "input" || n == "target" || n == "loss" || n == "losses" || n.rfind("grad.", 0) == 0 ||
        n.rfind("after.", 0) == 0 || n.rfind("input.", 0) == 0 || n.rfind("target.", 0) == 0) {
      continue;
    }
    out.push_back(kv);
  }
  return out;
}

std::unique_ptr<Model> build(const std::string& name) {
  ModelConfig c = model_preset(name);
  c.dropout = 0.0f;  // the references run without dropout
  return make_model(c, Device::cpu());
}

// max |got - want| against the tolerance 1e-4 * max|want| + 1e-7; returns the relative error.
double compare(const std::string& what, const Tensor& got, const Tensor& want) {
  REQUIRE_MESSAGE(got.shape() == want.shape(), what, ": shape ", shape_str(got.shape()), " vs ",
                  shape_str(want.shape()));
  const std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  CHECK_MESSAGE(max_err <= 1e-4 * max_ref + 1e-7, what, ": max error ", max_err, " (max |ref| ",
                max_ref, ")");
  return max_ref > 0 ? max_err / max_ref : max_err;
}

void check_one_step(const std::string& name) {
  const SafetensorsFile f = load_safetensors(data(name + "_reference.safetensors"));
  auto model = build(name);
  model->load_state_dict(model_state(f));
  const Tensor input = *f.find("input");
  const Tensor target = *f.find("target");
  Tensor loss = model->loss(model->forward(input), target);
  const double want = f.find("loss")->item<float>();
  const double got = loss.item<float>();
  CHECK_MESSAGE(std::fabs(got - want) <= 1e-5 * std::fabs(want), name, " loss ", got, " vs ", want);
  backward(loss);
  double worst = 0;
  int checked = 0;
  for (const auto& kv : model->named_parameters()) {
    const Tensor* ref = f.find("grad." + kv.first);
    REQUIRE_MESSAGE(ref != nullptr, "no reference gradient for ", kv.first);
    worst = std::max(worst, compare("grad " + kv.first, kv.second.grad(), *ref));
    ++checked;
  }
  for (const auto& kv : model->named_buffers()) {
    const Tensor* ref = f.find("after." + kv.first);
    if (ref) worst = std::max(worst, compare(kv.first + " after one step", kv.second, *ref));
  }
  MESSAGE(name, ": loss ", got, " (torch ", want, "), ", checked,
          " gradients, worst relative error ", worst);
}

void check_sgd(const std::string& name, double lr, double momentum, double wd) {
  const SafetensorsFile f = load_safetensors(data(name + "_sgd.safetensors"));
  auto model = build(name);
  model->load_state_dict(model_state(f));
  SGDOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.weight_decay = wd;
  SGD opt(model->parameters(), o);
  const std::vector<float> want = f.find("losses")->to_vector<float>();
  REQUIRE(want.size() == 5);
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    Tensor loss = model->loss(model->forward(*f.find("input." + std::to_string(i))),
                              *f.find("target." + std::to_string(i)));
    const double got = loss.item<float>();
    CHECK_MESSAGE(std::fabs(got - want[i]) <= 1e-4 * std::fabs(want[i]), name, " SGD step ", i,
                  ": loss ", got, " vs torch ", want[i]);
    backward(loss);
    opt.step();
  }
}

}  // namespace

TEST_CASE("parity: resnet-tiny loss, gradients and running stats match PyTorch") {
  check_one_step("resnet-tiny");
}

TEST_CASE("parity: transformer-tiny loss and gradients match PyTorch") {
  check_one_step("transformer-tiny");
}

TEST_CASE("parity: five SGD steps give PyTorch's losses (resnet-tiny)") {
  check_sgd("resnet-tiny", 0.01, 0.9, 1e-4);
}

TEST_CASE("parity: five SGD steps give PyTorch's losses (transformer-tiny)") {
  check_sgd("transformer-tiny", 0.1, 0.9, 0.0);
}

TEST_CASE("parity: loading a state dict with wrong names or shapes is a clear error") {
  const SafetensorsFile f = load_safetensors(data("resnet-tiny_reference.safetensors"));
  NamedTensors state = model_state(f);
  auto model = build("resnet-tiny");
  NamedTensors missing(state.begin() + 1, state.end());
  try {
    model->load_state_dict(missing);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("missing 1 entry: " + state.front().first) !=
          std::string::npos);
  }
  NamedTensors extra = state;
  extra.emplace_back("layer9.weight", zeros({1}));
  CHECK_THROWS_WITH_AS(model->load_state_dict(extra),
                       doctest::Contains("1 entry unexpected: layer9.weight"), Error);
  auto transformer = build("transformer-tiny");
  CHECK_THROWS_AS(transformer->load_state_dict(state), Error);
  NamedTensors bad_shape = state;
  for (auto& kv : bad_shape) {
    if (kv.first == "fc.weight") kv.second = zeros({3, 3});
  }
  CHECK_THROWS_WITH_AS(model->load_state_dict(bad_shape),
                       doctest::Contains("'fc.weight' has shape [3, 3] but the model expects"),
                       Error);
}
