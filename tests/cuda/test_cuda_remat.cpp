// Rematerialization on cuda:0 (tests/remat_suite.h): for transformer-tiny and a small ResNet,
// every planner's plan trains bitwise identically to no remat on the GPU, the measured peaks
// (allocated and reserved) equal the simulator's to the byte every step, and feasible budgets are
// met. Also: one training step on cuda:0 against the same step on the CPU (losses and every
// parameter gradient within FP32 tolerance). Skipped (exit 77) without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "tests/remat_suite.h"

using namespace regen;
using namespace regen::testing;

namespace {

const Device kGpu = Device::cuda(0);

// Largest |got - ref| relative to the tensor's largest |ref|.
double scaled_error(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) scale = std::max(scale, std::fabs(double(ref[i])));
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - double(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

void compare_with_cpu(const ModelConfig& cfg, int64_t batch, double rtol) {
  fresh_allocator(Device::cpu());
  Run cpu = make_run(cfg, batch, Device::cpu());
  const Trace c = train(cpu, 1, nullptr);
  fresh_allocator(kGpu);
  Run gpu = make_run(cfg, batch, kGpu);
  const Trace g = train(gpu, 1, nullptr);
  CAPTURE(cfg.name);
  CHECK(g.losses[0] == doctest::Approx(c.losses[0]).epsilon(rtol));
  REQUIRE(g.grads.size() == c.grads.size());
  double worst = 0;
  for (size_t i = 0; i < c.grads.size(); ++i)
    worst = std::max(worst, scaled_error(g.grads[i], c.grads[i]));
  MESSAGE(cfg.name << ": worst gradient error relative to each tensor's scale " << worst);
  CHECK(worst <= rtol);
}

}  // namespace

TEST_CASE("cuda remat: transformer-tiny, every planner: bitwise, exact peaks, budgets met") {
  check_model(model_preset("transformer-tiny"), 4,
              {"none", "blocks", "sqrt", "mutwo", "mutwo:keep", "mutwo:drop"}, kGpu);
}

TEST_CASE(
    "cuda remat: resnet (ResNet-50 blocks at 1/8 width, 64x64), every planner: bitwise, exact "
    "peaks, budgets met") {
  check_model(remat_resnet(), 8, {"none", "blocks", "sqrt", "mutwo", "mutwo:keep", "mutwo:drop"},
              kGpu);
}

// FP32 on both sides (no TF32): summation orders differ, so the bar is 1e-3 of each tensor's
// largest magnitude after one step.
TEST_CASE("cuda: one training step matches the CPU (transformer-tiny, resnet)") {
  compare_with_cpu(model_preset("transformer-tiny"), 4, 1e-3);
  compare_with_cpu(remat_resnet(), 8, 1e-3);
}
