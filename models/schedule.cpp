// Learning-rate schedules and gradient clipping (schedule.h).
#include "regen/models/schedule.h"

#include <cmath>
#include <map>
#include <utility>

#include "regen/kernels/kernels.h"

namespace regen {

const char* schedule_kind_name(LrSchedule::Kind k) {
  switch (k) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::step:
      return "step";
    case LrSchedule::Kind::cosine:
      return "cosine";
  }
  return "?";
}

LrSchedule::Kind parse_schedule_kind(const std::string& text) {
  if (text == "constant") return LrSchedule::Kind::constant;
  if (text == "step") return LrSchedule::Kind::step;
  if (text == "cosine") return LrSchedule::Kind::cosine;
  REGEN_FAIL("unknown learning-rate schedule '", text, "' (constant, step or cosine)");
}

std::string LrSchedule::problem() const {
  if (!(base >= 0) || !std::isfinite(base)) return "the learning rate must be finite and >= 0";
  if (warmup < 0) return "the warm-up must be >= 0 steps";
  if (kind == Kind::step) {
    if (step_size < 1) return "the step schedule needs a step size of at least 1";
    if (!(gamma >= 0) || !std::isfinite(gamma)) return "the step schedule's gamma must be >= 0";
  }
  if (kind == Kind::cosine) {
    if (horizon <= warmup) {
      return "the cosine schedule needs more steps (" + std::to_string(horizon) +
             ") than its warm-up (" + std::to_string(warmup) + ")";
    }
    if (!(min >= 0) || !std::isfinite(min)) return "the cosine schedule's final rate must be >= 0";
  }
  return "";
}

double LrSchedule::at(int64_t t) const {
  const std::string bad = problem();
  REGEN_CHECK(bad.empty(), "learning-rate schedule: ", bad);
  REGEN_CHECK(t >= 0, "learning-rate schedule: step ", t, " is negative");
  if (t < warmup) return base * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const int64_t u = t - warmup;  // the main schedule's own step
  switch (kind) {
    case Kind::constant:
      return base;
    case Kind::step:
      return base * std::pow(gamma, static_cast<double>(u / step_size));
    case Kind::cosine: {
      const int64_t span = horizon - warmup;
      if (u >= span) return min;
      const double kPi = 3.14159265358979323846;
      return min + (base - min) *
                       (1.0 + std::cos(kPi * static_cast<double>(u) / static_cast<double>(span))) /
                       2.0;
    }
  }
  return base;
}

namespace {

template <class T>
void sum_squares_launch(const Tensor& g, const Tensor& out, int64_t i) {
  REGEN_LAUNCH(g.device(), T, sum_squares, g.data<T>(), out.data<T>() + i, g.numel());
}

template <class T>
void scale_launch(const Tensor& g, double alpha) {
  REGEN_LAUNCH(g.device(), T, scale, g.data<T>(), g.data<T>(), g.numel(), static_cast<T>(alpha));
}

template <class T>
double host_sum(const Tensor& t) {
  double s = 0;
  for (T v : t.to_vector<T>()) s += static_cast<double>(v);
  return s;
}

}  // namespace

double gradient_norm(const std::vector<Tensor>& params) {
  return std::sqrt(gradient_sum_squares(params));
}

double gradient_sum_squares(const std::vector<Tensor>& params) {
  // The gradients by device and dtype; one block of per-tensor sums for each group.
  std::map<std::pair<std::string, int>, std::vector<Tensor>> groups;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (g.defined() && g.numel() > 0)
      groups[{g.device().str(), static_cast<int>(g.dtype())}].push_back(g);
  }
  double total = 0;
  for (const auto& [key, grads] : groups) {
    const Tensor& first = grads.front();
    Tensor sums;
    {
      CategoryScope cat(Category::workspace);
      TagScope tag("grad_norm");
      sums = empty({static_cast<int64_t>(grads.size())}, first.dtype(), first.device());
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      REGEN_FLOATING(first.dtype(), "gradient norm", sum_squares_launch, grads[i], sums,
                     static_cast<int64_t>(i));
    }
    if (dry_run_active()) continue;  // shapes only (a dry run): the block taken, no values to read
    total += first.dtype() == DType::f64 ? host_sum<double>(sums) : host_sum<float>(sums);
  }
  return total;
}

void scale_gradients(const std::vector<Tensor>& params, double coef) {
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (g.defined() && g.numel() > 0)
      REGEN_FLOATING(g.dtype(), "gradient clipping", scale_launch, g, coef);
  }
}

double clip_gradient_norm(const std::vector<Tensor>& params, double max_norm) {
  REGEN_CHECK(max_norm > 0 && std::isfinite(max_norm), "gradient clipping: the maximum norm ",
              max_norm, " must be a finite number > 0");
  const double norm = gradient_norm(params);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) scale_gradients(params, coef);
  return norm;
}

}  // namespace regen
