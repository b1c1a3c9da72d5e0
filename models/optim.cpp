// Optimizer bookkeeping and the SGD / AdamW updates (models/optim.h). The arithmetic lives in the
// fused launchers (kernels/cpu/optim.cpp and their CUDA twins); this file owns state and names.
// Tests: tests/test_ops_nlp.cpp, tests/test_train_block.cpp.
#include "regen/models/optim.h"

#include <set>

#include "regen/autograd/tape.h"
#include "regen/kernels/kernels.h"

namespace regen {

// ---- Optimizer --------------------------------------------------------------------------------

Optimizer::Optimizer(const char* kind, std::vector<Tensor> params, double lr)
    : kind_(kind), params_(std::move(params)), lr_(0.0) {
  set_lr(lr);
  std::set<std::string> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    REGEN_CHECK(p.defined(), kind_, ": parameter ", i, " is undefined");
    REGEN_CHECK(is_floating(p.dtype()), kind_, ": parameter ", i, " (", p.str(),
                ") is not floating-point");
    const std::string name = p.name().empty() ? "param" + std::to_string(i) : p.name();
    REGEN_CHECK(seen.insert(name).second, kind_, ": two parameters are named \"", name, "\"");
    names_.push_back(name);
  }
  states_.resize(params_.size());
}

void Optimizer::set_lr(double lr) {
  REGEN_CHECK(lr >= 0.0, kind_, ": learning rate ", lr, " must be >= 0");
  lr_ = lr;
}

void Optimizer::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    REGEN_CHECK(
        grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
        kind_, ": gradient ", grad.str(), " of parameter \"", names_[i],
        "\" does not match the parameter ", p.str());
    ParamState& state = states_[i];
    ++state.steps;
    if (hooks_) hooks_->before_update(names_[i], state.tensors);
    update(i, grad, state);
    if (hooks_) hooks_->after_update(names_[i], state.tensors);
  }
  if (hooks_) hooks_->after_step();
}

void Optimizer::count_replayed_step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) ++states_[i].steps;
  }
}

void Optimizer::replace_state(const std::string& name, const std::string& key, Tensor t) {
  ParamState& s = states_[index_of(name)];
  auto it = s.tensors.find(key);
  REGEN_CHECK(it != s.tensors.end() && it->second.defined(), kind_, ": parameter \"", name,
              "\" has no state \"", key, "\" to replace");
  REGEN_CHECK(t.defined() && t.shape() == it->second.shape() && t.dtype() == it->second.dtype(),
              kind_, ": state \"", key, "\" of \"", name, "\" is ", it->second.str(),
              "; cannot replace it with ", t.defined() ? t.str() : std::string("nothing"));
  Tensor old = std::move(it->second);
  it->second = std::move(t);
}

void Optimizer::zero_grad() {
  regen::zero_grad(params_);
}

void Optimizer::initialize_state() {
  for (size_t i = 0; i < params_.size(); ++i) create_state(i, states_[i]);
}

size_t Optimizer::index_of(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  REGEN_FAIL(kind_, ": no parameter named \"", name, "\"");
}

Tensor Optimizer::state(const std::string& name, const std::string& key) const {
  const ParamState& s = states_[index_of(name)];
  auto it = s.tensors.find(key);
  return it == s.tensors.end() ? Tensor() : it->second;
}

int64_t Optimizer::step_count(const std::string& name) const {
  return states_[index_of(name)].steps;
}

std::map<std::string, Tensor> Optimizer::named_state() const {
  std::map<std::string, Tensor> all;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const auto& kv : states_[i].tensors) all[names_[i] + "." + kv.first] = kv.second;
  }
  return all;
}

std::vector<int64_t> Optimizer::step_counts() const {
  std::vector<int64_t> out;
  for (const ParamState& s : states_) out.push_back(s.steps);
  return out;
}

void Optimizer::load_state(const std::map<std::string, Tensor>& state,
                           const std::vector<int64_t>& steps) {
  REGEN_CHECK(steps.size() == params_.size(), kind_, ": the saved state has step counts for ",
              steps.size(), " parameters, this optimizer has ", params_.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    REGEN_CHECK(steps[i] >= 0, kind_, ": the saved step count of \"", names_[i], "\" is ",
                steps[i]);
  }
  initialize_state();
  const std::map<std::string, Tensor> mine = named_state();
  for (const auto& [name, t] : state) {
    const auto it = mine.find(name);
    REGEN_CHECK(it != mine.end(), kind_, ": the saved state has '", name,
                "', which this optimizer does not keep (another optimizer or momentum?)");
    REGEN_CHECK(it->second.shape() == t.shape() && it->second.dtype() == t.dtype(), kind_,
                ": the saved state '", name, "' is ", t.str(), ", but this optimizer's is ",
                it->second.str());
  }
  for (const auto& [name, t] : mine) {
    REGEN_CHECK(state.count(name) == 1, kind_, ": the saved state has no '", name, "'");
  }
  for (const auto& [name, t] : mine) Tensor(t).copy_from(state.at(name));
  for (size_t i = 0; i < steps.size(); ++i) states_[i].steps = steps[i];
}

