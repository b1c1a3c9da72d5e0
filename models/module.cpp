// The module system (module.h).
#include "regen/models/module.h"

#include <functional>
#include <set>

namespace regen {

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  REGEN_CHECK(value.defined() && is_floating(value.dtype()), "register_parameter('", name,
              "'): parameters must be floating-point tensors");
  value.set_requires_grad(true);
  value.impl()->name = name;
  params_.emplace_back(name, std::move(value));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  REGEN_CHECK(value.defined(), "register_buffer('", name, "'): undefined tensor");
  value.impl()->name = name;
  buffers_.emplace_back(name, std::move(value));
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, NamedTensors* params, NamedTensors* buffers,
                     NamedTensors* extra) const {
  for (const auto& kv : params_) {
    if (params) params->emplace_back(prefix + kv.first, kv.second);
  }
  for (const auto& kv : buffers_) {
    if (buffers) buffers->emplace_back(prefix + kv.first, kv.second);
  }
  if (extra) extra_state(*extra, prefix);
  for (const auto& kv : children_) {
    kv.second->collect(prefix + kv.first + ".", params, buffers, extra);
  }
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", &out, nullptr, nullptr);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& kv : named_parameters()) out.push_back(kv.second);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", nullptr, &out, nullptr);
  return out;
}

NamedTensors Module::state_dict() const {
  // torch order: per module, parameters then buffers, children after; extra (host) state with
  // the buffers of its module.
  NamedTensors out;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    for (const auto& kv : m.params_) out.emplace_back(prefix + kv.first, kv.second);
    for (const auto& kv : m.buffers_) out.emplace_back(prefix + kv.first, kv.second);
    m.extra_state(out, prefix);
    for (const auto& kv : m.children_) walk(*kv.second, prefix + kv.first + ".");
  };
  walk(*this, "");
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& kv : state) given[kv.first] = &kv.second;
  // Every entry the model holds, by full name: a tensor to copy into, or host state that a
  // module loads itself.
  struct Target {
    std::string name;
    Tensor* tensor;  // nullptr: extra state of `owner`
    Module* owner;
    std::string local;
  };
  std::vector<Target> targets;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m,
                                                              const std::string& prefix) {
    for (auto& kv : m.params_) targets.push_back({prefix + kv.first, &kv.second, &m, kv.first});
    for (auto& kv : m.buffers_) targets.push_back({prefix + kv.first, &kv.second, &m, kv.first});
    NamedTensors extra;
    m.extra_state(extra, prefix);
    for (auto& kv : extra) {
      targets.push_back({kv.first, nullptr, &m, kv.first.substr(prefix.size())});
    }
    for (auto& kv : m.children_) walk(*kv.second, prefix + kv.first + ".");
  };
  walk(*this, "");

  // Names first (a checkpoint of another model reads as such), then shapes and dtypes, and only
  // then any copy: a failed load leaves the model as it was.
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const Target& t : targets) {
    if (given.count(t.name))
      used.insert(t.name);
    else
      missing.push_back(t.name);
  }
  std::vector<std::string> unexpected;
  for (const auto& kv : state) {
    if (!used.count(kv.first)) unexpected.push_back(kv.first);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
      return s;
    };
    auto entries = [](size_t n) { return std::to_string(n) + (n == 1 ? " entry" : " entries"); };
    std::string msg = "load_state_dict: " + std::to_string(used.size()) + " of the model's " +
                      std::to_string(targets.size()) + " names match (the state dict has " +
                      std::to_string(state.size()) + ")";
    if (!missing.empty()) msg += "; missing " + entries(missing.size()) + ": " + list(missing);
    if (!unexpected.empty()) {
      msg += "; " + entries(unexpected.size()) + " unexpected: " + list(unexpected);
    }
    REGEN_FAIL(msg);
  }
  for (const Target& t : targets) {
    if (!t.tensor || !used.count(t.name)) continue;
    const Tensor& src = *given[t.name];
    REGEN_CHECK(src.shape() == t.tensor->shape(), "load_state_dict: '", t.name, "' has shape ",
                sh(src.shape()), " but the model expects ", sh(t.tensor->shape()));
    REGEN_CHECK(src.dtype() == t.tensor->dtype(), "load_state_dict: '", t.name, "' is ",
                dtype_name(src.dtype()), " but the model expects ", dtype_name(t.tensor->dtype()));
  }
  for (const Target& t : targets) {
    if (!used.count(t.name)) continue;
    const Tensor& src = *given[t.name];
    if (t.tensor) {
      t.tensor->copy_from(src);
    } else {
      REGEN_CHECK(t.owner->load_extra_state(t.local, src), "load_state_dict: cannot load '", t.name,
                  "'");
    }
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& kv : named_parameters()) n += kv.second.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& kv : children_) kv.second->train(on);
}

void Module::replayed_forward() {
  on_replayed_forward();
  for (auto& kv : children_) kv.second->replayed_forward();
}

void Module::to(Device device) {
  CategoryScope cat(Category::parameter);
  auto move = [&](const std::string& name, Tensor& t) {
    if (t.device() == device) return;
    TagScope tag(t.name().empty() ? name : t.name());
    Tensor moved = t.to(device);
    // Keep the same TensorImpl (optimizers and callers hold it): swap in the new storage.
    TensorImpl* impl = t.impl().get();
    impl->storage = moved.impl()->storage;
    impl->offset_bytes = 0;
    impl->device = device;
    impl->grad.reset();
  };
  for (auto& kv : params_) move(kv.first, kv.second);
  for (auto& kv : buffers_) move(kv.first, kv.second);
  device_ = device;
  for (auto& kv : children_) kv.second->to(device);
}

Device Module::device() const {
  NamedTensors params, buffers;
  collect("", &params, &buffers, nullptr);
  if (!params.empty()) return params.front().second.device();
  if (!buffers.empty()) return buffers.front().second.device();
  return device_;
}

void Module::zero_grad() {
  regen::zero_grad(parameters());
}

void Module::assign_full_names() {
  for (auto& kv : named_parameters()) kv.second.impl()->name = kv.first;
  for (auto& kv : named_buffers()) kv.second.impl()->name = kv.first;
}

}  // namespace regen