Tensor Optimizer::make_state(size_t i, const std::string& key, bool zero) const {
  const Tensor& p = params_[i];
  CategoryScope category(Category::optimizer_state);
  TagScope tag(names_[i] + "." + key);
  return zero ? zeros(p.shape(), p.dtype(), p.device()) : empty(p.shape(), p.dtype(), p.device());
}

// ---- SGD --------------------------------------------------------------------------------------

namespace {
template <class T>
void sgd_launch(const Tensor& p, const Tensor& g, const Tensor& buf, const SGDOptions& o, double lr,
                bool first_step) {
  REGEN_LAUNCH(p.device(), T, sgd_step, p.data<T>(), g.data<T>(),
               buf.defined() ? buf.data<T>() : nullptr, p.numel(), lr, o.momentum, o.dampening,
               o.weight_decay, o.nesterov, first_step);
}

template <class T>
void adamw_launch(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                  const AdamWOptions& o, double weight_decay, double lr, int64_t step) {
  REGEN_LAUNCH(p.device(), T, adamw_step, p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(),
               p.numel(), lr, o.beta1, o.beta2, o.eps, weight_decay, step);
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  REGEN_CHECK(options.momentum >= 0.0, "SGD: momentum ", options.momentum, " must be >= 0");
  REGEN_CHECK(options.weight_decay >= 0.0, "SGD: weight_decay ", options.weight_decay,
              " must be >= 0");
  REGEN_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
              "SGD: nesterov momentum needs momentum > 0 and dampening 0 (got momentum ",
              options.momentum, ", dampening ", options.dampening, ")");
}

void SGD::create_state(size_t i, ParamState& state) {
  if (options_.momentum == 0.0) return;
  Tensor& slot = state.tensors["momentum_buffer"];
  if (!slot.defined()) slot = make_state(i, "momentum_buffer", true);
}

void SGD::update(size_t i, const Tensor& grad, ParamState& state) {
  Tensor buf;
  // torch sets the buffer from the gradient at a parameter's first momentum update.
  const bool first_step = state.steps == 1;
  if (options_.momentum != 0.0) {
    Tensor& slot = state.tensors["momentum_buffer"];
    if (!slot.defined()) slot = make_state(i, "momentum_buffer", false);  // written in full below
    buf = slot;
  }
  REGEN_FLOATING(params_[i].dtype(), "SGD step", sgd_launch, params_[i], grad, buf, options_, lr_,
                 first_step);
}

// ---- AdamW ------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer("AdamW", std::move(params), options.lr), options_(options) {
  REGEN_CHECK(
      options.beta1 >= 0.0 && options.beta1 < 1.0 && options.beta2 >= 0.0 && options.beta2 < 1.0,
      "AdamW: betas (", options.beta1, ", ", options.beta2, ") must be in [0, 1)");
  REGEN_CHECK(options.eps >= 0.0, "AdamW: eps ", options.eps, " must be >= 0");
  REGEN_CHECK(options.weight_decay >= 0.0, "AdamW: weight_decay ", options.weight_decay,
              " must be >= 0");
  for (const Tensor& p : params_) {
    decays_.push_back(options.weight_decay > 0.0 &&
                      (options.decay == DecayScope::all || p.dim() >= 2));
  }
}

void AdamW::create_state(size_t i, ParamState& state) {
  Tensor& m = state.tensors["exp_avg"];
  Tensor& v = state.tensors["exp_avg_sq"];
  if (!m.defined()) m = make_state(i, "exp_avg", true);
  if (!v.defined()) v = make_state(i, "exp_avg_sq", true);
}

void AdamW::update(size_t i, const Tensor& grad, ParamState& state) {
  Tensor& m = state.tensors["exp_avg"];
  Tensor& v = state.tensors["exp_avg_sq"];
  if (!m.defined()) m = make_state(i, "exp_avg", true);
  if (!v.defined()) v = make_state(i, "exp_avg_sq", true);
  REGEN_FLOATING(params_[i].dtype(), "AdamW step", adamw_launch, params_[i], grad, m, v, options_,
                 decays_[i] ? options_.weight_decay : 0.0, lr_, state.steps);
}

}  // namespace regen
